//! Unit tests of `limit`, beside it so that its file holds the code.

use super::*;
use crate::sync::AtomicBool;
use proptest::prelude::*;

#[test]
fn stress_in_flight_never_exceeds_allowed() {
    const THREADS: usize = 4;
    const ITERATIONS: usize = 50_000;
    let limit = ConcurrencyLimit::new(Fixed::new(8).unwrap().into(), TierShares::default());
    let violated = AtomicBool::new(false);
    let max_seen = AtomicUsize::new(0);
    let admitted = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (limit, violated, max_seen, admitted) = (&limit, &violated, &max_seen, &admitted);
            s.spawn(move || {
                // Each thread its own tier, so every share is exercised
                // against contention from the others.
                let tier = Criticality::ALL[t];
                let allowed = limit.allowed(tier);
                for i in 0..ITERATIONS {
                    let Some(permit) = limit.try_acquire(tier) else {
                        continue;
                    };
                    admitted.fetch_add(1, Ordering::Relaxed);
                    let observed = limit.in_flight();
                    max_seen.fetch_max(observed, Ordering::Relaxed);
                    if permit.in_flight_at_start() > allowed || observed > 8 {
                        violated.store(true, Ordering::Relaxed);
                    }
                    if i % 2 == 0 {
                        permit.record(Duration::from_millis(1), false);
                    } else {
                        drop(permit);
                    }
                }
            });
        }
    });
    assert!(!violated.load(Ordering::Relaxed));
    assert!(max_seen.load(Ordering::Relaxed) <= 8);
    assert!(max_seen.load(Ordering::Relaxed) >= 1);
    assert!(admitted.load(Ordering::Relaxed) > 0);
    assert_eq!(limit.in_flight(), 0);
    assert_eq!(limit.limit(), 8);
}

#[test]
fn stress_with_adaptive_limit_stays_within_max() {
    let cfg = AimdConfig {
        initial: 8,
        max: 16,
        ..AimdConfig::default()
    };
    let limit = ConcurrencyLimit::new(Aimd::new(cfg).unwrap().into(), TierShares::default());
    std::thread::scope(|s| {
        for t in 0..4 {
            let limit = &limit;
            s.spawn(move || {
                for i in 0..20_000 {
                    if let Some(p) = limit.try_acquire(Criticality::ALL[t]) {
                        assert!(limit.in_flight() <= 16);
                        // Every 7th job reports overload, so the limit moves
                        // both ways while others acquire.
                        p.record(Duration::from_millis(3), i % 7 == 0);
                    }
                }
            });
        }
    });
    assert_eq!(limit.in_flight(), 0);
    assert!((1..=16).contains(&limit.limit()));
}

#[test]
fn record_updates_shared_limit() {
    let limit = ConcurrencyLimit::new(Aimd::default().into(), TierShares::default());
    assert_eq!(limit.limit(), 20);
    let permits: Vec<_> = (0..10)
        .map(|_| limit.try_acquire(Criticality::Medium).unwrap())
        .collect();
    assert_eq!(limit.allowed(Criticality::Medium), 15);
    let mut permits = permits.into_iter();
    let last = permits.next_back().unwrap();
    assert_eq!(last.in_flight_at_start(), 10);
    assert_eq!(last.tier(), Criticality::Medium);
    // in_flight 10 ≥ 20 / 2: a good sample grows the limit.
    assert_eq!(last.record(Duration::from_millis(5), false), 21);
    assert_eq!(limit.limit(), 21);
    assert_eq!(limit.in_flight(), 9);
    let p = permits.next().unwrap();
    assert_eq!(p.record(Duration::from_millis(5), true), 18);
    drop(permits);
    assert_eq!(limit.in_flight(), 0);
}

/// Polls each listener once and drops those notified: how many were.
fn take_notified<L: std::future::Future + Unpin>(listeners: &mut Vec<L>) -> usize {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let before = listeners.len();
    listeners.retain_mut(|l| std::pin::Pin::new(l).poll(&mut cx).is_pending());
    before - listeners.len()
}

