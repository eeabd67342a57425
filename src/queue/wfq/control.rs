//! What changes the queue other than a push or a pop: a new configuration, a fresh admission
//! decision, items withdrawn without being served (`drain_where`, the hand-backs), and popped
//! items put back (`requeue`, for a batch worker).

use event_listener::IntoNotification;
use quanta::Instant;

use super::{weights_by_rank, WfqQueue};
use crate::loom::Ordering;
use crate::queue::{Closed, Dequeued, Entry, WfqConfig};
use crate::{ConfigError, Criticality};

impl<T> WfqQueue<T> {
    /// Applies a new configuration to the live queue: weights, bounds and cut-offs.
    ///
    /// Shrinking the bounds evicts by the push rule (newest item of the lowest non-empty tier
    /// first) until the queue fits, and returns what it evicted.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `config` fails [`WfqConfig::validate`]; the
    /// queue is then unchanged.
    pub fn reconfigure(&self, config: WfqConfig) -> Result<Vec<Entry<T>>, ConfigError> {
        config.validate()?;
        let mut st = self.state.lock();
        st.core.set_weights(weights_by_rank(&config));
        let evicted = st
            .core
            .set_bounds(config.capacity.get(), config.max_bytes.map(|b| b.get()));
        st.admission.reconfigure(&config.admission);
        self.capacity_hint
            .store(config.capacity.get(), Ordering::Relaxed);
        st.config = config;
        let now = self.now();
        self.observe(&mut st, now);
        Ok(evicted)
    }

    /// Sets the time one pop takes at the workers' measured capacity (the concurrency limit over
    /// the mean handler run), which turns on deadline-ordered service inside the weighted
    /// order: the tier whose head is due first is served ahead of the weighted pick when every
    /// more important tier's queued work would still meet its deadlines (slack stealing, see
    /// the queue core's `slack.rs`). `None` turns it off. For the runtime, which measures the
    /// capacity; a standalone queue has no capacity to measure and serves by weight alone.
    /// With it, the longest handler run seen per tier (by rank): how long a job served early
    /// may hold a worker that more important work then waits for.
    pub(crate) fn set_drain(&self, drain: Option<(std::time::Duration, [std::time::Duration; 4])>) {
        self.state.lock().core.set_drain(drain);
    }

    /// Re-evaluates queue-age admission now. Pushes and pops already do so; call this from a
    /// timer if the queue can sit idle while shed, so the shed level still reflects time passing.
    pub fn refresh_admission(&self) {
        let mut st = self.state.lock();
        // A precise read: a periodic caller must not count as a use that keeps the clock's
        // upkeep thread awake in an idle process (see the `time` module).
        let now = self.clock.now();
        self.observe(&mut st, now);
    }

