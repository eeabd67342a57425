//! Model test of the token buckets: arbitrary take / refund / reconfigure / advance-the-clock
//! sequences run against [`TokenBucket`] and [`TierBuckets`] and against a plain token bucket
//! that counts the nanoseconds of its tolerance in use, which drain one per nanosecond (the
//! textbook bucket the GCRA timestamp stands for). Interleavings of the same operations on
//! threads are `tests/loom_bucket.rs` and `tests/bucket_concurrency.rs`.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use triage::admission::{
    BorrowChain, BucketConfig, BucketsConfig, Grant, TierBuckets, TokenBucket, MAX_BURST, MAX_RATE,
};
use triage::quanta::Clock;
use triage::Criticality;

/// The largest tolerance a bucket keeps, ns (73 years; see `TokenBucket`).
const MAX_TOLERANCE: u64 = (1 << 61) - 1;

/// One bucket, as plainly as possible: `used` ns of its tolerance are in use at the model's
/// time; a token is granted while a whole interval of the tolerance is free.
#[derive(Clone, Debug, Default)]
struct Reference {
    interval: u64,
    tolerance: u64,
    used: u64,
}

impl Reference {
    fn new(rate: f64, burst: u64) -> Self {
        let mut r = Reference::default();
        r.set(rate, burst);
        r
    }

    /// New settings keep the fraction in use, rounded down to the nanosecond; a bucket that
    /// had no limit starts full.
    fn set(&mut self, rate: f64, burst: u64) {
        let interval = if rate > 0.0 {
            ((1e9 / rate).round() as u64).max(1)
        } else {
            0
        };
        let tolerance =
            (u128::from(interval) * u128::from(burst.max(1))).min(u128::from(MAX_TOLERANCE)) as u64;
        self.used = if self.interval == 0 || self.tolerance == 0 {
            0
        } else {
            (u128::from(self.used) * u128::from(tolerance) / u128::from(self.tolerance)) as u64
        };
        self.interval = interval;
        self.tolerance = tolerance;
    }

    fn limited(&self) -> bool {
        self.interval != 0
    }

    fn take(&mut self) -> bool {
        if !self.limited() {
            return true;
        }
        if self.tolerance - self.used < self.interval {
            return false;
        }
        self.used += self.interval;
        true
    }

    fn refund(&mut self) {
        self.used = self.used.saturating_sub(self.interval);
    }

    fn advance(&mut self, ns: u64) {
        self.used = self.used.saturating_sub(ns);
    }

    fn tokens(&self) -> u64 {
        if !self.limited() {
            return u64::MAX;
        }
        (self.tolerance - self.used) / self.interval
    }

    fn fill(&self) -> f64 {
        if !self.limited() || self.tolerance == 0 {
            return 1.0;
        }
        1.0 - self.used as f64 / self.tolerance as f64
    }

    fn burst(&self) -> u64 {
        self.tolerance / self.interval.max(1)
    }
}

/// Rates with whole and rounded intervals (1e9 / 3 and 1e9 / 7 are not whole), and none.
fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(1.0),
        Just(3.0),
        Just(7.0),
        Just(10.0),
        Just(250.0),
        Just(0.5),
    ]
}

#[derive(Clone, Debug)]
enum BucketAction {
    Take,
    Refund,
    Set {
        rate: f64,
        burst: u64,
    },
    Advance(u64),
    /// Reads the bucket at a clock reading `behind` ns older than the model's time, as a
    /// reader whose reading was taken before a concurrent take's.
    ReadBehind(u64),
}

fn bucket_action() -> impl Strategy<Value = BucketAction> {
    prop_oneof![
        8 => Just(BucketAction::Take),
        2 => Just(BucketAction::Refund),
        2 => (rate(), 1..6u64).prop_map(|(rate, burst)| BucketAction::Set { rate, burst }),
        4 => prop_oneof![0..1_000u64, 0..2_000_000_000u64].prop_map(BucketAction::Advance),
        1 => (0..4_000_000_000u64).prop_map(BucketAction::ReadBehind),
    ]
}

#[derive(Clone, Debug)]
enum TierAction {
    Acquire(Criticality),
    /// Gives back the `n`-th oldest outstanding grant (modulo their number).
    Refund(usize),
    Apply(usize),
    Advance(u64),
}

