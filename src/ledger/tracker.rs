//! Per-partition contiguous watermarks over settled offsets.

use crate::sync::{AtomicU64, Ordering};
use std::collections::hash_map::{Entry, HashMap};
use std::collections::VecDeque;
use std::fmt;
use std::hash::Hash;

use serde::Serialize;

use super::error::{ResolveError, TrackError};

/// Process-wide so that a token from another tracker, or from a previous
/// assignment of the same partition, can never match a current epoch.
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

/// One assignment generation of a partition.
///
/// Every [`AckTracker::assign`] gets a fresh epoch. Epochs increase within a
/// tracker and are unique within the process, so a token minted under one
/// assignment never resolves an offset of another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Epoch(u64);

impl Epoch {
    /// The raw generation number (for logs, metrics, and carrying in an
    /// [`AckRef`](crate::runtime::AckRef)).
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The epoch whose [`get`](Self::get) is `raw`: for a connector that carried it through
    /// an [`AckRef`](crate::runtime::AckRef). A forged or stale value only ever makes
    /// [`AckTracker::resolve`] answer `Stale`.
    pub const fn from_raw(raw: u64) -> Self {
        Epoch(raw)
    }

    fn next() -> Self {
        // Relaxed: only uniqueness matters, not ordering with other memory.
        Epoch(NEXT_EPOCH.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {}", self.0)
    }
}

/// Proof that an offset was tracked: hand it back to [`AckTracker::resolve`]
/// once the message has its [`Disposition`](super::Disposition).
///
/// Dropping a token without resolving it holds the partition's watermark back
/// forever (until the partition is revoked).
#[must_use = "an unresolved token holds the partition's watermark back"]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AckToken<P> {
    partition: P,
    offset: u64,
    epoch: Epoch,
}

impl<P> AckToken<P> {
    /// Rebuilds a token from its parts, e.g. after carrying them in a message
    /// envelope. [`AckTracker::resolve`] validates it like any other token.
    pub fn from_parts(partition: P, offset: u64, epoch: Epoch) -> Self {
        AckToken {
            partition,
            offset,
            epoch,
        }
    }

    /// The partition (or AMQP channel) key.
    pub fn partition(&self) -> &P {
        &self.partition
    }

    /// The source offset (or AMQP delivery tag).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The assignment generation the offset was tracked under.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Splits the token into `(partition, offset, epoch)`.
    pub fn into_parts(self) -> (P, u64, Epoch) {
        (self.partition, self.offset, self.epoch)
    }
}

/// Result of [`AckTracker::assign`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Assignment {
    /// The new epoch; tokens of earlier epochs are now stale.
    pub epoch: Epoch,
    /// The state the partition had if it was already assigned (as if
    /// [`AckTracker::revoke`] had been called first), else `None`.
    pub replaced: Option<Revoked>,
}

/// Final state of a partition when it stops being tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revoked {
    /// The epoch that ended; its tokens are now stale.
    pub epoch: Epoch,
    /// Final commit position, `None` if nothing was tracked in the epoch.
    /// Commit it before giving the partition up.
    pub watermark: Option<u64>,
    /// Offsets tracked but unresolved: never acknowledged, so the partition's
    /// next owner gets them again.
    pub pending: usize,
}

/// An offset in a partition's window, and whether its message has its disposition.
#[derive(Clone, Copy, Debug)]
struct Tracked {
    offset: u64,
    resolved: bool,
}

#[derive(Debug)]
struct PartitionState {
    epoch: Epoch,
    /// Tracked offsets from the oldest unresolved one to the newest, in
    /// increasing order. Invariant: empty, or the front is unresolved.
    window: VecDeque<Tracked>,
    last_tracked: Option<u64>,
    unresolved: usize,
    /// Highest position reported through [`AckTracker::mark_committed`].
    committed: Option<u64>,
}

impl PartitionState {
    fn new(epoch: Epoch) -> Self {
        PartitionState {
            epoch,
            window: VecDeque::new(),
            last_tracked: None,
            unresolved: 0,
            committed: None,
        }
    }

    fn watermark(&self) -> Option<u64> {
        match self.window.front() {
            Some(front) => Some(front.offset),
            // `track` refuses u64::MAX, so the addition cannot overflow.
            None => self.last_tracked.map(|last| last + 1),
        }
    }

    fn revoked(&self) -> Revoked {
        Revoked {
            epoch: self.epoch,
            watermark: self.watermark(),
            pending: self.unresolved,
        }
    }

    fn find(&self, offset: u64) -> Option<usize> {
        let front = self.window.front()?.offset;
        // Offsets are usually dense, so try the direct position before searching.
        if let Some(idx) = offset
            .checked_sub(front)
            .and_then(|d| usize::try_from(d).ok())
        {
            if self.window.get(idx).is_some_and(|s| s.offset == offset) {
                return Some(idx);
            }
        }
        self.window.binary_search_by_key(&offset, |s| s.offset).ok()
    }
}

