//! Goodput per tier: completions within deadline over what was offered.

use triage::{Criticality, PerTier};

/// The weights of the weighted total, Critical first (the queue's default weights).
pub const WEIGHTS: [u64; 4] = [8, 4, 2, 1];

/// One tier's figures over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierRow {
    /// Messages offered (re-submissions not counted again).
    pub offered: u64,
    /// Completed within their deadline.
    pub goodput: u64,
    /// Completed after it.
    pub late: u64,
}

impl TierRow {
    /// Goodput over offered (1 when nothing was offered).
    pub fn share(&self) -> f64 {
        if self.offered == 0 {
            1.0
        } else {
            self.goodput as f64 / self.offered as f64
        }
    }
}

/// Per-tier goodput of one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Goodput {
    /// Per tier.
    pub tiers: PerTier<TierRow>,
}

impl Goodput {
    /// A tier's goodput share.
    pub fn share(&self, tier: Criticality) -> f64 {
        self.tiers[tier].share()
    }

    /// The weighted total: sum of weight x goodput over sum of weight x offered, weights
    /// 8 / 4 / 2 / 1.
    pub fn weighted(&self) -> f64 {
        let (mut num, mut den) = (0u64, 0u64);
        for (i, tier) in Criticality::ALL.iter().enumerate() {
            let r = self.tiers[*tier];
            num += WEIGHTS[i] * r.goodput;
            den += WEIGHTS[i] * r.offered;
        }
        if den == 0 {
            1.0
        } else {
            num as f64 / den as f64
        }
    }

    /// The order of the grid search: Critical's goodput first, then the weighted total.
    pub fn better_than(&self, other: &Goodput) -> bool {
        let (a, b) = (
            self.share(Criticality::Critical),
            other.share(Criticality::Critical),
        );
        a > b || (a == b && self.weighted() > other.weighted())
    }
}
