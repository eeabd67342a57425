//! The runtime end to end on the in-memory broker: dispositions, retries with demotion, panics,
//! policies, deferral fallback, shutdown. Time-dependent tests run on tokio's paused clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::admission::{PullAdmissionConfig, QueueAgeConfig};
use triage::ledger::Disposition;
use triage::queue::WfqConfig;
use triage::runtime::{
    DeadLetterSink, DeferSink, HandlerError, Job, MemoryBroker, MemorySink, RefusalPolicy,
    Republish, RetryConfig, Runtime, RuntimeConfig, SinkError,
};
use triage::{Criticality, PerTier};

fn config(workers: usize, capacity: usize) -> RuntimeConfig {
    RuntimeConfig {
        workers: workers.try_into().unwrap(),
        queue: WfqConfig::with_capacity(capacity),
        retry: RetryConfig {
            max_retries: 3,
            base_backoff_ms: 1,
            max_backoff_ms: 5,
        },
        poll_interval_ms: 1,
        ..RuntimeConfig::default()
    }
}

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

/// A dead-letter sink that is down holds the message unacknowledged until it recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    dead.set_failing(false);
    rt.wait_idle().await;
    assert_eq!(broker.disposition(0), Some(Disposition::Failed));
    assert_eq!(dead.len(), 1);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances());
}

fn overload_config(policy: RefusalPolicy) -> RuntimeConfig {
    let mut c = config(1, 4);
    c.queue.admission = QueueAgeConfig::disabled();
    // The intake fills the queue to its capacity (not paced to twice the limit), so these tests
    // reach the full-queue refusals they are about whatever the load signal says.
    c.admission = PullAdmissionConfig::disabled();
    c.admission.prefetch_per_slot = 1000;
    c.policy = PerTier::splat(policy);
    c.policy.critical = RefusalPolicy::Backpressure;
    c
}

type BoxedResult =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), HandlerError>> + Send>>;

/// Waits on a gate so the test controls when the single worker proceeds.
fn gated(
    gate: Arc<tokio::sync::Semaphore>,
) -> impl Fn(Job<u32>) -> BoxedResult + Send + Sync + 'static {
    move |_job| {
        let gate = Arc::clone(&gate);
        Box::pin(async move {
            gate.acquire().await.unwrap().forget();
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    // Wait until the source is drained into the runtime.
    while broker.backlog() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let acks = broker.acks();
    // Critical evicts Sheddable; excess Sheddable is refused (full) and dropped with an ack.
    assert!(acks.shed >= 20, "{acks:?}");
    assert_eq!(acks.completed, 0);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    c.max_deferring = 2.try_into().unwrap();
    c.max_held = 1.try_into().unwrap();
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

#[test]
fn invalid_config_names_the_field_and_range() {
    let cases = [
        (
            "[queue.weights]\ncritical = -1\nhigh = 4\nmedium = 2\nsheddable = 1",
            "weight -1 is out of range: allowed 1..=1000",
        ),
        (
            "[queue.admission.cutoff_ms]\ncritical = 400\nhigh = 500\nmedium = 80\nsheddable = 20",
            "queue.admission.cutoff_ms.high = 500 is out of range: allowed 1..=400",
        ),
        // A zero count: the line names the key, the message the range.
        (
            "[queue]\ncapacity = 0",
            "capacity = 0\n  |            ^\n0 is out of range: allowed 1..=4294967296",
        ),
        ("workers = 0", "0 is out of range: allowed 1..=100000"),
        ("workers = 0", "workers = 0"),
        (
            "max_held = 200000",
            "200000 is out of range: allowed 1..=100000",
        ),
        (
            "max_deferring = -3",
            "-3 is out of range: allowed 1..=100000",
        ),
        (
            "max_dead_lettering = 0",
            "0 is out of range: allowed 1..=100000",
        ),
        (
            "[retry]\nmax_retries = 1000",
            "retry.max_retries = 1000 is out of range: allowed 0..=100",
        ),
        (
            "[limit]\nkind = \"aimd\"\nbackoff_ratio = 1.5",
            "limit.backoff_ratio",
        ),
        (
            "[queue.admission]\nexit_ratio = 1.0",
            "queue.admission.exit_ratio = 1 is out of range",
        ),
        ("bogus = 1", "unknown field `bogus`"),
    ];
    for (text, expected) in cases {
        let err = RuntimeConfig::from_toml(text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text:?}: {err}");
    }
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

/// Regression: a submission that evicts a queued Backpressure-tier message is accepted, and
/// the evicted message is held and served later, never handed to the submitter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_submit_that_evicts_keeps_both_messages() {
    use triage::runtime::{Ack, Envelope};
    let mut c = config(1, 2);
    c.queue.admission = QueueAgeConfig::disabled();
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
    tokio::time::sleep(Duration::from_millis(50)).await;
    rt.try_submit(env("high-a", Criticality::High)).unwrap();
    rt.try_submit(env("high-b", Criticality::High)).unwrap();
    // Full: the Critical message evicts the newest High one, and is accepted.
    rt.try_submit(env("critical", Criticality::Critical))
        .unwrap();
    gate.add_permits(100);
    rt.wait_idle().await;
    let mut served = served.lock().clone();
    served.sort_unstable();
    assert_eq!(served, vec!["busy", "critical", "high-a", "high-b"]);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.ledger.total().released, 0);
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

/// Waits on tokio's clock (paused in these tests: virtual time, not wall-clock) until `done`,
/// for at most a virtual minute; `false` if it never happened.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .is_ok()
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
    c.defer_cooldown_ms = 3_600_000;
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

/// A defer and dead-letter sink whose broker never answers: each publish waits for ever.
#[derive(Default)]
struct Hanging {
    started: AtomicU32,
}

impl Hanging {
    fn hang<'a>(&'a self) -> futures_util::future::BoxFuture<'a, Result<(), SinkError>> {
        self.started.fetch_add(1, Ordering::Relaxed);
        Box::pin(std::future::pending())
    }

    fn started(&self) -> u32 {
        self.started.load(Ordering::Relaxed)
    }
}

impl DeferSink<u32> for Hanging {
    fn publish<'a>(
        &'a self,
        _: &'a u32,
        _: &'a Republish,
    ) -> futures_util::future::BoxFuture<'a, Result<(), SinkError>> {
        self.hang()
    }
}

