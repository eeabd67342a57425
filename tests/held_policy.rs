//! A message held under backpressure does not hold back the messages of lower tiers whose own
//! policy is defer or drop: each refused message goes through its own tier's policy. On tokio's
//! paused clock with the runtime's clock following it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use triage::ledger::Disposition;
use triage::runtime::{Job, MemoryBroker, MemorySink, Runtime, RuntimeConfig};
use triage::Criticality;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_held_high_message_does_not_hold_the_defer_tiers_behind_it() {
    let clock = common::following_tokio();
    // Everything but Critical refused by the operator's switch; the default policies: High
    // held (backpressure), Medium and Sheddable deferred (a defer sink is given).
    let config = RuntimeConfig {
        workers: 4.try_into().unwrap(),
        forced_shed_level: 3,
        expert: triage::runtime::ExpertConfig {
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    let sink = Arc::new(MemorySink::new());
    let mut rt = Runtime::builder(config)
        .clock(clock.clone())
        .defer_sink(Arc::clone(&sink))
        .start(|_job: Job<u32>| async { Ok::<(), triage::runtime::HandlerError>(()) })
        .unwrap();
    let broker = MemoryBroker::new();
    let tiers = [
        Criticality::High,
        Criticality::Medium,
        Criticality::Sheddable,
        Criticality::Critical,
    ];
    for (id, tier) in tiers.into_iter().enumerate() {
        broker.publish(id as u32, tier, None);
    }
    rt.attach(broker.source());
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Medium and Sheddable went to the defer sink at once (reason `forced`), Critical was
    // served, High waits held for the level to come down.
    assert_eq!(broker.disposition(0), None, "High is held");
    assert_eq!(broker.disposition(1), Some(Disposition::Deferred));
    assert_eq!(broker.disposition(2), Some(Disposition::Deferred));
    assert_eq!(broker.disposition(3), Some(Disposition::Completed));
    assert_eq!(sink.len(), 2);
    let report = rt.shutdown(Duration::from_secs(1)).await;
    let total = report.stats.ledger.total();
    assert_eq!(total.consumed, total.settled() + total.released, "{report}");
}
