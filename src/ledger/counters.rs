//! Thread-safe per-tier disposition counters.

use std::fmt;

use serde::Serialize;

use super::Disposition;
use crate::sync::{Count, Ordering, PerThread};
use crate::Criticality;

const TIERS: usize = Criticality::ALL.len();

/// Counts consumed messages and their dispositions per criticality tier.
///
/// Shared by reference (or `Arc`) between the consumer, the workers and the
/// metrics endpoint; every method takes `&self`. Counters only increase.
///
/// Record [`record_consumed`](Self::record_consumed) for a message before its
/// [`record`](Self::record): a [`snapshot`](Self::snapshot) then never shows
/// more dispositions than consumed messages.
///
/// # Example
///
/// ```
/// use triage::Criticality;
/// use triage::ledger::{Disposition, Ledger};
///
/// let ledger = Ledger::new();
/// ledger.record_consumed(Criticality::High);
/// ledger.record_consumed(Criticality::High);
/// ledger.record(Criticality::High, Disposition::Completed);
///
/// let snap = ledger.snapshot();
/// let high = snap.tier(Criticality::High);
/// assert_eq!((high.consumed, high.completed), (2, 1));
/// // One message is still queued or in flight.
/// assert_eq!(snap.unresolved(), 1);
/// ```
#[derive(Debug, Default)]
pub struct Ledger {
    /// One copy per thread, summed by [`snapshot`](Self::snapshot): a message's records
    /// write its thread's cache lines, not lines every worker writes (see `crate::sync`).
    counts: PerThread<Counts>,
}

/// The counters of one thread's copy.
#[derive(Default)]
struct Counts {
    consumed: [Count; TIERS],
    settled: [[Count; Disposition::COUNT]; TIERS],
    goodput: [Count; TIERS],
    released: [Count; TIERS],
}

impl Ledger {
    /// A ledger with every counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one message of `tier` taken from a source.
    pub fn record_consumed(&self, tier: Criticality) {
        // Release pairs with the Acquire loads in `snapshot`.
        self.counts.local().consumed[tier.rank()].add(1, Ordering::Release);
    }

    /// Counts one message of `tier` that reached `disposition`. Call it once
    /// per message (the [`AckTracker`](super::AckTracker) refuses a second
    /// disposition for an offset).
    pub fn record(&self, tier: Criticality, disposition: Disposition) {
        self.counts.local().settled[tier.rank()][disposition.index()].add(1, Ordering::Release);
    }

    /// Counts `n` messages of `tier` that reached `disposition`, at once: for a worker that
    /// settles a batch and records it once (see `runtime::worker`).
    pub(crate) fn record_n(&self, tier: Criticality, disposition: Disposition, n: u64) {
        self.counts.local().settled[tier.rank()][disposition.index()].add(n, Ordering::Release);
    }

    /// [`record_goodput`](Self::record_goodput) for `n` messages at once.
    pub(crate) fn record_goodput_n(&self, tier: Criticality, n: u64) {
        self.counts.local().goodput[tier.rank()].add(n, Ordering::Release);
    }

    /// Counts one `Completed` message of `tier` that finished inside its deadline (or had
    /// none): goodput. Recorded in addition to [`record`](Self::record), not instead of it.
    pub fn record_goodput(&self, tier: Criticality) {
        self.counts.local().goodput[tier.rank()].add(1, Ordering::Release);
    }

    /// Counts one message of `tier` handed back to its source without a disposition (shutdown,
    /// revocation, or waiting as long as its broker lets a delivery stay unacknowledged, see
    /// [`ExpertConfig::patience_share`](crate::runtime::ExpertConfig::patience_share)): not
    /// acknowledged, so the broker redelivers it. Not a disposition: the message will get one
    /// on its redelivery, which is counted as consumed again.
    pub fn record_released(&self, tier: Criticality) {
        self.counts.local().released[tier.rank()].add(1, Ordering::Release);
    }

    /// Reads every counter.
    ///
    /// Not one atomic cut while others record, but dispositions are read before
    /// the consumed counts, so for messages counted as consumed before their
    /// disposition no tier ever shows more dispositions than consumed.
    pub fn snapshot(&self) -> LedgerSnapshot {
        // Every copy's dispositions before any copy's consumption: a disposition recorded
        // (release) after its message's consumption (on whichever thread), read here
        // (acquire), makes that consumption visible to the reads that follow.
        let mut tiers = [TierCounts::default(); TIERS];
        let load = |c: &Count| c.load(Ordering::Acquire);
        for copy in self.counts.iter() {
            for (counts, settled) in tiers.iter_mut().zip(&copy.settled) {
                for d in Disposition::ALL {
                    counts.set(d, counts.count(d).wrapping_add(load(&settled[d.index()])));
                }
            }
        }
        for copy in self.counts.iter() {
            for (rank, counts) in tiers.iter_mut().enumerate() {
                counts.goodput = counts.goodput.wrapping_add(load(&copy.goodput[rank]));
                counts.released = counts.released.wrapping_add(load(&copy.released[rank]));
            }
        }
        for copy in self.counts.iter() {
            for (counts, consumed) in tiers.iter_mut().zip(&copy.consumed) {
                counts.consumed = counts.consumed.wrapping_add(load(consumed));
            }
        }
        LedgerSnapshot { tiers }
    }
}

