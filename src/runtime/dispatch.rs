//! Dispatch: what a worker takes from the queue (weighted-fair among the tiers its share of the
//! concurrency limit allows, work-conserving when higher tiers are quiet), the last check of a
//! popped item before its handler, putting back what a worker did not start, and the
//! downstream outcome a handler's call reports to the breakers.

use crate::sync::Ordering;
use std::sync::Arc;

use quanta::Instant;

use crate::admission::Outcome;
use crate::queue::{Dequeued, TierMask, TryPopError};
use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::Item;
use crate::runtime::settle::Freed;
use crate::runtime::HandlerError;
use crate::Criticality;

/// Why [`Inner::dispatch_check`] keeps a popped item from its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Barred {
    /// Its source took it back (see `recall.rs`): released.
    TakenBack,
    /// Its deadline passed: expired.
    Expired,
    /// Its downstream's circuit admits no call now: refused, by its tier's policy.
    Circuit,
}

impl<T: Send + Sync + 'static> Inner<T> {
    /// Whether no tier above `tier` has work queued now, nor had any queued within
    /// `share_reserve_ms` (0: only "now" counts).
    pub(crate) fn higher_tiers_quiet(&self, tier: Criticality) -> bool {
        let above = Criticality::ALL
            .iter()
            .filter(|t| t.rank() > tier.rank())
            .fold(TierMask::NONE, |m, t| m.with(*t));
        if !self
            .queue
            .backlog()
            .without(TierMask::ALL.without(above))
            .is_empty()
        {
            return false;
        }
        let reserve = self
            .config()
            .expert
            .share_reserve_ms
            .saturating_mul(1_000_000);
        if reserve == 0 {
            return true;
        }
        let now = self.recent_ns();
        Criticality::ALL
            .iter()
            .filter(|t| t.rank() > tier.rank())
            .all(|t| {
                let last = self.signals.measured.max(|m| &m.last_work_ns[t.rank()]);
                last == 0 || now.saturating_sub(last) >= reserve
            })
    }

    /// The tiers a worker may take now: those under their share of the limit, plus, with
    /// work-conserving shares, those whose higher tiers are quiet while a slot is idle.
    pub(crate) fn worker_mask(&self) -> TierMask {
        let mask = self.limit.allowed_mask();
        if !self.config().expert.work_conserving || self.limit.in_flight() >= self.limit.limit() {
            return mask;
        }
        if mask == TierMask::ALL {
            return mask;
        }
        let mut mask = mask;
        for tier in Criticality::ALL {
            if !mask.contains(tier) && self.higher_tiers_quiet(tier) {
                mask = mask.with(tier);
            }
        }
        mask
    }

    /// Tiers past their share that a worker may take all the same when the queue serves them
    /// ahead of the weighted order, by deadline (`WfqQueue::set_drain`): the shares reserve
    /// workers for the more important tiers, and deadline-ordered service takes a tier early
    /// only when every more important tier's queued work can wait, its longest run included.
    /// All of them with work-conserving shares and the derived controls on (`derive_bounds`),
    /// else none.
    ///
    /// `None` (by weight alone) while a message is parked behind a busy ordering key: the
    /// message deadline order would pass holds its key, and the slack it spends is also that of
    /// every message parked behind it (a hot key's Critical messages expired).
    fn borrowing_mask(&self) -> Option<TierMask> {
        if self.keys.parked() > 0 {
            return None;
        }
        let config = self.config();
        Some(
            if config.expert.work_conserving && config.expert.admission.derive_bounds {
                TierMask::ALL
            } else {
                TierMask::NONE
            },
        )
    }

    /// One pop batch of the tiers a worker may take now (see `worker_mask`,
    /// `borrowing_mask`).
    fn pop_allowed(
        &self,
        max: usize,
        out: &mut Vec<Dequeued<Item<T>>>,
    ) -> Result<usize, TryPopError> {
        self.queue
            .pop_batch_borrowing(self.worker_mask(), self.borrowing_mask(), max, out)
    }

    /// Takes the next batch a worker may start, at most `max` items, weighted-fair among the
    /// tiers whose share of the concurrency limit is not used up, into `out`. Waits while there
    /// is none; `false` once the queue is closed and empty.
    pub(crate) async fn next_batch(
        self: &Arc<Self>,
        out: &mut Vec<Dequeued<Item<T>>>,
        max: usize,
    ) -> bool {
        let mut yielded = false;
        loop {
            match self.pop_allowed(max, out) {
                Ok(_) => {
                    self.pacing.wake_intake();
                    return true;
                }
                Err(TryPopError::Closed) => return false,
                Err(_) => {}
            }
            // Pulls what the intake would, rather than wait for it to; its pushes woke no one,
            // so if this worker's tiers cannot take them now, the others are told.
            if self.pull_for_intake() {
                match self.pop_allowed(max, out) {
                    Ok(_) => {
                        self.pacing.wake_intake();
                        return true;
                    }
                    Err(TryPopError::Closed) => return false,
                    Err(_) => {
                        self.queue.not_empty().notify(1);
                    }
                }
                continue;
            }
            if !yielded {
                // Let the intake (likely on this thread) run once before registering to
                // sleep: a yield costs less than a listener and a wake-up per message.
                yielded = true;
                tokio::task::yield_now().await;
                continue;
            }
            let _waiting = self.queue.wait_registration();
            // On this task's stack, not the heap: an idle worker's wait allocates nothing.
            event_listener::listener!(self.queue.not_empty() => on_push);
            // Only a worker that sees work its tiers' shares hold back waits for a slot too:
            // an idle worker over an empty queue is woken by a push, not by every completion.
            let held_back = self.queue.backlog().without(self.worker_mask());
            let on_release = self
                .limit
                .most_allowed(held_back)
                .map(|tier| self.limit.listen(tier));
            match self.pop_allowed(max, out) {
                Ok(_) => {
                    self.pacing.wake_intake();
                    return true;
                }
                Err(TryPopError::Closed) => return false,
                Err(_) => {}
            }
            match on_release {
                Some(on_release) => tokio::select! {
                    _ = on_push => {}
                    _ = on_release => {}
                },
                None => on_push.await,
            }
        }
    }

    /// The last check of a popped item before the handler sees it, with `now` a precise clock
    /// reading taken since it was popped (the batch's, or the previous handler's end): the one
    /// place to refuse a popped item. Whether its source took it back (a revoked partition:
    /// then it is released, see `recall.rs`; the worker published it in its slot before); its
    /// deadline, exactly (an item whose deadline passed is never served); its circuit, which
    /// may have opened while it was queued, or be half-open with every probe under way: then
    /// it is refused, before a handler call that would be bound to fail. `Ok`: serve it, with
    /// the breaker's call to report its outcome to
    /// ([`record_downstream`](Self::record_downstream)). `Err`: why not; the caller hands the
    /// item to [`dispatch_barred`](Self::dispatch_barred). The item is looked at in place, not
    /// moved, on the way of every served message.
    #[inline]
    pub(crate) fn dispatch_check(
        &self,
        item: &mut Item<T>,
        now: Instant,
    ) -> Result<Option<crate::admission::Call>, Barred> {
        if self.recalls.taken_back(item) {
            return Err(Barred::TakenBack);
        }
        if item.deadline().is_some_and(|deadline| deadline <= now) {
            return Err(Barred::Expired);
        }
        match item.circuit.as_ref().map(|b| self.breakers.try_call(b)) {
            Some(Some(call)) => Ok(Some(call)),
            Some(None) => Err(Barred::Circuit),
            None => Ok(None),
        }
    }

    /// Settles, releases or hands to its policy an item that
    /// [`dispatch_check`](Self::dispatch_check) barred from its handler.
    #[cold]
    pub(crate) fn dispatch_barred(self: &Arc<Self>, mut item: Item<T>, barred: Barred) {
        match barred {
            Barred::TakenBack => self.release_taken_back_item(item),
            Barred::Expired => self.expire(item),
            Barred::Circuit => {
                let tier = item.tier();
                // Admitted already: counted as withdrawn, not as a second admission decision.
                if !item.standing.refused() {
                    item.standing = item.standing.and_refused();
                    self.accounts.metrics.tiers[tier].withdrawn.increment(1);
                    self.accounts.counts.local().withdrawn[tier.rank()].add(1, Ordering::Relaxed);
                }
                let mut freed = Freed::default();
                match self.refused_circuit(item, None, &mut freed) {
                    Offer::Taken => {}
                    Offer::Hold(i) | Offer::Evicted(i) | Offer::CircuitHold(i) => {
                        self.hold_in_task(i)
                    }
                }
                self.release(freed);
            }
        }
    }

    /// Puts the items of a worker's batch it did not start back at the head of their tiers, as
    /// if never taken (the batch's items popped after one of tier `after`, which is being
    /// served); those that came out expired are settled; at shutdown, the rest are handled as
    /// queued items. What the queue has no room for (pushes filled what the batch left) stays
    /// in `batch`, in order, for this worker to serve after its current call: the queue never
    /// holds more than its capacity.
    pub(crate) fn requeue(
        self: &Arc<Self>,
        batch: &mut Vec<Dequeued<Item<T>>>,
        after: Criticality,
    ) {
        if batch.is_empty() {
            return;
        }
        // Those that came out expired were never charged to their tier: done with, settled.
        if batch.iter().any(Dequeued::is_expired) {
            let (expired, ready): (Vec<_>, Vec<_>) =
                batch.drain(..).partition(Dequeued::is_expired);
            batch.extend(ready);
            for d in expired {
                self.expire(d.into_entry().into_inner());
            }
        }
        // `batch` is in reverse serving order: the last is the next to serve.
        if self.queue.requeue(batch, after).is_err() {
            for d in batch.drain(..) {
                self.shutdown_item(d.into_entry().into_inner());
            }
        }
    }

    /// Tells the breakers how a call went: success or failure for the message's key (a
    /// failure only when the handler named that key), and a failure for another key the
    /// handler named. Anything else (another error, a panic) says nothing about a downstream.
    pub(crate) fn record_downstream(
        &self,
        call: Option<crate::admission::Call>,
        outcome: &std::thread::Result<Result<(), HandlerError>>,
    ) {
        let named = match outcome {
            Ok(Err(e)) => e.downstream_key(),
            _ => None,
        };
        let mut named_counted = false;
        if let Some(call) = call {
            let verdict = match (outcome, named) {
                (Ok(Ok(())), _) => Outcome::Success,
                (_, Some(key)) if call.breaker().is_some_and(|b| b.key() == key) => {
                    named_counted = true;
                    Outcome::Failure
                }
                _ => Outcome::Neutral,
            };
            self.breakers.record(call, verdict);
        }
        if let Some(key) = named {
            if !named_counted && self.breakers.enabled() {
                self.breakers.record_failure(key);
            }
        }
    }

    /// A worker found the queue empty: pulls for an intake that waits for room, if one lets it
    /// (see `pacing::PullForIntake`). Whether anything was offered.
    pub(crate) fn pull_for_intake(self: &Arc<Self>) -> bool {
        if self.pacing.pulling_for.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let helpers = self.pacing.helpers.load();
        helpers.iter().any(|h| h.pull(self))
    }
}
