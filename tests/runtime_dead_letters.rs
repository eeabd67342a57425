//! Dead letters on the in-memory broker: `Failed` is acknowledged only once the dead-letter
//! sink confirmed its copy; a copy refused for good becomes a reference copy, or, refused too,
//! holds its message unacknowledged; a sink that is down is retried; all of it off the
//! workers, and bounded by `max_dead_lettering`. On tokio's paused clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, eventually, BoxedResult, Hanging};
use triage::ledger::Disposition;
use triage::runtime::{HandlerError, Job, MemoryBroker, MemorySink, Runtime};
use triage::Criticality;

/// A dead-letter sink that is down holds the message unacknowledged until it recovers.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn failed_is_acked_only_after_the_dead_letter_sink_confirms() {
    let broker = MemoryBroker::new();
    broker.publish(1u32, Criticality::High, None);
    broker.close();
    let dead = Arc::new(MemorySink::new());
    dead.set_failing(true);
    let mut rt = Runtime::builder(config(1, 8))
        .dead_letter_sink(Arc::clone(&dead))
        .start(|_job: Job<u32>| async { Err(HandlerError::permanent("bad")) })
        .unwrap();
    rt.attach(broker.source());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        broker.disposition(0),
        None,
        "acknowledged before the dead letter was confirmed"
    );
    assert_eq!(broker.acks().pending, 1);
    // Handled once (a permanent error), then waiting for the sink, off the worker.
    let stats = rt.stats();
    assert_eq!(
        (stats.alive, stats.running, stats.queued),
        (1, 0, 0),
        "{stats}"
    );
    assert!(dead.is_empty());
    dead.set_failing(false);
    rt.wait_idle().await;
    assert_eq!(broker.disposition(0), Some(Disposition::Failed));
    assert_eq!(dead.len(), 1);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances());
}

/// Message 0 fails for good; the others succeed.
fn poison_zero(job: Job<u32>) -> BoxedResult {
    let poison = *job.payload() == 0;
    Box::pin(async move {
        if poison {
            Err(HandlerError::permanent("malformed"))
        } else {
            Ok(())
        }
    })
}

/// Issue 10.1: a dead letter the sink refuses for good (a record over the producer's maximum)
/// is answered with a reference copy, off the worker: the single worker serves the next
/// messages at once, and the failed one ends `Failed` with a copy that says why.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dead_letter_refused_for_good_becomes_a_reference_copy_off_the_worker() {
    let broker = MemoryBroker::new();
    for i in 0..4u32 {
        broker.publish(i, Criticality::Critical, None);
    }
    let dead = Arc::new(MemorySink::new());
    dead.set_rejecting(true);
    let mut rt = Runtime::builder(config(1, 8))
        .dead_letter_sink(Arc::clone(&dead))
        .start(poison_zero)
        .unwrap();
    rt.attach(broker.source());
    assert!(
        eventually(|| broker.acks().completed == 3).await,
        "the worker hangs on the refused dead letter: {:?}",
        broker.acks()
    );
    assert!(eventually(|| broker.disposition(0) == Some(Disposition::Failed)).await);
    assert!(dead.is_empty(), "the full copy was refused");
    let references = dead.references();
    assert_eq!(references.len(), 1);
    let (payload, info) = &references[0];
    assert_eq!(*payload, 0);
    assert_eq!(info.reason, "dead_letter_rejected");
    let error = info.error.as_deref().unwrap();
    assert!(error.contains("publish rejected"), "{error}");
    assert!(
        error.contains("failed: permanent handler error: malformed"),
        "{error}"
    );
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.ledger.total().failed, 1);
    assert_eq!(report.stats.alive, 0);
}

