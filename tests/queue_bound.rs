//! Issue 33's zero-configuration queue bound, as a user meets it: under a pulled overload whose
//! messages carry deadlines, the queue holds what the workers clear within a quarter of each
//! tier's deadline slack, not `queue.capacity` (1,024 by default), so what it admits is served
//! before its deadline instead of waiting behind a deep queue. `expert.admission.derive_bounds = false`
//! (the defaults before) fills the queue to its capacity. On tokio's paused clock with the
//! runtime's clock following it: the counts do not depend on the machine's load.

mod common;

use std::time::Duration;

use triage::runtime::{HandlerError, Job, MemoryBroker, MemorySink, Runtime, RuntimeConfig};
use triage::Criticality;

/// Two workers of a 10 ms handler (200/s) offered 1,000/s for 4 s, half Critical due 1 s after
/// publishing, half Sheddable due 100 ms after: the most messages queued at once (sampled every
/// 10 ms), and Critical's completions.
async fn overload(derive_bounds: bool) -> (u64, u64) {
    let mut config = RuntimeConfig {
        workers: 2.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    config.expert.admission.derive_bounds = derive_bounds;
    let broker = MemoryBroker::new();
    let clock = common::following_tokio();
    let mut rt = Runtime::builder(config)
        .clock(clock.clone())
        .defer_sink(std::sync::Arc::new(MemorySink::new()))
        .start(|_job: Job<u32>| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    rt.attach(broker.source());
    let mut peak = 0;
    for i in 0..4_000u32 {
        let (tier, window) = if i % 2 == 0 {
            (Criticality::Critical, Duration::from_secs(1))
        } else {
            (Criticality::Sheddable, Duration::from_millis(100))
        };
        broker.publish(i, tier, Some(clock.now() + window));
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            peak = peak.max(rt.stats().queued);
        }
    }
    broker.close();
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let critical = report.stats.ledger.tier(Criticality::Critical).completed;
    (peak, critical)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_queue_holds_what_the_workers_clear_within_the_deadlines() {
    let (derived, critical) = overload(true).await;
    let (configured, critical_before) = overload(false).await;
    // A quarter of Critical's slack (under 1 s) at 200/s: at most 50 queued. Medium and High,
    // with no messages, do not lift it.
    assert!(derived <= 50, "derived bound: {derived} queued at once");
    assert!(
        configured >= 400,
        "configured capacity: {configured} queued at once"
    );
    // What the deep queue held was served late or expired: no fewer Critical completions.
    assert!(
        critical >= critical_before,
        "{critical} < {critical_before}"
    );
}
