//! The queue's state and rules, single-threaded; [`WfqQueue`](super::WfqQueue) puts it behind a
//! lock. Keeping the rules here, free of synchronisation, is what lets the model tests drive
//! them directly.

use std::collections::VecDeque;
use std::time::Duration;

use quanta::Instant;

use super::scheduler::Stride;
use super::time::DEADLINE_WINDOW;
use super::{
    Dequeued, Entry, Evictions, Meta, PushError, QueueStats, RefuseReason, Removed, TierStats,
};
use crate::Criticality;
use hand_back::TierHandBacks;
use slack::Slack;

mod hand_back;
mod slack;

/// The fields every push or pop touches come first, in declaration order (`repr(C)`), so that
/// an operation touches few cache lines: with producers and consumers on different cores each
/// line it touches moves between them, inside the critical section (see `mod.rs`).
#[repr(C)]
pub(crate) struct Core<T> {
    len: usize,
    capacity: usize,
    /// Bytes counted against the budget: the sum of held sizes with a budget, always 0
    /// without one (see `budget_mask`).
    total_bytes: usize,
    /// The byte budget, `usize::MAX` for none.
    max_bytes: usize,
    /// `usize::MAX` with a byte budget, 0 without: a size is masked with it before it counts
    /// into `total_bytes`. Without a budget the total stays 0, so every byte check
    /// (`size <= max_bytes - total_bytes`) passes whatever the sizes, and "no budget bounds by
    /// count only" holds even for sizes that add up past `usize::MAX`, with no branch on the
    /// fast path.
    budget_mask: usize,
    /// Bit `rank` set per non-empty tier, kept as items come and go.
    backlog: u8,
    closed: bool,
    /// Before this instant queue-age admission cannot leave level 0 (kept for `WfqQueue`,
    /// which decides it; here so it shares the first cache line with the lock).
    pub(crate) recheck_at: Option<Instant>,
    /// Items taken out by pops (served or expired).
    pops: u64,
    sched: Stride,
    /// Items accepted per tier, indexed by rank (the hot half of `TierStats::pushed`).
    pushed: [u64; 4],
    /// Items served per tier, indexed by rank (`TierStats::popped`).
    popped: [u64; 4],
    /// Bytes held per tier, indexed by rank, for the stats and for eviction by bytes. `u128`:
    /// without a budget held sizes may add up past `usize::MAX` (at most `capacity` sizes of
    /// at most `usize::MAX` each, which `u128` holds).
    bytes: [u128; 4],
    /// FIFO per tier, indexed by rank: push at the back, serve from the front, evict from the
    /// back (the newest).
    tiers: [VecDeque<Entry<T>>; 4],
    /// At or before every deadline held (a lower bound: serving the earliest does not raise
    /// it). A push that needs room looks for expired items only once this has passed, so a
    /// full queue of live items pays one comparison, not a scan.
    earliest_deadline: Option<Instant>,
    /// Reads an item's hand-back instant, once [`track_hand_backs`](Self::track_hand_backs)
    /// was called: then pushes keep `hand_backs` (one call and a comparison or two), and
    /// [`take_due`](Self::take_due) finds what is due. `None` costs a push one branch.
    hand_back_of: Option<fn(&T) -> Option<Instant>>,
    /// The counters of the slow paths (refusals, evictions, expiries, drains); `pushed` and
    /// `popped` above are added in by [`stats`](Self::stats).
    stats: [TierStats; 4],
    /// Per tier, indexed by rank: bounds of the items' hand-back instants (see `hand_back.rs`).
    hand_backs: [TierHandBacks; 4],
    /// Deadline-ordered service inside the weighted order (see `slack.rs`).
    slack: Slack,
}

/// `usize::MAX` with a byte budget, 0 without (`Core::budget_mask`).
fn budget_mask(max_bytes: Option<usize>) -> usize {
    if max_bytes.is_some() {
        usize::MAX
    } else {
        0
    }
}