impl DeadLetterSink<u32> for Hanging {
    fn publish<'a>(
        &'a self,
        _: &'a u32,
        _: &'a Republish,
    ) -> futures_util::future::BoxFuture<'a, Result<(), SinkError>> {
        self.hang()
    }
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
    c.queue.admission = QueueAgeConfig::disabled();
    // Pull to the queue's capacity, so the last two are refused as Full (not left unpulled).
    c.admission.prefetch_per_slot = 1000;
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

fn ok_handler(_job: Job<u32>) -> BoxedResult {
    Box::pin(async { Ok(()) })
}

/// A `defer` written out without a defer sink would shed what it promises to keep: refused
/// at start-up, naming the tier. The default (`defer_or_drop`) still starts without one.
#[tokio::test(flavor = "current_thread")]
async fn a_defer_policy_without_a_defer_sink_is_refused_at_start() {
    let policies = |medium: &str| {
        format!(
            "[policy]\ncritical = \"backpressure\"\nhigh = \"backpressure\"\n\
             medium = \"{medium}\"\nsheddable = \"defer_or_drop\""
        )
    };
    let c = RuntimeConfig::from_toml(&policies("defer")).unwrap();
    let err = Runtime::builder(c.clone())
        .start(ok_handler)
        .unwrap_err()
        .to_string();
    assert!(err.contains("policy.medium = defer"), "{err}");
    assert!(err.contains("no defer sink"), "{err}");
    let rt = Runtime::builder(c)
        .defer_sink(Arc::new(MemorySink::new()))
        .start(ok_handler)
        .unwrap();
    rt.shutdown(Duration::from_secs(1)).await;

    let c = RuntimeConfig::default();
    assert_eq!(c.policy.sheddable, RefusalPolicy::DeferOrDrop);
    let rt = Runtime::builder(c).start(ok_handler).unwrap();
    rt.shutdown(Duration::from_secs(1)).await;
    let c = RuntimeConfig::from_toml(&policies("drop")).unwrap();
    assert_eq!(c.policy.sheddable, RefusalPolicy::DeferOrDrop);
    let rt = Runtime::builder(c).start(ok_handler).unwrap();
    rt.shutdown(Duration::from_secs(1)).await;
}

