//! The runtime end to end on the in-memory broker, handling: every message completed and
//! acknowledged once, retries demoted one level each, panics and permanent errors failed,
//! expired messages never handled, a panicking observer harmless, a slot held outside shared,
//! an in-process submission that evicts keeping both messages. Tests that wait for time run
//! on tokio's paused clock; those that only wait for the runtime to be idle run on two threads.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::config;
use parking_lot::Mutex;
use triage::admission::QueueAgeConfig;
use triage::ledger::Disposition;
use triage::runtime::{
    Ack, Envelope, HandlerError, Job, MemoryBroker, MemorySink, RefusalPolicy, Runtime,
};
use triage::{Criticality, PerTier};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_completes_and_is_acked_once() {
    let broker = MemoryBroker::new();
    for i in 0..2_000u32 {
        broker.publish(i, Criticality::ALL[(i % 4) as usize], None);
    }
    broker.close();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    // Backpressure for every tier: the broker is the buffer, so nothing is shed however fast
    // the source is.
    let mut c = config(4, 64);
    c.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let mut rt = Runtime::builder(c)
        .start(move |job: Job<u32>| {
            let seen = Arc::clone(&seen2);
            async move {
                seen.lock().push(*job.payload());
                Ok(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let acks = broker.acks();
    assert_eq!(acks.completed, 2_000, "{acks:?}");
    assert_eq!(acks.duplicates, 0);
    assert_eq!(acks.pending, 0);
    let mut seen = seen.lock().clone();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..2_000).collect::<Vec<_>>(),
        "each handled exactly once"
    );
    let total = report.stats.ledger.total();
    assert_eq!(
        (total.consumed, total.completed, total.goodput),
        (2_000, 2_000, 2_000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_panicking_on_every_third_message_fails_them_after_demoted_retries() {
    let broker = MemoryBroker::new();
    for i in 0..300u32 {
        broker.publish(i, Criticality::Critical, None);
    }
    broker.close();
    let dead = Arc::new(MemorySink::new());
    // (message, attempt) -> tier it was served at
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let calls2 = Arc::clone(&calls);
    let mut rt = Runtime::builder(config(4, 512))
        .dead_letter_sink(Arc::clone(&dead))
        .start(move |job: Job<u32>| {
            let calls = Arc::clone(&calls2);
            async move {
                calls
                    .lock()
                    .insert((*job.payload(), job.attempt()), job.criticality());
                if job.payload() % 3 == 0 {
                    panic!("boom on {}", job.payload());
                }
                Ok(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;

    assert!(report.stats.balances(), "{report}");
    let acks = broker.acks();
    assert_eq!(acks.failed, 100, "{acks:?}");
    assert_eq!(acks.completed, 200, "{acks:?}");
    assert_eq!(dead.len(), 100);
    let calls = calls.lock();
    for i in (0..300u32).step_by(3) {
        // First attempt at Critical, then one level lower per retry, floored at Sheddable.
        assert_eq!(calls[&(i, 0)], Criticality::Critical);
        assert_eq!(calls[&(i, 1)], Criticality::High);
        assert_eq!(calls[&(i, 2)], Criticality::Medium);
        assert_eq!(calls[&(i, 3)], Criticality::Sheddable);
        assert!(!calls.contains_key(&(i, 4)), "bounded attempts");
    }
    for (payload, info) in dead.items() {
        assert_eq!(payload % 3, 0);
        assert_eq!(info.attempt, 3);
        assert_eq!(info.reason, "panicked");
        assert_eq!(
            info.criticality,
            Criticality::Critical,
            "original criticality kept"
        );
    }
    let total = report.stats.ledger.total();
    assert_eq!((total.failed, total.completed), (100, 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_is_dead_lettered_without_retry() {
    let broker = MemoryBroker::new();
    broker.publish(7u32, Criticality::High, None);
    broker.close();
    let attempts = Arc::new(AtomicU32::new(0));
    let a2 = Arc::clone(&attempts);
    let mut rt = Runtime::builder(config(1, 8))
        .start(move |_job: Job<u32>| {
            a2.fetch_add(1, Ordering::Relaxed);
            async { Err(HandlerError::permanent("malformed")) }
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert_eq!(attempts.load(Ordering::Relaxed), 1);
    assert_eq!(broker.disposition(0), Some(Disposition::Failed));
    assert!(report.stats.balances());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_messages_are_never_handled() {
    let clock = triage::quanta::Clock::new();
    let broker = MemoryBroker::new();
    let past = clock.now();
    for i in 0..100u32 {
        let deadline = if i % 2 == 0 { Some(past) } else { None };
        broker.publish(i, Criticality::Medium, deadline);
    }
    broker.close();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let h2 = Arc::clone(&handled);
    let mut rt = Runtime::builder(config(2, 256))
        .clock(clock)
        .start(move |job: Job<u32>| {
            h2.lock().push(*job.payload());
            async { Ok(()) }
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(handled.lock().iter().all(|i| i % 2 == 1));
    assert_eq!(broker.acks().expired, 50);
    assert_eq!(broker.acks().completed, 50);
    assert_eq!(report.stats.ledger.tier(Criticality::Medium).expired, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_observer_costs_no_message_and_no_worker() {
    let broker = MemoryBroker::new();
    for i in 0..10u32 {
        broker.publish(i, Criticality::Medium, None);
    }
    broker.close();
    let mut rt = Runtime::builder(config(1, 16))
        .observe(|id: &u32, _, _| {
            if id % 2 == 0 {
                panic!("observer bug");
            }
        })
        .start(|_job: Job<u32>| async { Ok(()) })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert_eq!(broker.acks().completed, 10);
    assert!(report.stats.balances(), "{report}");
}

/// Issue 13: a slot held outside the runtime through `Runtime::concurrency_limit` (an HTTP
/// request, say) is one the workers cannot use, and its release wakes them.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_slot_held_outside_is_shared_capacity() {
    let mut c = config(1, 16);
    c.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let rt = Runtime::builder(c)
        .start(|_job: Job<u32>| async { Ok(()) })
        .unwrap();
    let limit = rt.concurrency_limit();
    assert_eq!(limit.limit(), 1);
    let outside = limit.try_acquire(Criticality::Critical).unwrap();
    rt.try_submit(Envelope::new(7, Criticality::Critical, Ack::noop()))
        .unwrap();
    // However long the worker waits (a virtual second), the one slot is taken (`running`
    // counts it): nothing completes, and the message stays queued.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = rt.stats();
    assert_eq!(stats.ledger.total().completed, 0, "{stats}");
    assert_eq!(
        (stats.running, stats.queued, stats.alive),
        (1, 1, 1),
        "{stats}"
    );
    drop(outside);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.stats.ledger.total().completed, 1, "{report}");
    assert!(report.stats.balances(), "{report}");
}

/// Regression: a submission that evicts a queued Backpressure-tier message is accepted, and
/// the evicted message is held and served later, never handed to the submitter.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn try_submit_that_evicts_keeps_both_messages() {
    let mut c = config(1, 2);
    c.expert.queue.admission = QueueAgeConfig::disabled();
    c.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let served = Arc::new(Mutex::new(Vec::new()));
    let (g2, s2) = (Arc::clone(&gate), Arc::clone(&served));
    let rt = Runtime::builder(c)
        .start(move |job: Job<&'static str>| {
            let (g, s) = (Arc::clone(&g2), Arc::clone(&s2));
            async move {
                g.acquire().await.unwrap().forget();
                s.lock().push(*job.payload());
                Ok(())
            }
        })
        .unwrap();
    let env = |p, t| Envelope::new(p, t, Ack::noop());
    rt.try_submit(env("busy", Criticality::High)).unwrap();
    // The worker takes it and waits at the gate: the queue's two places are free.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((rt.stats().running, rt.stats().queued), (1, 0));
    rt.try_submit(env("high-a", Criticality::High)).unwrap();
    rt.try_submit(env("high-b", Criticality::High)).unwrap();
    // Full: the Critical message evicts the newest High one, and is accepted.
    rt.try_submit(env("critical", Criticality::Critical))
        .unwrap();
    assert_eq!(rt.stats().queue.tier(Criticality::High).evicted, 1);
    // The evicted one is held (by a task of its own), not handed back: all four are inside.
    assert_eq!((rt.stats().queued, rt.stats().alive), (2, 4));
    gate.add_permits(100);
    rt.wait_idle().await;
    let mut served = served.lock().clone();
    // The evicted one last: it is queued again only once a pop made room.
    assert_eq!((served[0], served[3]), ("busy", "high-b"), "{served:?}");
    served.sort_unstable();
    assert_eq!(served, vec!["busy", "critical", "high-a", "high-b"]);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.ledger.total().released, 0);
}