impl<T> Core<T> {
    pub(crate) fn new(capacity: usize, max_bytes: Option<usize>, weights: [u32; 4]) -> Self {
        Core {
            len: 0,
            capacity,
            total_bytes: 0,
            max_bytes: max_bytes.unwrap_or(usize::MAX),
            budget_mask: budget_mask(max_bytes),
            backlog: 0,
            closed: false,
            recheck_at: None,
            pops: 0,
            sched: Stride::new(weights),
            pushed: [0; 4],
            popped: [0; 4],
            bytes: [0; 4],
            tiers: Default::default(),
            earliest_deadline: None,
            hand_back_of: None,
            stats: [TierStats::default(); 4],
            hand_backs: [TierHandBacks::default(); 4],
            slack: Slack::default(),
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    #[inline]
    pub(crate) fn backlogged(&self) -> u8 {
        self.backlog
    }

    /// Items taken out by pops so far.
    #[inline]
    pub(crate) fn pops(&self) -> u64 {
        self.pops
    }

    /// When the oldest item held was queued (`None` when empty): the oldest of the heads.
    pub(crate) fn oldest(&self) -> Option<Instant> {
        self.tiers
            .iter()
            .filter_map(|t| t.front().map(|e| e.enqueued_at))
            .min()
    }

    /// Counts a refusal decided outside the lock (admission) into this tier's stats.
    pub(crate) fn refuse<U>(
        &mut self,
        reason: RefuseReason,
        tier: Criticality,
        item: U,
    ) -> PushError<U> {
        self.pushed[tier.rank()] += 1;
        self.stats[tier.rank()].refused[reason.index()] += 1;
        PushError::new(reason, item)
    }

    /// Pushes `item`, making room if the queue is full: first by discarding every expired item
    /// (a deadline at or before `now`, or before `precise()` when the earliest deadline is
    /// close), then by evicting the newest items of the lowest tiers strictly below it.
    /// All-or-nothing: if the room cannot be made, nothing is removed.
    /// On success also says whether the item became its tier's head (the tier was empty), the
    /// only way a push changes the queue ages.
    ///
    /// What the push removed goes to `removed` (left as it is when nothing was): the common
    /// push returns a flag, not the removed items, so that nothing the size of an item is
    /// moved on its way back.
    #[inline]
    pub(crate) fn push(
        &mut self,
        item: T,
        meta: Meta,
        now: Instant,
        precise: impl FnOnce() -> Instant,
        removed: &mut Evictions<T>,
    ) -> Result<bool, PushError<T>> {
        let size = meta.size_bytes;
        // The common case: room, open, no budget exceeded. One branch, no eviction set built.
        if self.len < self.capacity && !self.closed && size <= self.max_bytes - self.total_bytes {
            return Ok(self.enqueue(item, meta, now));
        }
        self.push_slow(item, meta, now, precise, removed)
    }

    #[inline]
    fn enqueue(&mut self, item: T, meta: Meta, now: Instant) -> bool {
        let rank = meta.criticality.rank();
        let size = meta.size_bytes;
        if let Some(d) = meta.deadline {
            if self.earliest_deadline.is_none_or(|e| d < e) {
                self.earliest_deadline = Some(d);
            }
        }
        let was_empty = self.backlog & (1 << rank) == 0;
        if let Some(of) = self.hand_back_of {
            self.track_push(rank, of(&item), was_empty);
        }
        self.tiers[rank].push_back(Entry::new(item, meta, now));
        if was_empty {
            self.backlog |= 1 << rank;
            self.sched.activate(rank);
        }
        self.len += 1;
        if size != 0 {
            self.bytes[rank] += size as u128;
            self.total_bytes += size & self.budget_mask;
        }
        self.pushed[rank] += 1;
        was_empty
    }

    #[cold]
    #[inline(never)]
    fn track_push(&mut self, rank: usize, h: Option<Instant>, was_empty: bool) {
        if was_empty {
            self.hand_backs[rank] = TierHandBacks::default();
        }
        self.hand_backs[rank].pushed_back(h);
    }

    #[cold]
    fn push_slow(
        &mut self,
        item: T,
        meta: Meta,
        now: Instant,
        precise: impl FnOnce() -> Instant,
        out: &mut Evictions<T>,
    ) -> Result<bool, PushError<T>> {
        let rank = meta.criticality.rank();
        if self.closed {
            return Err(self.refuse(RefuseReason::Closed, meta.criticality, item));
        }
        let size = meta.size_bytes;
        let max_bytes = self.max_bytes;
        if size > max_bytes {
            return Err(self.refuse(RefuseReason::TooLarge, meta.criticality, item));
        }
        let expiry = self.expiry_cutoff(now, precise);
        // Full by count, nothing expired, nothing below: the usual refusal, decided from the
        // backlog bits without counting.
        let nothing_below = self.backlog & ((1u8 << rank) - 1) == 0;
        if expiry.is_none() && nothing_below && self.len >= self.capacity {
            return Err(self.refuse(RefuseReason::Full, meta.criticality, item));
        }
        // A live item is never evicted for one whose own deadline has passed: that would lose
        // the live one's service and serve nothing.
        let incoming_expired = meta.deadline.is_some_and(|d| d <= expiry.unwrap_or(now));
        match self.room_plan(rank, size, max_bytes, expiry) {
            Some(needs_eviction) if !(needs_eviction && incoming_expired) => {}
            _ => return Err(self.refuse(RefuseReason::Full, meta.criticality, item)),
        }
        let mut removed = Vec::new();
        if let Some(cutoff) = expiry {
            self.remove_expired(cutoff, &mut removed);
        }
        let mut one = None;
        // `size > max_bytes - total_bytes` rather than `total_bytes + size > max_bytes`: the
        // total never exceeds the budget, so this cannot overflow, whatever the sizes.
        while self.len >= self.capacity || size > max_bytes - self.total_bytes {
            match self.evict_below(rank) {
                // One eviction and nothing expired, the usual case, needs no allocation.
                Some(e) if removed.is_empty() && one.is_none() => one = Some(e),
                Some(e) => {
                    if let Some(first) = one.take() {
                        removed.push(Removed::Evicted(first));
                    }
                    removed.push(Removed::Evicted(e));
                }
                // Unreachable given the check above; refusing keeps the bound regardless.
                None => return Err(self.refuse(RefuseReason::Full, meta.criticality, item)),
            }
        }
        let new_head = self.enqueue(item, meta, now);
        *out = match one {
            Some(e) => Evictions::one(Removed::Evicted(e)),
            None => Evictions::from_vec(removed),
        };
        Ok(new_head)
    }

    /// The instant at or before which a held deadline has passed, if any held deadline may
    /// have: `None` when the earliest deadline is still ahead (the common case, no scan).
    fn expiry_cutoff(&self, now: Instant, precise: impl FnOnce() -> Instant) -> Option<Instant> {
        let earliest = self.earliest_deadline?;
        if earliest <= now {
            return Some(now);
        }
        let precise = precise();
        (earliest <= precise).then_some(precise)
    }

    /// Whether discarding the items expired at `expiry` and evicting below `rank` would make
    /// room for one item of `size` bytes: `None` if not, else whether evictions are needed
    /// (`Some(false)`: discarding the expired items is enough).
    fn room_plan(
        &self,
        rank: usize,
        size: usize,
        max_bytes: usize,
        expiry: Option<Instant>,
    ) -> Option<bool> {
        // Sizes are summed in `u128`: without a budget they may add up past `usize::MAX`.
        let mut expired_items = 0;
        let mut expired_bytes: u128 = 0;
        let mut expired_lower_items = 0;
        let mut expired_lower_bytes: u128 = 0;
        if let Some(cutoff) = expiry {
            for (r, tier) in self.tiers.iter().enumerate() {
                for e in tier.iter().filter(|e| e.is_expired(cutoff)) {
                    expired_items += 1;
                    expired_bytes += (e.size_bytes & self.budget_mask) as u128;
                    if r < rank {
                        expired_lower_items += 1;
                        expired_lower_bytes += e.size_bytes as u128;
                    }
                }
            }
        }
        let len = self.len - expired_items;
        // `total_bytes <= max_bytes` always holds (both 0 and `usize::MAX` without a budget),
        // so the subtractions cannot underflow and the live total fits in `usize`.
        let bytes = self.total_bytes - expired_bytes as usize;
        let lower_items: usize =
            self.tiers[..rank].iter().map(VecDeque::len).sum::<usize>() - expired_lower_items;
        let lower_bytes = self.bytes[..rank].iter().sum::<u128>() - expired_lower_bytes;
        let need_slot = len >= self.capacity;
        // 0 without a budget: `bytes` is 0 and `max_bytes` is `usize::MAX`.
        let need_bytes = size.saturating_sub(max_bytes - bytes) as u128;
        if (need_slot && lower_items == 0) || lower_bytes < need_bytes {
            return None;
        }
        Some(need_slot || need_bytes > 0)
    }

    /// Takes out every item expired at `cutoff`, lowest tier first and oldest first within a
    /// tier, and makes `earliest_deadline` exact again.
    #[cold]
    fn remove_expired(&mut self, cutoff: Instant, out: &mut Vec<Removed<T>>) {
        let mut earliest: Option<Instant> = None;
        for rank in 0..self.tiers.len() {
            // Rotate the tier once through itself: live items keep their order, no allocation.
            for _ in 0..self.tiers[rank].len() {
                let Some(e) = self.tiers[rank].pop_front() else {
                    break;
                };
                if e.is_expired(cutoff) {
                    self.take_out(rank, &e);
                    self.stats[rank].expired += 1;
                    out.push(Removed::Expired(e));
                } else {
                    if let Some(d) = e.deadline() {
                        earliest = Some(earliest.map_or(d, |x| x.min(d)));
                    }
                    self.tiers[rank].push_back(e);
                }
            }
            if self.tiers[rank].is_empty() {
                self.backlog &= !(1 << rank);
            }
        }
        self.earliest_deadline = earliest;
    }

    /// Removes the newest item of the lowest non-empty tier strictly below `rank`.
    fn evict_below(&mut self, rank: usize) -> Option<Entry<T>> {
        let below = self.backlog & ((1u8 << rank) - 1);
        if below == 0 {
            return None;
        }
        let victim = below.trailing_zeros() as usize;
        let e = self.tiers[victim].pop_back()?;
        if self.tiers[victim].is_empty() {
            self.backlog &= !(1 << victim);
        }
        self.take_out(victim, &e);
        self.stats[victim].evicted += 1;
        Some(e)
    }

    #[inline]
    fn take_out(&mut self, rank: usize, e: &Entry<T>) {
        self.len -= 1;
        let size = e.size_bytes;
        if size != 0 {
            self.bytes[rank] -= size as u128;
            self.total_bytes -= size & self.budget_mask;
        }
    }

    /// Serves the next item by weight; an item whose deadline passed is handed back as expired
    /// without being charged to its tier's share.
    /// Only tiers whose bit is set in `mask` (bit `rank`) are considered, and those of
    /// `borrowing` when served ahead of the weighted order, in deadline order (see
    /// [`set_drain`](Self::set_drain)); with `borrowing` `None`, by weight alone.
    ///
    /// `recent` may lag the true time a little (see the `time` module): a deadline at or before
    /// it has passed for sure, one more than `DEADLINE_WINDOW` after it has not; only a
    /// deadline inside the window is checked against `precise()`. So no expired item is
    /// served, and most pops read no clock.
    #[inline]
    pub(crate) fn pop(
        &mut self,
        recent: Instant,
        precise: impl FnOnce() -> Instant,
        mask: u8,
        borrowing: Option<u8>,
    ) -> Option<Dequeued<T>> {
        let rank = self.next_tier(mask, borrowing, recent)?;
        let e = self.tiers[rank].pop_front()?;
        if self.tiers[rank].is_empty() {
            self.backlog &= !(1 << rank);
        }
        self.take_out(rank, &e);
        self.pops += 1;
        let expired = match e.deadline() {
            None => false,
            Some(d) => d <= recent || (d <= recent + DEADLINE_WINDOW && d <= precise()),
        };
        if expired {
            self.stats[rank].expired += 1;
            return Some(Dequeued::Expired(e));
        }
        self.sched.charge(rank);
        self.popped[rank] += 1;
        Some(Dequeued::Ready(e))
    }

    /// What a size of `size_bytes` counts against the byte budget: itself with a budget, 0
    /// without one.
    #[inline]
    pub(crate) fn budgeted(&self, size_bytes: usize) -> usize {
        size_bytes & self.budget_mask
    }

    /// Whether `count` more items of `bytes` in all (as [`budgeted`](Self::budgeted)) fit
    /// under the count bound and the byte budget as they stand.
    pub(crate) fn has_room(&self, count: usize, bytes: usize) -> bool {
        self.len + count <= self.capacity && bytes <= self.max_bytes - self.total_bytes
    }

    /// Puts an entry that a pop took out as ready, and that was not served, back at the head
    /// of its tier with its stamp, as if the pop had not happened (its tier's scheduling charge
    /// refunded). Entries go back in the reverse order of their pops. Does not check the
    /// bounds: the caller does ([`has_room`](Self::has_room)).
    pub(crate) fn requeue_front(&mut self, e: Entry<T>) {
        let rank = e.criticality.rank();
        let size = e.size_bytes;
        if let Some(d) = e.deadline() {
            if self.earliest_deadline.is_none_or(|x| d < x) {
                self.earliest_deadline = Some(d);
            }
        }
        self.sched.refund(rank);
        if let Some(of) = self.hand_back_of {
            let old_head = self.tiers[rank].front().map(|h| of(&h.item));
            self.hand_backs[rank].pushed_front(of(&e.item), old_head);
        }
        self.backlog |= 1 << rank;
        self.tiers[rank].push_front(e);
        self.len += 1;
        self.bytes[rank] += size as u128;
        self.total_bytes += size & self.budget_mask;
        self.pops = self.pops.saturating_sub(1);
        self.popped[rank] = self.popped[rank].saturating_sub(1);
    }

    /// After [`requeue_front`](Self::requeue_front) of every entry popped after one of tier
    /// `rank`: the scheduler's virtual time as that pop left it.
    pub(crate) fn requeued_after(&mut self, rank: usize) {
        self.sched.restore_vtime(rank);
    }

    /// The queue age each tier sees, indexed by rank: the age of the oldest item waiting at that
    /// tier or above.
    pub(crate) fn ages(&self, now: Instant) -> [Duration; 4] {
        let mut ages = [Duration::ZERO; 4];
        let mut oldest = Duration::ZERO;
        for rank in (0..4).rev() {
            if let Some(head) = self.tiers[rank].front() {
                oldest = oldest.max(head.sojourn(now));
            }
            ages[rank] = oldest;
        }
        ages
    }

    /// Items held per tier, indexed by rank.
    pub(crate) fn depths(&self) -> [usize; 4] {
        [0, 1, 2, 3].map(|r| self.tiers[r].len())
    }

    pub(crate) fn set_weights(&mut self, weights: [u32; 4]) {
        self.sched.set_weights(weights);
    }

    /// Sets the time one pop takes at the measured capacity and the longest run per tier,
    /// which turns on deadline-ordered service inside the weighted order (`slack.rs`); `None`
    /// turns it off.
    pub(crate) fn set_drain(&mut self, drain: Option<(Duration, [Duration; 4])>) {
        self.slack.set(drain);
    }

    /// Applies new bounds, evicting by the push rule (newest of the lowest non-empty tier) until
    /// the queue fits; with nothing below, the most critical tier gives way last.
    pub(crate) fn set_bounds(
        &mut self,
        capacity: usize,
        max_bytes: Option<usize>,
    ) -> Vec<Entry<T>> {
        self.capacity = capacity;
        self.max_bytes = max_bytes.unwrap_or(usize::MAX);
        // Held without a budget, the sizes may add up past any budget now set, or past
        // `usize::MAX`: while evicting they are compared in `u128` and nothing counts into
        // `total_bytes`, which is set once they fit.
        self.budget_mask = 0;
        self.total_bytes = 0;
        let limit = max_bytes.map_or(u128::MAX, |b| b as u128);
        let mut out = Vec::new();
        while self.len > self.capacity || self.bytes.iter().sum::<u128>() > limit {
            match self.evict_below(Criticality::COUNT) {
                Some(e) => out.push(e),
                None => break,
            }
        }
        self.budget_mask = budget_mask(max_bytes);
        if max_bytes.is_some() {
            // At most the budget, so within `usize`.
            self.total_bytes =
                usize::try_from(self.bytes.iter().sum::<u128>()).unwrap_or(usize::MAX);
        }
        out
    }

    /// Takes out every item for which `pred` returns `true`, most critical tier first and
    /// oldest first within a tier, counted as drained; the others keep their order. Visits
    /// every item once (each tier rotated through itself, no allocation but the result).
    pub(crate) fn drain_where(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<Entry<T>> {
        let mut out = Vec::new();
        for rank in (0..self.tiers.len()).rev() {
            for _ in 0..self.tiers[rank].len() {
                let Some(e) = self.tiers[rank].pop_front() else {
                    break;
                };
                if pred(&e.item) {
                    self.take_out(rank, &e);
                    self.stats[rank].drained += 1;
                    out.push(e);
                } else {
                    self.tiers[rank].push_back(e);
                }
            }
            if self.tiers[rank].is_empty() {
                self.backlog &= !(1 << rank);
            }
        }
        out
    }

    /// Closes the queue and hands back everything it holds, most critical first, oldest first.
    pub(crate) fn close(&mut self) -> Vec<Entry<T>> {
        self.closed = true;
        self.earliest_deadline = None;
        self.hand_backs = [TierHandBacks::default(); 4];
        let mut out = Vec::with_capacity(self.len);
        for rank in (0..4).rev() {
            let n = self.tiers[rank].len() as u64;
            self.stats[rank].drained += n;
            out.extend(self.tiers[rank].drain(..));
            self.bytes[rank] = 0;
        }
        self.len = 0;
        self.total_bytes = 0;
        self.backlog = 0;
        out
    }

    pub(crate) fn stats(&self, shed_level: u8, overloaded: [u64; 4]) -> QueueStats {
        let mut tiers = self.stats;
        for (rank, t) in tiers.iter_mut().enumerate() {
            t.pushed += self.pushed[rank];
            t.popped += self.popped[rank];
            t.depth = self.tiers[rank].len() as u64;
            t.bytes = u64::try_from(self.bytes[rank]).unwrap_or(u64::MAX);
            t.pushed += overloaded[rank];
            t.refused[RefuseReason::Overloaded.index()] += overloaded[rank];
        }
        let [sheddable, medium, high, critical] = tiers;
        QueueStats {
            tiers: crate::PerTier::new(critical, high, medium, sheddable),
            shed_level,
        }
    }
}
