//! Configuration of the per-tier token buckets.

use serde::{Deserialize, Serialize};

use crate::{ConfigError, Criticality};

/// Largest rate accepted, in messages per second (ten million: beyond any single consumer).
pub const MAX_RATE: f64 = 10_000_000.0;

/// Largest burst accepted, in messages.
pub const MAX_BURST: u64 = 10_000_000;

/// One tier's token bucket: a steady rate and a burst.
///
/// The rate is given either in messages per second (`rate`) or as a fraction of
/// [`BucketsConfig::capacity`] (`share`), exactly one of the two.
///
/// Plain public fields, built with struct-update syntax over [`Default`] (no rate, no share,
/// the default burst): `BucketConfig { rate: Some(10.0), ..BucketConfig::default() }`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Tokens added per second, in messages per second. Allowed `0.001..=10_000_000`. Give
    /// either `rate` or `share`.
    pub rate: Option<f64>,
    /// The rate as a fraction of [`BucketsConfig::capacity`] (seed 003 reserves 50 / 40 / 10 %
    /// of a system capacity). Allowed `0.0 < share <= 1.0`; needs `buckets.capacity`. Give
    /// either `rate` or `share`.
    pub share: Option<f64>,
    /// The most tokens the bucket holds, in messages: how many may be admitted at once after
    /// a quiet spell. Allowed `1..=10_000_000`. Default: one second of the rate, rounded up
    /// (seed 003's buckets refill over one second).
    pub burst: Option<u64>,
}

/// Per-tier token buckets (seed 003, "Admission Control: The Token Bucket with Priority
/// Tiers"): steady-state admission where each tier is admitted at most at its rate, with a
/// burst, and a tier whose bucket is empty may take a token from the tiers it is configured to
/// borrow from. A message refused by its bucket is refused with reason `rate` and goes to its
/// tier's refusal policy.
///
/// Off by default: a tier without a bucket is not rate-limited.
///
/// ```toml
/// [buckets]
/// capacity = 2600.0              # messages/s: what `share` is a fraction of
/// critical = { share = 0.5 }     # 1,300/s, burst 1,300
/// high = { rate = 1000.0, burst = 200 }
/// sheddable = { share = 0.1 }
/// [buckets.borrow]
/// critical = ["high"]            # the default chain
/// ```
///
/// # Examples
///
/// ```
/// use triage::admission::BucketsConfig;
/// use triage::Criticality;
///
/// let config: BucketsConfig = toml::from_str(
///     "capacity = 1000.0\nhigh = { share = 0.4 }\nmedium = { rate = 50.0, burst = 5 }\n",
/// )?;
/// config.validate()?;
/// assert_eq!(config.rate(Criticality::High), Some(400.0));
/// assert_eq!(config.burst(Criticality::Medium), Some(5));
/// assert_eq!(config.rate(Criticality::Critical), None); // not rate-limited
///
/// let bad: BucketsConfig = toml::from_str("high = { share = 0.4 }")?;
/// assert_eq!(bad.validate().unwrap_err().field(), "high.share");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BucketsConfig {
    /// The capacity figure `share` refers to, in messages per second (for example the
    /// measured capacity of the worker). Allowed `0.001..=10_000_000`. Default none (then every
    /// bucket gives `rate`).
    pub capacity: Option<f64>,
    /// Critical's bucket. Default none (not rate-limited).
    pub critical: Option<BucketConfig>,
    /// High's bucket. Default none.
    pub high: Option<BucketConfig>,
    /// Medium's bucket. Default none.
    pub medium: Option<BucketConfig>,
    /// Sheddable's bucket. Default none.
    pub sheddable: Option<BucketConfig>,
    /// The tiers each tier may borrow a token from, tried in order, when its own bucket is
    /// empty. A tier may borrow only from tiers below it (borrowing upward would let a lower
    /// tier spend what a higher one was promised), each at most once. A lender without a
    /// bucket lends nothing; a tier without a bucket never needs to borrow. Default: Critical
    /// borrows from High; nothing else borrows (seed 003). Giving the table replaces the
    /// default chain: `[buckets.borrow]` with no keys turns borrowing off.
    pub borrow: BorrowChain,
}

/// Whom each tier may borrow from, in order. See [`BucketsConfig::borrow`].
///
/// A key left out of a `[buckets.borrow]` table means no lenders for that tier (the default
/// chain applies only when the whole table is left out).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BorrowChain {
    /// Critical's lenders. Default `["high"]`.
    #[serde(default)]
    pub critical: Vec<Criticality>,
    /// High's lenders. Default none.
    #[serde(default)]
    pub high: Vec<Criticality>,
    /// Medium's lenders. Default none.
    #[serde(default)]
    pub medium: Vec<Criticality>,
    /// Sheddable's lenders: always none (nothing is below it).
    #[serde(default)]
    pub sheddable: Vec<Criticality>,
}

impl Default for BorrowChain {
    fn default() -> Self {
        BorrowChain {
            critical: vec![Criticality::High],
            high: Vec::new(),
            medium: Vec::new(),
            sheddable: Vec::new(),
        }
    }
}

