//! Priority-scaled concurrency shares: each tier may use only a fraction of the
//! concurrency limit, so that as load rises the least important work is refused
//! slots first and the headroom that remains belongs to the more important
//! tiers. After the article "Load Shedding: drop low-priority work to save the
//! rest" (priority-scaled concurrency shares).
//!
//! With the defaults and a limit of 100, a Sheddable job may start only while
//! fewer than 50 jobs (of any tier) are running, a Medium one below 75, High
//! below 90, and Critical below 100. The shares bound *admission*, not
//! occupancy: they do not reserve slots, they stop lower tiers from filling the
//! last ones.
//!
//! Every tier gets at least one slot whenever the limit is at least 1. Without
//! that floor a worker running at limit 1 (a fixed limit of 1 for ordered
//! processing, or an adaptive limit at its minimum) would never run Sheddable
//! work at all, not even when idle, and its consumer would stall. The price is
//! that tier separation fades at very small limits; ordering between tiers is
//! then the queue's job, and refusing lower tiers the admission controller's.

use serde::{Deserialize, Serialize};

use super::error::LimitConfigError;
use crate::Criticality;

/// Fixed-point scale of a share: 32 fractional bits.
const ONE: u64 = 1 << 32;

/// Per-tier fractions of the concurrency limit (priority-scaled concurrency
/// shares, after "Load Shedding: drop low-priority work to save the rest"):
/// a `tier` job may start only while fewer than
/// [`allowed(limit, tier)`](Self::allowed) jobs of any tier are in flight, so
/// lower tiers are refused the last slots first. Shares bound admission; they
/// do not reserve slots.
///
/// Every tier gets at least one slot whenever the limit is at least 1, so a
/// worker at limit 1 (ordered processing, or an adaptive limit at its minimum)
/// still runs Sheddable work when idle instead of stalling its consumer; at
/// very small limits tier separation is then left to the queue and admission.
///
/// Validated on construction and on deserialisation, so every value of this
/// type is valid.
///
/// Serialised as `{ critical = 1.0, high = 0.9, medium = 0.75, sheddable = 0.5 }`;
/// missing fields take their defaults.
///
/// # Example
///
/// ```
/// use triage::Criticality;
/// use triage::limit::TierShares;
///
/// let shares = TierShares::default();
/// assert_eq!(shares.allowed(100, Criticality::High), 90);
/// assert_eq!(shares.allowed(1, Criticality::Sheddable), 1);
/// let err = TierShares::new(1.0, 0.9, 0.95, 0.5).unwrap_err();
/// assert_eq!(err.field, "shares.medium");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "SharesConfig", into = "SharesConfig")]
pub struct TierShares {
    /// Indexed by `Criticality::rank()`.
    shares: [f64; 4],
    /// `⌈share × 2³²⌉`, indexed by rank. Rounding up makes decimal shares such as
    /// 0.9 or 0.3, which `f64` stores slightly low, floor to the exact decimal
    /// product (`100 × 0.9 = 90`, not 89) for any limit up to `MAX_LIMIT`.
    fixed: [u64; 4],
}

impl Default for TierShares {
    fn default() -> Self {
        Self::from_valid(SharesConfig::default())
    }
}

impl TierShares {
    /// Shares for each tier, as fractions of the limit.
    ///
    /// # Errors
    ///
    /// [`LimitConfigError`] naming `shares.<tier>` if a share is outside
    /// `(0, 1]`, or is larger than the share of the tier above it (shares must
    /// not increase from Critical down to Sheddable).
    pub fn new(
        critical: f64,
        high: f64,
        medium: f64,
        sheddable: f64,
    ) -> Result<Self, LimitConfigError> {
        Self::try_from(SharesConfig {
            critical,
            high,
            medium,
            sheddable,
        })
    }

    fn from_valid(c: SharesConfig) -> Self {
        let mut shares = [0.0; 4];
        shares[Criticality::Critical.rank()] = c.critical;
        shares[Criticality::High.rank()] = c.high;
        shares[Criticality::Medium.rank()] = c.medium;
        shares[Criticality::Sheddable.rank()] = c.sheddable;
        // Shares are in (0, 1], so the product is in (0, 2³²] and fits a u64 exactly.
        let fixed = shares.map(|s| (s * ONE as f64).ceil() as u64);
        Self { shares, fixed }
    }

    /// The fraction of the limit that `tier` may use, in `(0, 1]`.
    pub fn share(&self, tier: Criticality) -> f64 {
        self.shares[tier.rank()]
    }

    /// How many jobs may be in flight, across all tiers, for a `tier` job to
    /// start: `max(1, ⌊limit × share⌋)`, or 0 when `limit` is 0. Never above
    /// `limit`. Integer arithmetic only.
    pub fn allowed(&self, limit: usize, tier: Criticality) -> usize {
        allowed_fixed(limit, self.fixed[tier.rank()])
    }

