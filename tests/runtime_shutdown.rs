//! Stopping a runtime on the in-memory broker: `shutdown` returns within its grace whatever
//! hangs (handlers, deferrals, dead letters), releases what it could not finish, never
//! acknowledges it, and leaves nothing alive; dropping a runtime stops its intake and releases
//! everything inside. On tokio's paused clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, eventually, BoxedResult, Hanging};
use triage::admission::QueueAgeConfig;
use triage::runtime::{HandlerError, Job, MemoryBroker, Runtime};
use triage::Criticality;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shutdown_returns_within_grace_despite_a_hanging_handler() {
    let broker = MemoryBroker::new();
    for i in 0..10u32 {
        broker.publish(i, Criticality::High, None);
    }
    let mut rt = Runtime::builder(config(2, 16))
        .start(|job: Job<u32>| async move {
            if *job.payload() == 9 {
                std::future::pending::<()>().await;
            }
            Ok(())
        })
        .unwrap();
    rt.attach(broker.source());
    while broker.acks().completed < 9 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let grace = Duration::from_secs(10);
    let report = rt.shutdown(grace).await;
    assert!(report.grace_exceeded);
    assert!(
        report.elapsed <= grace,
        "took {:?} on the virtual clock",
        report.elapsed
    );
    let acks = broker.acks();
    assert_eq!(
        acks.completed, 9,
        "work finished before shutdown is acknowledged"
    );
    assert_eq!(
        acks.released, 1,
        "the hanging one is released, never acknowledged"
    );
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.alive, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shutdown_releases_queued_work_unacknowledged() {
    let broker = MemoryBroker::new();
    for i in 0..50u32 {
        broker.publish(i, Criticality::Critical, None);
    }
    let mut rt = Runtime::builder(config(1, 64))
        .start(|_job: Job<u32>| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(())
        })
        .unwrap();
    rt.attach(broker.source());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let report = rt.shutdown(Duration::from_secs(30)).await;
    assert!(!report.grace_exceeded);
    let acks = broker.acks();
    assert_eq!(acks.completed, 3, "{acks:?}");
    assert_eq!(acks.released + broker.backlog() as u64, 47, "{acks:?}");
    assert_eq!(acks.duplicates, 0);
    assert!(report.stats.balances(), "{report}");
}

/// Regression: with the hung handler in any worker but the first, shutdown used to await an
/// already finished worker again and panic instead of returning its report.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shutdown_with_a_hung_handler_returns_a_report_whatever_the_worker() {
    for _ in 0..20 {
        let broker = MemoryBroker::new();
        broker.publish(0u32, Criticality::Critical, None);
        broker.publish(1u32, Criticality::Critical, None);
        let mut rt = Runtime::builder(config(4, 8))
            .start(|job: Job<u32>| async move {
                if *job.payload() == 1 {
                    std::future::pending::<()>().await;
                }
                Ok(())
            })
            .unwrap();
        rt.attach(broker.source());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let report = rt.shutdown(Duration::from_secs(1)).await;
        assert!(report.grace_exceeded);
        assert_eq!(broker.acks().completed, 1);
        assert_eq!(broker.acks().released, 1);
        assert!(report.stats.balances(), "{report}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shutdown_accepts_an_unbounded_grace() {
    let broker = MemoryBroker::new();
    broker.publish(0u32, Criticality::High, None);
    broker.close();
    let mut rt = Runtime::builder(config(1, 8))
        .start(|_job: Job<u32>| async { Ok(()) })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::MAX).await;
    assert!(!report.grace_exceeded);
    assert_eq!(broker.acks().completed, 1);
}

/// Message 0 fails for good, message 1 hangs in the handler, the others succeed.
fn fail_zero_hang_one(job: Job<u32>) -> BoxedResult {
    let id = *job.payload();
    Box::pin(async move {
        match id {
            0 => Err(HandlerError::permanent("malformed")),
            1 => std::future::pending().await,
            _ => Ok(()),
        }
    })
}

