//! `observe::serve_alongside`: the scrape and a recorder of the process's own both see every
//! metric (a process of its own: the recorder is global).
#![cfg(feature = "prometheus")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use triage::runtime::{Job, MemoryBroker, Runtime, RuntimeConfig};
use triage::Criticality;

/// Counts Critical completions, ignores the rest.
struct CriticalCompletions(Arc<AtomicU64>);

struct Cell(Arc<AtomicU64>);

impl metrics::CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

impl metrics::Recorder for CriticalCompletions {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let critical = key
            .labels()
            .any(|l| l.key() == "tier" && l.value() == "critical");
        if key.name() == "triage_completed_total" && critical {
            metrics::Counter::from_arc(Arc::new(Cell(Arc::clone(&self.0))))
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_and_the_process_recorder_both_count() {
    let mine = Arc::new(AtomicU64::new(0));
    let server = triage::observe::serve_alongside(
        "127.0.0.1:0".parse().unwrap(),
        CriticalCompletions(Arc::clone(&mine)),
    )
    .unwrap();
    assert!(matches!(
        triage::observe::serve_alongside(
            "127.0.0.1:0".parse().unwrap(),
            CriticalCompletions(Arc::new(AtomicU64::new(0)))
        ),
        Err(triage::observe::ServeError::AlreadyInstalled)
    ));

    let broker = MemoryBroker::new();
    for i in 0..40u32 {
        broker.publish(i, Criticality::ALL[(i % 4) as usize], None);
    }
    broker.close();
    let mut rt = Runtime::builder(RuntimeConfig::default())
        .start(|_job: Job<u32>| async { Ok(()) })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        report.stats.ledger.tier(Criticality::Critical).completed,
        10
    );
    assert_eq!(mine.load(Ordering::Relaxed), 10);

    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with("triage_completed_total{tier=\"critical\"}"))
        .unwrap_or_else(|| panic!("no critical completions in:\n{out}"));
    assert!(line.ends_with(" 10"), "{line}");
    assert!(out.contains("# HELP triage_completed_total "), "{out}");
    assert!(
        out.contains("# TYPE triage_sojourn_seconds histogram"),
        "{out}"
    );
}
