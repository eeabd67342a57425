//! The policy step: a refused (or evicted) message goes to its tier's refusal policy, which
//! drops it, defers it or holds it (backpressure). Holding outside a source is a task that
//! offers the message again until it is taken; deferring is a task that publishes the copy and
//! settles the message `Deferred` once the broker confirmed it (the deferral part,
//! `deferral.rs`, keeps the sink, its permits and its health). At shutdown the queued messages
//! are deferred where their policy says so, or released.

use crate::sync::Ordering;
use std::sync::Arc;
use std::time::Duration;

use quanta::Instant;

use crate::ledger::Disposition;
use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::{Item, Origin};
use crate::runtime::refusal::Refusal;
use crate::runtime::settle::Freed;
use crate::runtime::{DeferReason, RefusalPolicy, Republish};

/// The `triage-reason` of a dead letter whose deferral the defer sink refused for good.
const DEFER_REJECTED: &str = "defer_rejected";

impl<T: Send + Sync + 'static> Inner<T> {
    /// The refuse path: counted once per message, then the tier's policy. The key of a message
    /// it settles goes to `freed`.
    pub(crate) fn refused(
        self: &Arc<Self>,
        mut item: Item<T>,
        r: Refusal,
        started: Option<Instant>,
        freed: &mut Freed,
    ) -> Offer<T> {
        let tier = item.tier();
        self.decide(&item, r.decision());
        if !item.standing.refused() {
            // Count messages, not attempts: a held message is offered again and again.
            item.standing = item.standing.and_refused();
            self.accounts.refusals.add(tier, r);
            self.accounts.counts.local().refused[tier.rank()].add(1, Ordering::Relaxed);
        }
        // The decision ends here: what follows is the policy the operator chose (a Drop's
        // observer call and acknowledgement, a deferral's task), whose cost is the sink's, the
        // observer's and the broker client's, not the decision's.
        self.reject_costs
            .refused(started.map(|s| self.clock.now().saturating_duration_since(s)));
        self.refuse(item, r, freed)
    }

    /// Refused because its downstream's circuit is open: the tier's policy (dropped, deferred
    /// with reason `circuit`, or held apart as [`Offer::CircuitHold`]), never a handler call.
    pub(crate) fn refused_circuit(
        self: &Arc<Self>,
        item: Item<T>,
        started: Option<Instant>,
        freed: &mut Freed,
    ) -> Offer<T> {
        match self.refused(item, Refusal::Circuit, started, freed) {
            Offer::Hold(item) => Offer::CircuitHold(item),
            other => other,
        }
    }

    pub(crate) fn policy(&self, item: &Item<T>) -> RefusalPolicy {
        match self.config().policy[item.tier()] {
            // A deferred copy would be served after the later messages of its key: a keyed
            // message is held instead, and its key waits behind it (`crate::ordering`).
            RefusalPolicy::Defer if item.key.is_some() => RefusalPolicy::Backpressure,
            // Deferred often enough: it waits (in its topic, or held) until served or expired,
            // rather than bouncing between the topics.
            RefusalPolicy::Defer if item.deferrals >= self.config().max_deferrals => {
                RefusalPolicy::Backpressure
            }
            RefusalPolicy::Defer if self.deferrals.sink.is_none() => RefusalPolicy::Drop,
            RefusalPolicy::Defer if !self.defer_healthy() => RefusalPolicy::Backpressure,
            p => p,
        }
    }

    /// The policy step: what the tier's refusal policy makes of a refused (or evicted) message,
    /// dropped, deferred or held. The key of a message it settles goes to `freed`.
    pub(crate) fn refuse(
        self: &Arc<Self>,
        mut item: Item<T>,
        reason: Refusal,
        freed: &mut Freed,
    ) -> Offer<T> {
        let tier = item.tier();
        item.last_refusal = Some(reason);
        if reason == Refusal::TooLarge && item.origin != Origin::Pushed {
            // Larger than the queue's whole byte budget, it can never be queued: held, it
            // would wait for ever (pinning its source's position); deferred, it would come back
            // as large. It goes to the dead-letter path, as a message that can never succeed.
            // Pushed work is handed back to its caller instead (`SubmitError::Full`).
            let error = format!(
                "{} bytes, more than queue.max_bytes ({})",
                item.size_bytes,
                self.config().expert.queue.max_bytes.map_or(0, |b| b.get())
            );
            let this = Arc::clone(self);
            self.spawn(async move { this.dead_letter(item, "too_large", error).await });
            return Offer::Taken;
        }
        match self.policy(&item) {
            // `DeferOrDrop` is resolved at start-up and never reaches here.
            RefusalPolicy::Drop | RefusalPolicy::DeferOrDrop => {
                self.accounts.metrics.tiers[item.original].shed[reason.index()].increment(1);
                self.record(item, Disposition::Shed, freed);
                Offer::Taken
            }
            RefusalPolicy::Backpressure => {
                self.accounts.metrics.tiers[tier].backpressure.increment(1);
                let mut item = item;
                item.mark_waiting();
                Offer::Hold(item)
            }
            RefusalPolicy::Defer if self.expires_before_drain(&item) => {
                let metrics = &self.accounts.metrics.tiers[item.original];
                metrics.shed[reason.index()].increment(1);
                metrics.too_late_to_defer.increment(1);
                self.record(item, Disposition::Shed, freed);
                Offer::Taken
            }
            RefusalPolicy::Defer => match Arc::clone(&self.deferrals.permits).try_acquire_owned() {
                Ok(permit) => {
                    let this = Arc::clone(self);
                    self.spawn(async move {
                        this.defer_until_done(item, reason.defer_reason()).await;
                        drop(permit);
                    });
                    Offer::Taken
                }
                Err(_) => {
                    self.accounts.metrics.tiers[tier].backpressure.increment(1);
                    let mut item = item;
                    item.mark_waiting();
                    Offer::Hold(item)
                }
            },
        }
    }

    pub(crate) fn hold_in_task(self: &Arc<Self>, item: Item<T>) {
        let this = Arc::clone(self);
        self.spawn(async move { this.hold_until_queued(item).await });
    }

    /// Backpressure outside a source: keep offering until taken. On shutdown the item is
    /// dropped, which releases it unacknowledged; so is one its source took back.
    pub(crate) async fn hold_until_queued(self: &Arc<Self>, mut item: Item<T>) {
        self.signals.held.fetch_add(1, Ordering::Relaxed);
        loop {
            tokio::select! {
                _ = self.lifecycle.stop.cancelled() => break,
                _ = tokio::time::sleep(self.poll_interval()) => {}
            }
            if self.recalls.taken_back(&mut item) {
                self.signals.held.fetch_sub(1, Ordering::Relaxed);
                return self.release_taken_back_item(item);
            }
            let now = self.clock.now();
            if item.deadline().is_some_and(|d| d <= now) {
                self.signals.held.fetch_sub(1, Ordering::Relaxed);
                return self.expire(item);
            }
            // Waited as long as its broker allows (see `patience.rs`).
            if item.hand_back_at().is_some_and(|at| at <= now) {
                self.signals.held.fetch_sub(1, Ordering::Relaxed);
                return self.hand_back(item, crate::runtime::patience::Waited::Held);
            }
            // Still refused by its circuit: not worth an offer (nor a refusal counted again).
            if item
                .circuit
                .as_ref()
                .is_some_and(|b| !self.breakers.admits(b))
            {
                continue;
            }
            match self.offer(item) {
                Offer::Taken => {
                    self.signals.held.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
                // Ours is queued; the one it evicted is held in its place.
                Offer::Hold(back) | Offer::Evicted(back) | Offer::CircuitHold(back) => item = back,
            }
        }
        self.signals.held.fetch_sub(1, Ordering::Relaxed);
        drop(item);
    }

    /// Whether a deferred copy of `item` would expire before a drain could bring it back
    /// (see [`expires_before_drain`](super::deferral::expires_before_drain)), from the signals
    /// now.
    pub(crate) fn expires_before_drain(&self, item: &Item<T>) -> bool {
        let Some(deadline) = item.deadline() else {
            return false;
        };
        let backlog = Duration::from_nanos(self.signals.backlog_clear_ns.load(Ordering::Relaxed));
        let since = self.signals.shedding_since_ns.load(Ordering::Relaxed);
        let recent = crate::queue::time::recent(&self.clock);
        let now_ns = recent.saturating_duration_since(self.origin).as_nanos() as u64;
        let shedding = (self.signals.shed_level() > 0).then(|| {
            Duration::from_nanos(if since == u64::MAX {
                0
            } else {
                now_ns.saturating_sub(since)
            })
        });
        let recover = Duration::from_millis(self.config().expert.admission.recover_ms);
        let forced = self.live.forced_for(now_ns);
        super::deferral::expires_before_drain(
            deadline.saturating_duration_since(recent),
            backlog,
            shedding,
            forced,
            recover,
        )
    }

    /// Deferrals a full held buffer may start now to make room (see
    /// `RuntimeConfig::defer_held_to_make_room`): the free deferral permits, or 0 without a
    /// healthy defer sink or with the option off.
    pub(crate) fn room_deferrals(&self) -> usize {
        if self.deferrals.sink.is_none()
            || !self.config().defer_held_to_make_room
            || !self.defer_healthy()
        {
            return 0;
        }
        self.deferrals.permits.available_permits()
    }

    /// Whether a held message may be deferred to make room: unkeyed (a copy would be served
    /// after its key's later messages) and deferred fewer than `max_deferrals` times.
    pub(crate) fn deferrable(&self, item: &Item<T>) -> bool {
        item.key.is_none() && item.deferrals < self.config().max_deferrals
    }

    /// Defers a held message to make room for more important work behind it in its source
    /// (reason `make_room`): published and acknowledged once the broker confirmed the copy, as
    /// any deferral. Given back when no deferral permit is free. A message of a `Defer` tier
    /// whose copy would expire before a drain could bring it back
    /// ([`expires_before_drain`](Self::expires_before_drain)) is shed instead, as its tier's
    /// refusals are: the room is made all the same, without a publish and a fetch for a copy
    /// that could only end `Expired`. A `Backpressure` tier's message is always deferred: its
    /// policy promises it is not lost to overload.
    pub(crate) fn defer_to_make_room(self: &Arc<Self>, mut item: Item<T>) -> Result<(), Item<T>> {
        if self.config().policy[item.tier()] == RefusalPolicy::Defer
            && self.expires_before_drain(&item)
        {
            item.unmark_waiting();
            let metrics = &self.accounts.metrics.tiers[item.original];
            // Every held message was refused (or evicted) before it was held.
            let reason = item.last_refusal.unwrap_or(Refusal::Overloaded);
            metrics.shed[reason.index()].increment(1);
            metrics.too_late_to_defer.increment(1);
            self.settle(item, Disposition::Shed);
            return Ok(());
        }
        match Arc::clone(&self.deferrals.permits).try_acquire_owned() {
            Ok(permit) => {
                item.unmark_waiting();
                let this = Arc::clone(self);
                self.spawn(async move {
                    this.defer_until_done(item, DeferReason::MakeRoom).await;
                    drop(permit);
                });
                Ok(())
            }
            Err(_) => Err(item),
        }
    }

    /// Whether the defer sink is in use: none failed in transport within the cool-down.
    pub(crate) fn defer_healthy(&self) -> bool {
        self.deferrals.healthy_at(self.now_ns())
    }

    pub(crate) fn republish_info(
        &self,
        item: &Item<T>,
        reason: &'static str,
        error: Option<String>,
    ) -> Republish {
        let deadline = item
            .deadline()
            .map(|d| crate::runtime::job::wall_deadline(&self.clock, d));
        Republish {
            criticality: item.original,
            attempt: item.attempt,
            deferrals: item.deferrals,
            deadline,
            reason,
            error,
        }
    }

    /// Publishes to the defer sink; on a transport failure the message falls back to
    /// backpressure (retried into the queue, or the sink once it recovers, and never
    /// acknowledged before) and Defer tiers behave as Backpressure for the cool-down. A
    /// permanent rejection concerns this message only: it goes to the dead-letter path once
    /// (reason `defer_rejected`), and the sink stays in use for the others.
    pub(crate) async fn defer_until_done(self: Arc<Self>, item: Item<T>, reason: DeferReason) {
        let Some(sink) = self.deferrals.sink.clone() else {
            return self.hold_until_queued(item).await;
        };
        let mut info = self.republish_info(&item, reason.as_str(), None);
        info.deferrals = item.deferrals.saturating_add(1);
        match sink.publish(item.payload(), &info).await {
            Ok(()) => {
                self.accounts.metrics.tiers[item.original]
                    .deferred
                    .increment(1);
                self.settle(item, Disposition::Deferred);
            }
            Err(e) if e.is_permanent() => {
                self.accounts.metrics.defer_rejected.increment(1);
                self.dead_letter(item, DEFER_REJECTED, e.to_string()).await;
            }
            Err(_) => {
                self.accounts.metrics.defer_failures.increment(1);
                let cooldown = Duration::from_millis(self.config().expert.defer_cooldown_ms);
                self.deferrals.failed_at(self.now_ns(), cooldown);
                self.hold_until_queued(item).await;
            }
        }
    }

    /// A queued (or taken but not started) item at shutdown: deferred where its policy says so
    /// (and the sink is up), otherwise released unacknowledged for redelivery.
    pub(crate) fn shutdown_item(self: &Arc<Self>, item: Item<T>) {
        let config = self.config();
        let defer = item.key.is_none()
            && item.deferrals < config.max_deferrals
            && self.deferrals.sink.is_some()
            && config.policy[item.tier()] == RefusalPolicy::Defer
            && self.defer_healthy();
        if defer {
            let this = Arc::clone(self);
            self.spawn(async move {
                this.defer_until_done(item, DeferReason::Shutdown).await;
            });
        } else {
            drop(item);
        }
    }

    /// Queued items at shutdown: deferred where their policy says so (and the sink is up),
    /// otherwise released unacknowledged for redelivery.
    pub(crate) fn drain_queue(self: &Arc<Self>) {
        // Parked messages are released with the queued ones: none may run ahead of the
        // earlier message of its key, which is released or still running.
        drop(self.keys.close());
        for e in self.queue.close() {
            self.shutdown_item(e.into_inner());
        }
    }
}