/// One message in each place a runtime keeps one: dead-lettering (0, its sink hanging), in
/// the handler (1, hanging), queued (2, 3), deferring (4, Medium, its sink hanging) and held
/// by backpressure (5, High). Returns once all six are inside the runtime.
async fn everywhere(broker: &MemoryBroker<u32>) -> (Runtime<u32>, Arc<Hanging>, Arc<Hanging>) {
    let mut c = config(1, 2);
    c.expert.queue.admission = QueueAgeConfig::disabled();
    // Pull to the queue's capacity, so the last two are refused as Full (not left unpulled).
    c.expert.admission.prefetch_per_slot = 1000;
    let defer = Arc::new(Hanging::default());
    let dead = Arc::new(Hanging::default());
    let mut rt = Runtime::builder(c)
        .defer_sink(Arc::clone(&defer))
        .dead_letter_sink(Arc::clone(&dead))
        .start(fail_zero_hang_one)
        .unwrap();
    rt.attach(broker.source());
    broker.publish(0, Criticality::Critical, None);
    assert!(eventually(|| dead.started() == 1).await);
    broker.publish(1, Criticality::Critical, None);
    assert!(eventually(|| rt.stats().running == 1).await);
    broker.publish(2, Criticality::Critical, None);
    broker.publish(3, Criticality::Critical, None);
    broker.publish(4, Criticality::Medium, None);
    broker.publish(5, Criticality::High, None);
    assert!(
        eventually(|| {
            let s = rt.stats();
            (s.alive, s.queued, s.held, defer.started()) == (6, 2, 1, 1)
        })
        .await,
        "{}",
        rt.stats()
    );
    (rt, defer, dead)
}

/// Issue 10.4: dropping a runtime without `shutdown` stops its intake (nothing more is
/// consumed) and releases every message inside it, wherever it was, never acknowledging one.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_a_runtime_stops_intake_and_releases_everything_inside() {
    let broker = MemoryBroker::new();
    let (rt, defer, dead) = everywhere(&broker).await;
    drop(rt);
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 6..10u32 {
        broker.publish(i, Criticality::Critical, None);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(broker.backlog(), 4, "consumed after the drop");
    let acks = broker.acks();
    assert_eq!(acks.released, 6, "{acks:?}");
    assert_eq!(acks.pending, 4, "only the four never consumed: {acks:?}");
    assert_eq!(acks.published - acks.released - acks.pending, 0, "{acks:?}");
    assert_eq!(acks.duplicates, 0);
    // The tasks that held the sinks are gone.
    assert_eq!(Arc::strong_count(&defer), 1);
    assert_eq!(Arc::strong_count(&dead), 1);
}

/// Issue 10.5: when shutdown's grace runs out, deferrals and dead letters still waiting for
/// their broker are cancelled too: their messages are released, the report balances with
/// nothing alive, and nothing is acknowledged after the sources' final acknowledgement.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shutdown_grace_covers_deferrals_and_dead_letters() {
    let broker = MemoryBroker::new();
    let (rt, defer, dead) = everywhere(&broker).await;
    let grace = Duration::from_secs(2);
    let report = rt.shutdown(grace).await;
    assert!(report.grace_exceeded);
    assert!(report.elapsed <= grace, "{:?}", report.elapsed);
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.alive, 0, "{report}");
    let acks = broker.acks();
    // Queued Critical and held High are released at once; Medium would be deferred but its
    // sink hangs; the rest are cancelled when the grace runs out.
    assert_eq!((acks.released, acks.pending), (6, 0), "{acks:?}");
    assert_eq!(report.stats.ledger.total().released, 6);
    assert_eq!(Arc::strong_count(&defer), 1, "a deferral outlived shutdown");
    assert_eq!(
        Arc::strong_count(&dead),
        1,
        "a dead letter outlived shutdown"
    );
}
