//! Settling: the one place a message's disposition is recorded (observer, ledger, ack), and
//! what recording it frees: the next message of its ordering key, let through the key gate.
//! Also the two ways a message is found useless before it is served: expired while held or
//! waiting, and expired at intake from its headers alone.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use crate::admission::Decision;
use crate::ledger::Disposition;
use crate::ordering::Arrival;
use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::Item;

impl<T: Send + Sync + 'static> Inner<T> {
    /// Records the disposition (observer, ledger, ack), exactly once per message: the one place
    /// a disposition is recorded; for a keyed message, then lets the next message of its key
    /// through the gate. Returns the payload's shared handle, if a handler had one, for the
    /// next message to reuse.
    pub(crate) fn settle(
        self: &Arc<Self>,
        item: Item<T>,
        disposition: Disposition,
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
            self.release_key(key);
        }
        spare
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
        match self
            .keys
            .arrive(key, item, crate::queue::time::recent(&self.clock))
        {
            Arrival::Admitted(mut item) => {
                item.unmark_waiting();
                Some(item)
            }
            Arrival::Parked => None,
            // Shutting down: released unacknowledged, with the rest of its key.
            Arrival::Closed(item) => {
                drop(item);
                None
            }
        }
    }

    /// The message of `key` inside the runtime has its disposition: offers the next one parked
    /// behind it. Settling that one (expired while parked, shed by its policy) releases the
    /// next in turn; a thread-local work list turns that recursion into a loop, so a long run
    /// of shed messages of one key never deepens the stack.
    pub(crate) fn release_key(self: &Arc<Self>, key: u64) {
        thread_local! {
            static RELEASING: std::cell::RefCell<Option<Vec<u64>>> =
                const { std::cell::RefCell::new(None) };
        }
        /// Ends the release loop even if an offer panics, so later releases are not taken
        /// for nested ones.
        struct Done;
        impl Drop for Done {
            fn drop(&mut self) {
                RELEASING.with(|r| *r.borrow_mut() = None);
            }
        }
        let nested = RELEASING.with(|r| {
            let mut r = r.borrow_mut();
            match r.as_mut() {
                Some(pending) => {
                    pending.push(key);
                    true
                }
                None => {
                    *r = Some(Vec::new());
                    false
                }
            }
        });
        if nested {
            return;
        }
        let _done = Done;
        let mut next = Some(key);
        while let Some(key) = next {
            self.release_one(key);
            next = RELEASING.with(|r| r.borrow_mut().as_mut().and_then(Vec::pop));
        }
    }

    pub(crate) fn release_one(self: &Arc<Self>, key: u64) {
        let Some((item, parked_at)) = self.keys.release_next_waited(key) else {
            return;
        };
        let now = crate::queue::time::recent(&self.clock);
        self.accounts
            .metrics
            .ordering_wait
            .record(now.saturating_duration_since(parked_at).as_secs_f64());
        if item.deadline.is_some_and(|d| d <= now) {
            return self.expire(item);
        }
        match self.offer(item) {
            Offer::Taken => {}
            Offer::Hold(held) | Offer::Evicted(held) | Offer::CircuitHold(held) => {
                self.hold_in_task(held)
            }
        }
    }

    /// A message whose deadline passed before it could be queued (held by backpressure, or
    /// waiting to retry): as useless as one expired in the queue, and settled the same way.
    pub(crate) fn expire(self: &Arc<Self>, item: Item<T>) {
        self.accounts.metrics.tiers[item.original]
            .expired
            .increment(1);
        self.settle(item, Disposition::Expired);
    }

    /// A message pulled past its deadline: expired before it is queued, counted apart.
    pub(crate) fn expire_at_intake(self: &Arc<Self>, mut item: Item<T>) {
        self.accounts.metrics.tiers[item.original]
            .expired_at_intake
            .increment(1);
        // Expired before the key gate, it never held its key: settling it must not release
        // the key of an earlier message of that key still running.
        item.key = None;
        self.decide(&mut item, Decision::ShedExpired);
        self.expire(item);
    }
}
