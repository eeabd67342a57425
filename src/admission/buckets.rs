//! The four tiers' token buckets and the borrowing chain between them.

use quanta::{Clock, Instant};

use crate::admission::{BucketsConfig, TokenBucket};
use crate::loom::{AtomicBool, AtomicU16, Ordering};
use crate::Criticality;

/// What a granted token was taken from, so it can be given back if the message is refused
/// later for another reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// The tier has no bucket: nothing was taken.
    Unlimited,
    /// From the tier's own bucket.
    Own(Criticality),
    /// From a lender's bucket, the tier's own being empty.
    Borrowed(Criticality),
}

/// Per-tier token buckets with borrowing (seed 003, "Admission Control: The Token Bucket with
/// Priority Tiers"; its sketch lets CRITICAL borrow from STANDARD when its own bucket is
/// empty).
///
/// Each tier with a bucket is admitted at most at its rate (plus its burst after a quiet
/// spell); when its bucket is empty it tries its lenders in the configured order (default:
/// Critical borrows from High). A tier without a bucket is not limited and never borrows.
/// Lock-free and allocation-free: a token is one compare-and-swap on the bucket's theoretical
/// arrival time ([`TokenBucket`]; only a live [`apply`](TierBuckets::apply) makes a take wait,
/// for a few instructions), time comes from the injectable clock, and without any bucket
/// configured [`try_acquire`](TierBuckets::try_acquire) is one atomic load and reads no clock.
///
/// # Where a pull-based consumer checks it
///
/// At intake, before the queue: after expiry at intake and the pull-based shed level, the
/// bucket is the last check before the queue push (so no token is spent on a message refused
/// anyway; one spent on a message the queue then refuses is refunded). A refusal is reason
/// `rate` and goes to the tier's refusal policy: Drop settles it `Shed`, Defer re-publishes it,
/// Backpressure holds it in the intake and offers it again as tokens refill. So for Critical
/// (Backpressure by default) a refusal paces it to its rate (plus what it borrows) and never
/// loses it; the broker is the buffer. A held message takes a token each time it is offered,
/// so a held tier is admitted at exactly its rate.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::admission::{BucketConfig, BucketsConfig, TierBuckets};
/// use triage::Criticality::{Critical, High};
///
/// let bucket = |burst| BucketConfig { rate: Some(10.0), burst: Some(burst), ..BucketConfig::default() };
/// let config = BucketsConfig {
///     critical: Some(bucket(1)),
///     high: Some(bucket(2)),
///     ..BucketsConfig::default()
/// };
/// let (clock, mock) = triage::quanta::Clock::mock();
/// let buckets = TierBuckets::new(&config, clock);
/// assert!(buckets.try_acquire(Critical).is_some()); // its own token
/// assert!(buckets.try_acquire(Critical).is_some()); // borrowed from High
/// assert!(buckets.try_acquire(High).is_some()); // High's last token
/// assert!(buckets.try_acquire(High).is_none()); // High never borrows
/// assert!(buckets.try_acquire(Critical).is_none());
/// mock.increment(Duration::from_millis(100)); // one token each refilled
/// assert!(buckets.try_acquire(High).is_some());
/// assert_eq!(buckets.fill(High), 0.0);
/// assert_eq!(buckets.fill(Critical), 1.0);
/// ```
#[derive(Debug)]
pub struct TierBuckets {
    buckets: [TokenBucket; 4],
    /// Per tier (rank), up to three lenders' ranks, 4 bits each, first in the lowest bits;
    /// 0xF ends the list.
    lenders: [AtomicU16; 4],
    any: AtomicBool,
    clock: Clock,
    origin: Instant,
}

const NO_LENDER: u16 = 0xF;

fn pack(lenders: &[Criticality]) -> u16 {
    let mut packed = 0xFFFF;
    for (i, l) in lenders.iter().take(3).enumerate() {
        packed &= !(0xF << (4 * i));
        packed |= (l.rank() as u16) << (4 * i);
    }
    packed
}

