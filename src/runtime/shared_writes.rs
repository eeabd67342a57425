//! How many writes to shared atomics a message costs the runtime in steady state, counted on
//! the real code (see `crate::sync`): the in-memory source's path, as `benches/runtime.rs` runs
//! it (a no-op handler, 8 workers, backpressure), on one thread, where every write of every
//! task is this thread's. Metric handles count as shared writes (an exporter's counters and
//! histograms are atomics every thread writes), through a recorder that counts them.

use std::sync::Arc;
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

use crate::admission::QueueAgeConfig;
use crate::ledger::Disposition;
use crate::runtime::Source;
use crate::runtime::{HandlerError, Job, MemoryBroker, RefusalPolicy, Runtime, RuntimeConfig};
use crate::sync::{record_shared_write_sites, shared_write_sites, shared_writes};
use crate::{Criticality, PerTier};

/// What an exporter's handle costs: one shared write per update.
struct Handle;

impl CounterFn for Handle {
    fn increment(&self, _: u64) {
        crate::sync::note_shared_writes(1);
    }
    fn absolute(&self, _: u64) {
        crate::sync::note_shared_writes(1);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, _: f64) {
        crate::sync::note_shared_writes(1);
    }
    fn decrement(&self, _: f64) {
        crate::sync::note_shared_writes(1);
    }
    fn set(&self, _: f64) {
        crate::sync::note_shared_writes(1);
    }
}

impl HistogramFn for Handle {
    fn record(&self, _: f64) {
        crate::sync::note_shared_writes(1);
    }
}

struct Counting;

impl Recorder for Counting {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Handle))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(Handle))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Handle))
    }
}

const WARM: u64 = 2_000;
const MEASURED: u64 = 20_000;

fn publish(broker: &MemoryBroker<u64>, from: u64, n: u64) {
    for i in from..from + n {
        broker.publish(i, Criticality::ALL[(i % 4) as usize], None);
    }
}

async fn completed(broker: &MemoryBroker<u64>, n: u64) {
    while broker.acks().completed < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The source's own writes per message (pulled and acknowledged as the plain pool does), to
/// take out of the runtime's: they are the source's, whoever pulls.
async fn source_writes_per_message() -> f64 {
    let broker = MemoryBroker::new();
    publish(&broker, 0, MEASURED);
    broker.close();
    let mut source = broker.source();
    let before = shared_writes();
    while let Some(env) = source.next().await {
        env.ack.resolve(Disposition::Completed);
    }
    (shared_writes() - before) as f64 / MEASURED as f64
}

#[test]
fn a_message_writes_at_most_four_shared_atomics_in_steady_state() {
    metrics::with_local_recorder(&Counting, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async {
            let source = source_writes_per_message().await;
            let mut config = RuntimeConfig {
                workers: 8.try_into().expect("non-zero"),
                ..RuntimeConfig::default()
            };
            config.expert.queue.admission = QueueAgeConfig::disabled();
            config.policy = PerTier::splat(RefusalPolicy::Backpressure);
            // A clock that stands still: a worker's batch size follows its handler's measured
            // time, and the writes per batch are shared over the batch's messages, so the
            // count must not depend on how fast this machine runs the handler today. Standing
            // still, every handler takes no time and every batch is as large as it can be.
            let (clock, _mock) = quanta::Clock::mock();
            let mut runtime = Runtime::builder(config)
                .clock(clock)
                .start(|job: Job<u64>| async move {
                    std::hint::black_box(job.payload());
                    Ok::<(), HandlerError>(())
                })
                .expect("valid config");
            let broker = MemoryBroker::new();
            runtime.attach(broker.source());
            publish(&broker, 0, WARM);
            completed(&broker, WARM).await;
            // Published before counting: the broker's writes are the test's (nothing runs
            // until the test awaits).
            publish(&broker, WARM, MEASURED);
            record_shared_write_sites();
            let before = shared_writes();
            completed(&broker, WARM + MEASURED).await;
            let writes = shared_writes() - before;
            let sites = shared_write_sites();
            broker.close();
            let report = runtime.shutdown(Duration::from_secs(5)).await;
            assert!(report.stats.balances());
            let per_message = writes as f64 / MEASURED as f64 - source;
            let mut inventory = String::new();
            for (at, n) in &sites {
                let share = *n as f64 / MEASURED as f64;
                if share >= 0.005 {
                    inventory.push_str(&format!("  {share:6.3}  {at}\n"));
                }
            }
            println!(
                "shared writes per message: {per_message:.2} (the source's own {source:.2} \
                 taken out)\n{inventory}"
            );
            assert!(
                per_message <= 4.0,
                "{per_message:.2} shared writes per message, at most 4 wanted:\n{inventory}"
            );
        });
    });
}

/// The count above sees only the atomics of `crate::sync` (and `crate::loom`, which takes them
/// from there): one from the standard library elsewhere would be a shared write it misses.
#[test]
fn every_atomic_of_the_crate_comes_from_sync() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("readable src") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("readable file");
                let name = path.display().to_string();
                let allowed = name.ends_with("src/sync.rs") || name.ends_with("src/loom.rs");
                if !allowed && text.contains(concat!("std::sync::", "atomic")) {
                    found.push(name);
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    assert!(
        found.is_empty(),
        "std atomics outside crate::sync: {found:?}"
    );
}
