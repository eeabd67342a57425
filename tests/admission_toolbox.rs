//! The admission toolbox through the runtime: per-tier token buckets (virtual clock), the
//! decision breakdown, and the memory budget's exact accounting.

use std::sync::Arc;
use std::time::Duration;

use triage::admission::{BucketConfig, BucketsConfig, QueueAgeConfig};
use triage::quanta::Clock;
use triage::runtime::{Ack, Envelope, Job, RefusalPolicy, Runtime, RuntimeConfig, SubmitError};
use triage::{Criticality, PerTier};

use Criticality::*;

fn config() -> RuntimeConfig {
    let mut config = RuntimeConfig {
        workers: 1.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    config.expert.queue.admission = QueueAgeConfig::disabled();
    config.expert.queue.capacity = 20_000.try_into().unwrap();
    config
}

fn env(i: u64, tier: Criticality) -> Envelope<u64> {
    Envelope::new(i, tier, Ack::noop())
}

/// A runtime whose metrics go to a Prometheus recorder of its own, and the handle to scrape it.
#[cfg(feature = "prometheus")]
fn started_with_scrape(
    config: RuntimeConfig,
    clock: Clock,
) -> (Runtime<u64>, metrics_exporter_prometheus::PrometheusHandle) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let rt = metrics::with_local_recorder(&recorder, || {
        Runtime::builder(config)
            .clock(clock)
            .start(|_job: Job<u64>| std::future::pending())
            .unwrap()
    });
    (rt, handle)
}

/// The value of the first line of a scrape starting with `line_start` (a series and its labels).
#[cfg(feature = "prometheus")]
fn scraped(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line_start} not in\n{text}"))
}