    /// Takes out every held item for which `pred` returns `true` and hands them back, most
    /// critical tier first and oldest first within a tier, counted in
    /// [`TierStats::drained`](crate::queue::TierStats::drained); the others keep their places and
    /// their order. For a caller that must withdraw some of what it queued without serving it:
    /// the messages of a source that lost them (a revoked partition), or those that have
    /// waited as long as their broker allows unacknowledged.
    ///
    /// Visits every item once, under the lock: a scan of the queue, for events (a
    /// revocation), not for every message.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::queue::{Meta, WfqConfig, WfqQueue};
    /// use triage::Criticality;
    ///
    /// let queue = WfqQueue::new(WfqConfig { capacity: 8.try_into()?, ..WfqConfig::default() })?;
    /// for (partition, offset) in [(0, 10), (1, 20), (0, 11), (1, 21)] {
    ///     assert!(queue.push((partition, offset), Meta::new(Criticality::High))?.is_empty());
    /// }
    /// // Partition 1 was revoked: its records leave, the others stay in order.
    /// let revoked: Vec<_> = queue
    ///     .drain_where(|&(p, _)| p == 1)
    ///     .into_iter()
    ///     .map(|e| e.into_inner())
    ///     .collect();
    /// assert_eq!(revoked, [(1, 20), (1, 21)]);
    /// assert_eq!(queue.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drain_where(&self, pred: impl FnMut(&T) -> bool) -> Vec<Entry<T>> {
        let mut st = self.state.lock();
        let out = st.core.drain_where(pred);
        if out.is_empty() {
            return out;
        }
        // Younger heads: queue-age admission is re-evaluated now, as after a pop.
        let now = self.now();
        self.observe(&mut st, now);
        out
    }

    /// From now on, reads each item's *hand-back instant* with `hand_back_of`: the instant by
    /// which the item must leave the queue, served or not (`None`: it may wait for ever). For
    /// a consumer whose broker takes a delivery back by force when it stays unacknowledged too
    /// long (RabbitMQ's `consumer_timeout`): [`take_due`](Self::take_due) then takes out what
    /// is due, so it can be handed back in time. The function must be cheap and pure (the same
    /// answer for an item whenever it is asked): a push calls it once. Calling this again
    /// replaces the function. The items already held are scanned once, under the lock.
    pub fn track_hand_backs(&self, hand_back_of: fn(&T) -> Option<Instant>) {
        self.state.lock().core.track_hand_backs(hand_back_of);
    }

    /// Takes out every held item whose hand-back instant (see
    /// [`track_hand_backs`](Self::track_hand_backs)) is at or before the clock's time now, and
    /// hands them back, most critical tier first and oldest first within a tier, counted in
    /// [`TierStats::drained`](crate::queue::TierStats::drained); the others keep their places and
    /// their order. Empty until `track_hand_backs` is called.
    ///
    /// Cheap enough for a timer tick, whatever the queue holds: it looks at each tier's head
    /// while it is due, and scans a tier only when an item queued behind a later one (a
    /// message offered again after waiting elsewhere, a retry, one of a source with less
    /// patience, or one behind an item that may wait for ever) may be due: at most once per
    /// such item handed back, never per message (see `hand_back.rs` for the bounds that make
    /// this exact).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use triage::quanta::{Clock, Instant};
    /// use triage::queue::{Meta, WfqConfig, WfqQueue};
    /// use triage::Criticality;
    ///
    /// let (clock, mock) = Clock::mock();
    /// let queue: WfqQueue<(&str, Option<Instant>)> =
    ///     WfqQueue::with_clock(WfqConfig { capacity: 8.try_into()?, ..WfqConfig::default() }, clock.clone())?;
    /// queue.track_hand_backs(|&(_, by)| by);
    /// let soon = clock.now() + Duration::from_secs(1);
    /// for item in [("a", Some(soon)), ("b", None), ("c", Some(soon + Duration::from_secs(5)))] {
    ///     assert!(queue.push(item, Meta::new(Criticality::Sheddable))?.is_empty());
    /// }
    /// assert!(queue.take_due().is_empty());
    /// mock.increment(Duration::from_secs(1));
    /// let due: Vec<_> = queue.take_due().into_iter().map(|e| e.into_inner().0).collect();
    /// assert_eq!(due, ["a"]);
    /// mock.increment(Duration::from_secs(5));
    /// // "c" waited behind "b", which may wait for ever: found all the same.
    /// let due: Vec<_> = queue.take_due().into_iter().map(|e| e.into_inner().0).collect();
    /// assert_eq!(due, ["c"]);
    /// assert_eq!(queue.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take_due(&self) -> Vec<Entry<T>> {
        let mut out = Vec::new();
        let mut st = self.state.lock();
        // A precise read: a periodic caller must not keep the clock's upkeep thread awake
        // (see the `time` module).
        let now = self.clock.now();
        st.core.take_due(now, &mut out);
        if out.is_empty() {
            return out;
        }
        self.observe(&mut st, now);
        out
    }

    /// Puts entries popped as ready but not served back at the head of their tiers, keeping
    /// their stamps and refunding their tiers' scheduling charges, under one lock, as far as the
    /// bounds allow: for a consumer that took a batch, served its item of tier `after` and
    /// cannot serve the rest soon.
    ///
    /// `batch` holds the pops that came right after that one, in **reverse** serving order (the
    /// last element is the next to serve, as a worker holds its batch). The queue takes them
    /// from the front of `batch` (the last popped first), so what goes back is always the tail
    /// of the batch's pops and the weighted-fair order goes on as if they had not been popped.
    /// It stops at the first that would exceed the count bound or the byte budget (pushes may
    /// have filled the room the batch left) or that is not [`Dequeued::Ready`]: those stay in
    /// `batch`, for the caller to serve itself, in the same order. So the queue never holds more
    /// than its bounds, and nothing is evicted or refused for an item that was already admitted.
    ///
    /// Returns how many went back. Once the queue is closed, takes nothing and returns
    /// [`Closed`]: the caller hands every entry of `batch` on as a queued item at shutdown.
    pub(crate) fn requeue(
        &self,
        batch: &mut Vec<Dequeued<T>>,
        after: Criticality,
    ) -> Result<usize, Closed> {
        let mut st = self.state.lock();
        if st.core.is_closed() {
            return Err(Closed);
        }
        let mut count = 0;
        let mut bytes: usize = 0;
        let fits = batch
            .iter()
            .take_while(|d| match d {
                Dequeued::Ready(e) => {
                    count += 1;
                    // A sum past `usize::MAX` exceeds any budget.
                    match bytes.checked_add(st.core.budgeted(e.size_bytes)) {
                        Some(sum) => {
                            bytes = sum;
                            st.core.has_room(count, bytes)
                        }
                        None => false,
                    }
                }
                Dequeued::Expired(_) => false,
            })
            .count();
        if fits == 0 {
            return Ok(0);
        }
        // The service the requeued pops came after: the latest ready one this caller keeps,
        // else the one it is serving.
        let last_kept = batch[fits..]
            .iter()
            .find_map(|d| match d {
                Dequeued::Ready(e) => Some(e.criticality),
                Dequeued::Expired(_) => None,
            })
            .unwrap_or(after);
        for d in batch.drain(..fits) {
            st.core.requeue_front(d.into_entry());
        }
        st.core.requeued_after(last_kept.rank());
        let now = self.now();
        // Older heads again: admission is re-evaluated now, not at its next recheck.
        self.observe(&mut st, now);
        let pops = st.core.pops();
        drop(st);
        self.published.pops.store(pops, Ordering::Relaxed);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.not_empty.notify(usize::MAX.additional());
        }
        Ok(fits)
    }
}
