//! What a tier knows of its items' hand-back instants: enough for
//! [`WfqQueue::take_due`](crate::queue::WfqQueue::take_due) to find every item due without
//! visiting the items that are not, in the usual case.
//!
//! # Why not only the heads
//!
//! A tier is FIFO by enqueue time, and items mostly arrive in the order their source received
//! them, so their hand-back instants (receipt plus a share of the broker's patience) mostly
//! grow from head to tail: then the items due are a prefix of the tier, and taking heads while
//! they are due finds them all. But not always: a message held under backpressure and offered
//! again, an evicted one queued again, a retry, a message released from its key's lane, one
//! handed back to the head of its tier by a worker, or one of another source with less
//! patience is queued behind items that are due later than it, or behind an item with no
//! hand-back at all (a source without such a limit). Such a *straggler* cannot be reached by
//! taking heads, and waiting until it reaches the head could outlast the broker's patience:
//! under a sustained Critical backlog a Sheddable tier barely moves.
//!
//! So each tier keeps two bounds, updated in O(1) as items come in:
//! - `tail`: at or above the hand-back instant of every item in the tier (`Top` once one
//!   without an instant is in it). An item pushed below it may be behind a later one: a
//!   straggler.
//! - `stragglers`: at or before the hand-back instant of every straggler.
//!
//! The invariant: every item of the tier with a hand-back instant `h` either has only items
//! with instants at or before `h` ahead of it (the heads reach it: once it is due, so is
//! everything ahead of it), or `h >= stragglers`. Taking heads while due, and scanning the
//! tier only once `stragglers` has come, therefore finds every item due. A scan recomputes
//! both bounds exactly, so the next one comes only when a straggler is really due: scans are
//! at most one per straggler handed back (plus one per bound made stale by pops), never one
//! per message. Removing items (pops, evictions, expiries, drains) keeps the invariant, since
//! it only removes items from ahead of others; the bounds then may be stale but stay bounds.

use quanta::Instant;

use super::Core;
use crate::queue::Entry;

/// An upper bound of the hand-back instants in a tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Tail {
    /// No item with or without an instant since the bounds were last reset.
    #[default]
    Empty,
    /// At or above every instant held.
    At(Instant),
    /// An item without a hand-back instant is (or was) in the tier: every later one with an
    /// instant is behind it.
    Top,
}

impl Tail {
    /// Whether an item with instant `h` pushed behind everything this bounds could be behind a
    /// later one (or one without an instant).
    fn above(self, h: Instant) -> bool {
        match self {
            Tail::Empty => false,
            Tail::At(t) => t > h,
            Tail::Top => true,
        }
    }

    fn raise(&mut self, h: Option<Instant>) {
        *self = match (*self, h) {
            (Tail::Top, _) | (_, None) => Tail::Top,
            (Tail::Empty, Some(h)) => Tail::At(h),
            (Tail::At(t), Some(h)) => Tail::At(t.max(h)),
        };
    }
}

/// The bounds of one tier (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TierHandBacks {
    tail: Tail,
    /// At or before the hand-back instant of every straggler; `None`: no straggler.
    stragglers: Option<Instant>,
}

impl TierHandBacks {
    /// An item with hand-back instant `h` (`None`: never due) was pushed at the tail.
    #[inline]
    pub(crate) fn pushed_back(&mut self, h: Option<Instant>) {
        if let Some(h) = h {
            if self.tail.above(h) {
                self.straggle(h);
            }
        }
        self.tail.raise(h);
    }

    /// An item with hand-back instant `h` was put back at the head, in front of a head with
    /// instant `old_head` (`None`: the tier was empty; `Some(None)`: a head never due).
    pub(crate) fn pushed_front(&mut self, h: Option<Instant>, old_head: Option<Option<Instant>>) {
        match old_head {
            None => *self = TierHandBacks::default(),
            // The items the heads reached have instants at or after the old head's: they stay
            // reachable only if this one is not later than it.
            Some(Some(x)) if h.is_none_or(|h| h > x) => self.straggle(x),
            // Behind a head never due, every item with an instant is a straggler already.
            Some(_) => {}
        }
        self.tail.raise(h);
    }

    fn straggle(&mut self, h: Instant) {
        self.stragglers = Some(self.stragglers.map_or(h, |s| s.min(h)));
    }

    /// Whether a straggler may be due at `now`: then the tier must be scanned.
    #[inline]
    pub(crate) fn stragglers_due(&self, now: Instant) -> bool {
        self.stragglers.is_some_and(|s| s <= now)
    }

    /// Bounds recomputed exactly from the tier's instants, head to tail (see [`Scan`]).
    pub(crate) fn rescanned(scan: Scan) -> Self {
        TierHandBacks {
            tail: scan.running,
            stragglers: scan.stragglers,
        }
    }
}

/// Exact bounds of a tier, built by visiting its items from head to tail.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Scan {
    running: Tail,
    stragglers: Option<Instant>,
}

impl Scan {
    /// The next item, behind the ones visited, has hand-back instant `h`.
    pub(crate) fn visit(&mut self, h: Option<Instant>) {
        if let Some(h) = h {
            if self.running.above(h) {
                self.stragglers = Some(self.stragglers.map_or(h, |s| s.min(h)));
            }
        }
        self.running.raise(h);
    }
}

