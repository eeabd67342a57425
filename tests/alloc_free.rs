//! The refuse path allocates nothing: counted by a global allocator that tallies the
//! allocations of the current thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use triage::admission::QueueAgeConfig;
use triage::quanta::Clock;
use triage::queue::{Meta, PushError, TierMask, WfqConfig, WfqQueue};
use triage::runtime::{Ack, Envelope, Job, RefusalPolicy, Runtime, RuntimeConfig, SubmitError};
use triage::{Criticality, PerTier};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn queue_refuse_paths_allocate_nothing() {
    // Full with nothing lower to evict.
    let q = WfqQueue::new(WfqConfig {
        capacity: 4.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    })
    .unwrap();
    for i in 0..4u64 {
        assert!(q
            .push(i, Meta::new(Criticality::Sheddable))
            .unwrap()
            .is_empty());
    }
    let n = allocations_in(|| {
        for i in 0..10_000u64 {
            let err = q.push(i, Meta::new(Criticality::Sheddable)).unwrap_err();
            assert!(matches!(err, PushError::Full(_)));
        }
    });
    assert_eq!(n, 0, "refuse (full) path allocated {n} times");

    // Refused by queue-age admission: one atomic load.
    let (clock, mock) = Clock::mock();
    let q = WfqQueue::with_clock(
        WfqConfig {
            capacity: 64.try_into().unwrap(),
            ..WfqConfig::default()
        },
        clock,
    )
    .unwrap();
    assert!(q
        .push(0u64, Meta::new(Criticality::Critical))
        .unwrap()
        .is_empty());
    mock.increment(Duration::from_millis(500));
    assert!(q
        .push(1u64, Meta::new(Criticality::Critical))
        .unwrap()
        .is_empty());
    assert_eq!(q.shed_level(), 4);
    let n = allocations_in(|| {
        for i in 0..10_000u64 {
            let tier = Criticality::ALL[(i % 4) as usize];
            assert!(matches!(
                q.push(i, Meta::new(tier)),
                Err(PushError::Overloaded(_))
            ));
        }
    });
    assert_eq!(n, 0, "refuse (overloaded) path allocated {n} times");
}

#[test]
fn queue_evict_path_allocates_nothing_once_warm() {
    let q = WfqQueue::new(WfqConfig {
        capacity: 2.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    })
    .unwrap();
    let cycle = |i: u64| {
        // [S, S] -> push C evicts the newest S -> pop C -> push S -> [S, S]
        let mut ev = q.push(i, Meta::new(Criticality::Critical)).unwrap();
        let victim = ev.next().unwrap().into_inner();
        assert!(ev.next().is_none());
        let only_critical = TierMask::NONE.with(Criticality::Critical);
        let served = q
            .try_pop_masked(only_critical)
            .unwrap()
            .ready()
            .unwrap()
            .into_inner();
        assert_eq!(served, i);
        assert!(q
            .push(victim, Meta::new(Criticality::Sheddable))
            .unwrap()
            .is_empty());
    };
    assert!(q
        .push(0, Meta::new(Criticality::Sheddable))
        .unwrap()
        .is_empty());
    assert!(q
        .push(1, Meta::new(Criticality::Sheddable))
        .unwrap()
        .is_empty());
    for i in 10..20 {
        cycle(i);
    }
    let n = allocations_in(|| {
        for i in 100..10_100 {
            cycle(i);
        }
    });
    assert_eq!(n, 0, "evict path allocated {n} times");
}

