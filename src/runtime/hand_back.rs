//! Handing back: the runtime's steps for the broker's patience (see `patience.rs` for why
//! and what): each message's hand-back instant, the sweep of what is due on the sampler's
//! tick, and the hand-back itself (expired, deferred or released).

use std::sync::Arc;
use std::time::Duration;

use quanta::Instant;

use crate::runtime::engine::Inner;
use crate::runtime::item::Item;
use crate::runtime::metrics::{HANDED_BACK_DEFERRED, HANDED_BACK_RELEASED};
use crate::runtime::patience::{share_of, Waited};
use crate::runtime::{DeferReason, RefusalPolicy, Source};

/// The queue reads an item's hand-back instant with this.
fn hand_back_of<T>(item: &Item<T>) -> Option<Instant> {
    item.hand_back_at()
}

impl<T: Send + Sync + 'static> Inner<T> {
    fn ns_since_origin(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A source with `patience` is attached: from now on the queue reads each item's hand-back
    /// instant (a push then pays one call more; without such a source, nothing).
    pub(crate) fn track_patience(&self, patience: Option<Duration>) {
        if patience.is_some() && self.patience.start_tracking() {
            self.queue.track_hand_backs(hand_back_of::<T>);
        }
    }

    /// The hand-back instant of a message received now from a source with `patience`, after
    /// it `waited` in the source: `patience_share` of the patience after its delivery.
    pub(crate) fn hand_back_at(
        &self,
        patience: Option<Duration>,
        waited: Duration,
    ) -> Option<Instant> {
        let patience = patience?;
        let left = share_of(patience, self.config().expert.patience_share).saturating_sub(waited);
        let now = crate::queue::time::recent(&self.clock);
        Some(now.checked_add(left).unwrap_or(now))
    }

    /// A message with hand-back instant `at` was parked behind its key.
    pub(crate) fn parked_with(&self, at: Option<Instant>) {
        if let Some(at) = at {
            self.patience.parked_until(self.ns_since_origin(at));
        }
    }

    /// Hands back a message that waited (where `waited` says) until its hand-back instant:
    /// expired if its deadline passed, deferred where its tier defers and a copy comes back in
    /// time, released otherwise (see the module docs). A queued or held message of an ordering
    /// key is its key's message inside the runtime: released, it takes the messages parked
    /// behind it along and frees the key; expired, it frees the key as any disposition does.
    pub(crate) fn hand_back(self: &Arc<Self>, mut item: Item<T>, waited: Waited) {
        let key = item.key;
        if waited == Waited::Parked {
            // Not its key's message inside the runtime: its end frees nothing.
            item.key = None;
        }
        if item.deadline().is_some_and(|d| d <= self.clock.now()) {
            return self.expire(item);
        }
        let tier = item.original;
        let deferred = key.is_none()
            && self.policy(&item) == RefusalPolicy::Defer
            && !self.expires_before_drain(&item);
        let permit = if deferred {
            Arc::clone(&self.deferrals.permits).try_acquire_owned().ok()
        } else {
            None
        };
        let outcome = if permit.is_some() {
            HANDED_BACK_DEFERRED
        } else {
            HANDED_BACK_RELEASED
        };
        self.accounts.metrics.tiers[tier].handed_back[waited.index()][outcome].increment(1);
        self.patience.count_handed_back(tier);
        match permit {
            Some(permit) => {
                item.unmark_waiting();
                let this = Arc::clone(self);
                self.spawn(async move {
                    this.defer_until_done(item, DeferReason::Patience).await;
                    drop(permit);
                });
            }
            None => {
                // Released unacknowledged: the broker delivers it again.
                drop(item);
                if let (Some(key), false) = (key, waited == Waited::Parked) {
                    for parked in self.keys.withdraw(key) {
                        self.hand_back(parked, Waited::Parked);
                    }
                }
            }
        }
    }

    /// On the sampler's tick: hands back what is due in the queue and in the key gate.
    pub(crate) fn sweep_patience(self: &Arc<Self>) {
        if !self.patience.tracking() {
            return;
        }
        for entry in self.queue.take_due() {
            self.hand_back(entry.into_inner(), Waited::Queued);
        }
        let now = self.clock.now();
        if !self.patience.take_parked_due(self.ns_since_origin(now)) {
            return;
        }
        let mut next = u64::MAX;
        let due = self.keys.drain_where(|item| match item.hand_back_at() {
            Some(at) if at <= now => true,
            Some(at) => {
                next = next.min(self.ns_since_origin(at));
                false
            }
            None => false,
        });
        self.patience.parked_until(next);
        for item in due {
            self.hand_back(item, Waited::Parked);
        }
    }

    /// Asks `source` to release what waited `patience_share` of its patience in its own buffer,
    /// once per `admission.tick_ms` at most (`next` is when it may next).
    pub(crate) fn release_waiting<S: Source<Payload = T>>(
        &self,
        source: &mut S,
        next: &mut tokio::time::Instant,
    ) {
        let Some(patience) = source.patience() else {
            return;
        };
        let now = tokio::time::Instant::now();
        if now < *next {
            return;
        }
        let config = self.config();
        *next = now + Duration::from_millis(config.expert.admission.tick_ms);
        source.release_waiting(share_of(patience, config.expert.patience_share));
    }
}