/// Issue 10, point 8: one completion frees one slot, so it wakes one waiter, not all.
#[test]
fn one_release_wakes_one_waiter() {
    let limit = ConcurrencyLimit::new(Fixed::new(2).unwrap().into(), TierShares::default());
    let a = limit.try_acquire(Criticality::Critical).unwrap();
    let b = limit.try_acquire(Criticality::Critical).unwrap();
    let mut waiters: Vec<_> = (0..8)
        .map(|_| Box::pin(limit.listen(Criticality::Critical)))
        .collect();
    assert_eq!(take_notified(&mut waiters), 0);
    drop(a);
    assert_eq!(
        take_notified(&mut waiters),
        1,
        "one free slot, one waiter woken"
    );
    // The woken waiter takes the slot; the next release frees one again.
    let _c = limit.try_acquire(Criticality::Critical).unwrap();
    b.record(Duration::from_millis(1), false);
    assert_eq!(
        take_notified(&mut waiters),
        1,
        "one free slot, one waiter woken"
    );
    assert_eq!(waiters.len(), 6);
}

/// A release wakes only waiters whose tier may use the freed slot: Sheddable may start below
/// 2 in flight (half of 4), so releases down to 3 and 2 in flight leave it asleep.
#[test]
fn a_release_wakes_only_a_tier_that_may_proceed() {
    let limit = ConcurrencyLimit::new(Fixed::new(4).unwrap().into(), TierShares::default());
    let held: Vec<_> = (0..4)
        .map(|_| limit.try_acquire(Criticality::Critical).unwrap())
        .collect();
    let mut sheddable = vec![Box::pin(limit.listen(Criticality::Sheddable))];
    let mut critical = vec![Box::pin(limit.listen(Criticality::Critical))];
    let mut held = held.into_iter();
    drop(held.next());
    assert_eq!(
        take_notified(&mut sheddable),
        0,
        "3 in flight: no room for Sheddable"
    );
    assert_eq!(take_notified(&mut critical), 1);
    drop(held.next());
    assert_eq!(take_notified(&mut sheddable), 0, "2 in flight: still none");
    drop(held.next());
    assert_eq!(
        take_notified(&mut sheddable),
        1,
        "1 in flight: Sheddable may start"
    );
}

#[test]
fn sheddable_refused_first() {
    let limit = ConcurrencyLimit::new(Fixed::new(10).unwrap().into(), TierShares::default());
    let held: Vec<_> = (0..5)
        .map(|_| limit.try_acquire(Criticality::Critical).unwrap())
        .collect();
    assert!(limit.try_acquire(Criticality::Sheddable).is_none());
    let medium = limit.try_acquire(Criticality::Medium).unwrap();
    assert_eq!(medium.in_flight_at_start(), 6);
    drop(held);
    assert!(limit.try_acquire(Criticality::Sheddable).is_some());
}

fn sample_strategy() -> impl Strategy<Value = Vec<(u64, usize, bool)>> {
    prop::collection::vec((0u64..20_000_000_000, 0usize..2_000, any::<bool>()), 0..400)
}

fn bounds_strategy() -> impl Strategy<Value = (usize, usize, usize)> {
    (1usize..50, 0usize..300, 0usize..300)
        .prop_map(|(min, span, at)| (min, min + span, min + at.min(span)))
}

fn check(mut limiter: Limiter, min: usize, max: usize, samples: &[(u64, usize, bool)]) {
    assert!((min..=max).contains(&limiter.limit()));
    for &(nanos, in_flight, dropped) in samples {
        let sample = Sample {
            latency: Duration::from_nanos(nanos),
            in_flight,
            dropped,
        };
        let l = limiter.on_sample(sample);
        assert_eq!(l, limiter.limit());
        assert!((min..=max).contains(&l), "{l} outside [{min}, {max}]");
    }
}

proptest! {
    #[test]
    fn limits_stay_within_bounds(
        samples in sample_strategy(),
        (min, max, initial) in bounds_strategy(),
        backoff in 0.01f64..0.99,
        tolerance in 1.0f64..4.0,
        smoothing in 0.01f64..=1.0,
        long_window in 1u32..1_000,
        queue_size in prop::option::of(1usize..100),
    ) {
        check(Fixed::new(initial).unwrap().into(), initial, initial, &samples);

        let aimd = AimdConfig { initial, min, max, backoff_ratio: backoff, timeout_ms: 500 };
        check(Aimd::new(aimd).unwrap().into(), min, max, &samples);

        let g2 = Gradient2Config { initial, min, max, tolerance, smoothing, long_window, short_window: long_window.min(5), queue_size };
        check(Gradient2::new(g2).unwrap().into(), min, max, &samples);
    }
}
