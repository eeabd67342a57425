//! Ordered processing in the runtime, on the in-memory broker: per-key order with random
//! service times and retries, the unordered control, and what a refused keyed message of a
//! Defer tier does (held, not deferred). On tokio's paused clock with the runtime's clock
//! following it, so the counts and orders do not depend on the machine's load.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::queue::WfqConfig;
use triage::runtime::{
    HandlerError, Job, MemoryBroker, MemorySink, RefusalPolicy, RetryConfig, Runtime, RuntimeConfig,
};
use triage::Criticality;

fn config(workers: usize, capacity: usize) -> RuntimeConfig {
    RuntimeConfig {
        workers: workers.try_into().unwrap(),
        retry: RetryConfig { max_retries: 3 },
        expert: triage::runtime::ExpertConfig {
            retry: triage::runtime::BackoffConfig {
                base_backoff_ms: 1,
                max_backoff_ms: 3,
            },
            queue: WfqConfig {
                capacity: capacity.try_into().unwrap(),
                ..WfqConfig::default()
            },
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    }
}

/// (key, sequence within the key)
type Msg = (u64, u32);

struct Run {
    /// Per key, the sequence numbers in completion order.
    completions: HashMap<u64, Vec<u32>>,
    /// A handler started while another message of its key was running.
    overlapped: bool,
    completed: u64,
}

/// `keys × per_key` messages, interleaved across keys, 8 workers, service 0-1 ms, about one in
/// eight first attempts failing (retried). `keyed`: published with ordering keys. Service
/// times, failures and the retries' jitter come from the thread's fastrand, seeded here, so a
/// run is the same every time.
async fn run(keys: u64, per_key: u32, keyed: bool) -> Run {
    fastrand::seed(7);
    let broker = MemoryBroker::new();
    for seq in 0..per_key {
        for key in 0..keys {
            let tier = Criticality::ALL[((key + u64::from(seq)) % 4) as usize];
            if keyed {
                broker.publish_keyed((key, seq), tier, None, key);
            } else {
                broker.publish((key, seq), tier, None);
            }
        }
    }
    broker.close();
    let completions: Arc<Mutex<HashMap<u64, Vec<u32>>>> = Arc::default();
    let running: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let overlapped = Arc::new(AtomicBool::new(false));
    let mut c = config(8, 64);
    c.policy = triage::PerTier::splat(RefusalPolicy::Backpressure);
    let (done, busy, over) = (
        Arc::clone(&completions),
        Arc::clone(&running),
        Arc::clone(&overlapped),
    );
    let mut rt = Runtime::builder(c)
        .clock(common::following_tokio())
        .start(move |job: Job<Msg>| {
            let (done, busy, over) = (Arc::clone(&done), Arc::clone(&busy), Arc::clone(&over));
            async move {
                let (key, seq) = *job.payload();
                if !busy.lock().insert(key) {
                    over.store(true, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_micros(fastrand::u64(0..1_000))).await;
                let fail = job.attempt() == 0 && fastrand::u8(0..8) == 0;
                busy.lock().remove(&key);
                if fail {
                    return Err(HandlerError::retryable("flaky"));
                }
                done.lock().entry(key).or_default().push(seq);
                Ok(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.parked, 0);
    let acks = broker.acks();
    assert_eq!(acks.duplicates, 0);
    assert_eq!(acks.pending, 0);
    let completions = std::mem::take(&mut *completions.lock());
    Run {
        completed: acks.completed,
        completions,
        overlapped: overlapped.load(Ordering::Relaxed),
    }
}

fn out_of_order(run: &Run) -> Vec<u64> {
    let mut keys: Vec<u64> = run
        .completions
        .iter()
        .filter(|(_, seqs)| !seqs.windows(2).all(|w| w[0] < w[1]))
        .map(|(k, _)| *k)
        .collect();
    keys.sort_unstable();
    keys
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn key_mode_completes_every_key_in_order_with_retries() {
    let run = run(20, 40, true).await;
    assert_eq!(run.completed, 800);
    assert!(!run.overlapped, "two messages of one key ran together");
    assert_eq!(out_of_order(&run), Vec::<u64>::new());
    for seqs in run.completions.values() {
        assert_eq!(*seqs, (0..40).collect::<Vec<_>>());
    }
}

/// The control: the same run without keys completes every key out of order (retries alone
/// put a failed message behind its successors), so the test above can tell.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn unordered_the_same_run_completes_keys_out_of_order() {
    let run = run(20, 40, false).await;
    assert_eq!(run.completed, 800);
    assert_eq!(out_of_order(&run), (0..20).collect::<Vec<u64>>());
}

/// A Sheddable message of a Defer tier, evicted by a Critical one: deferred when unkeyed;
/// held (and served before the next message of its key) when keyed.
async fn evicted_sheddable(keyed: bool) -> (usize, Vec<u32>) {
    let broker = MemoryBroker::new();
    let sink = Arc::new(MemorySink::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut c = config(1, 1);
    c.policy.sheddable = RefusalPolicy::Defer;
    let order: Arc<Mutex<Vec<u32>>> = Arc::default();
    let (g, o) = (Arc::clone(&gate), Arc::clone(&order));
    let mut rt = Runtime::builder(c)
        .clock(common::following_tokio())
        .defer_sink(Arc::clone(&sink))
        .start(move |job: Job<u32>| {
            let (g, o) = (Arc::clone(&g), Arc::clone(&o));
            async move {
                let id = *job.payload();
                if id == 0 {
                    // Holds the only worker until the test has seen the eviction.
                    g.acquire().await.unwrap().forget();
                }
                o.lock().push(id);
                Ok(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    broker.publish(0, Criticality::Critical, None);
    let started = tokio::time::Instant::now();
    while rt.stats().running == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "hang guard");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if keyed {
        broker.publish_keyed(1, Criticality::Sheddable, None, 7);
        broker.publish_keyed(2, Criticality::Sheddable, None, 7);
    } else {
        broker.publish(1, Criticality::Sheddable, None);
        broker.publish(2, Criticality::Sheddable, None);
    }
    broker.publish(3, Criticality::Critical, None);
    broker.close();
    loop {
        let s = rt.stats();
        let settled = if keyed {
            s.held == 1 && s.parked == 1 && s.queued == 1
        } else {
            sink.len() == 2 && s.queued == 1
        };
        if settled {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "hang guard: {s}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    gate.add_permits(1);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let order = order.lock().clone();
    (sink.len(), order)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_message_of_a_defer_tier_is_held_not_deferred() {
    let (deferred, order) = evicted_sheddable(true).await;
    assert_eq!(deferred, 0);
    assert_eq!(order, vec![0, 3, 1, 2]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_a_key_the_same_message_is_deferred() {
    let (deferred, order) = evicted_sheddable(false).await;
    assert_eq!(deferred, 2);
    // Both Sheddable messages went to the defer sink: only the Critical ones were served.
    assert_eq!(order, vec![0, 3]);
}

/// Under the `drop` policy a keyed message evicted by a Critical one is shed, and the next
/// message of its key goes on at once (a dropped message will never be processed).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_shed_keyed_message_lets_the_next_of_its_key_through() {
    let broker = MemoryBroker::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut c = config(1, 1);
    c.policy.sheddable = RefusalPolicy::Drop;
    let order: Arc<Mutex<Vec<u32>>> = Arc::default();
    let (g, o) = (Arc::clone(&gate), Arc::clone(&order));
    let mut rt = Runtime::builder(c)
        .clock(common::following_tokio())
        .start(move |job: Job<u32>| {
            let (g, o) = (Arc::clone(&g), Arc::clone(&o));
            async move {
                let id = *job.payload();
                if id == 0 {
                    g.acquire().await.unwrap().forget();
                }
                o.lock().push(id);
                Ok(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    broker.publish(0, Criticality::Critical, None);
    let started = tokio::time::Instant::now();
    while rt.stats().running == 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "hang guard");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    broker.publish_keyed(1, Criticality::Sheddable, None, 7);
    broker.publish_keyed(2, Criticality::Sheddable, None, 7);
    broker.publish(3, Criticality::Critical, None);
    broker.close();
    // 1 is evicted by 3 and shed, which lets 2 through: refused too (the queue holds 3, of a
    // higher tier), so shed as well.
    while broker.acks().shed < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "hang guard: {}",
            rt.stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(rt.stats().parked, 0);
    gate.add_permits(1);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(*order.lock(), vec![0, 3]);
    assert_eq!(broker.acks().completed, 2);
}

/// Messages parked behind a busy key are bounded by `max_parked`: at it, the intake stops
/// pulling and the rest waits in the broker; once the key moves, everything is served in order.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn parked_messages_are_bounded_and_the_source_waits() {
    let broker = MemoryBroker::new();
    for i in 0..100u32 {
        broker.publish_keyed(i, Criticality::High, None, 1);
    }
    broker.close();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut c = config(4, 64);
    c.expert.max_parked = 10.try_into().unwrap();
    let order: Arc<Mutex<Vec<u32>>> = Arc::default();
    let (g, o) = (Arc::clone(&gate), Arc::clone(&order));
    let mut rt = Runtime::builder(c)
        .clock(common::following_tokio())
        .start(move |job: Job<u32>| {
            let (g, o) = (Arc::clone(&g), Arc::clone(&o));
            async move {
                if *job.payload() == 0 {
                    g.acquire().await.unwrap().forget();
                }
                o.lock().push(*job.payload());
                Ok(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    let started = tokio::time::Instant::now();
    while rt.stats().parked < 10 {
        assert!(started.elapsed() < Duration::from_secs(30), "hang guard");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Give the intake time to (wrongly) pull more; it must not.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let s = rt.stats();
    assert_eq!((s.parked, s.running), (10, 1), "{s}");
    assert_eq!(broker.backlog(), 89);
    gate.add_permits(1);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(*order.lock(), (0..100).collect::<Vec<_>>());
}

/// A backlog is not an overload, in key mode too: a keyed backlog of Medium messages (few
/// keys, so most of what is pulled waits behind a busy key) on the default refusal policies
/// is served whole. Pulling far ahead into the key gate used to read as arrival beyond
/// capacity, raise the shed level and drop Medium (11,283 of 20,000 once on Kafka).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_backlog_on_default_policies_is_not_shed() {
    let broker = MemoryBroker::new();
    let (keys, per_key) = (16u64, 400u32);
    for seq in 0..per_key {
        for key in 0..keys {
            broker.publish_keyed((key, seq), Criticality::Medium, None, key);
        }
    }
    broker.close();
    let c = RuntimeConfig {
        workers: 8.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::builder(c)
        .clock(common::following_tokio())
        .start(move |_job: Job<Msg>| async move {
            tokio::time::sleep(Duration::from_micros(200)).await;
            Ok(())
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let acks = broker.acks();
    assert_eq!(acks.completed, keys * u64::from(per_key), "{report}");
    assert_eq!(acks.shed + acks.deferred + acks.expired, 0, "{report}");
}

/// A keyed message pulled past its deadline is expired at intake, before the key gate: it
/// never held its key, so its expiry must not release the key of the earlier message still
/// running (a user found 8 handlers at once on one key with 10/20/30/40 tiers and short
/// deadlines, and completions out of order).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_message_expired_at_intake_does_not_release_its_key() {
    let clock = common::following_tokio();
    // The clock starts at zero: let time pass so that a deadline can lie in the past.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let broker = MemoryBroker::new();
    let past = clock.now() - Duration::from_secs(1);
    let live = clock.now() + Duration::from_secs(3600);
    let mut seq = 0u32;
    for _ in 0..10 {
        for deadline in [live, past, past, live] {
            broker.publish_keyed((0, seq), Criticality::High, Some(deadline), 0);
            seq += 1;
        }
    }
    broker.close();
    let order: Arc<Mutex<Vec<u32>>> = Arc::default();
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let overlapped = Arc::new(AtomicBool::new(false));
    let (done, run, over) = (
        Arc::clone(&order),
        Arc::clone(&running),
        Arc::clone(&overlapped),
    );
    let mut rt = Runtime::builder(config(8, 64))
        .clock(clock)
        .start(move |job: Job<Msg>| {
            let (done, run, over) = (Arc::clone(&done), Arc::clone(&run), Arc::clone(&over));
            async move {
                if run.fetch_add(1, Ordering::SeqCst) > 0 {
                    over.store(true, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                run.fetch_sub(1, Ordering::SeqCst);
                done.lock().push(job.payload().1);
                Ok(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let acks = broker.acks();
    assert_eq!((acks.completed, acks.expired), (20, 20), "{report}");
    assert!(
        !overlapped.load(Ordering::Relaxed),
        "two handlers ran at once on one key"
    );
    let served = order.lock().clone();
    let expected: Vec<u32> = (0..40).filter(|s| s % 4 == 0 || s % 4 == 3).collect();
    assert_eq!(served, expected);
}

/// A long run of one key's messages, each shed as the key reaches it: settling one releases
/// the next, which is shed and releases the one after. The runtime drives that as a loop, so
/// the stack does not grow with the run (20,000 nested settles would overflow a worker's).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_long_run_of_one_keys_messages_shed_in_turn_does_not_grow_the_stack() {
    const RUN: u32 = 20_000;
    let broker = MemoryBroker::new();
    broker.publish_keyed((7, 0), Criticality::Critical, None, 7);
    for seq in 1..=RUN {
        broker.publish_keyed((7, seq), Criticality::Sheddable, None, 7);
    }
    broker.close();
    let mut c = config(1, 64);
    c.expert.max_parked = (RUN as usize * 2).try_into().unwrap();
    // Sheddable is refused whatever the signals, and dropped.
    c.forced_shed_level = 1;
    c.policy[Criticality::Sheddable] = RefusalPolicy::Drop;
    let first = Arc::new(tokio::sync::Semaphore::new(0));
    let go = Arc::clone(&first);
    let mut rt = Runtime::builder(c)
        .clock(common::following_tokio())
        .start(move |job: Job<Msg>| {
            let go = Arc::clone(&go);
            async move {
                if job.payload().1 == 0 {
                    // Held until the rest of the key is parked behind it.
                    let _ = go.acquire().await;
                }
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    assert!(
        common::eventually(|| rt.stats().parked == u64::from(RUN)).await,
        "hang guard: {}",
        rt.stats()
    );
    first.add_permits(1);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let acks = broker.acks();
    assert_eq!(acks.completed, 1);
    assert_eq!(acks.shed, u64::from(RUN));
    assert_eq!(acks.pending, 0);
}