/// Counters of one tier (or of all tiers, from [`LedgerSnapshot::total`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TierCounts {
    /// Messages taken from a source.
    pub consumed: u64,
    /// Messages whose handler succeeded.
    pub completed: u64,
    /// Messages dead-lettered or rejected to a dead-letter exchange.
    pub failed: u64,
    /// Messages durably re-published for later.
    pub deferred: u64,
    /// Messages discarded because their deadline passed.
    pub expired: u64,
    /// Messages evicted or refused by the overload policy.
    pub shed: u64,
    /// Of `completed`, those that finished inside their deadline (or had none).
    pub goodput: u64,
    /// Messages handed back to the source unacknowledged, for redelivery (not a disposition).
    pub released: u64,
}

impl TierCounts {
    /// The counter of `disposition`.
    pub fn count(&self, disposition: Disposition) -> u64 {
        match disposition {
            Disposition::Completed => self.completed,
            Disposition::Failed => self.failed,
            Disposition::Deferred => self.deferred,
            Disposition::Expired => self.expired,
            Disposition::Shed => self.shed,
        }
    }

    fn set(&mut self, disposition: Disposition, value: u64) {
        let field = match disposition {
            Disposition::Completed => &mut self.completed,
            Disposition::Failed => &mut self.failed,
            Disposition::Deferred => &mut self.deferred,
            Disposition::Expired => &mut self.expired,
            Disposition::Shed => &mut self.shed,
        };
        *field = value;
    }

    /// Messages with a disposition, of any kind.
    pub fn settled(&self) -> u64 {
        Disposition::ALL.iter().map(|&d| self.count(d)).sum()
    }

    /// Messages consumed that have neither a disposition nor were released: they must be
    /// queued or in flight. Saturates at 0 if dispositions were recorded without their
    /// consumption.
    pub fn unresolved(&self) -> u64 {
        self.consumed
            .saturating_sub(self.settled())
            .saturating_sub(self.released)
    }

    fn add(&mut self, other: &TierCounts) {
        self.consumed += other.consumed;
        self.goodput += other.goodput;
        self.released += other.released;
        for d in Disposition::ALL {
            self.set(d, self.count(d) + other.count(d));
        }
    }
}

/// A copy of a [`Ledger`]'s counters.
///
/// The runtime checks the invariant
/// `consumed = completed + failed + deferred + expired + shed + queued + in_flight`
/// by comparing [`unresolved`](Self::unresolved) with its queued and in-flight
/// counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LedgerSnapshot {
    /// Per-tier counters, indexed by [`Criticality::rank`].
    pub tiers: [TierCounts; TIERS],
}

impl LedgerSnapshot {
    /// Counters of `tier`.
    pub fn tier(&self, tier: Criticality) -> &TierCounts {
        &self.tiers[tier.rank()]
    }

    /// Counters summed over all tiers.
    pub fn total(&self) -> TierCounts {
        let mut total = TierCounts::default();
        for tier in &self.tiers {
            total.add(tier);
        }
        total
    }

    /// Messages consumed without a disposition yet, over all tiers.
    pub fn unresolved(&self) -> u64 {
        self.tiers.iter().map(TierCounts::unresolved).sum()
    }
}

impl fmt::Display for LedgerSnapshot {
    /// A compact table: one row per tier, most critical first, then the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}",
            "tier",
            "consumed",
            "completed",
            "goodput",
            "failed",
            "deferred",
            "expired",
            "shed",
            "released",
            "unresolved"
        )?;
        let rows = Criticality::ALL
            .iter()
            .map(|&c| (c.as_str(), *self.tier(c)))
            .chain(std::iter::once(("total", self.total())));
        for (name, t) in rows {
            writeln!(
                f,
                "{:<9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}",
                name,
                t.consumed,
                t.completed,
                t.goodput,
                t.failed,
                t.deferred,
                t.expired,
                t.shed,
                t.released,
                t.unresolved()
            )?;
        }
        Ok(())
    }
}