fn tier() -> impl Strategy<Value = Criticality> {
    prop_oneof![
        Just(Criticality::Critical),
        Just(Criticality::High),
        Just(Criticality::Medium),
        Just(Criticality::Sheddable),
    ]
}

/// A valid configuration: each tier with or without a bucket, and a borrowing chain of tiers
/// below each (in a random order).
fn config() -> impl Strategy<Value = BucketsConfig> {
    let bucket = proptest::option::weighted(0.7, (rate(), 1..5u64)).prop_map(|b| {
        b.and_then(|(rate, burst)| {
            (rate > 0.0).then(|| BucketConfig {
                rate: Some(rate),
                burst: Some(burst),
                ..BucketConfig::default()
            })
        })
    });
    let lenders = |tier: Criticality| {
        let below: Vec<Criticality> = Criticality::ALL
            .into_iter()
            .filter(|l| l.rank() < tier.rank())
            .collect();
        let n = below.len();
        proptest::sample::subsequence(below, 0..=n).prop_shuffle()
    };
    (
        proptest::array::uniform4(bucket),
        lenders(Criticality::Critical),
        lenders(Criticality::High),
        lenders(Criticality::Medium),
    )
        .prop_map(|(buckets, critical, high, medium)| {
            let [c0, c1, c2, c3] = buckets;
            BucketsConfig {
                critical: c0,
                high: c1,
                medium: c2,
                sheddable: c3,
                borrow: BorrowChain {
                    critical,
                    high,
                    medium,
                    sheddable: Vec::new(),
                },
                ..BucketsConfig::default()
            }
        })
}

fn tier_action(configs: usize) -> impl Strategy<Value = TierAction> {
    prop_oneof![
        8 => tier().prop_map(TierAction::Acquire),
        2 => any::<usize>().prop_map(TierAction::Refund),
        1 => (0..configs).prop_map(TierAction::Apply),
        3 => prop_oneof![0..1_000u64, 0..2_000_000_000u64].prop_map(TierAction::Advance),
    ]
}

/// The four tiers' reference buckets and their borrowing chain, as `TierBuckets` documents
/// them: own bucket first, then each lender with a bucket, in order.
struct TierReference {
    buckets: [Reference; 4],
    lenders: [Vec<Criticality>; 4],
}

impl TierReference {
    fn apply(&mut self, config: &BucketsConfig) {
        for t in Criticality::ALL {
            let b = &mut self.buckets[t.rank()];
            match (config.rate(t), config.burst(t)) {
                (Some(rate), Some(burst)) => b.set(rate, burst),
                _ => b.set(0.0, 1),
            }
            self.lenders[t.rank()] = config.borrow.lenders(t).to_vec();
        }
    }

    fn acquire(&mut self, tier: Criticality) -> Option<Grant> {
        if !self.buckets[tier.rank()].limited() {
            return Some(Grant::Unlimited);
        }
        if self.buckets[tier.rank()].take() {
            return Some(Grant::Own(tier));
        }
        for &lender in &self.lenders[tier.rank()] {
            let b = &mut self.buckets[lender.rank()];
            if b.limited() && b.take() {
                return Some(Grant::Borrowed(lender));
            }
        }
        None
    }
}