/// Without a defer sink the default sheds Medium and Sheddable under overload (Drop); with
/// one it defers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defer_or_drop_defers_with_a_sink_and_drops_without() {
    for with_sink in [false, true] {
        let broker = MemoryBroker::new();
        for i in 0..20u32 {
            broker.publish(i, Criticality::Sheddable, None);
        }
        broker.close();
        let mut c = config(1, 2);
        c.queue.admission = QueueAgeConfig::disabled();
        // Pull the whole backlog at once (not paced), so the full queue refuses some of it.
        c.admission.prefetch_per_slot = 1000;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let sink = Arc::new(MemorySink::new());
        let mut builder = Runtime::builder(c);
        if with_sink {
            builder = builder.defer_sink(Arc::clone(&sink));
        }
        let mut rt = builder.start(gated(Arc::clone(&gate))).unwrap();
        rt.attach(broker.source());
        while broker.backlog() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        gate.add_permits(1_000);
        rt.wait_idle().await;
        let report = rt.shutdown(Duration::from_secs(5)).await;
        assert!(report.stats.balances(), "{report}");
        let acks = broker.acks();
        if with_sink {
            assert!(acks.deferred > 0 && acks.shed == 0, "{acks:?}");
            assert_eq!(sink.len() as u64, acks.deferred);
        } else {
            assert!(acks.shed > 0 && acks.deferred == 0, "{acks:?}");
        }
        assert_eq!(acks.completed + acks.deferred + acks.shed, 20, "{acks:?}");
    }
}

/// The same sink for deferrals and dead letters would drain dead letters back as deferred
/// work: refused at start-up.
#[tokio::test(flavor = "current_thread")]
async fn one_sink_for_deferrals_and_dead_letters_is_refused_at_start() {
    let sink = Arc::new(MemorySink::new());
    let err = Runtime::builder(config(1, 8))
        .defer_sink(Arc::clone(&sink))
        .dead_letter_sink(Arc::clone(&sink))
        .start(ok_handler)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dead_letter_sink"), "{err}");
}

/// A source that acknowledges failed messages because the dead-letter sink keeps them.
struct NeedsDeadLetters(triage::runtime::MemorySource<u32>);

impl triage::runtime::Source for NeedsDeadLetters {
    type Payload = u32;

    async fn next(&mut self) -> Option<triage::runtime::Envelope<u32>> {
        self.0.next().await
    }

    fn needs_dead_letter_sink(&self) -> Option<&'static str> {
        Some("dead_letter_via_sink")
    }
}

/// A source that relies on a dead-letter sink is refused by a runtime without one, with an
/// error naming the source's setting; accepted by one with a sink.
#[tokio::test(flavor = "current_thread")]
async fn a_source_that_relies_on_a_dead_letter_sink_is_refused_without_one() {
    let broker = MemoryBroker::new();
    let mut rt = Runtime::builder(config(1, 8)).start(ok_handler).unwrap();
    let err = rt
        .try_attach(NeedsDeadLetters(broker.source()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("dead_letter_via_sink = true"), "{err}");
    assert!(err.contains("dead-letter sink"), "{err}");
    rt.shutdown(Duration::from_secs(1)).await;
    let mut rt = Runtime::builder(config(1, 8))
        .dead_letter_sink(Arc::new(MemorySink::new()))
        .start(ok_handler)
        .unwrap();
    rt.try_attach(NeedsDeadLetters(broker.source())).unwrap();
    rt.shutdown(Duration::from_secs(1)).await;
}

/// The dead-letter path is bounded: with `max_dead_lettering` messages already in it (their
/// sink hanging), a worker whose message fails for good waits for room (backpressure) rather
/// than piling up tasks; shutdown releases them all.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_dead_letter_path_is_bounded_by_max_dead_lettering() {
    let broker = MemoryBroker::new();
    let dead = Arc::new(Hanging::default());
    let mut c = config(1, 8);
    c.max_dead_lettering = 1.try_into().unwrap();
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

/// Issue 13: a slot held outside the runtime through `Runtime::concurrency_limit` (an HTTP
/// request, say) is one the workers cannot use, and its release wakes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_outside_is_shared_capacity() {
    use triage::runtime::{Ack, Envelope};
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
    // However long the worker gets, the one slot is taken: nothing can complete.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(rt.stats().ledger.total().completed, 0);
    }
    assert_eq!(rt.stats().running, 1);
    drop(outside);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert_eq!(report.stats.ledger.total().completed, 1, "{report}");
    assert!(report.stats.balances(), "{report}");
}

