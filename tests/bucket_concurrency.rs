//! The token buckets under real threads: takes racing a live `set` (a reconfiguration) and
//! racing readers of the token count. The clock stands still (a mock that no thread moves), so
//! every count is exact: nothing refills, and whatever is granted beyond the burst was given
//! back by a race. The loom models of the same protocol are in `tests/loom_bucket.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use triage::admission::{BucketConfig, BucketsConfig, TierBuckets, TokenBucket};
use triage::quanta::Clock;
use triage::Criticality::{Critical, High};

const BURST: u64 = 2_000;

/// Takers race a setter that reconfigures the bucket to the same rate and burst, over and over,
/// at a time that does not move: `set` keeps the fill, so the takers are granted exactly the
/// burst, whatever the interleaving. A `set` that read the fill, then stored a timestamp
/// computed from it after a take had moved it, erased that take: a token given back.
#[test]
fn a_set_racing_takes_gives_no_token_back() {
    for round in 0..20 {
        let bucket = Arc::new(TokenBucket::new(1.0, BURST));
        let granted = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(4));
        let takers: Vec<_> = (0..3)
            .map(|_| {
                let (bucket, granted, done, start) = (
                    Arc::clone(&bucket),
                    Arc::clone(&granted),
                    Arc::clone(&done),
                    Arc::clone(&start),
                );
                thread::spawn(move || {
                    start.wait();
                    // Takes while the setter runs, then until refused once it is done: the
                    // bucket ends empty.
                    loop {
                        let last = done.load(Ordering::Acquire);
                        if bucket.try_take(0) {
                            granted.fetch_add(1, Ordering::Relaxed);
                        } else if last {
                            break;
                        }
                    }
                })
            })
            .collect();
        start.wait();
        for _ in 0..20_000 {
            bucket.set(1.0, BURST, 0);
        }
        done.store(true, Ordering::Release);
        for t in takers {
            t.join().unwrap();
        }
        assert_eq!(
            granted.load(Ordering::Relaxed),
            BURST,
            "round {round}: the clock stood still, so exactly the burst is granted"
        );
        assert_eq!(bucket.tokens(0), 0);
    }
}

/// Readers of the token count race takes and reconfigurations (a burst of 1 and of 4, to and
/// fro), on a clock that moves between rounds: a count is never above the larger burst. A
/// reader that read the clock, then the bucket's timestamp after a take at a later time had
/// moved it, wrapped below zero (184,467,440,737,095,514 tokens of a burst of 1).
#[test]
fn token_counts_stay_within_the_burst_under_takes_and_reconfigurations() {
    let small = BucketsConfig {
        critical: Some(BucketConfig {
            rate: Some(1000.0),
            burst: Some(1),
            ..BucketConfig::default()
        }),
        high: Some(BucketConfig {
            rate: Some(1000.0),
            burst: Some(1),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    let large = BucketsConfig {
        critical: Some(BucketConfig {
            rate: Some(1000.0),
            burst: Some(4),
            ..BucketConfig::default()
        }),
        high: Some(BucketConfig {
            rate: Some(1000.0),
            burst: Some(4),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    small.validate().unwrap();
    large.validate().unwrap();
    // A real clock: each thread's reading is its own, as in the runtime.
    let buckets = Arc::new(TierBuckets::new(&small, Clock::new()));
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(4));
    let takers: Vec<_> = (0..2)
        .map(|_| {
            let (buckets, done, start) =
                (Arc::clone(&buckets), Arc::clone(&done), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                let mut taken = 0u64;
                while !done.load(Ordering::Acquire) {
                    if buckets.try_acquire(Critical).is_some() {
                        taken += 1;
                    }
                }
                taken
            })
        })
        .collect();
    let reader = {
        let (buckets, done, start) = (Arc::clone(&buckets), Arc::clone(&done), Arc::clone(&start));
        thread::spawn(move || {
            start.wait();
            let mut worst = 0u64;
            while !done.load(Ordering::Acquire) {
                for tier in [Critical, High] {
                    worst = worst.max(buckets.tokens(tier));
                    let fill = buckets.fill(tier);
                    assert!((0.0..=1.0).contains(&fill), "fill {fill}");
                }
            }
            worst
        })
    };
    start.wait();
    for i in 0..200_000 {
        buckets.apply(if i % 2 == 0 { &large } else { &small });
    }
    done.store(true, Ordering::Release);
    let taken: u64 = takers.into_iter().map(|t| t.join().unwrap()).sum();
    let worst = reader.join().unwrap();
    assert!(worst <= 4, "a count above the largest burst: {worst}");
    assert!(taken > 0);
}
