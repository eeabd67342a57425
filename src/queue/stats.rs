//! Counters kept by the queue, and the snapshot it reports.

use std::fmt;

use crate::queue::RefuseReason;
use crate::{Criticality, PerTier};

/// Counters of one tier. Counters only increase; depth is derived from them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Push attempts, refused ones included.
    pub pushed: u64,
    /// Items handed out ready to serve.
    pub popped: u64,
    /// Items handed back because their deadline had passed: at dequeue, or discarded by a
    /// push into a full queue (as [`Removed::Expired`](crate::queue::Removed::Expired)).
    pub expired: u64,
    /// Items evicted to make room for a more critical one, or by a capacity shrink.
    pub evicted: u64,
    /// Refused pushes, by [`RefuseReason`] (`overloaded`, `full`, `too_large`, `closed`).
    pub refused: [u64; 4],
    /// Items handed back unserved at the caller's request: by
    /// [`WfqQueue::close`](crate::queue::WfqQueue::close) or
    /// [`WfqQueue::drain_where`](crate::queue::WfqQueue::drain_where).
    pub drained: u64,
    /// Items held now.
    pub depth: u64,
    /// Bytes held now (sum of `size_bytes`), saturating at `u64::MAX` (sizes held without a
    /// byte budget may add up past it).
    pub bytes: u64,
}

impl TierStats {
    /// Refusals for `reason`.
    pub fn refused_for(&self, reason: RefuseReason) -> u64 {
        self.refused[reason.index()]
    }

    /// All refusals.
    pub fn refused_total(&self) -> u64 {
        self.refused.iter().sum()
    }

    /// Whether `pushed = popped + expired + evicted + refused + drained + depth`: every push
    /// attempt is accounted for exactly once.
    pub fn balances(&self) -> bool {
        self.pushed
            == self.popped
                + self.expired
                + self.evicted
                + self.refused_total()
                + self.drained
                + self.depth
    }
}

/// A snapshot of the queue's counters, per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Counters per tier.
    pub tiers: PerTier<TierStats>,
    /// Current shed level of queue-age admission: tiers with `rank() < shed_level` are refused.
    pub shed_level: u8,
}

impl QueueStats {
    /// The counters of `tier`.
    pub fn tier(&self, tier: Criticality) -> &TierStats {
        &self.tiers[tier]
    }

    /// Items held now, across tiers.
    pub fn depth(&self) -> u64 {
        self.tiers.iter().map(|(_, t)| t.depth).sum()
    }

    /// Whether every tier [balances](TierStats::balances).
    pub fn balances(&self) -> bool {
        self.tiers.iter().all(|(_, t)| t.balances())
    }

    /// Sum over tiers of one counter.
    pub fn total(&self, f: impl Fn(&TierStats) -> u64) -> u64 {
        self.tiers.iter().map(|(_, t)| f(t)).sum()
    }
}

impl fmt::Display for QueueStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
            "tier", "pushed", "popped", "expired", "evicted", "refused", "depth"
        )?;
        for (tier, t) in self.tiers.iter() {
            writeln!(
                f,
                "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
                tier.as_str(),
                t.pushed,
                t.popped,
                t.expired,
                t.evicted,
                t.refused_total(),
                t.depth
            )?;
        }
        Ok(())
    }
}