/// A held message with less time left than a handler run takes is expired without a handler
/// call when its turn comes, not served to finish past its deadline; one with time left is
/// served. (The oldest held message is offered first, so under sustained overload it would
/// otherwise reach a worker right at its deadline.) Real time: the runtime paces its pulls on
/// its clock, which a mock clock standing still would stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_that_cannot_finish_in_time_is_expired_not_served() {
    let clock = triage::quanta::Clock::new();
    let mut config = config(1, 1);
    config.queue.admission = QueueAgeConfig::disabled();
    config.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (g, c) = (Arc::clone(&gate), Arc::clone(&calls));
    let mut rt = Runtime::builder(config)
        .clock(clock.clone())
        .start(move |job: Job<u32>| {
            let (g, c) = (Arc::clone(&g), Arc::clone(&c));
            async move {
                let id = *job.payload();
                c.lock().push(id);
                match id {
                    // The first call takes 2 s: a mean handler run of about 1 s after two.
                    0 => tokio::time::sleep(Duration::from_secs(2)).await,
                    // The second holds the only worker until the test lets it go.
                    1 => drop(g.acquire().await),
                    _ => {}
                }
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    let broker = MemoryBroker::new();
    rt.attach(broker.source());
    broker.publish(0, Criticality::Critical, None);
    // One at a time, so that no worker's batch takes 2 along with 1.
    broker.publish(1, Criticality::Critical, None);
    while calls.lock().len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    broker.publish(2, Criticality::Critical, None);
    while rt.stats().queued < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // 1 runs, 2 waits in the queue (capacity 1), 3 is held (and the intake pulls no more while
    // it holds a Critical message: 4 waits in the broker). 3 has 600 ms left, less than a mean
    // handler run: it cannot finish in time. 4 has a minute.
    let now = clock.now();
    broker.publish(
        3,
        Criticality::Critical,
        Some(now + Duration::from_millis(600)),
    );
    broker.publish(
        4,
        Criticality::Critical,
        Some(now + Duration::from_secs(60)),
    );
    broker.close();
    while rt.stats().held < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    gate.add_permits(1);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert_eq!(*calls.lock(), vec![0, 1, 2, 4], "{report}");
    let critical = report.stats.ledger.tier(Criticality::Critical);
    assert_eq!((critical.completed, critical.expired), (4, 1), "{report}");
    assert_eq!(broker.acks().expired, 1);
    assert!(report.stats.balances(), "{report}");
}

/// Opens the gate, waits until everything settled, shuts down: the report, its ledger checked.
async fn release(rt: Runtime<u32>, gate: &tokio::sync::Semaphore) -> triage::runtime::Report {
    gate.add_permits(1_000);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    report
}

/// The held buffer fills (8), the source pauses with the Critical messages still in the
/// broker and nothing deferred; once the gate opens all 30 High are served.
async fn assert_paused_then_served(
    rt: Runtime<u32>,
    broker: &MemoryBroker<u32>,
    sink: &MemorySink<u32>,
    gate: &tokio::sync::Semaphore,
) -> triage::runtime::Report {
    assert!(
        eventually(|| rt.stats().held >= 8).await,
        "{:?}",
        rt.stats()
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Paused behind the held High: the Critical messages wait in the broker.
    assert!(broker.backlog() >= 5, "backlog {}", broker.backlog());
    assert_eq!(sink.len(), 0, "deferred although pausing was expected");
    let report = release(rt, gate).await;
    assert_eq!(report.stats.ledger.tier(Criticality::High).completed, 30);
    report
}

/// One mixed source: Critical, 30 High, 5 Critical more (with `deadline` from now), behind a
/// single worker held by a gate and a queue of 2. High is held under backpressure up to
/// `max_held` (8). With `first_free`, message 0 is served at once (a measured handler run of
/// about 5 ms) and the gate holds the next one.
async fn held_high_before_critical(
    make_room: bool,
    deadline: Option<Duration>,
    first_free: bool,
) -> (
    Runtime<u32>,
    MemoryBroker<u32>,
    Arc<MemorySink<u32>>,
    Arc<tokio::sync::Semaphore>,
) {
    let mut c = overload_config(RefusalPolicy::Backpressure);
    c.max_held = 8.try_into().unwrap();
    c.queue = WfqConfig::with_capacity(2);
    c.queue.admission = QueueAgeConfig::disabled();
    c.defer_held_to_make_room = make_room;
    let clock = triage::quanta::Clock::new();
    let deadline = deadline.map(|d| clock.now() + d);
    let broker = MemoryBroker::new();
    broker.publish(0, Criticality::Critical, deadline);
    let sink = Arc::new(MemorySink::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = Arc::clone(&gate);
    let mut rt = Runtime::builder(c)
        .clock(clock)
        .defer_sink(Arc::clone(&sink))
        .start(move |job: Job<u32>| {
            let g = Arc::clone(&g);
            let free = first_free && *job.payload() == 0;
            async move {
                if free {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                } else {
                    g.acquire().await.unwrap().forget();
                }
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    if first_free {
        assert!(eventually(|| broker.acks().completed == 1).await);
    }
    for i in 1..=30u32 {
        broker.publish(i, Criticality::High, None);
    }
    for i in 31..=35u32 {
        broker.publish(i, Criticality::Critical, deadline);
    }
    broker.close();
    (rt, broker, sink, gate)
}

/// A full held buffer makes room: the newest held High are deferred (reason `make_room`) so
/// the intake reads on to the Critical messages behind them in the same source, while the
/// single worker is still busy (no handler run measured yet: any deadline is at risk). With
/// the option off the source pauses and they wait in the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_held_buffer_defers_its_newest_lower_tier_to_reach_critical_behind_it() {
    let (rt, broker, sink, gate) =
        held_high_before_critical(true, Some(Duration::from_secs(60)), false).await;
    assert!(
        eventually(|| broker.backlog() == 0).await,
        "the Critical messages behind the held High were never pulled: {:?}",
        broker.acks()
    );
    // Pulled while the only worker is still on message 0: the gate has not opened.
    assert_eq!(broker.acks().completed, 0);
    let report = release(rt, &gate).await;
    for i in [0, 31, 32, 33, 34, 35] {
        assert_eq!(
            broker.disposition(i),
            Some(Disposition::Completed),
            "critical {i}"
        );
    }
    let deferred: Vec<u32> = sink.items().iter().map(|(id, _)| *id).collect();
    assert!(!deferred.is_empty(), "{report}");
    for (id, info) in sink.items() {
        assert_eq!(info.criticality, Criticality::High, "message {id}");
        assert_eq!(info.reason, "make_room", "message {id}");
        assert_eq!(info.deferrals, 1, "message {id}");
    }
    // Newest first: of the High held in arrival order (3..=30; 1 and 2 took the queue and
    // were evicted by Critical later), those served are an oldest prefix and those deferred
    // the rest.
    let served: Vec<u32> = (3..=30)
        .filter(|&i| broker.disposition(u64::from(i)) == Some(Disposition::Completed))
        .collect();
    assert!(!served.is_empty(), "deferred {deferred:?}");
    assert_eq!(
        served,
        (3..3 + served.len() as u32).collect::<Vec<_>>(),
        "deferred {deferred:?}"
    );
    for i in served.len() as u32 + 3..=30 {
        assert!(
            deferred.contains(&i),
            "high {i} neither served nor deferred"
        );
    }
    let high = report.stats.ledger.tier(Criticality::High);
    assert_eq!(high.completed + high.deferred, 30, "{report}");
    assert_eq!(high.deferred, deferred.len() as u64, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_make_room_a_full_held_buffer_pauses_its_source() {
    let (rt, broker, sink, gate) =
        held_high_before_critical(false, Some(Duration::from_secs(60)), false).await;
    assert_paused_then_served(rt, &broker, &sink, &gate).await;
}

/// Critical with an hour of slack is not at risk behind a held buffer that the workers clear
/// in well under a second (a handler run measured at about 5 ms): the source pauses, and the
/// held High are served later rather than deferred.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_held_buffer_pauses_when_the_work_behind_it_has_time_to_spare() {
    let (rt, broker, sink, gate) =
        held_high_before_critical(true, Some(Duration::from_secs(3600)), true).await;
    let report = assert_paused_then_served(rt, &broker, &sink, &gate).await;
    assert_eq!(report.stats.ledger.tier(Criticality::Critical).completed, 6);
}

/// Critical with no deadline (a topic whose producers stamp none) is at risk behind a full
/// held buffer: nothing bounds its wait in the broker, so room is made, even with a handler
/// run measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_held_buffer_makes_room_for_critical_without_a_deadline() {
    let (rt, broker, sink, gate) = held_high_before_critical(true, None, true).await;
    assert!(
        eventually(|| broker.backlog() == 0).await,
        "the Critical messages behind the held High were never pulled"
    );
    assert!(!sink.is_empty());
    let report = release(rt, &gate).await;
    assert_eq!(report.stats.ledger.tier(Criticality::Critical).completed, 6);
    let high = report.stats.ledger.tier(Criticality::High);
    assert_eq!(high.completed + high.deferred, 30, "{report}");
}
