//! A message larger than the queue's whole byte budget can never be queued: it is
//! dead-lettered (reason `too_large`), not held for ever nor deferred to come back as large.
//! On tokio's paused clock with the runtime's clock following it.

mod common;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use triage::ledger::Disposition;
use triage::runtime::{Job, MemoryBroker, MemorySink, Runtime, RuntimeConfig};
use triage::Criticality;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_message_larger_than_the_queue_budget_is_dead_lettered() {
    let clock = common::following_tokio();
    let mut config = RuntimeConfig {
        workers: 2.try_into().unwrap(),
        expert: triage::runtime::ExpertConfig {
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    config.expert.queue.max_bytes = NonZeroUsize::new(1_000);
    let deferred = Arc::new(MemorySink::new());
    let dead = Arc::new(MemorySink::new());
    let mut rt = Runtime::builder(config)
        .clock(clock.clone())
        .defer_sink(Arc::clone(&deferred))
        .dead_letter_sink(Arc::clone(&dead))
        .start(|_job: Job<u32>| async { Ok::<(), triage::runtime::HandlerError>(()) })
        .unwrap();
    let broker = MemoryBroker::new();
    // A Medium (defer) and a High (backpressure) message too large, and a small one.
    broker.publish_with(0, Criticality::Medium, None, 2_000);
    broker.publish_with(1, Criticality::High, None, 2_000);
    broker.publish_with(2, Criticality::High, None, 100);
    rt.attach(broker.source());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(broker.disposition(0), Some(Disposition::Failed));
    assert_eq!(broker.disposition(1), Some(Disposition::Failed));
    assert_eq!(broker.disposition(2), Some(Disposition::Completed));
    assert_eq!(dead.len(), 2);
    assert!(deferred.is_empty());
    let report = rt.shutdown(Duration::from_secs(1)).await;
    let total = report.stats.ledger.total();
    assert_eq!(total.consumed, total.settled(), "{report}");
    assert_eq!(report.stats.alive, 0, "{report}");
}