impl BorrowChain {
    /// No tier borrows.
    pub fn none() -> Self {
        BorrowChain {
            critical: Vec::new(),
            ..BorrowChain::default()
        }
    }

    /// The lenders of `tier`, in the order they are tried.
    pub fn lenders(&self, tier: Criticality) -> &[Criticality] {
        match tier {
            Criticality::Critical => &self.critical,
            Criticality::High => &self.high,
            Criticality::Medium => &self.medium,
            Criticality::Sheddable => &self.sheddable,
        }
    }
}

impl BucketsConfig {
    /// The bucket of `tier`, if it has one.
    pub fn bucket(&self, tier: Criticality) -> Option<&BucketConfig> {
        match tier {
            Criticality::Critical => self.critical.as_ref(),
            Criticality::High => self.high.as_ref(),
            Criticality::Medium => self.medium.as_ref(),
            Criticality::Sheddable => self.sheddable.as_ref(),
        }
    }

    /// Whether any tier is rate-limited.
    pub fn any(&self) -> bool {
        Criticality::ALL.iter().any(|&t| self.bucket(t).is_some())
    }

    /// The rate of `tier`'s bucket, messages per second (`rate`, or `share × capacity`);
    /// `None` without a bucket (or, before validation, without a usable rate).
    pub fn rate(&self, tier: Criticality) -> Option<f64> {
        let b = self.bucket(tier)?;
        match (b.rate, b.share) {
            (Some(rate), _) => Some(rate),
            (None, Some(share)) => self.capacity.map(|c| share * c),
            (None, None) => None,
        }
    }

    /// The burst of `tier`'s bucket in messages: `burst`, or one second of its rate rounded
    /// up (at least 1); `None` without a bucket.
    pub fn burst(&self, tier: Criticality) -> Option<u64> {
        let b = self.bucket(tier)?;
        match b.burst {
            Some(burst) => Some(burst),
            None => self.rate(tier).map(|r| (r.ceil() as u64).max(1)),
        }
    }

    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range (paths relative to this table,
    /// e.g. `high.rate`, `borrow.critical`): a rate, share, burst or capacity out of range,
    /// both or neither of `rate` and `share`, a `share` without `capacity`, or a tier
    /// borrowing from itself, from a tier above it, or from the same tier twice.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(c) = self.capacity {
            if !(0.001..=MAX_RATE).contains(&c) {
                return Err(ConfigError::new("capacity", c, "0.001..=10000000"));
            }
        }
        for tier in Criticality::ALL {
            let Some(b) = self.bucket(tier) else {
                continue;
            };
            match (b.rate, b.share) {
                (Some(rate), None) => {
                    if !(0.001..=MAX_RATE).contains(&rate) {
                        return Err(ConfigError::new(
                            format!("{tier}.rate"),
                            rate,
                            "0.001..=10000000 (messages per second)",
                        ));
                    }
                }
                (None, Some(share)) => {
                    if !(share > 0.0 && share <= 1.0) {
                        return Err(ConfigError::new(
                            format!("{tier}.share"),
                            share,
                            "0.0 < share <= 1.0",
                        ));
                    }
                    if self.capacity.is_none() {
                        return Err(ConfigError::new(
                            format!("{tier}.share"),
                            share,
                            "only with buckets.capacity set (a share of that rate, messages per second)",
                        ));
                    }
                    // A share of a tiny capacity could fall below the smallest rate.
                    let rate = self.rate(tier).unwrap_or(0.0);
                    if rate < 0.001 {
                        return Err(ConfigError::new(
                            format!("{tier}.share"),
                            share,
                            "a share giving at least 0.001 messages per second",
                        ));
                    }
                }
                (Some(_), Some(share)) => {
                    return Err(ConfigError::new(
                        format!("{tier}.share"),
                        share,
                        "absent when rate is given (one of rate or share)",
                    ));
                }
                (None, None) => {
                    return Err(ConfigError::new(
                        format!("{tier}.rate"),
                        "none",
                        "0.001..=10000000 (messages per second), or a share",
                    ));
                }
            }
            if let Some(burst) = b.burst {
                if !(1..=MAX_BURST).contains(&burst) {
                    return Err(ConfigError::new(
                        format!("{tier}.burst"),
                        burst,
                        "1..=10000000 (messages)",
                    ));
                }
            }
        }
        for tier in Criticality::ALL {
            let lenders = self.borrow.lenders(tier);
            for (i, lender) in lenders.iter().enumerate() {
                if lender.rank() >= tier.rank() || lenders[..i].contains(lender) {
                    let allowed: Vec<&str> = Criticality::ALL
                        .iter()
                        .filter(|t| t.rank() < tier.rank())
                        .map(|t| t.as_str())
                        .collect();
                    return Err(ConfigError::new(
                        format!("borrow.{tier}"),
                        lender,
                        format!("tiers below {tier}, each once: [{}]", allowed.join(", ")),
                    ));
                }
            }
        }
        Ok(())
    }
}