/// Tracks consumed offsets per partition and computes, for each, the
/// contiguous commit position: the next offset to consume such that every
/// tracked offset below it has a disposition.
///
/// One tracker per source (Kafka consumer, or AMQP connection with one key per
/// channel). It is not synchronised: the runtime owns it or wraps it in a lock.
///
/// # Complexity
///
/// With `w` the window from the oldest unresolved offset to the newest tracked
/// one on a partition: [`track`](Self::track) is amortised O(1),
/// [`resolve`](Self::resolve) is O(1) when offsets are dense and O(log w)
/// otherwise, plus O(1) amortised to advance the watermark;
/// [`watermark`](Self::watermark), [`pending`](Self::pending) and
/// [`pending_total`](Self::pending_total) are O(1). Memory is O(w) per
/// partition, bounded by the in-flight window, not by the offset range.
/// Nothing allocates per resolve.
///
/// # Example
///
/// ```
/// use triage::ledger::AckTracker;
///
/// let mut tracker = AckTracker::new();
/// tracker.assign("orders-0");
/// let t10 = tracker.track(&"orders-0", 10)?;
/// let t11 = tracker.track(&"orders-0", 11)?;
/// let t12 = tracker.track(&"orders-0", 12)?;
/// assert_eq!(tracker.watermark(&"orders-0"), Some(10));
///
/// // 12 is done but 10 and 11 are not: nothing may be committed yet.
/// assert_eq!(tracker.resolve(&t12)?, None);
/// assert_eq!(tracker.resolve(&t10)?, Some(11));
/// assert_eq!(tracker.resolve(&t11)?, Some(13));
/// assert_eq!(tracker.watermark(&"orders-0"), Some(13));
///
/// // A periodic committer commits only what changed.
/// let changed: Vec<_> = tracker.committable().map(|(p, pos)| (*p, pos)).collect();
/// assert_eq!(changed, [("orders-0", 13)]);
/// tracker.mark_committed(&"orders-0", 13);
/// assert_eq!(tracker.committable().count(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AckTracker<P> {
    partitions: HashMap<P, PartitionState>,
    pending_total: usize,
}

impl<P: fmt::Debug> fmt::Debug for AckTracker<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The windows can be large; print the summary only.
        f.debug_struct("AckTracker")
            .field("partitions", &self.partitions.len())
            .field("pending_total", &self.pending_total)
            .finish()
    }
}

impl<P: Eq + Hash + Clone> Default for AckTracker<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Eq + Hash + Clone> AckTracker<P> {
    /// An empty tracker with no partition assigned.
    pub fn new() -> Self {
        AckTracker {
            partitions: HashMap::new(),
            pending_total: 0,
        }
    }

    /// Starts tracking `partition` under a new epoch.
    ///
    /// If the partition was already assigned, its state is discarded as by
    /// [`revoke`](Self::revoke) (returned in [`Assignment::replaced`]) and its
    /// old tokens become stale. The watermark is `None` until the first
    /// [`track`](Self::track): the start position comes from the group, not
    /// from this tracker.
    pub fn assign(&mut self, partition: P) -> Assignment {
        let epoch = Epoch::next();
        let replaced = match self.partitions.entry(partition) {
            Entry::Occupied(mut e) => {
                let old = std::mem::replace(e.get_mut(), PartitionState::new(epoch));
                self.pending_total -= old.unresolved;
                Some(old.revoked())
            }
            Entry::Vacant(e) => {
                e.insert(PartitionState::new(epoch));
                None
            }
        };
        Assignment { epoch, replaced }
    }

    /// Stops tracking `partition`; returns its final state, or `None` if it was
    /// not assigned. Later resolves of its tokens return
    /// [`ResolveError::Stale`].
    pub fn revoke(&mut self, partition: &P) -> Option<Revoked> {
        let state = self.partitions.remove(partition)?;
        self.pending_total -= state.unresolved;
        Some(state.revoked())
    }