impl TierBuckets {
    /// Buckets from `config` (validated by the caller: see [`BucketsConfig::validate`]), full,
    /// reading time from `clock`.
    pub fn new(config: &BucketsConfig, clock: Clock) -> Self {
        let buckets = TierBuckets {
            buckets: Default::default(),
            lenders: Default::default(),
            any: AtomicBool::new(false),
            origin: clock.now(),
            clock,
        };
        buckets.apply(config);
        buckets
    }

    /// Applies new settings to the running buckets (live reconfiguration): rates, bursts and
    /// the borrowing chain. Each bucket keeps its fill ratio; a tier whose bucket is removed
    /// is no longer limited, one that gains a bucket starts full. The config must be
    /// validated first.
    pub fn apply(&self, config: &BucketsConfig) {
        let now = self.now_ns();
        for tier in Criticality::ALL {
            let bucket = &self.buckets[tier.rank()];
            // `set` keeps the fill, and a tier without a bucket reads as full: a new bucket
            // starts full.
            match (config.rate(tier), config.burst(tier)) {
                (Some(rate), Some(burst)) => bucket.set(rate, burst, now),
                _ => bucket.set(0.0, 1, now),
            }
            self.lenders[tier.rank()].store(pack(config.borrow.lenders(tier)), Ordering::Relaxed);
        }
        self.any.store(config.any(), Ordering::Release);
    }

    /// Nanoseconds since this set's origin, on its clock.
    fn now_ns(&self) -> u64 {
        self.clock
            .now()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }

    /// Takes a token for one message of `tier`: from its own bucket, else from its lenders in
    /// order. `None` when the tier is rate-limited and neither its bucket nor a lender has a
    /// token: refuse the message with reason `rate`.
    pub fn try_acquire(&self, tier: Criticality) -> Option<Grant> {
        if !self.any.load(Ordering::Acquire) {
            return Some(Grant::Unlimited);
        }
        let own = &self.buckets[tier.rank()];
        if !own.is_limited() {
            return Some(Grant::Unlimited);
        }
        let now = self.now_ns();
        if own.try_take(now) {
            return Some(Grant::Own(tier));
        }
        let mut lenders = self.lenders[tier.rank()].load(Ordering::Relaxed);
        for _ in 0..3 {
            let rank = lenders & 0xF;
            if rank == NO_LENDER {
                break;
            }
            lenders >>= 4;
            let Some(lender) = Criticality::from_rank(rank as usize) else {
                break;
            };
            let bucket = &self.buckets[lender.rank()];
            // A lender without a bucket lends nothing: unlimited is not a pool to draw on.
            if bucket.is_limited() && bucket.try_take(now) {
                return Some(Grant::Borrowed(lender));
            }
        }
        None
    }

    /// Gives back a token that was not used.
    pub fn refund(&self, grant: Grant) {
        match grant {
            Grant::Unlimited => {}
            Grant::Own(t) | Grant::Borrowed(t) => self.buckets[t.rank()].refund(),
        }
    }

    /// The fill ratio of `tier`'s bucket now, `0.0..=1.0` (1.0 for a tier without a bucket).
    pub fn fill(&self, tier: Criticality) -> f64 {
        self.buckets[tier.rank()].fill(self.now_ns())
    }

    /// Whole tokens in `tier`'s bucket now, at most its burst (`u64::MAX` for a tier without a
    /// bucket). Concurrent takes and reconfigurations never make it wrap: a take at a later
    /// instant than this call's clock reading leaves it reading 0.
    pub fn tokens(&self, tier: Criticality) -> u64 {
        self.buckets[tier.rank()].tokens(self.now_ns())
    }