    /// The shares in fixed point (`⌈share × 2³²⌉`), indexed by rank: what
    /// [`ConcurrencyLimit`](super::ConcurrencyLimit) keeps in atomics so that a live
    /// reconfiguration can swap them without a lock on the admission path.
    pub(crate) fn fixed(&self) -> [u64; 4] {
        self.fixed
    }
}

/// [`TierShares::allowed`] for one share in fixed point (see [`TierShares::fixed`]).
pub(crate) fn allowed_fixed(limit: usize, fixed: u64) -> usize {
    if limit == 0 {
        return 0;
    }
    let scaled = (limit as u128 * u128::from(fixed)) >> 32;
    // share ≤ 1, so scaled ≤ limit and fits in usize.
    (scaled as usize).clamp(1, limit)
}

/// Serialised form of [`TierShares`]; not public because `TierShares` is what
/// callers hold and it cannot be invalid.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SharesConfig {
    /// Default 1.0: Critical work may use the whole limit.
    critical: f64,
    /// Default 0.9.
    high: f64,
    /// Default 0.75.
    medium: f64,
    /// Default 0.5: Sheddable work stops once half the limit is in use.
    sheddable: f64,
}

impl Default for SharesConfig {
    fn default() -> Self {
        Self {
            critical: 1.0,
            high: 0.9,
            medium: 0.75,
            sheddable: 0.5,
        }
    }
}

impl From<TierShares> for SharesConfig {
    fn from(s: TierShares) -> Self {
        Self {
            critical: s.share(Criticality::Critical),
            high: s.share(Criticality::High),
            medium: s.share(Criticality::Medium),
            sheddable: s.share(Criticality::Sheddable),
        }
    }
}

impl TryFrom<SharesConfig> for TierShares {
    type Error = LimitConfigError;

    fn try_from(c: SharesConfig) -> Result<Self, Self::Error> {
        let ordered = [
            ("shares.critical", c.critical),
            ("shares.high", c.high),
            ("shares.medium", c.medium),
            ("shares.sheddable", c.sheddable),
        ];
        let mut ceiling = ("", 1.0);
        for (field, share) in ordered {
            // Negated conjunction so that NaN is rejected too.
            if !(share > 0.0 && share <= ceiling.1) {
                let allowed = if ceiling.0.is_empty() {
                    "(0, 1]".to_owned()
                } else {
                    format!("(0, {} ({})]", ceiling.1, ceiling.0)
                };
                return Err(LimitConfigError::new(field, share, allowed));
            }
            ceiling = (field, share);
        }
        Ok(Self::from_valid(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Criticality::*;

    #[test]
    fn defaults() {
        let s = TierShares::default();
        assert_eq!(s.allowed(100, Critical), 100);
        assert_eq!(s.allowed(100, High), 90);
        assert_eq!(s.allowed(100, Medium), 75);
        assert_eq!(s.allowed(100, Sheddable), 50);
        assert_eq!(s.allowed(8, High), 7);
        assert_eq!(s.allowed(8, Medium), 6);
        assert_eq!(s.allowed(8, Sheddable), 4);
        assert_eq!(s.share(High), 0.9);
    }

    #[test]
    fn floor_of_one_and_zero_limit() {
        let s = TierShares::default();
        for tier in Criticality::ALL {
            assert_eq!(s.allowed(1, tier), 1);
            assert_eq!(s.allowed(0, tier), 0);
        }
        assert_eq!(s.allowed(3, Sheddable), 1);
        let tiny = TierShares::new(1.0, 0.01, 0.01, 0.001).unwrap();
        assert_eq!(tiny.allowed(50, Sheddable), 1);
    }

    #[test]
    fn decimal_shares_floor_exactly() {
        // 0.3 and 0.7 are stored below their decimal value; f64 flooring would
        // give 2 and 6 here.
        let s = TierShares::new(1.0, 0.7, 0.3, 0.3).unwrap();
        assert_eq!(s.allowed(10, High), 7);
        assert_eq!(s.allowed(10, Medium), 3);
        for limit in 1..=100_000usize {
            let exact_high = limit * 7 / 10;
            assert_eq!(s.allowed(limit, High), exact_high.max(1), "limit {limit}");
            assert_eq!(s.allowed(limit, Critical), limit);
        }
        assert_eq!(
            TierShares::default().allowed(usize::MAX, Critical),
            usize::MAX
        );
    }

    #[test]
    fn rejects_invalid_with_field_named() {
        let e = TierShares::new(1.5, 0.9, 0.75, 0.5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "shares.critical = 1.5 is out of range: allowed (0, 1]"
        );
        let e = TierShares::new(0.8, 0.9, 0.75, 0.5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "shares.high = 0.9 is out of range: allowed (0, 0.8 (shares.critical)]"
        );
        let e = TierShares::new(1.0, 0.9, 0.75, 0.0).unwrap_err();
        assert_eq!(e.field, "shares.sheddable");
        let e = TierShares::new(1.0, 0.9, f64::NAN, 0.5).unwrap_err();
        assert_eq!(e.field, "shares.medium");
        assert!(TierShares::new(0.5, 0.5, 0.5, 0.5).is_ok());
    }
}