/// A tier limited to R/s, offered 1,000 messages per virtual second for 10 virtual seconds,
/// admits its burst then R per second, within one message, and the decisions add up to the
/// messages offered.
#[tokio::test(flavor = "current_thread")]
async fn a_rate_limited_tier_admits_its_rate_over_ten_virtual_seconds() {
    const RATE: f64 = 50.0;
    let (clock, mock) = Clock::mock();
    let mut config = config();
    config.buckets = BucketsConfig {
        medium: Some(BucketConfig {
            rate: Some(RATE),
            burst: Some(1),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    config.policy[Medium] = RefusalPolicy::Drop;
    let rt = Runtime::builder(config)
        .clock(clock)
        .start(|_job: Job<u64>| async { Ok(()) })
        .unwrap();
    let mut per_second = Vec::new();
    let mut last = 0;
    for ms in 0..10_000u64 {
        rt.try_submit(env(ms, Medium)).unwrap();
        mock.increment(Duration::from_millis(1));
        if ms % 1000 == 999 {
            let admitted = rt.decisions()[Medium].admitted;
            per_second.push(admitted - last);
            last = admitted;
            tokio::task::yield_now().await;
        }
    }
    let d = rt.decisions()[Medium];
    // Burst 1 at t = 0, then one every 20 ms: 1 + 499 over [0, 10 s).
    assert!(
        (d.admitted as i64 - 500).abs() <= 1,
        "admitted {} of 10,000 at {RATE}/s over 10 s",
        d.admitted
    );
    for (s, n) in per_second.iter().enumerate() {
        assert!((*n as f64 - RATE).abs() <= 1.0, "second {s}: {n}");
    }
    assert_eq!(d.shed_rate, 10_000 - d.admitted);
    assert_eq!(d.total(), 10_000);
    rt.wait_idle().await;
    let stats = rt.stats();
    let t = stats.ledger.tier(Medium);
    assert_eq!(t.consumed, 10_000);
    assert_eq!(t.completed, d.admitted);
    assert_eq!(t.shed, d.shed_rate);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// Critical borrows from High when its own bucket is empty; High does not borrow; a
/// Backpressure tier's rate refusal comes back to an in-process caller as `RateLimited`.
#[tokio::test(flavor = "current_thread")]
async fn critical_borrows_from_high_and_high_does_not_borrow() {
    let (clock, mock) = Clock::mock();
    let mut config = config();
    config.buckets = BucketsConfig {
        critical: Some(BucketConfig {
            rate: Some(1.0),
            burst: Some(2),
            ..BucketConfig::default()
        }),
        high: Some(BucketConfig {
            rate: Some(1.0),
            burst: Some(3),
            ..BucketConfig::default()
        }),
        medium: Some(BucketConfig {
            rate: Some(1.0),
            burst: Some(10),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    config.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = Arc::clone(&gate);
    let rt = Runtime::builder(config)
        .clock(clock)
        .start(move |_job: Job<u64>| {
            let g = Arc::clone(&g);
            async move {
                let _ = g.acquire().await;
                Ok(())
            }
        })
        .unwrap();
    for i in 0..5 {
        rt.try_submit(env(i, Critical)).unwrap();
    }
    assert_eq!(rt.buckets().tokens(Critical), 0);
    assert_eq!(rt.buckets().tokens(High), 0, "Critical took High's three");
    assert!(matches!(
        rt.try_submit(env(5, Critical)),
        Err(SubmitError::RateLimited(_))
    ));
    // High is empty and does not borrow from Medium, which is full.
    assert!(matches!(
        rt.try_submit(env(6, High)),
        Err(SubmitError::RateLimited(_))
    ));
    assert_eq!(rt.buckets().tokens(Medium), 10);
    assert_eq!(rt.buckets().fill(Medium), 1.0);
    assert_eq!(rt.buckets().fill(High), 0.0);
    mock.increment(Duration::from_secs(1));
    rt.try_submit(env(7, High)).unwrap();
    assert!((rt.buckets().fill(Critical) - 0.5).abs() < 1e-9);
    let d = rt.decisions();
    assert_eq!((d[Critical].admitted, d[Critical].shed_rate), (5, 1));
    assert_eq!((d[High].admitted, d[High].shed_rate), (1, 1));
    gate.add_permits(100);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let total: u64 = Criticality::ALL.iter().map(|&t| d[t].total()).sum();
    assert_eq!(total, report.stats.ledger.total().consumed);
}

/// The memory budget's accounting is exact: bytes added when a message is taken, removed at
/// its disposition (served, shed, or handed back), and tiers refused at their thresholds.
#[tokio::test(flavor = "current_thread")]
async fn memory_accounting_is_exact() {
    let mut config = config();
    config.memory.budget_bytes = Some(2000); // Sheddable 1000, Medium 1400, High 1700
    config.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Drop,
        RefusalPolicy::Drop,
    );
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = Arc::clone(&gate);
    let rt = Runtime::builder(config)
        .start(move |_job: Job<u64>| {
            let g = Arc::clone(&g);
            async move {
                let _ = g.acquire().await;
                Ok(())
            }
        })
        .unwrap();
    let sized = |i, tier, size| env(i, tier).with_size_bytes(size);
    rt.try_submit(sized(0, Sheddable, 400)).unwrap();
    rt.try_submit(sized(1, Sheddable, 400)).unwrap();
    tokio::task::yield_now().await; // one is in the handler now: still held
    assert_eq!(rt.memory().held(), 800);
    // 1,200 > 1,000: refused for memory, dropped, its bytes gone at once.
    rt.try_submit(sized(2, Sheddable, 400)).unwrap();
    assert_eq!(rt.memory().held(), 800);
    rt.try_submit(sized(3, Medium, 500)).unwrap();
    assert_eq!(rt.memory().held(), 1300);
    rt.try_submit(sized(4, High, 300)).unwrap();
    assert_eq!(rt.memory().held(), 1600);
    // 1,800 > High's 1,700: a Backpressure tier gets its message back, bytes released.
    assert!(matches!(
        rt.try_submit(sized(5, High, 200)),
        Err(SubmitError::Memory(_))
    ));
    assert_eq!(rt.memory().held(), 1600);
    rt.try_submit(sized(6, Critical, 400)).unwrap();
    assert_eq!(rt.memory().held(), 2000);
    assert_eq!(rt.memory().peak(), 2000);
    let d = rt.decisions();
    assert_eq!((d[Sheddable].admitted, d[Sheddable].shed_memory), (2, 1));
    assert_eq!((d[High].admitted, d[High].shed_memory), (1, 1));
    assert_eq!(d[Critical].admitted, 1);
    let order = rt.memory().first_refusals();
    assert!(order[Sheddable] < order[High] && order[Critical].is_none());
    gate.add_permits(100);
    rt.wait_idle().await;
    assert_eq!(rt.memory().held(), 0);
    assert_eq!(rt.memory().waiting(), 0);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// The fill gauges and the memory gauge match the state they sample.
#[cfg(feature = "prometheus")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_gauges_match_the_buckets_and_the_bytes_held() {
    let (clock, _mock) = Clock::mock();
    let mut config = config();
    config.buckets = BucketsConfig {
        high: Some(BucketConfig {
            rate: Some(10.0),
            burst: Some(4),
            ..BucketConfig::default()
        }),
        sheddable: Some(BucketConfig {
            rate: Some(10.0),
            burst: Some(8),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    config.memory.budget_bytes = Some(1 << 20);
    let (rt, handle) = started_with_scrape(config, clock);
    for i in 0..2 {
        rt.try_submit(env(i, High).with_size_bytes(1000)).unwrap();
    }
    rt.try_submit(env(9, Sheddable).with_size_bytes(24))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // a few sampler ticks
    let text = handle.render();
    let value = |line_start: &str| scraped(&text, line_start);
    assert_eq!(value("triage_bucket_fill_ratio{tier=\"high\"}"), 0.5);
    assert_eq!(rt.buckets().fill(High), 0.5);
    assert_eq!(value("triage_bucket_fill_ratio{tier=\"sheddable\"}"), 0.875);
    assert_eq!(value("triage_bucket_fill_ratio{tier=\"critical\"}"), 1.0);
    assert_eq!(value("triage_memory_held_bytes"), 2024.0);
    assert_eq!(value("triage_memory_budget_bytes"), (1 << 20) as f64);
    assert_eq!(
        value("triage_admission_decisions_total{tier=\"high\",decision=\"admitted\"}"),
        2.0
    );
    assert!(text.contains("# HELP triage_admission_decisions_total"));
    let _ = rt.shutdown(Duration::from_millis(100)).await;
}

/// The refusal and decision counters reach the scrape from the runtime's own counts (added at
/// each sampler tick): exactly what was refused, by reason, and never added twice.
#[cfg(feature = "prometheus")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_refusal_counters_reach_the_scrape_once() {
    let (clock, _mock) = Clock::mock();
    let mut config = config();
    // High holds 4 tokens that never refill (the virtual clock stands still): the other 6 of
    // 10 are refused for rate and handed back (Backpressure).
    config.buckets = BucketsConfig {
        high: Some(BucketConfig {
            rate: Some(10.0),
            burst: Some(4),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    let (rt, handle) = started_with_scrape(config, clock);
    let refused = (0..10)
        .filter(|&i| {
            matches!(
                rt.try_submit(env(i, High)),
                Err(SubmitError::RateLimited(_))
            )
        })
        .count();
    assert_eq!(refused, 6);
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(300)).await; // a few sampler ticks
        let text = handle.render();
        assert_eq!(
            scraped(&text, "triage_refused_total{tier=\"high\",reason=\"rate\"}"),
            6.0
        );
        assert_eq!(
            scraped(
                &text,
                "triage_admission_decisions_total{tier=\"high\",decision=\"shed-rate\"}"
            ),
            6.0
        );
        assert_eq!(
            scraped(
                &text,
                "triage_admission_decisions_total{tier=\"high\",decision=\"admitted\"}"
            ),
            4.0
        );
    }
    assert_eq!(rt.stats().refused[High], 6);
    let _ = rt.shutdown(Duration::from_millis(100)).await;
}

/// `Runtime::reconfigure` changes the buckets and the memory budget of a running runtime.
#[tokio::test(flavor = "current_thread")]
async fn buckets_and_memory_budget_are_reconfigured_live() {
    let (clock, mock) = Clock::mock();
    let mut config = config();
    config.buckets = BucketsConfig {
        sheddable: Some(BucketConfig {
            rate: Some(1.0),
            burst: Some(1),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    config.policy[Sheddable] = RefusalPolicy::Drop;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = Arc::clone(&gate);
    let rt = Runtime::builder(config.clone())
        .clock(clock)
        .start(move |_job: Job<u64>| {
            let g = Arc::clone(&g);
            async move {
                let _ = g.acquire().await;
                Ok(())
            }
        })
        .unwrap();
    rt.try_submit(env(0, Sheddable)).unwrap();
    rt.try_submit(env(1, Sheddable)).unwrap();
    assert_eq!(rt.decisions()[Sheddable].shed_rate, 1);
    // 100/s, burst 10: after 50 ms, 5 tokens.
    config.buckets = BucketsConfig {
        sheddable: Some(BucketConfig {
            rate: Some(100.0),
            burst: Some(10),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    config.memory.budget_bytes = Some(1000);
    rt.reconfigure(config.clone()).unwrap();
    mock.increment(Duration::from_millis(50));
    assert_eq!(rt.buckets().tokens(Sheddable), 5);
    assert_eq!(rt.memory().budget(), Some(1000));
    // The budget applies: 100 + 600 bytes of Sheddable pass its 500.
    rt.try_submit(env(2, Sheddable).with_size_bytes(100))
        .unwrap();
    rt.try_submit(env(3, Sheddable).with_size_bytes(600))
        .unwrap();
    assert_eq!(rt.decisions()[Sheddable].shed_memory, 1);
    assert_eq!(rt.buckets().tokens(Sheddable), 4);
    // An invalid bucket is refused, naming the field, and nothing changes.
    let mut bad = config.clone();
    bad.buckets.borrow.high = vec![Critical];
    let err = rt.reconfigure(bad).unwrap_err();
    assert_eq!(err.field(), Some("buckets.borrow.high"));
    assert_eq!(rt.buckets().tokens(Sheddable), 4);
    gate.add_permits(100);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// A pulled Critical tier over its rate (Backpressure, its default policy): paced to its
/// bucket, never lost, and served in the order it was pulled (a held message is re-offered
/// before newer ones of its tier take the refilled tokens).
#[tokio::test(flavor = "current_thread")]
async fn pulled_critical_over_its_rate_is_paced_in_order_and_never_lost() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use triage::runtime::MemoryBroker;
    const N: u64 = 200;
    let (clock, mock) = Clock::mock();
    let mut config = config();
    config.buckets = BucketsConfig {
        critical: Some(BucketConfig {
            rate: Some(100.0),
            burst: Some(10),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    let broker = MemoryBroker::new();
    for i in 0..N {
        broker.publish(i, Critical, None);
    }
    broker.close();
    let next = Arc::new(AtomicU64::new(0));
    let out_of_order = Arc::new(AtomicU64::new(0));
    let (n2, o2) = (Arc::clone(&next), Arc::clone(&out_of_order));
    let mut rt = Runtime::builder(config)
        .clock(clock)
        .start(move |job: Job<u64>| {
            if n2.fetch_add(1, Ordering::Relaxed) != *job.payload() {
                o2.fetch_add(1, Ordering::Relaxed);
            }
            async { Ok(()) }
        })
        .unwrap();
    rt.attach(broker.source());
    let mut virtual_ms = 0u64;
    while rt.stats().ledger.tier(Critical).completed < N && virtual_ms < 60_000 {
        let completed = rt.stats().ledger.tier(Critical).completed;
        // Never more than the burst plus the rate over the virtual time so far.
        assert!(
            completed <= 10 + virtual_ms / 10,
            "{completed} completed after {virtual_ms} virtual ms"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        mock.increment(Duration::from_millis(10));
        virtual_ms += 10;
    }
    rt.wait_idle().await;
    let stats = rt.stats();
    let t = stats.ledger.tier(Critical);
    assert_eq!((t.consumed, t.completed, t.shed), (N, N, 0));
    assert_eq!(
        out_of_order.load(Ordering::Relaxed),
        0,
        "served out of order"
    );
    // 10 at once, then one per 10 virtual ms: about 1.9 s of virtual time.
    assert!(virtual_ms >= 1_900, "done after {virtual_ms} virtual ms");
    let d = rt.decisions()[Critical];
    assert_eq!(d.total(), N);
    assert!(d.shed_rate > 0 && d.admitted > 0, "{d:?}");
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// A Defer tier refused by the operator's forced level while its defer sink is failing falls
/// back to backpressure, and `try_submit` says why: `Overloaded` (the forced level), not
/// `Full` (the queue is empty).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_defer_tier_refused_by_the_forced_level_with_its_sink_down_comes_back_overloaded() {
    use triage::runtime::MemorySink;
    let (clock, _mock) = Clock::mock();
    let mut config = config();
    config.policy[High] = RefusalPolicy::Defer;
    config.forced_shed_level = 3;
    let sink = Arc::new(MemorySink::new());
    sink.set_failing(true);
    let rt = Runtime::builder(config)
        .clock(clock)
        .defer_sink(Arc::clone(&sink))
        .start(|_job: Job<u64>| async { Ok(()) })
        .unwrap();
    // Refused by force and deferred; the publish fails, so the sink is marked unhealthy and
    // this message waits under backpressure (taken: `Ok`).
    rt.try_submit(env(0, High)).unwrap();
    tokio::task::yield_now().await;
    let refused = rt.try_submit(env(1, High)).unwrap_err();
    assert!(
        matches!(refused, SubmitError::Overloaded(_)),
        "{refused:?} with nothing queued"
    );
    assert_eq!(rt.stats().queued, 0);
    drop(refused);
    let report = rt.shutdown(Duration::from_millis(100)).await;
    assert!(report.stats.balances(), "{report}");
}
