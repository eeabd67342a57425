//! The refusal policies on the in-memory broker: Drop sheds and acknowledges while Critical
//! backpressures; Defer publishes before it acknowledges and falls back to backpressure while
//! its sink fails; a deferral the sink refuses for good is dead-lettered alone; the default
//! `defer_or_drop` defers with a sink and drops without. On tokio's paused clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, eventually, gated, overload_config};
use parking_lot::Mutex;
use triage::admission::QueueAgeConfig;
use triage::ledger::Disposition;
use triage::runtime::{MemoryBroker, MemorySink, RefusalPolicy, Runtime};
use triage::Criticality;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn drop_policy_sheds_and_acks_while_critical_backpressures() {
    let broker = MemoryBroker::new();
    // Fill: 1 in the handler + 4 queued Sheddable, then 20 more Sheddable and 5 Critical.
    for i in 0..25u32 {
        broker.publish(i, Criticality::Sheddable, None);
    }
    for i in 25..30u32 {
        broker.publish(i, Criticality::Critical, None);
    }
    broker.close();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let observed = Arc::new(Mutex::new(Vec::new()));
    let o2 = Arc::clone(&observed);
    let mut rt = Runtime::builder(overload_config(RefusalPolicy::Drop))
        .observe(move |id: &u32, tier, d| o2.lock().push((*id, tier, d)))
        .start(gated(Arc::clone(&gate)))
        .unwrap();
    rt.attach(broker.source());
    assert!(eventually(|| broker.backlog() == 0).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let acks = broker.acks();
    // The excess Sheddable is refused (full) and dropped with an ack; each Critical evicts a
    // queued Sheddable (dropped too), and the fifth waits under backpressure. Of the 25
    // Sheddable at most one survives, the one the worker may have taken before the Critical
    // ones came: 24 or 25 shed.
    assert!((24..=25).contains(&acks.shed), "{acks:?}");
    assert_eq!(acks.shed + acks.pending, 30, "{acks:?}");
    assert_eq!(acks.completed, 0);
    let stats = rt.stats();
    assert_eq!(stats.alive, acks.pending, "{stats}");
    assert_eq!(
        stats.ledger.tier(Criticality::Critical).consumed,
        5,
        "{stats}"
    );
    gate.add_permits(1_000);
    rt.wait_idle().await;
    let acks = broker.acks();
    for i in 25..30 {
        assert_eq!(
            broker.disposition(i),
            Some(Disposition::Completed),
            "critical {i} lost"
        );
    }
    assert_eq!(acks.completed + acks.shed, 30, "{acks:?}");
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let shed = report.stats.ledger.tier(Criticality::Sheddable).shed;
    assert_eq!(shed, acks.shed);
    // The observer saw each message's disposition once, the same one its ack got.
    let observed = observed.lock();
    assert_eq!(observed.len(), 30);
    for (id, _, d) in observed.iter() {
        assert_eq!(broker.disposition(u64::from(*id)), Some(*d));
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn defer_policy_publishes_then_acks_and_falls_back_to_backpressure_when_the_sink_fails() {
    let broker = MemoryBroker::new();
    for i in 0..30u32 {
        broker.publish(i, Criticality::Sheddable, None);
    }
    broker.close();
    let sink = Arc::new(MemorySink::new());
    sink.set_failing(true);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut c = overload_config(RefusalPolicy::Defer);
    c.expert.max_deferring = 2.try_into().unwrap();
    c.expert.max_held = 1.try_into().unwrap();
    let mut rt = Runtime::builder(c)
        .defer_sink(Arc::clone(&sink))
        .start(gated(Arc::clone(&gate)))
        .unwrap();
    rt.attach(broker.source());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let acks = broker.acks();
    assert_eq!(acks.deferred, 0, "deferred although the sink refused");
    assert_eq!(
        acks.shed, 0,
        "a Defer tier is never dropped because its sink failed"
    );
    assert!(
        broker.backlog() > 0,
        "the source kept being pulled while the sink was down"
    );
    // Nothing served (the gate is closed) and nothing lost: whatever was pulled is inside.
    assert_eq!(acks.completed, 0);
    assert_eq!(
        rt.stats().alive,
        30 - broker.backlog() as u64,
        "{}",
        rt.stats()
    );
    sink.set_failing(false);
    gate.add_permits(1_000);
    rt.wait_idle().await;
    let acks = broker.acks();
    assert_eq!(acks.completed + acks.deferred, 30, "{acks:?}");
    assert_eq!(sink.len() as u64, acks.deferred);
    assert!(sink
        .items()
        .iter()
        .all(|(_, info)| info.criticality == Criticality::Sheddable));
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// Issue 10.3: the defer sink refusing one message for good (a record over the producer's
/// maximum) is not an outage: that message goes to the dead-letter path once, and the
/// messages refused after it are still deferred, inside what would be the cool-down.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_defer_rejection_dead_letters_that_message_and_keeps_deferring_the_others() {
    let broker = MemoryBroker::new();
    let oversized = 10u32;
    let defer = Arc::new(MemorySink::new().reject_if(move |id: &u32| *id == oversized));
    let dead = Arc::new(MemorySink::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut c = overload_config(RefusalPolicy::Defer);
    // An hour: a sink marked unhealthy would stay so for the whole test.
    c.expert.defer_cooldown_ms = 3_600_000;
    let mut rt = Runtime::builder(c)
        .defer_sink(Arc::clone(&defer))
        .dead_letter_sink(Arc::clone(&dead))
        .start(gated(Arc::clone(&gate)))
        .unwrap();
    rt.attach(broker.source());
    // One in the handler, four queued: the queue is full.
    broker.publish(0, Criticality::Sheddable, None);
    assert!(eventually(|| rt.stats().running == 1).await);
    for i in 1..5u32 {
        broker.publish(i, Criticality::Sheddable, None);
    }
    assert!(
        eventually(|| rt.stats().queued == 4).await,
        "{}",
        rt.stats()
    );
    broker.publish(oversized, Criticality::Sheddable, None);
    assert!(
        eventually(|| broker.disposition(5) == Some(Disposition::Failed)).await,
        "the rejected deferral was not dead-lettered: {:?}",
        broker.acks()
    );
    for i in 11..30u32 {
        broker.publish(i, Criticality::Sheddable, None);
    }
    assert!(
        eventually(|| broker.acks().deferred == 19).await,
        "one rejected message switched the Defer tiers to backpressure: {:?}",
        broker.acks()
    );
    let dead_letters = dead.items();
    assert_eq!(dead_letters.len(), 1, "dead-lettered once");
    let (payload, info) = &dead_letters[0];
    assert_eq!((*payload, info.reason), (oversized, "defer_rejected"));
    assert!(info.error.as_deref().unwrap().contains("publish rejected"));
    assert_eq!(defer.len(), 19);
    assert!(defer.items().iter().all(|(id, _)| *id != oversized));
    gate.add_permits(1_000);
    assert!(eventually(|| broker.acks().completed == 5).await);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.alive, 0);
    let acks = broker.acks();
    assert_eq!(
        (acks.completed, acks.deferred, acks.failed),
        (5, 19, 1),
        "{acks:?}"
    );
}

/// Without a defer sink the default sheds Medium and Sheddable under overload (Drop); with
/// one it defers them.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn defer_or_drop_defers_with_a_sink_and_drops_without() {
    for with_sink in [false, true] {
        let broker = MemoryBroker::new();
        for i in 0..20u32 {
            broker.publish(i, Criticality::Sheddable, None);
        }
        broker.close();
        let mut c = config(1, 2);
        c.expert.queue.admission = QueueAgeConfig::disabled();
        // Pull the whole backlog at once (not paced), so the full queue refuses some of it.
        c.expert.admission.prefetch_per_slot = 1000;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let sink = Arc::new(MemorySink::new());
        let mut builder = Runtime::builder(c);
        if with_sink {
            builder = builder.defer_sink(Arc::clone(&sink));
        }
        let mut rt = builder.start(gated(Arc::clone(&gate))).unwrap();
        rt.attach(broker.source());
        assert!(eventually(|| broker.backlog() == 0).await);
        gate.add_permits(1_000);
        rt.wait_idle().await;
        let report = rt.shutdown(Duration::from_secs(5)).await;
        assert!(report.stats.balances(), "{report}");
        let acks = broker.acks();
        // One in the handler at most and two queued are served; the rest is refused (full).
        let refused = if with_sink {
            assert_eq!(acks.shed, 0, "{acks:?}");
            assert_eq!(sink.len() as u64, acks.deferred);
            acks.deferred
        } else {
            assert_eq!(acks.deferred, 0, "{acks:?}");
            acks.shed
        };
        assert!((17..=18).contains(&refused), "{acks:?}");
        assert_eq!(acks.completed + refused, 20, "{acks:?}");
    }
}