    /// Whether `tier` has a bucket.
    pub fn is_limited(&self, tier: Criticality) -> bool {
        self.buckets[tier.rank()].is_limited()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::admission::{BorrowChain, BucketConfig};
    use Criticality::*;

    /// A tier limited to R/s, offered far more than R (a message every millisecond of virtual
    /// time), admits its burst and then R per second, within one message, over 10 s.
    #[test]
    fn admits_the_rate_within_one_message_over_ten_virtual_seconds() {
        for (rate, burst) in [(100.0, 1u64), (250.0, 50), (37.0, 10), (999.0, 2)] {
            let config = BucketsConfig {
                medium: Some(BucketConfig {
                    rate: Some(rate),
                    burst: Some(burst),
                    ..BucketConfig::default()
                }),
                ..BucketsConfig::default()
            };
            config.validate().unwrap();
            let (clock, mock) = Clock::mock();
            let buckets = TierBuckets::new(&config, clock);
            let mut admitted = 0u64;
            let mut per_second = Vec::new();
            let mut this_second = 0u64;
            for ms in 0..10_000u64 {
                if ms > 0 && ms % 1000 == 0 {
                    per_second.push(this_second);
                    this_second = 0;
                }
                for _ in 0..10 {
                    if buckets.try_acquire(Medium).is_some() {
                        admitted += 1;
                        this_second += 1;
                    }
                }
                mock.increment(Duration::from_millis(1));
            }
            per_second.push(this_second);
            // Offered over [0, 10 s): the burst at t=0, then one per 1/R s.
            let expected = burst as f64 + rate * 10.0 - 1.0;
            assert!(
                (admitted as f64 - expected).abs() <= 1.0,
                "rate {rate} burst {burst}: admitted {admitted}, expected {expected}"
            );
            // After the first second (which includes the burst) every second admits R ± 1.
            for (s, n) in per_second.iter().enumerate().skip(1) {
                assert!(
                    (*n as f64 - rate).abs() <= 1.0,
                    "rate {rate}: second {s} admitted {n}"
                );
            }
        }
    }

    #[test]
    fn critical_borrows_from_high_and_high_does_not_borrow() {
        let config = BucketsConfig {
            critical: Some(BucketConfig {
                rate: Some(10.0),
                burst: Some(2),
                ..BucketConfig::default()
            }),
            high: Some(BucketConfig {
                rate: Some(10.0),
                burst: Some(3),
                ..BucketConfig::default()
            }),
            medium: Some(BucketConfig {
                rate: Some(10.0),
                burst: Some(5),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        };
        let (clock, _mock) = Clock::mock();
        let b = TierBuckets::new(&config, clock);
        assert_eq!(b.try_acquire(Critical), Some(Grant::Own(Critical)));
        assert_eq!(b.try_acquire(Critical), Some(Grant::Own(Critical)));
        assert_eq!(b.tokens(Critical), 0);
        // Its own empty: from High, leaving High with what is left.
        assert_eq!(b.try_acquire(Critical), Some(Grant::Borrowed(High)));
        assert_eq!(b.tokens(High), 2);
        assert_eq!(b.try_acquire(High), Some(Grant::Own(High)));
        assert_eq!(b.try_acquire(Critical), Some(Grant::Borrowed(High)));
        assert_eq!(b.tokens(High), 0);
        // Both empty: Critical refused (it does not borrow from Medium by default) and High
        // refused though Medium has tokens: High does not borrow.
        assert_eq!(b.try_acquire(Critical), None);
        assert_eq!(b.try_acquire(High), None);
        assert_eq!(b.tokens(Medium), 5);
        // The fill gauges match the buckets.
        assert_eq!(b.fill(Critical), 0.0);
        assert_eq!(b.fill(High), 0.0);
        assert_eq!(b.fill(Medium), 1.0);
        assert_eq!(b.fill(Sheddable), 1.0);
        b.try_acquire(Medium).unwrap();
        assert!((b.fill(Medium) - 0.8).abs() < 1e-9);
    }

    #[test]
    fn a_configured_chain_is_followed_in_order_and_can_be_turned_off() {
        let mut config = BucketsConfig {
            critical: Some(BucketConfig {
                rate: Some(1.0),
                burst: Some(1),
                ..BucketConfig::default()
            }),
            high: Some(BucketConfig {
                rate: Some(1.0),
                burst: Some(1),
                ..BucketConfig::default()
            }),
            medium: Some(BucketConfig {
                rate: Some(1.0),
                burst: Some(1),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        };
        config.borrow.critical = vec![Medium, High];
        config.validate().unwrap();
        let (clock, _mock) = Clock::mock();
        let b = TierBuckets::new(&config, clock);
        assert_eq!(b.try_acquire(Critical), Some(Grant::Own(Critical)));
        assert_eq!(b.try_acquire(Critical), Some(Grant::Borrowed(Medium)));
        assert_eq!(b.try_acquire(Critical), Some(Grant::Borrowed(High)));
        assert_eq!(b.try_acquire(Critical), None);
        config.borrow = BorrowChain::none();
        config.validate().unwrap();
        let (clock, _mock) = Clock::mock();
        let b = TierBuckets::new(&config, clock);
        assert!(b.try_acquire(Critical).is_some());
        assert_eq!(b.try_acquire(Critical), None);
        assert_eq!(b.tokens(High), 1);
    }

    #[test]
    fn unlimited_tiers_and_refunds() {
        let config = BucketsConfig {
            high: Some(BucketConfig {
                rate: Some(1.0),
                burst: Some(1),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        };
        let (clock, _mock) = Clock::mock();
        let b = TierBuckets::new(&config, clock);
        // Critical has no bucket: unlimited, and it never drains its lender.
        for _ in 0..100 {
            assert_eq!(b.try_acquire(Critical), Some(Grant::Unlimited));
        }
        let g = b.try_acquire(High).unwrap();
        assert_eq!(b.try_acquire(High), None);
        b.refund(g);
        assert_eq!(b.try_acquire(High), Some(Grant::Own(High)));
        let off = TierBuckets::new(&BucketsConfig::default(), Clock::mock().0);
        assert_eq!(off.try_acquire(Sheddable), Some(Grant::Unlimited));
    }

    #[test]
    fn apply_changes_rates_live() {
        let (clock, mock) = Clock::mock();
        let config = BucketsConfig {
            sheddable: Some(BucketConfig {
                rate: Some(10.0),
                burst: Some(10),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        };
        let b = TierBuckets::new(&config, clock);
        for _ in 0..10 {
            b.try_acquire(Sheddable).unwrap();
        }
        assert_eq!(b.try_acquire(Sheddable), None);
        b.apply(&BucketsConfig {
            sheddable: Some(BucketConfig {
                rate: Some(100.0),
                burst: Some(10),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        });
        mock.increment(Duration::from_millis(10));
        assert_eq!(b.tokens(Sheddable), 1);
        b.apply(&BucketsConfig::default());
        assert_eq!(b.try_acquire(Sheddable), Some(Grant::Unlimited));
    }

    #[test]
    fn validation_names_the_field() {
        let c = BucketsConfig {
            high: Some(BucketConfig {
                rate: Some(0.0),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field(), "high.rate");
        let c = BucketsConfig {
            high: Some(BucketConfig {
                rate: Some(1.0),
                burst: Some(0),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field(), "high.burst");
        let mut c = BucketsConfig::default();
        c.borrow.high = vec![Critical];
        let e = c.validate().unwrap_err();
        assert_eq!(e.field(), "borrow.high");
        assert!(e.to_string().contains("medium, sheddable"), "{e}");
        let c: Result<BucketsConfig, _> = toml::from_str("critical = { rate = 1.0, share = 0.5 }");
        assert_eq!(c.unwrap().validate().unwrap_err().field(), "critical.share");
        let c: BucketsConfig = toml::from_str("capacity = 0.0").unwrap();
        assert_eq!(c.validate().unwrap_err().field(), "capacity");
        let c: BucketsConfig = toml::from_str("[borrow]\n").unwrap();
        assert!(c.borrow.critical.is_empty());
    }
}
