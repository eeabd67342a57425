//! The metrics endpoint: `/metrics` shows the runtime's metrics, `/healthz` answers, both on
//! their own listener.
#![cfg(feature = "prometheus")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use triage::runtime::{Job, MemoryBroker, RefusalPolicy, Runtime, RuntimeConfig};
use triage::{Criticality, PerTier};

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// `promtool check metrics` on a scrape: its exit code and what it printed, or `None` when
/// promtool is missing, after a line on the terminal naming `tests/tools.sh` (which installs
/// it). Under `TRIAGE_REQUIRE_TOOLS` (set by `tests/run.sh`, which installs it) a missing
/// promtool panics instead.
fn promtool_check_metrics(scrape: &str) -> Option<(i32, String)> {
    let spawned = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if std::env::var_os("TRIAGE_REQUIRE_TOOLS").is_some() => {
            panic!(
                "cannot run promtool ({e}): install it with tests/tools.sh (Debian's prometheus)"
            )
        }
        Err(e) => {
            // Straight to the terminal: the harness captures only print macros.
            let _ = writeln!(
                std::io::stderr(),
                "skipped `promtool check metrics`: cannot run promtool ({e}); tests/tools.sh \
                 installs it (Debian's prometheus), and tests/run.sh runs this check for real"
            );
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.code().unwrap_or(-1), text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_liveness_are_served() {
    let server = triage::observe::serve("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = server.local_addr();
    let (status, body) = get(addr, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert_eq!(get(addr, "/nope").0, 404);

    let broker = MemoryBroker::new();
    for i in 0..200u32 {
        broker.publish(i, Criticality::ALL[(i % 4) as usize], None);
    }
    broker.close();
    let mut config = RuntimeConfig::default();
    config.expert.queue.capacity = 8.try_into().unwrap();
    config.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Drop,
        RefusalPolicy::Drop,
    );
    let mut rt = Runtime::builder(config)
        .start(|_job: Job<u32>| async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(())
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    let completed = report.stats.ledger.tier(Criticality::Critical).completed;
    assert_eq!(completed, 50);

    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200);
    let line = body
        .lines()
        .find(|l| l.starts_with("triage_completed_total{tier=\"critical\"}"))
        .unwrap_or_else(|| panic!("no critical completions in:\n{body}"));
    assert!(line.ends_with(" 50"), "{line}");
    for name in [
        "triage_consumed_total",
        "triage_admitted_total",
        "triage_goodput_total",
        "triage_handler_latency_seconds",
        "triage_sojourn_seconds",
    ] {
        assert!(body.contains(name), "{name} missing from /metrics");
    }
    let shed: u64 = body
        .lines()
        .filter(|l| l.starts_with("triage_shed_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(shed, report.stats.ledger.total().shed);

    // What Prometheus itself accepts: every family has HELP and TYPE, names and units follow
    // its conventions, and the latencies are histograms (buckets, aggregatable across workers).
    if let Some((code, lint)) = promtool_check_metrics(&body) {
        assert_eq!(code, 0, "promtool check metrics:\n{lint}\nscrape:\n{body}");
    }
    for name in [
        "triage_sojourn_seconds",
        "triage_handler_latency_seconds",
        "triage_reject_cost_seconds",
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} histogram")),
            "{name} is not a histogram:\n{body}"
        );
    }
    let critical_sojourn_inf = body
        .lines()
        .find(|l| l.starts_with("triage_sojourn_seconds_bucket{tier=\"critical\",le=\"+Inf\"}"))
        .unwrap_or_else(|| panic!("no +Inf bucket for critical sojourn:\n{body}"));
    assert!(
        critical_sojourn_inf.ends_with(" 50"),
        "{critical_sojourn_inf}"
    );
    let families = body.lines().filter(|l| l.starts_with("# TYPE ")).count();
    let helps = body.lines().filter(|l| l.starts_with("# HELP ")).count();
    assert_eq!(helps, families, "a family without HELP:\n{body}");
}