    /// Registers a consumed `offset` of `partition` as pending.
    ///
    /// Offsets must strictly increase per partition; gaps (compaction,
    /// transaction markers) are allowed and are never pending.
    ///
    /// # Errors
    ///
    /// [`TrackError::NotAssigned`] if the partition is not assigned,
    /// [`TrackError::NotIncreasing`] if `offset` is not above the last tracked
    /// one, [`TrackError::OutOfRange`] for `u64::MAX`. The state is unchanged.
    pub fn track(&mut self, partition: &P, offset: u64) -> Result<AckToken<P>, TrackError> {
        let state = self
            .partitions
            .get_mut(partition)
            .ok_or(TrackError::NotAssigned { offset })?;
        if offset == u64::MAX {
            return Err(TrackError::OutOfRange { offset });
        }
        if let Some(last) = state.last_tracked {
            if offset <= last {
                return Err(TrackError::NotIncreasing { offset, last });
            }
        }
        state.window.push_back(Tracked {
            offset,
            resolved: false,
        });
        state.last_tracked = Some(offset);
        state.unresolved += 1;
        self.pending_total += 1;
        Ok(AckToken {
            partition: partition.clone(),
            offset,
            epoch: state.epoch,
        })
    }

    /// Records that the token's offset has its disposition.
    ///
    /// Returns `Some(position)` when the partition's commit position advanced
    /// (to the next offset to consume), `None` when an earlier offset is still
    /// pending.
    ///
    /// # Errors
    ///
    /// [`ResolveError::Stale`] if the token's epoch is not the partition's
    /// current one (revoked or reassigned: such a completion never moves the
    /// watermark), [`ResolveError::AlreadyResolved`] for a second disposition,
    /// [`ResolveError::Unknown`] for an offset never tracked in the epoch. The
    /// state is unchanged on error.
    pub fn resolve(&mut self, token: &AckToken<P>) -> Result<Option<u64>, ResolveError> {
        let offset = token.offset;
        let state = self
            .partitions
            .get_mut(&token.partition)
            .filter(|s| s.epoch == token.epoch)
            .ok_or(ResolveError::Stale {
                offset,
                epoch: token.epoch,
            })?;
        let Some(idx) = state.find(offset) else {
            // Below the window every tracked offset is settled; anything else
            // (a gap inside the window, or beyond the last tracked) was never tracked.
            let below_window = match state.window.front() {
                Some(front) => offset < front.offset,
                None => state.last_tracked.is_some_and(|last| offset <= last),
            };
            return Err(if below_window {
                ResolveError::AlreadyResolved { offset }
            } else {
                ResolveError::Unknown { offset }
            });
        };
        let slot = &mut state.window[idx];
        if slot.resolved {
            return Err(ResolveError::AlreadyResolved { offset });
        }
        slot.resolved = true;
        state.unresolved -= 1;
        self.pending_total -= 1;
        if idx != 0 {
            return Ok(None);
        }
        while state.window.front().is_some_and(|s| s.resolved) {
            state.window.pop_front();
        }
        Ok(state.watermark())
    }

    /// Current commit position of `partition` (the next offset to consume; every
    /// tracked offset below it has a disposition). `None` if the partition is
    /// not assigned or nothing was tracked since its assignment.
    pub fn watermark(&self, partition: &P) -> Option<u64> {
        self.partitions.get(partition)?.watermark()
    }

    /// Current epoch of `partition`, `None` if it is not assigned.
    pub fn epoch(&self, partition: &P) -> Option<Epoch> {
        self.partitions.get(partition).map(|s| s.epoch)
    }

    /// Offsets of `partition` tracked but not yet resolved, `None` if it is not
    /// assigned.
    pub fn pending(&self, partition: &P) -> Option<usize> {
        self.partitions.get(partition).map(|s| s.unresolved)
    }

    /// Offsets tracked but not yet resolved, over all assigned partitions.
    pub fn pending_total(&self) -> usize {
        self.pending_total
    }

    /// The assigned partitions, in no particular order.
    pub fn partitions(&self) -> impl Iterator<Item = &P> + '_ {
        self.partitions.keys()
    }

    /// Partitions whose commit position differs from the last one recorded with
    /// [`mark_committed`](Self::mark_committed), with that position.
    ///
    /// Does not change state, so a failed commit is simply offered again. O(number
    /// of partitions).
    pub fn committable(&self) -> impl Iterator<Item = (&P, u64)> + '_ {
        self.partitions.iter().filter_map(|(p, s)| {
            let wm = s.watermark()?;
            (s.committed != Some(wm)).then_some((p, wm))
        })
    }

    /// Records that `position` was committed for `partition` (call it from the
    /// commit's success path). Keeps the highest position seen, so out-of-order
    /// commit callbacks are harmless.
    ///
    /// Returns `false`, recording nothing, if the partition is not assigned or
    /// `position` is beyond its current watermark (a position this tracker never
    /// offered in this epoch).
    pub fn mark_committed(&mut self, partition: &P, position: u64) -> bool {
        let Some(state) = self.partitions.get_mut(partition) else {
            return false;
        };
        if state.watermark().is_none_or(|wm| position > wm) {
            return false;
        }
        state.committed = Some(state.committed.map_or(position, |c| c.max(position)));
        true
    }
}
