//! The memory budget: the payload bytes the process holds, against a budget, per tier.

use crate::admission::MemoryConfig;
use crate::loom::{AtomicU64, Ordering};
use crate::{Criticality, PerTier};

/// The payload bytes held by the process, and the per-tier limits they are admitted against.
///
/// # Accounting
///
/// Exact by construction: a message's `size_bytes` is added when it is consumed (the runtime
/// builds its item) and removed when it leaves, settled with its disposition or released
/// unacknowledged, whichever path it takes (queued, held under backpressure, parked behind its
/// ordering key, deferring, waiting to retry, in a handler). The high-water mark is kept too.
///
/// Sizes come from outside (a header, a payload, a producer's claim), so no sum of them
/// overflows: the counts are kept past 2^64 bytes (a carry word) and read saturated at
/// `u64::MAX`, and every decision compares them in 128 bits.
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
///   plus the largest recent message ([`largest`](MemoryBudget::largest)) would pass the
///   budget: a pulled message is in memory before anyone can refuse it, so the budget is kept
///   by not pulling. With messages no larger than the recent ones, the bytes held never pass
///   the budget; a message larger than those may pass it by its excess, once.
///
/// "Recent" is the last [`LARGEST_WINDOW`](MemoryBudget::LARGEST_WINDOW) to twice that many
/// messages with a size, not every message ever seen: one message of the budget's size,
/// remembered for ever, let the intake pull only while nothing else was held, so a pool of
/// workers ran one handler at a time for the rest of the run. A window counted in messages
/// always moves on, since the intake still pulls one message at a time while a large size is
/// remembered (one message alone is always pulled); a window in time would serialise for its
/// whole length however many small messages showed the sizes had changed. Sizes recurring
/// within the window keep their bound. A reconfiguration that changes anything starts the
/// window afresh: an operator who sees the intake serialised behind a size that will not come
/// back can clear it.
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
/// let budget = MemoryBudget::new(&MemoryConfig { budget_bytes: Some(100), ..MemoryConfig::default() });
/// budget.add(40);
/// budget.add(20); // a 20-byte Sheddable message: 60 > 50 held
/// assert!(!budget.admits(Sheddable, 20));
/// assert!(budget.admits(Critical, 20));
/// budget.remove(20, false); // refused and dropped: its bytes leave
/// assert_eq!(budget.held(), 40);
/// assert_eq!(budget.peak(), 60);
/// assert_eq!(budget.largest(), 40);
/// assert!(budget.may_pull()); // 40 + the largest recent (40) fits 100
/// ```
#[derive(Debug, Default)]
pub struct MemoryBudget {
    held: Bytes,
    waiting: Bytes,
    /// The most bytes held at once, saturated at `u64::MAX`.
    peak: AtomicU64,
    /// The largest size among the messages of the current window (`[0]`) and of the one
    /// before (`[1]`).
    largest: [AtomicU64; 2],
    /// Messages with a size added since the window started afresh.
    sized: AtomicU64,
    /// 0: no budget.
    budget: AtomicU64,
    /// Per tier (rank), the bytes of working set above which it is refused.
    limits: [AtomicU64; 4],
    /// Memory refusals so far, and the sequence number of each tier's first (0: none).
    refusals: AtomicU64,
    first_refusal: [AtomicU64; 4],
}

/// A count of bytes that no sum of sizes overflows: the low word wraps as atomics do (so an
/// add and its remove cancel exactly, in any order), and the high word counts the wraps. The
/// two words are read apart, so a read racing a wrap may be off by 2^64 for that instant: only
/// ever past 2^64 bytes claimed.
#[derive(Debug, Default)]
struct Bytes {
    low: AtomicU64,
    high: AtomicU64,
}

impl Bytes {
    /// Adds `n`; returns the count after.
    #[inline]
    fn add(&self, n: u64) -> u128 {
        let (after, wrapped) = self.low.fetch_add(n, Ordering::Relaxed).overflowing_add(n);
        let high = if wrapped {
            self.high.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
        } else {
            self.high.load(Ordering::Relaxed)
        };
        (u128::from(high) << 64) | u128::from(after)
    }

    /// Takes `n` away (added before, maybe as several parts).
    #[inline]
    fn sub(&self, n: u128) {
        let (low, high) = (n as u64, (n >> 64) as u64);
        let borrow = self.low.fetch_sub(low, Ordering::Relaxed) < low;
        let high = high.wrapping_add(u64::from(borrow));
        if high != 0 {
            self.high.fetch_sub(high, Ordering::Relaxed);
        }
    }

