//! Settling: the one place a message's disposition is recorded (observer, ledger, ack), and
//! what recording it frees: its ordering key, whose next message is due through the key gate.
//! Also the settling of a message found useless before it is served: expired at the gate,
//! while held or waiting, and at intake from its headers alone (where each is decided: the
//! gate's module docs).
//!
//! # Settling returns, the loop releases
//!
//! Recording a keyed message's disposition frees its key, and the next message of that key is
//! then offered; that offer may settle messages in turn (the message itself, shed by its
//! policy; the lower ones its push evicted), which frees their keys. No step releases a key
//! itself: recording returns the key in [`Freed`], the steps of one offer collect what they
//! freed there, and the loop that drives them ([`Inner::release`]) offers each key's next
//! message until nothing more is freed. So a long run of one key's messages shed in turn is a
//! loop, never a recursion, and no step re-enters another.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use crate::admission::Decision;
use crate::ledger::Disposition;
use crate::ordering::Arrival;
use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::Item;

impl<T: Send + Sync + 'static> Inner<T> {
    /// Records the disposition (observer, ledger, ack), exactly once per message, then lets the
    /// next message of its key (if it had one) through the key gate. Returns the payload's
    /// shared handle, if a handler had one, for the next message to reuse.
    pub(crate) fn settle(
        self: &Arc<Self>,
        item: Item<T>,
        disposition: Disposition,
    ) -> Option<Arc<T>> {
        let mut freed = Freed::default();
        let spare = self.record(item, disposition, &mut freed);
        self.release(freed);
        spare
    }

    /// Records the disposition (observer, ledger, ack), exactly once per message: the one place
    /// a disposition is recorded. Its key, if it had one, goes to `freed` for the caller's
    /// loop to release. Returns the payload's shared handle, if a handler had one.
    pub(crate) fn record(
        &self,
        item: Item<T>,
        disposition: Disposition,
        freed: &mut Freed,
    ) -> Option<Arc<T>> {
        let key = item.key;
        if let Some(observe) = &self.observer {
            let observed = std::panic::catch_unwind(AssertUnwindSafe(|| {
                observe(item.payload(), item.original, disposition)
            }));
            // A panicking observer must not cost the message its acknowledgement, nor the
            // worker its life: counted with handler panics, and the disposition stands.
            if observed.is_err() {
                self.accounts.metrics.panics.increment(1);
            }
        }
        let spare = item.settle(disposition);
        if let Some(key) = key {
            freed.push(key);
        }
        spare
    }

    /// The loop that drives the key gate: for each key freed, the next message parked behind
    /// it is offered (or expired); what that frees in turn is released in the same loop.
    pub(crate) fn release(self: &Arc<Self>, mut freed: Freed) {
        while let Some(key) = freed.pop() {
            self.release_one(key, &mut freed);
        }
    }

    /// The next message of `key`, if one is parked, offered: the gate expires it if its
    /// deadline passed while it waited. What settling it frees goes to `freed`.
    fn release_one(self: &Arc<Self>, key: u64, freed: &mut Freed) {
        let Some((item, parked_at)) = self.keys.release_next_waited(key) else {
            return;
        };
        let now = crate::queue::time::recent(&self.clock);
        self.accounts
            .metrics
            .ordering_wait
            .record(now.saturating_duration_since(parked_at).as_secs_f64());
        match self.offer_into(item, false, freed) {
            Offer::Taken => {}
            Offer::Hold(held) | Offer::Evicted(held) | Offer::CircuitHold(held) => {
                self.hold_in_task(held)
            }
        }
    }

    /// A message taken from a source or a producer meets the key gate: `Some` to go on (not
    /// keyed, or the first of its key inside), `None` when parked behind its key (or released,
    /// the gate being closed at shutdown).
    pub(crate) fn pass_gate(&self, mut item: Item<T>) -> Option<Item<T>> {
        let Some(key) = item.key else {
            return Some(item);
        };
        // Parked, it is in memory either way and waits for its key, not for room: out of the
        // memory budget's working set, as a message held under backpressure is, so the
        // messages parked behind a key never keep that key's own message out of the budget.
        // Its offer, when the key lets it through, counts it in again.
        item.mark_waiting();
        let hand_back_at = item.hand_back_at();
        match self
            .keys
            .arrive(key, item, crate::queue::time::recent(&self.clock))
        {
            Arrival::Admitted(mut item) => {
                item.unmark_waiting();
                Some(item)
            }
            Arrival::Parked => {
                self.parked_with(hand_back_at);
                None
            }
            // Shutting down: released unacknowledged, with the rest of its key.
            Arrival::Closed(item) => {
                drop(item);
                None
            }
        }
    }

    /// A message whose deadline passed before it could be queued (held by backpressure, or
    /// waiting to retry): as useless as one expired in the queue, and settled the same way.
    pub(crate) fn expire(self: &Arc<Self>, item: Item<T>) {
        let mut freed = Freed::default();
        self.expire_into(item, &mut freed);
        self.release(freed);
    }

    /// [`expire`](Self::expire) inside a step: its key goes to `freed`.
    pub(crate) fn expire_into(&self, item: Item<T>, freed: &mut Freed) {
        self.accounts.metrics.tiers[item.original]
            .expired
            .increment(1);
        self.record(item, Disposition::Expired, freed);
    }

    /// A message pulled past its deadline: expired before it is queued, counted apart.
    pub(crate) fn expire_at_intake(self: &Arc<Self>, mut item: Item<T>) {
        self.accounts.metrics.tiers[item.original]
            .expired_at_intake
            .increment(1);
        // Expired before the key gate, it never held its key: settling it must not release
        // the key of an earlier message of that key still running.
        item.key = None;
        self.decide(&item, Decision::ShedExpired);
        self.expire(item);
    }
}

/// Ordering keys freed by the messages settled in one step, for the loop that drives the steps
/// to release ([`Inner::release`]). The first key is kept inline: settling one keyed message
/// allocates nothing; only keys freed while others wait to be released take a vector.
#[derive(Debug, Default)]
pub(crate) struct Freed {
    first: Option<u64>,
    more: Vec<u64>,
}

impl Freed {
    /// One more key to release.
    pub(crate) fn push(&mut self, key: u64) {
        match self.first {
            None => self.first = Some(key),
            Some(_) => self.more.push(key),
        }
    }

    /// The key to release next: the last freed first, so a run of one key's messages is
    /// released before the keys freed earlier (as the messages were settled).
    pub(crate) fn pop(&mut self) -> Option<u64> {
        self.more.pop().or_else(|| self.first.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_keys_come_back_last_first_and_one_is_kept_inline() {
        let mut f = Freed::default();
        assert_eq!(f.pop(), None);
        f.push(1);
        assert_eq!(f.more.capacity(), 0);
        f.push(2);
        f.push(3);
        assert_eq!(f.pop(), Some(3));
        f.push(4);
        assert_eq!(f.pop(), Some(4));
        assert_eq!(f.pop(), Some(2));
        assert_eq!(f.pop(), Some(1));
        assert_eq!(f.pop(), None);
    }
}
