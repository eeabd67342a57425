//! The memory budget: the payload bytes the process holds, against a budget, per tier.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::admission::MemoryConfig;
use crate::{Criticality, PerTier};

/// The payload bytes held by the process, and the per-tier limits they are admitted against.
///
/// # Accounting
///
/// Exact by construction: a message's `size_bytes` is added when it is consumed (the runtime
/// builds its item) and removed when it leaves, settled with its disposition or released
/// unacknowledged, whichever path it takes (queued, held under backpressure, deferring,
/// waiting to retry, in a handler). The high-water mark is kept too.
///
/// # Decisions
///
/// Seeds 001 and 002 name memory pressure as a shedding signal that "prevents OOM kills";
/// Envoy's overload manager acts at fractions of a fixed heap size. Here:
///
/// - **A tier is refused** (reason `memory`, then its refusal policy) when admitting the
///   message would make the *working set* exceed its threshold (default Sheddable 0.50,
///   Medium 0.70, High 0.85, Critical 1.0 of the budget). The working set is every byte held
///   except the messages waiting: held under backpressure, or parked behind an earlier
///   message of their ordering key. Those are in memory either way, and counting them against
///   each other would keep a held tier out for ever once its own backlog passed its
///   threshold, or a key's message out for ever behind the messages parked after it (which
///   wait for it). A message alone in the working set is always admitted (it is there
///   already; refusing it frees nothing).
/// - **The intake stops pulling** ([`may_pull`](MemoryBudget::may_pull)) while the bytes held
///   plus the largest message seen so far would pass the budget: a pulled message is in memory
///   before anyone can refuse it, so the budget is kept by not pulling. With messages no larger
///   than the largest seen before, the bytes held never pass the budget; a message larger than
///   any before it may pass it by its excess, once.
///
/// So under memory pressure Drop tiers free their bytes at once, Defer tiers once the defer
/// store confirmed the copy, and Backpressure tiers wait, in memory, without growing it: the
/// broker keeps the rest.
///
/// Lock-free: a handful of relaxed atomics per message, no allocation.
///
/// # Examples
///
/// ```
/// use triage::admission::{MemoryBudget, MemoryConfig};
/// use triage::Criticality::{Critical, Sheddable};
///
/// let budget = MemoryBudget::new(&MemoryConfig::with_budget(100));
/// budget.add(40);
/// budget.add(20); // a 20-byte Sheddable message: 60 > 50 held
/// assert!(!budget.admits(Sheddable, 20));
/// assert!(budget.admits(Critical, 20));
/// budget.remove(20, false); // refused and dropped: its bytes leave
/// assert_eq!(budget.held(), 40);
/// assert_eq!(budget.peak(), 60);
/// assert!(budget.may_pull()); // 40 + the largest seen (40) fits 100
/// ```
#[derive(Debug, Default)]
pub struct MemoryBudget {
    held: AtomicU64,
    waiting: AtomicU64,
    peak: AtomicU64,
    largest: AtomicU64,
    /// 0: no budget.
    budget: AtomicU64,
    /// Per tier (rank), the bytes of working set above which it is refused.
    limits: [AtomicU64; 4],
    /// Memory refusals so far, and the sequence number of each tier's first (0: none).
    refusals: AtomicU64,
    first_refusal: [AtomicU64; 4],
}

impl MemoryBudget {
    /// A budget from `config` (validated by the caller: see [`MemoryConfig::validate`]).
    pub fn new(config: &MemoryConfig) -> Self {
        let b = MemoryBudget::default();
        b.apply(config);
        b
    }

    /// Applies new settings (live reconfiguration): the budget and thresholds change at once;
    /// the bytes held are kept. A budget removed admits everything from then on.
    pub fn apply(&self, config: &MemoryConfig) {
        for tier in Criticality::ALL {
            let limit = config.limit_bytes(tier).unwrap_or(u64::MAX);
            self.limits[tier.rank()].store(limit, Ordering::Relaxed);
        }
        self.budget
            .store(config.budget_bytes.unwrap_or(0), Ordering::Relaxed);
    }

    /// A message of `size` bytes entered the process.
    #[inline]
    pub fn add(&self, size: u64) {
        // Most messages of a source that does not report sizes: no read-modify-write on a line
        // every thread shares for nothing.
        if size == 0 {
            return;
        }
        let held = self.held.fetch_add(size, Ordering::Relaxed) + size;
        if self.peak.load(Ordering::Relaxed) < held {
            self.peak.fetch_max(held, Ordering::Relaxed);
        }
        if self.largest.load(Ordering::Relaxed) < size {
            self.largest.fetch_max(size, Ordering::Relaxed);
        }
    }

    /// A message of `size` bytes left the process (settled or released); `waiting`: it was
    /// marked waiting (held under backpressure or parked behind its key).
    #[inline]
    pub fn remove(&self, size: u64, waiting: bool) {
        if size == 0 {
            return;
        }
        if waiting {
            self.waiting.fetch_sub(size, Ordering::Relaxed);
        }
        self.held.fetch_sub(size, Ordering::Relaxed);
    }