    #[inline]
    fn get(&self) -> u128 {
        let high = self.high.load(Ordering::Relaxed);
        (u128::from(high) << 64) | u128::from(self.low.load(Ordering::Relaxed))
    }
}

/// `n`, or `u64::MAX` past it.
fn saturated(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl MemoryBudget {
    /// The messages (with a size) in one window of [`largest`](MemoryBudget::largest): it is
    /// the largest size among the last `LARGEST_WINDOW` to `2 × LARGEST_WINDOW` of them. Long
    /// enough that a size recurring every few dozen messages keeps its bound; short enough
    /// that a one-off large message serialises the intake for a few hundred messages at most.
    pub const LARGEST_WINDOW: u64 = 64;

    /// A budget from `config` (validated by the caller: see [`MemoryConfig::validate`]).
    pub fn new(config: &MemoryConfig) -> Self {
        let b = MemoryBudget::default();
        b.apply(config);
        b
    }

    /// Applies new settings (live reconfiguration): the budget and thresholds change at once;
    /// the bytes held are kept, and the window of [`largest`](MemoryBudget::largest) starts
    /// afresh (the next message pulled measures it again). A budget removed admits everything
    /// from then on.
    pub fn apply(&self, config: &MemoryConfig) {
        for tier in Criticality::ALL {
            let limit = config.limit_bytes(tier).unwrap_or(u64::MAX);
            self.limits[tier.rank()].store(limit, Ordering::Relaxed);
        }
        self.budget
            .store(config.budget_bytes.unwrap_or(0), Ordering::Relaxed);
        self.sized.store(0, Ordering::Relaxed);
        for largest in &self.largest {
            largest.store(0, Ordering::Relaxed);
        }
    }

    /// A message of `size` bytes entered the process.
    #[inline]
    pub fn add(&self, size: u64) {
        // Most messages of a source that does not report sizes: no read-modify-write on a line
        // every thread shares for nothing.
        if size == 0 {
            return;
        }
        let held = saturated(self.held.add(size));
        if self.peak.load(Ordering::Relaxed) < held {
            self.peak.fetch_max(held, Ordering::Relaxed);
        }
        // The message opening a window moves the current one back, dropping the one before.
        // Two adds racing a turn of the window at most forget a size one window early.
        let seq = self.sized.fetch_add(1, Ordering::Relaxed);
        if seq != 0 && seq % Self::LARGEST_WINDOW == 0 {
            let current = self.largest[0].swap(0, Ordering::Relaxed);
            self.largest[1].store(current, Ordering::Relaxed);
        }
        if self.largest[0].load(Ordering::Relaxed) < size {
            self.largest[0].fetch_max(size, Ordering::Relaxed);
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
            self.waiting.sub(u128::from(size));
        }
        self.held.sub(u128::from(size));
    }

    /// Several messages left the process at once (settled together, none waiting), `bytes`
    /// their sizes summed: what [`remove`](MemoryBudget::remove) of each would do.
    #[inline]
    pub(crate) fn remove_sum(&self, bytes: u128) {
        if bytes != 0 {
            self.held.sub(bytes);
        }
    }

    /// A message of `size` bytes now waits, held under backpressure or parked behind its
    /// ordering key (out of the working set).
    #[inline]
    pub fn mark_waiting(&self, size: u64) {
        if size != 0 {
            self.waiting.add(size);
        }
    }

    /// A waiting message of `size` bytes is offered again (back in the working set).
    #[inline]
    pub fn unmark_waiting(&self, size: u64) {
        if size != 0 {
            self.waiting.sub(u128::from(size));
        }
    }

    /// The working set, in 128 bits.
    #[inline]
    fn working_bytes(&self) -> u128 {
        self.held.get().saturating_sub(self.waiting.get())
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
        let working = self.working_bytes();
        working <= u128::from(limit) || working <= u128::from(size)
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
    /// plus the largest recent message ([`largest`](MemoryBudget::largest)) fit the budget.
    #[inline]
    pub fn may_pull(&self) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        if budget == 0 {
            return true;
        }
        let held = self.held.get();
        held == 0 || held.saturating_add(u128::from(self.largest())) <= u128::from(budget)
    }

    /// The largest size among the recent messages, in bytes: the last
    /// [`LARGEST_WINDOW`](MemoryBudget::LARGEST_WINDOW) to twice that many with a size, since
    /// the last reconfiguration (0 until one is added).
    pub fn largest(&self) -> u64 {
        self.largest[0]
            .load(Ordering::Relaxed)
            .max(self.largest[1].load(Ordering::Relaxed))
    }

    /// Payload bytes held now, in bytes (`u64::MAX` past it).
    pub fn held(&self) -> u64 {
        saturated(self.held.get())
    }

    /// Of [`held`](MemoryBudget::held), the bytes of messages waiting: held under
    /// backpressure or parked behind their ordering key.
    pub fn waiting(&self) -> u64 {
        saturated(self.waiting.get())
    }

    /// Bytes held and not waiting (the working set): queued, deferring, waiting to retry, in
    /// a handler.
    pub fn working(&self) -> u64 {
        saturated(self.working_bytes())
    }

    /// The most bytes ever held at once (`u64::MAX` past it).
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
        let b = MemoryBudget::new(&MemoryConfig {
            budget_bytes: Some(100 * MB),
            ..MemoryConfig::default()
        });
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
        let b = MemoryBudget::new(&MemoryConfig {
            budget_bytes: Some(100),
            ..MemoryConfig::default()
        });
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
        let b = MemoryBudget::new(&MemoryConfig {
            budget_bytes: Some(100),
            ..MemoryConfig::default()
        });
        b.add(300);
        assert!(b.admits(Sheddable, 300));
        assert!(!b.may_pull(), "nothing more is pulled while it is held");
        b.add(1);
        assert!(!b.admits(Sheddable, 1));
        b.remove(301, false);
        assert!(b.may_pull());
    }

    /// One message of the budget's size, then small ones: its size counts against pulling
    /// until `2 × LARGEST_WINDOW` messages have been added since it (it was remembered for
    /// ever), or until a reconfiguration.
    #[test]
    fn the_largest_message_is_forgotten_after_a_window_or_a_reconfiguration() {
        let w = MemoryBudget::LARGEST_WINDOW;
        let b = MemoryBudget::new(&MemoryConfig {
            budget_bytes: Some(1000),
            ..MemoryConfig::default()
        });
        b.add(1000);
        b.remove(1000, false);
        for i in 1..2 * w {
            b.add(10);
            assert_eq!(b.largest(), 1000, "message {i}");
            assert!(!b.may_pull(), "10 held + 1000 > 1000");
            b.remove(10, false);
        }
        b.add(10);
        assert_eq!(b.largest(), 10);
        assert!(b.may_pull());
        b.add(1000);
        assert_eq!(b.largest(), 1000);
        b.apply(&MemoryConfig {
            budget_bytes: Some(2000),
            ..MemoryConfig::default()
        });
        assert_eq!((b.largest(), b.held()), (0, 1010));
        assert!(b.may_pull());
        b.add(10);
        assert_eq!(b.largest(), 10);
    }

    /// Sizes claimed past 2^64 bytes in all: counted exactly, read saturated, and every byte
    /// leaves with its message (an add wrapped the count to a few bytes, and a debug build
    /// panicked).
    #[test]
    fn sizes_past_u64_are_counted_exactly_and_read_saturated() {
        let b = MemoryBudget::new(&MemoryConfig {
            budget_bytes: Some(100),
            ..MemoryConfig::default()
        });
        b.add(u64::MAX);
        b.add(u64::MAX);
        b.add(5);
        assert_eq!(
            (b.held(), b.peak(), b.largest()),
            (u64::MAX, u64::MAX, u64::MAX)
        );
        assert!(!b.admits(Critical, 5) && !b.admits(Critical, u64::MAX));
        assert!(!b.may_pull());
        b.mark_waiting(u64::MAX);
        b.mark_waiting(u64::MAX);
        assert_eq!((b.waiting(), b.working()), (u64::MAX, 5));
        assert!(b.admits(Sheddable, 5), "alone in the working set");
        b.remove(u64::MAX, true);
        assert_eq!(
            (b.held(), b.waiting(), b.working()),
            (u64::MAX, u64::MAX, 5)
        );
        b.remove(u64::MAX, true);
        assert_eq!((b.held(), b.waiting(), b.working()), (5, 0, 5));
        b.remove(5, false);
        assert_eq!(b.held(), 0);
        assert!(b.may_pull());
    }

    #[test]
    fn no_budget_admits_everything_and_apply_changes_it() {
        let b = MemoryBudget::new(&MemoryConfig::default());
        b.add(u64::MAX / 4);
        assert!(b.admits(Sheddable, 1) && b.may_pull());
        b.remove(u64::MAX / 4, false);
        b.apply(&MemoryConfig {
            budget_bytes: Some(10),
            ..MemoryConfig::default()
        });
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