/// The runtime's whole admit-or-refuse decision, metrics included: a Prometheus recorder is
/// installed for the runtime's metric handles when the `prometheus` feature is on.
#[tokio::test(flavor = "current_thread")]
async fn runtime_refuse_decision_allocates_nothing() {
    let (clock, mock) = Clock::mock();
    let mut config = RuntimeConfig {
        workers: 1.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    config.expert.queue.capacity = 4.try_into().unwrap();
    config.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Drop,
        RefusalPolicy::Drop,
    );
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g2 = Arc::clone(&gate);
    let build = move || {
        Runtime::builder(config)
            .clock(clock)
            .start(move |_job: Job<u64>| {
                let g = Arc::clone(&g2);
                async move {
                    let _ = g.acquire().await;
                    Ok(())
                }
            })
            .unwrap()
    };
    #[cfg(feature = "prometheus")]
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    #[cfg(feature = "prometheus")]
    let rt = metrics::with_local_recorder(&recorder, build);
    #[cfg(not(feature = "prometheus"))]
    let rt = build();

    let env = |i: u64, tier| Envelope::new(i, tier, Ack::noop());
    // One running, four queued (Sheddable), then the queue is full.
    for i in 0..5 {
        rt.try_submit(env(i, Criticality::Sheddable)).unwrap();
        tokio::task::yield_now().await;
    }
    // Warm up: first refusals register nothing new, but the sampled cost histogram starts here.
    for i in 0..2_000 {
        rt.try_submit(env(i, Criticality::Sheddable)).unwrap();
    }
    // Drop policy on a full queue: counted, shed, acknowledged.
    let batch: Vec<_> = (0..10_000)
        .map(|i| env(i, Criticality::Sheddable))
        .collect();
    let n = allocations_in(|| {
        for e in batch {
            rt.try_submit(e).unwrap();
        }
    });
    assert_eq!(n, 0, "drop decision allocated {n} times");

    // Backpressure under queue-age admission: the message comes back, nothing allocated.
    // A Critical message waits a virtual second: every tier's queue age is past its cut-off.
    rt.try_submit(env(0, Criticality::Critical)).unwrap();
    mock.increment(Duration::from_secs(1));
    rt.try_submit(env(1, Criticality::Critical)).unwrap();
    assert_eq!(rt.load().shed_tiers(), 4);
    let batch: Vec<_> = (0..10_000).map(|i| env(i, Criticality::High)).collect();
    let mut back = Vec::with_capacity(10_000);
    let n = allocations_in(|| {
        for e in batch {
            match rt.try_submit(e) {
                Err(SubmitError::Overloaded(e)) => back.push(e),
                other => panic!("expected overloaded, got {other:?}"),
            }
        }
    });
    assert_eq!(n, 0, "backpressure decision allocated {n} times");
    assert_eq!(back.len(), 10_000);
    drop(back);

    let stats = rt.stats();
    // 12,000 refused, plus the two Sheddable messages the Critical ones evicted.
    assert_eq!(stats.ledger.tier(Criticality::Sheddable).shed, 12_002);
    gate.add_permits(100);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// Circuit-breaker-aware admission: looking the downstream key up (a hash of a borrowed
/// `&str`) and refusing for an open circuit allocate nothing, shed (Drop) or handed back
/// (Backpressure).
#[tokio::test(flavor = "current_thread")]
async fn circuit_refusal_allocates_nothing() {
    use triage::admission::{BreakerConfig, CircuitState};
    let mut config = RuntimeConfig {
        workers: 1.try_into().unwrap(),
        expert: triage::runtime::ExpertConfig {
            breaker: BreakerConfig {
                min_calls: 1,
                ..BreakerConfig::default()
            },
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    config.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Drop,
        RefusalPolicy::Drop,
    );
    let build = move || {
        Runtime::builder(config)
            .downstream(|m: &(&'static str, u64)| Some(m.0))
            .start(|_job: Job<(&'static str, u64)>| async { Ok(()) })
            .unwrap()
    };
    #[cfg(feature = "prometheus")]
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    #[cfg(feature = "prometheus")]
    let rt = metrics::with_local_recorder(&recorder, build);
    #[cfg(not(feature = "prometheus"))]
    let rt = build();
    rt.breakers().record_failure("payments");
    assert_eq!(rt.breakers().state("payments"), Some(CircuitState::Open));
    let env = |i: u64, tier| Envelope::new(("payments", i), tier, Ack::noop());
    for i in 0..2_000 {
        rt.try_submit(env(i, Criticality::Sheddable)).unwrap();
    }
    let batch: Vec<_> = (0..10_000)
        .map(|i| env(i, Criticality::Sheddable))
        .collect();
    let n = allocations_in(|| {
        for e in batch {
            rt.try_submit(e).unwrap();
        }
    });
    assert_eq!(n, 0, "circuit refusal (drop) allocated {n} times");

    let batch: Vec<_> = (0..10_000).map(|i| env(i, Criticality::Critical)).collect();
    let mut back = Vec::with_capacity(10_000);
    let n = allocations_in(|| {
        for e in batch {
            match rt.try_submit(e) {
                Err(SubmitError::CircuitOpen(e)) => back.push(e),
                other => panic!("expected circuit open, got {other:?}"),
            }
        }
    });
    assert_eq!(n, 0, "circuit refusal (backpressure) allocated {n} times");
    assert_eq!(back.len(), 10_000);
    drop(back);
    let stats = rt.stats();
    assert_eq!(stats.ledger.tier(Criticality::Sheddable).shed, 12_000);
    assert_eq!(stats.refused[Criticality::Sheddable], 12_000);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// The refuse path for reason `rate` (a token bucket empty), Drop and Backpressure, metrics
/// included: a failed compare-and-swap, then the same refusal as any other.
#[tokio::test(flavor = "current_thread")]
async fn runtime_rate_refusal_allocates_nothing() {
    use triage::admission::{BucketConfig, BucketsConfig};
    let (clock, _mock) = Clock::mock();
    let mut config = RuntimeConfig {
        workers: 1.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    config.expert.queue.admission = QueueAgeConfig::disabled();
    config.buckets = BucketsConfig {
        high: Some(BucketConfig {
            rate: Some(1.0),
            burst: Some(1),
            ..BucketConfig::default()
        }),
        sheddable: Some(BucketConfig {
            rate: Some(1.0),
            burst: Some(1),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    config.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Drop,
        RefusalPolicy::Drop,
    );
    let build = move || {
        Runtime::builder(config)
            .clock(clock)
            .start(|_job: Job<u64>| async { Ok(()) })
            .unwrap()
    };
    #[cfg(feature = "prometheus")]
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    #[cfg(feature = "prometheus")]
    let rt = metrics::with_local_recorder(&recorder, build);
    #[cfg(not(feature = "prometheus"))]
    let rt = build();
    let env = |i: u64, tier| Envelope::new(i, tier, Ack::noop());
    // Each bucket's one token, then warm-up refusals.
    rt.try_submit(env(0, Criticality::Sheddable)).unwrap();
    rt.try_submit(env(0, Criticality::High)).unwrap();
    for i in 0..2_000 {
        rt.try_submit(env(i, Criticality::Sheddable)).unwrap();
    }
    let batch: Vec<_> = (0..10_000)
        .map(|i| env(i, Criticality::Sheddable))
        .collect();
    let n = allocations_in(|| {
        for e in batch {
            rt.try_submit(e).unwrap();
        }
    });
    assert_eq!(n, 0, "rate refusal (drop) allocated {n} times");
    let batch: Vec<_> = (0..10_000).map(|i| env(i, Criticality::High)).collect();
    let mut back = Vec::with_capacity(10_000);
    let n = allocations_in(|| {
        for e in batch {
            match rt.try_submit(e) {
                Err(SubmitError::RateLimited(e)) => back.push(e),
                other => panic!("expected rate limited, got {other:?}"),
            }
        }
    });
    assert_eq!(n, 0, "rate refusal (backpressure) allocated {n} times");
    let d = rt.decisions();
    assert_eq!(d[Criticality::Sheddable].shed_rate, 12_000);
    assert_eq!(d[Criticality::High].shed_rate, 10_000);
    drop(back);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// Allocations the runtime makes while it serves `messages` in-memory messages (no-op handler,
/// one thread, so the thread-local count sees every task), publishing and start-up excluded.
async fn runtime_allocations(messages: u64) -> u64 {
    use triage::runtime::{HandlerError, MemoryBroker};
    let broker = MemoryBroker::new();
    for i in 0..messages {
        broker.publish(i, Criticality::ALL[(i % 4) as usize], None);
    }
    broker.close();
    let mut config = RuntimeConfig {
        workers: 8.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    config.expert.queue.admission = QueueAgeConfig::disabled();
    config.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let mut runtime = Runtime::builder(config)
        .start(|job: Job<u64>| async move {
            std::hint::black_box(job.payload());
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let source = broker.source();
    let before = ALLOCATIONS.with(Cell::get);
    runtime.attach(source);
    runtime.wait_idle().await;
    let n = ALLOCATIONS.with(Cell::get) - before;
    let report = runtime.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    n
}

/// Issue 11: allocations per message in steady state, the in-memory source through the whole
/// runtime (intake, admission, the queue, 8 workers taking batches, the handler's future, the
/// ledger, the acknowledgement). The marginal count between two runs (10,000 messages apart)
/// removes what start-up and the first messages allocate once: nothing is allocated per
/// message (the handler's future is not boxed, the payload's shared handle is reused, an idle
/// worker's listener lives on its stack).
#[tokio::test(flavor = "current_thread")]
async fn runtime_allocations_per_message_in_steady_state() {
    let small = runtime_allocations(2_000).await;
    let large = runtime_allocations(12_000).await;
    println!("allocations: {small} for 2,000 messages, {large} for 12,000");
    assert_eq!(
        large.saturating_sub(small),
        0,
        "{small} allocations for 2,000 messages, {large} for 12,000"
    );
}