    /// A message of `size` bytes now waits, held under backpressure or parked behind its
    /// ordering key (out of the working set).
    #[inline]
    pub fn mark_waiting(&self, size: u64) {
        if size != 0 {
            self.waiting.fetch_add(size, Ordering::Relaxed);
        }
    }

    /// A waiting message of `size` bytes is offered again (back in the working set).
    #[inline]
    pub fn unmark_waiting(&self, size: u64) {
        if size != 0 {
            self.waiting.fetch_sub(size, Ordering::Relaxed);
        }
    }

    /// Whether a message of `tier` and `size` bytes, already counted in the working set, may
    /// be admitted: the working set is within `tier`'s limit, or holds this message alone.
    /// Always `true` without a budget.
    #[inline]
    pub fn admits(&self, tier: Criticality, size: u64) -> bool {
        let limit = self.limits[tier.rank()].load(Ordering::Relaxed);
        if limit == u64::MAX {
            return true;
        }
        let working = self.working();
        working <= limit || working <= size
    }

    /// Records a refusal of `tier` for memory (for [`first_refusals`](MemoryBudget::first_refusals)).
    #[inline]
    pub fn note_refusal(&self, tier: Criticality) {
        let seq = self.refusals.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = self.first_refusal[tier.rank()].compare_exchange(
            0,
            seq,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Whether an intake may pull another message: no budget, nothing held, or the bytes held
    /// plus the largest message seen so far fit the budget.
    #[inline]
    pub fn may_pull(&self) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        if budget == 0 {
            return true;
        }
        let held = self.held.load(Ordering::Relaxed);
        held == 0 || held.saturating_add(self.largest.load(Ordering::Relaxed)) <= budget
    }

    /// Payload bytes held now, in bytes.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Of [`held`](MemoryBudget::held), the bytes of messages waiting: held under
    /// backpressure or parked behind their ordering key.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Bytes held and not waiting (the working set): queued, deferring, waiting to retry, in
    /// a handler.
    pub fn working(&self) -> u64 {
        self.held().saturating_sub(self.waiting())
    }

    /// The most bytes ever held at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// The budget in bytes (`None`: no budget).
    pub fn budget(&self) -> Option<u64> {
        match self.budget.load(Ordering::Relaxed) {
            0 => None,
            b => Some(b),
        }
    }

    /// Per tier, the position of its first memory refusal among all memory refusals (1 for
    /// the first ever), `None` if never refused: tells in which order tiers were refused.
    pub fn first_refusals(&self) -> PerTier<Option<u64>> {
        PerTier::from_fn(
            |t| match self.first_refusal[t.rank()].load(Ordering::Relaxed) {
                0 => None,
                n => Some(n),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Criticality::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn thresholds_refuse_bottom_up() {
        let b = MemoryBudget::new(&MemoryConfig::with_budget(100 * MB));
        b.add(51 * MB);
        assert!(!b.admits(Sheddable, 1));
        assert!(b.admits(Medium, 1));
        b.add(20 * MB);
        assert!(!b.admits(Medium, 1));
        assert!(b.admits(High, 1));
        b.add(15 * MB);
        assert!(!b.admits(High, 1));
        assert!(b.admits(Critical, 1));
        b.add(15 * MB);
        assert!(!b.admits(Critical, 1));
    }

    #[test]
    fn waiting_messages_leave_the_working_set() {
        let b = MemoryBudget::new(&MemoryConfig::with_budget(100));
        for _ in 0..9 {
            b.add(10);
            b.mark_waiting(10);
        }
        assert_eq!((b.held(), b.waiting(), b.working()), (90, 90, 0));
        // Offered again: back in the working set, which fits High's 85.
        b.unmark_waiting(10);
        assert!(b.admits(High, 1));
        assert!(b.may_pull(), "90 + the largest seen (10) fits 100");
        b.remove(10, false);
        for _ in 0..8 {
            b.remove(10, true);
        }
        assert_eq!((b.held(), b.waiting()), (0, 0));
        assert_eq!(b.peak(), 90);
    }

    #[test]
    fn a_lone_message_larger_than_the_limit_is_admitted() {
        let b = MemoryBudget::new(&MemoryConfig::with_budget(100));
        b.add(300);
        assert!(b.admits(Sheddable, 300));
        assert!(!b.may_pull(), "nothing more is pulled while it is held");
        b.add(1);
        assert!(!b.admits(Sheddable, 1));
        b.remove(301, false);
        assert!(b.may_pull());
    }

    #[test]
    fn no_budget_admits_everything_and_apply_changes_it() {
        let b = MemoryBudget::new(&MemoryConfig::default());
        b.add(u64::MAX / 4);
        assert!(b.admits(Sheddable, 1) && b.may_pull());
        b.remove(u64::MAX / 4, false);
        b.apply(&MemoryConfig::with_budget(10));
        b.add(6);
        assert!(!b.admits(Sheddable, 1));
        b.note_refusal(Sheddable);
        b.note_refusal(Sheddable);
        b.note_refusal(High);
        assert_eq!(
            b.first_refusals(),
            PerTier::new(None, Some(3), None, Some(1))
        );
    }
}