fn persistence() -> Option<Box<FileFailurePersistence>> {
    Some(Box::new(FileFailurePersistence::Direct(
        "proptest-regressions/bucket_model.txt",
    )))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: persistence().map(|p| p as _),
        ..ProptestConfig::default()
    })]

    /// One bucket: every answer and every reading matches the reference, after each step.
    #[test]
    fn a_bucket_follows_the_reference(
        (rate, burst) in (rate(), 1..6u64),
        actions in proptest::collection::vec(bucket_action(), 1..200),
    ) {
        let bucket = TokenBucket::new(rate, burst);
        let mut reference = Reference::new(rate, burst);
        let mut now = 0u64;
        for action in actions {
            match action {
                BucketAction::Take => {
                    prop_assert_eq!(bucket.try_take(now), reference.take(), "take at {}", now);
                }
                BucketAction::Refund => {
                    bucket.refund();
                    reference.refund();
                }
                BucketAction::Set { rate, burst } => {
                    bucket.set(rate, burst, now);
                    reference.set(rate, burst);
                }
                BucketAction::Advance(ns) => {
                    now += ns;
                    reference.advance(ns);
                }
                BucketAction::ReadBehind(behind) => {
                    let then = now.saturating_sub(behind);
                    let tokens = bucket.tokens(then);
                    // Never more than now (time only refills), never wrapped past the burst.
                    prop_assert!(tokens <= reference.tokens(), "{} at {} > {} now", tokens, then, reference.tokens());
                    prop_assert!(!reference.limited() || tokens <= reference.burst());
                    let fill = bucket.fill(then);
                    prop_assert!((0.0..=1.0).contains(&fill) && fill <= reference.fill() + 1e-12);
                }
            }
            prop_assert_eq!(bucket.is_limited(), reference.limited());
            prop_assert_eq!(bucket.tokens(now), reference.tokens(), "tokens at {}", now);
            prop_assert!((bucket.fill(now) - reference.fill()).abs() < 1e-9);
        }
    }

    /// The four tiers with borrowing, live reconfigurations and refunds of earlier grants.
    #[test]
    fn tier_buckets_follow_the_reference(
        configs in proptest::collection::vec(config(), 1..4),
        actions in proptest::collection::vec(tier_action(3), 1..200),
    ) {
        let (clock, mock) = Clock::mock();
        for c in &configs {
            prop_assert!(c.validate().is_ok(), "{:?}", c);
        }
        let buckets = TierBuckets::new(&configs[0], clock);
        let mut reference = TierReference {
            buckets: Default::default(),
            lenders: Default::default(),
        };
        reference.apply(&configs[0]);
        let mut outstanding: Vec<Grant> = Vec::new();
        for action in actions {
            match action {
                TierAction::Acquire(tier) => {
                    let got = buckets.try_acquire(tier);
                    prop_assert_eq!(got, reference.acquire(tier), "acquire {}", tier);
                    outstanding.extend(got.filter(|g| *g != Grant::Unlimited));
                }
                TierAction::Refund(n) => {
                    if !outstanding.is_empty() {
                        let grant = outstanding.remove(n % outstanding.len());
                        buckets.refund(grant);
                        if let Grant::Own(t) | Grant::Borrowed(t) = grant {
                            let b = &mut reference.buckets[t.rank()];
                            if b.limited() {
                                b.refund();
                            }
                        }
                    }
                }
                TierAction::Apply(i) => {
                    let c = &configs[i % configs.len()];
                    buckets.apply(c);
                    reference.apply(c);
                }
                TierAction::Advance(ns) => {
                    mock.increment(Duration::from_nanos(ns));
                    for b in &mut reference.buckets {
                        b.advance(ns);
                    }
                }
            }
            for t in Criticality::ALL {
                let r = &reference.buckets[t.rank()];
                prop_assert_eq!(buckets.is_limited(t), r.limited());
                prop_assert_eq!(buckets.tokens(t), r.tokens(), "{} tokens", t);
                prop_assert!((buckets.fill(t) - r.fill()).abs() < 1e-9, "{} fill", t);
            }
        }
    }

    /// Settings and clock readings anywhere in their ranges, valid or not (a rate of 10^-9, a
    /// burst of 2^64 - 1, a reading past 2^62 ns): nothing panics, a count never passes the
    /// burst, a fill stays in `0.0..=1.0`, and a full bucket grants at least one token.
    #[test]
    fn extreme_settings_and_readings_saturate(
        rate in prop_oneof![Just(1e-9), Just(0.001), Just(MAX_RATE), Just(f64::MAX), Just(f64::NAN), Just(-1.0), 0.001..MAX_RATE],
        burst in prop_oneof![Just(0u64), Just(MAX_BURST), Just(u64::MAX), 1..MAX_BURST],
        nows in proptest::collection::vec(prop_oneof![Just(u64::MAX), Just(1u64 << 62), any::<u64>(), 0..1_000_000_000u64], 1..20),
    ) {
        let bucket = TokenBucket::new(rate, burst);
        let limit = bucket.tokens(0);
        prop_assert!(!bucket.is_limited() || bucket.try_take(0));
        for now in nows {
            let _ = bucket.try_take(now);
            let tokens = bucket.tokens(now);
            prop_assert!(!bucket.is_limited() || tokens <= limit, "{} > {}", tokens, limit);
            let fill = bucket.fill(now);
            prop_assert!((0.0..=1.0).contains(&fill), "fill {}", fill);
            bucket.refund();
            bucket.set(rate, burst, now);
        }
    }
}