impl<T> Core<T> {
    /// Reads each item's hand-back instant with `of` from now on (see
    /// [`WfqQueue::track_hand_backs`](crate::queue::WfqQueue::track_hand_backs)); the bounds
    /// of the items already held are computed once, by a scan.
    pub(crate) fn track_hand_backs(&mut self, of: fn(&T) -> Option<Instant>) {
        self.hand_back_of = Some(of);
        for rank in 0..self.tiers.len() {
            let mut scan = Scan::default();
            for e in &self.tiers[rank] {
                scan.visit(of(&e.item));
            }
            self.hand_backs[rank] = TierHandBacks::rescanned(scan);
        }
    }

    /// Takes out every item whose hand-back instant is at or before `now` into `out`, most
    /// critical tier first and oldest first within a tier, counted as drained: the heads
    /// while they are due, and a tier's other items only when one of its stragglers may be
    /// (see the module docs). Nothing without [`track_hand_backs`](Self::track_hand_backs).
    pub(crate) fn take_due(&mut self, now: Instant, out: &mut Vec<Entry<T>>) {
        let Some(of) = self.hand_back_of else {
            return;
        };
        let due = |e: &Entry<T>| of(&e.item).is_some_and(|h| h <= now);
        for rank in (0..self.tiers.len()).rev() {
            while self.tiers[rank].front().is_some_and(due) {
                let Some(e) = self.tiers[rank].pop_front() else {
                    break;
                };
                self.take_out(rank, &e);
                self.stats[rank].drained += 1;
                out.push(e);
            }
            if self.hand_backs[rank].stragglers_due(now) {
                let mut scan = Scan::default();
                for _ in 0..self.tiers[rank].len() {
                    let Some(e) = self.tiers[rank].pop_front() else {
                        break;
                    };
                    let h = of(&e.item);
                    if h.is_some_and(|h| h <= now) {
                        self.take_out(rank, &e);
                        self.stats[rank].drained += 1;
                        out.push(e);
                    } else {
                        scan.visit(h);
                        self.tiers[rank].push_back(e);
                    }
                }
                self.hand_backs[rank] = TierHandBacks::rescanned(scan);
            }
            if self.tiers[rank].is_empty() {
                self.backlog &= !(1 << rank);
                self.hand_backs[rank] = TierHandBacks::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(origin: Instant, ms: u64) -> Option<Instant> {
        Some(origin + Duration::from_millis(ms))
    }

    /// In order, nothing straggles; an item pushed behind a later one (or behind one never
    /// due) does, and the bound is the earliest such instant.
    #[test]
    fn an_item_behind_a_later_one_straggles() {
        let o = quanta::Clock::mock().0.now();
        let mut t = TierHandBacks::default();
        t.pushed_back(at(o, 10));
        t.pushed_back(at(o, 10));
        t.pushed_back(at(o, 20));
        assert_eq!(t.stragglers, None);
        t.pushed_back(at(o, 15));
        t.pushed_back(at(o, 12));
        assert_eq!(t.stragglers, at(o, 12));
        assert!(!t.stragglers_due(o + Duration::from_millis(11)));
        assert!(t.stragglers_due(o + Duration::from_millis(12)));

        let mut t = TierHandBacks::default();
        t.pushed_back(None);
        t.pushed_back(at(o, 50));
        assert_eq!(t.stragglers, at(o, 50), "behind one never due");
    }

    /// Put back at the head: nothing changes when it is not later than the old head;
    /// otherwise the items the heads reached may straggle, from the old head's instant on.
    #[test]
    fn a_later_item_in_front_makes_the_rest_straggle() {
        let o = quanta::Clock::mock().0.now();
        let mut t = TierHandBacks::default();
        t.pushed_back(at(o, 10));
        t.pushed_front(at(o, 5), Some(at(o, 10)));
        assert_eq!(t.stragglers, None);
        t.pushed_front(at(o, 30), Some(at(o, 5)));
        assert_eq!(t.stragglers, at(o, 5));
        let mut t = TierHandBacks::default();
        t.pushed_back(at(o, 10));
        t.pushed_front(None, Some(at(o, 10)));
        assert_eq!(t.stragglers, at(o, 10));
        t.pushed_front(at(o, 1), None);
        assert_eq!(t, TierHandBacks::default().with_tail(at(o, 1)));
    }

    /// A scan finds exactly the items some earlier item's instant (or lack of one) hides.
    #[test]
    fn a_scan_bounds_exactly() {
        let o = quanta::Clock::mock().0.now();
        let mut s = Scan::default();
        for h in [at(o, 5), at(o, 9), at(o, 7), None, at(o, 20), at(o, 8)] {
            s.visit(h);
        }
        let t = TierHandBacks::rescanned(s);
        assert_eq!(t.stragglers, at(o, 7));
        assert_eq!(t.tail, Tail::Top);
    }

    impl TierHandBacks {
        fn with_tail(mut self, h: Option<Instant>) -> Self {
            self.tail.raise(h);
            self
        }
    }
}