/// Issue 10.1: when the reference copy is refused for good too (a missing topic), the message
/// is held unacknowledged and counted, while the other messages keep flowing; shutdown
/// releases it, never acknowledges it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dead_letter_and_its_reference_refused_for_good_hold_the_message_not_the_worker() {
    let broker = MemoryBroker::new();
    for i in 0..4u32 {
        broker.publish(i, Criticality::Critical, None);
    }
    let dead = Arc::new(MemorySink::new());
    dead.set_rejecting(true);
    dead.set_rejecting_references(true);
    let mut rt = Runtime::builder(config(1, 8))
        .dead_letter_sink(Arc::clone(&dead))
        .start(poison_zero)
        .unwrap();
    rt.attach(broker.source());
    assert!(
        eventually(|| broker.acks().completed == 3).await,
        "the worker hangs on the refused dead letter: {:?}",
        broker.acks()
    );
    assert!(eventually(|| rt.stats().dead_letters_held == 1).await);
    // Tried again after the longest backoff, still refused: held, counted once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rt.stats().dead_letters_held, 1);
    assert_eq!(broker.disposition(0), None, "acknowledged without a copy");
    assert_eq!(broker.acks().pending, 1);
    // Later messages still flow.
    broker.publish(4, Criticality::Critical, None);
    assert!(eventually(|| broker.acks().completed == 4).await);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.alive, 0);
    assert_eq!(report.stats.dead_letters_held, 0);
    let acks = broker.acks();
    assert_eq!(
        (acks.released, acks.failed, acks.completed),
        (1, 0, 4),
        "{acks:?}"
    );
    assert!(dead.is_empty() && dead.references().is_empty());
}

/// Issue 10.1: a dead-letter sink that is down is retried with backoff off the worker: the
/// next message is served meanwhile, and the failed one is acknowledged once the sink
/// confirms.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dead_letter_sink_down_is_retried_off_the_worker() {
    let broker = MemoryBroker::new();
    for i in 0..4u32 {
        broker.publish(i, Criticality::Critical, None);
    }
    let dead = Arc::new(MemorySink::new());
    dead.set_failing(true);
    let mut rt = Runtime::builder(config(1, 8))
        .dead_letter_sink(Arc::clone(&dead))
        .start(poison_zero)
        .unwrap();
    rt.attach(broker.source());
    assert!(
        eventually(|| broker.acks().completed == 3).await,
        "the worker waits for the dead-letter sink: {:?}",
        broker.acks()
    );
    assert_eq!(broker.disposition(0), None);
    dead.set_failing(false);
    assert!(eventually(|| broker.disposition(0) == Some(Disposition::Failed)).await);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead.items()[0].1.reason, "failed");
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.alive, 0);
}

/// The dead-letter path is bounded: with `max_dead_lettering` messages already in it (their
/// sink hanging), a worker whose message fails for good waits for room (backpressure) rather
/// than piling up tasks; shutdown releases them all.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_dead_letter_path_is_bounded_by_max_dead_lettering() {
    let broker = MemoryBroker::new();
    let dead = Arc::new(Hanging::default());
    let mut c = config(1, 8);
    c.expert.max_dead_lettering = 1.try_into().unwrap();
    let mut rt = Runtime::builder(c)
        .dead_letter_sink(Arc::clone(&dead))
        .start(|job: Job<u32>| {
            let fails = *job.payload() < 2;
            async move {
                if fails {
                    Err(HandlerError::permanent("malformed"))
                } else {
                    Ok(())
                }
            }
        })
        .unwrap();
    rt.attach(broker.source());
    for i in 0..3u32 {
        broker.publish(i, Criticality::Critical, None);
    }
    // 0 is dead-lettering, 1 failed and waits in the worker, 2 is still queued behind it.
    assert!(eventually(|| rt.stats().queued == 1 && rt.stats().alive == 3).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(dead.started(), 1, "one dead letter at a time");
    assert_eq!(broker.acks().completed, 0, "the worker waits for room");
    let report = rt.shutdown(Duration::from_secs(2)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.alive, 0);
    let acks = broker.acks();
    assert_eq!((acks.released, acks.completed), (3, 0), "{acks:?}");
}
