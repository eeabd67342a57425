//! The runtime's moving parts: admission of offered items, refusal policies, deferral, workers.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quanta::{Clock, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{
    admits_at, Breakers, Decision, Outcome, PullAdmission, PullSample, TierBuckets,
};
use crate::ledger::Disposition;
use crate::limit::ConcurrencyLimit;
use crate::ordering::{Arrival, KeyGate};
use crate::queue::{Dequeued, Meta, Removed, TierMask, TryPopError, WfqQueue};
use crate::runtime::intake::PullForIntake;
use crate::runtime::item::{Accounts, Item};
use crate::runtime::refusal::Refusal;
use crate::runtime::{
    DeadLetterSink, DeferReason, DeferSink, HandlerError, RefusalPolicy, Republish, RuntimeConfig,
};
use crate::Criticality;

/// Called with each message's disposition, just before its acknowledgement.
pub(crate) type Observer<T> = Arc<dyn Fn(&T, Criticality, Disposition) + Send + Sync>;

/// Maps a message to its downstream key, borrowed from the message (no allocation).
pub(crate) type DownstreamFn<T> = Arc<dyn for<'a> Fn(&'a T) -> Option<&'a str> + Send + Sync>;

/// Refusals between two samples of the reject path's cost: two clock reads per sample, under
/// 1 ns per refusal on average. It was 1,024, which left a worker at 1x (a few hundred
/// refusals a phase) with one sample or none, and that one was often the process's first
/// refusal, on cold caches: the proving ground's p50 was then a single outlier.
const REJECT_SAMPLE_EVERY: u64 = 64;

/// The `triage-reason` of a dead letter whose deferral the defer sink refused for good.
const DEFER_REJECTED: &str = "defer_rejected";

/// The `triage-reason` of a reference copy published in place of a refused dead letter.
const DEAD_LETTER_REJECTED: &str = "dead_letter_rejected";

/// At most one log line per this long about dead letters held after a permanent refusal.
const DEAD_LETTER_LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts a message in `triage_dead_letters_held` for as long as it lives, however its task
/// ends (settled, released at shutdown, or aborted).
struct HeldDeadLetter<'a>(&'a AtomicI64);

impl<'a> HeldDeadLetter<'a> {
    fn new(gauge: &'a AtomicI64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        HeldDeadLetter(gauge)
    }
}

impl Drop for HeldDeadLetter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn bound(mut text: String) -> String {
    let len = crate::wire::bound_error(&text).len();
    text.truncate(len);
    text
}

pub(crate) struct Inner<T> {
    pub(crate) queue: WfqQueue<Item<T>>,
    pub(crate) limit: ConcurrencyLimit,
    pub(crate) accounts: Arc<Accounts>,
    /// The configuration in force, swapped whole by a live reconfiguration (see
    /// `reconfigure.rs`): read it through [`Inner::config`], once per decision.
    pub(crate) config: arc_swap::ArcSwap<RuntimeConfig>,
    /// What a live reconfiguration changes besides `config`: the generation, the operator's
    /// forced shed and brownout levels.
    pub(crate) live: crate::runtime::reconfigure::Live,
    pub(crate) defer: Option<Arc<dyn DeferSink<T>>>,
    pub(crate) dead_letter: Option<Arc<dyn DeadLetterSink<T>>>,
    pub(crate) observer: Option<Observer<T>>,
    /// Circuit breakers per downstream key, and the mapping of a message to its key.
    pub(crate) breakers: Arc<Breakers>,
    pub(crate) downstream: Option<DownstreamFn<T>>,
    pub(crate) clock: Clock,
    /// Stop taking new work (shutdown began).
    pub(crate) stop: CancellationToken,
    /// Deferral, dead-letter, hold and retry tasks, so shutdown can wait for them.
    pub(crate) tasks: TaskTracker,
    /// Ends every task of `tasks` at its next poll, dropping what it holds (which releases
    /// its message): when shutdown's grace runs out, or the runtime is dropped.
    pub(crate) kill: CancellationToken,
    pub(crate) deferring: Arc<tokio::sync::Semaphore>,
    /// Clock reading (ns since `origin`) until which Defer tiers behave as Backpressure.
    pub(crate) defer_unhealthy_until: AtomicU64,
    pub(crate) origin: Instant,
    pub(crate) held: AtomicI64,
    pub(crate) refusals: AtomicU64,
    /// The reject path's sampled costs, moved into the histogram by the sampler.
    pub(crate) reject_costs: super::cost::CostSamples,
    /// Sources still being pulled (not finished, not stopped).
    pub(crate) pulling: std::sync::atomic::AtomicUsize,
    /// Room for messages in the dead-letter path (`max_dead_lettering`).
    pub(crate) dead_lettering: Arc<tokio::sync::Semaphore>,
    /// Messages held unacknowledged after their dead letter was refused for good.
    pub(crate) dead_letters_held: AtomicI64,
    /// When the last line about held dead letters was logged (ns since `origin`; `u64::MAX`
    /// for never).
    pub(crate) dead_letter_logged_at: AtomicU64,
    /// Pull-based admission's shed level: pulled messages of tiers with `rank() < level` are
    /// refused. Written by the sampler.
    pub(crate) shed_level: AtomicU8,
    /// When pull admission's level last rose from 0 (ns since `origin`; `u64::MAX` while it
    /// is 0): how long the current shedding episode has lasted. Written by the sampler.
    pub(crate) shedding_since_ns: AtomicU64,
    /// The time the work ahead (the sources' lag, and the messages queued and held) takes to
    /// clear at the estimated capacity, in ns (0: none, or no estimate yet). Written by the sampler: while a backlog lasts the workers have no
    /// room, and the drains are pulled only into room.
    pub(crate) backlog_clear_ns: AtomicU64,
    /// Messages pulled from non-drain sources, per tier rank: the arrival mix.
    pub(crate) pulled: [AtomicU64; 4],
    /// Of those, the ones with a deadline, and the sum of their deadline slack at intake in µs (each at most `u32::MAX`),
    /// per tier rank: what pull-based admission predicts deadline misses from.
    pub(crate) pulled_with_deadline: [AtomicU64; 4],
    pub(crate) slack_us: [AtomicU64; 4],
    /// Handler runs finished, and their summed run time in ns: the capacity estimate.
    pub(crate) served: AtomicU64,
    pub(crate) busy_ns: AtomicU64,
    /// Each non-drain source's lag, written by its intake (`u64::MAX`: unknown).
    pub(crate) lags: parking_lot::Mutex<Vec<Arc<AtomicU64>>>,
    /// Woken when a worker takes an item while an intake waits for room (pacing).
    pub(crate) room: tokio::sync::Notify,
    pub(crate) room_waiters: AtomicUsize,
    /// The sources a worker that finds the queue empty may pull from itself, for their intake
    /// (see `intake::PullForIntake`); read once per empty queue.
    pub(crate) helpers: arc_swap::ArcSwap<Vec<Arc<dyn PullForIntake<T>>>>,
    /// Of the intakes waiting for room, those whose source the workers pull from meanwhile:
    /// a pop need not wake them.
    pub(crate) pulling_for: AtomicUsize,
    /// Whether anything was ever offered with `try_submit` (queue-age admission then counts
    /// in the load level).
    pub(crate) pushed_seen: std::sync::atomic::AtomicBool,
    /// When each tier (rank) last had an item queued, ns since `origin` (0: never).
    pub(crate) last_work_ns: [AtomicU64; 4],
    /// The key gate of ordered sources: keyed messages past it are inside the runtime, the
    /// later ones of a busy key wait in it (see `crate::ordering`).
    pub(crate) gate: KeyGate<Item<T>>,
    /// Per-tier token buckets (`buckets` in the config), on `clock`.
    pub(crate) buckets: TierBuckets,
}

/// What became of an offered item.
pub(crate) enum Offer<T> {
    /// Queued, or settled by policy (shed, deferring): the caller is done with it.
    Taken,
    /// Refused under Backpressure: the caller holds it and offers it again later.
    Hold(Item<T>),
    /// The offered item was queued, and evicted this one, whose tier's policy is
    /// Backpressure: the caller holds the victim and offers it again later.
    Evicted(Item<T>),
    /// Refused because its downstream's circuit is open, under Backpressure: the caller holds
    /// it apart from the items refused for load (other messages of its tier are not refused)
    /// and offers it again when a circuit changes state.
    CircuitHold(Item<T>),
}

impl<T> Inner<T> {
    /// The configuration in force (one lock-free load): a reconfiguration swaps it whole, so
    /// one guard gives one consistent configuration.
    #[inline]
    pub(crate) fn config(&self) -> arc_swap::Guard<Arc<RuntimeConfig>> {
        self.config.load()
    }
}

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
    pub(crate) fn pass_gate(&self, item: Item<T>) -> Option<Item<T>> {
        let Some(key) = item.key else {
            return Some(item);
        };
        match self
            .gate
            .arrive(key, item, crate::queue::time::recent(&self.clock))
        {
            Arrival::Admitted(item) => Some(item),
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
    fn release_key(self: &Arc<Self>, key: u64) {
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

    fn release_one(self: &Arc<Self>, key: u64) {
        let Some((item, parked_at)) = self.gate.release_next_waited(key) else {
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

    /// How many queued messages keep every worker busy until the intake pulls again:
    /// `admission.prefetch_per_slot ×` the concurrency limit.
    pub(crate) fn prefetch(&self) -> usize {
        self.config().admission.prefetch_per_slot * self.limit.limit().max(1)
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

    /// Looks up the breaker of the item's downstream key, once per consumed message: a hash of
    /// a key borrowed from the message, no allocation (but for a key never seen before).
    #[inline]
    pub(crate) fn map_downstream(&self, item: &mut Item<T>) {
        if let Some(key_of) = &self.downstream {
            if self.breakers.enabled() {
                item.circuit = key_of(item.payload()).and_then(|k| self.breakers.breaker(k));
            }
        }
    }

    /// The mean handler run so far (busy time over calls), at most one second; zero before the
    /// first call.
    pub(crate) fn mean_service(&self) -> Duration {
        let served = self.served.load(Ordering::Relaxed);
        if served == 0 {
            return Duration::ZERO;
        }
        let busy = self.busy_ns.load(Ordering::Relaxed);
        Duration::from_nanos(busy / served).min(Duration::from_secs(1))
    }

    pub(crate) fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.config().poll_interval_ms)
    }

    /// Admission: push into the queue, apply the policy to whatever is refused or evicted.
    ///
    /// The refuse path (Drop or Backpressure) allocates nothing and logs nothing: a queue push
    /// that fails on one atomic load, counter increments on pre-registered handles, and the
    /// ack's resolve.
    pub(crate) fn offer(self: &Arc<Self>, item: Item<T>) -> Offer<T> {
        self.offer_with(item, false)
    }

    /// [`offer`](Self::offer) for a worker that pulled the item itself and pops right after:
    /// its push wakes no other worker (see `WfqQueue::push_admitted_quiet`).
    pub(crate) fn offer_quiet(self: &Arc<Self>, item: Item<T>) -> Offer<T> {
        self.offer_with(item, true)
    }

    fn offer_with(self: &Arc<Self>, mut item: Item<T>, quiet: bool) -> Offer<T> {
        let tier = item.tier();
        let seq = self.refusals.load(Ordering::Relaxed);
        let sampled = seq % REJECT_SAMPLE_EVERY == 0;
        let started = if sampled {
            Some(self.clock.now())
        } else {
            None
        };
        // A message bound for a downstream whose circuit is open would only fail: refused before
        // it takes a place in the queue, whatever the load.
        if let Some(b) = &item.circuit {
            if !self.breakers.admits(b) {
                return self.refused_circuit(item, started);
            }
        }
        // The operator's forced level refuses whatever the signals say (seed 002: one switch).
        if !admits_at(self.live.forced_level(), tier) {
            return self.refused(item, Refusal::Forced, started);
        }
        // A shed tier is refused only while the workers have enough queued to do: refusal makes
        // room for more important work, and idle workers next to held work make none.
        if !item.pushed
            && !admits_at(self.shed_level.load(Ordering::Relaxed), tier)
            && self.queue.len() >= self.prefetch()
        {
            return self.refused(item, Refusal::Overloaded, started);
        }
        // Offered again after waiting under backpressure: back in the memory working set.
        item.unmark_waiting();
        if !self.accounts.memory.admits(tier, item.size_bytes as u64) {
            self.accounts.memory.note_refusal(tier);
            return self.refused(item, Refusal::Memory, started);
        }
        // A pulled message that would wait (Backpressure) for a full queue with nothing below
        // its tier to evict is refused on the queue's published length and backlog, without
        // its lock: at 10x that lock is taken against every worker's pop, and a refusal under
        // it cost a p50 of 1-2 µs in the proving ground. Held by the intake, the message is
        // offered again after the next pop. The hint counts items past their deadline that a
        // push would discard; they leave at the next pop too.
        if !item.pushed
            && self.queue.looks_full_for(tier)
            && self.policy(&item) == RefusalPolicy::Backpressure
        {
            return self.refused(item, Refusal::Full, started);
        }
        // The bucket last, so no token is spent on a message refused anyway.
        let Some(grant) = self.buckets.try_acquire(tier) else {
            return self.refused(item, Refusal::Rate, started);
        };
        let first_admission = !item.admitted_before;
        item.admitted_before = true;
        let undecided = !item.decided;
        item.decided = true;
        let original = item.original;
        let meta = Meta::new(tier)
            .deadline_opt(item.deadline)
            .size_bytes(item.size_bytes);
        let pushed = if item.pushed {
            self.queue.push(item, meta)
        } else if quiet {
            self.queue.push_admitted_quiet(item, meta)
        } else {
            self.queue.push_admitted(item, meta)
        };
        match pushed {
            Ok(evicted) => {
                // Recent time moves once per millisecond: stored only when it moved, so most
                // pushes only read a line that every thread's pushes would otherwise write.
                let now = self.recent_ns().max(1);
                let last_work = &self.last_work_ns[tier.rank()];
                if last_work.load(Ordering::Relaxed) != now {
                    last_work.store(now, Ordering::Relaxed);
                }
                if first_admission {
                    self.accounts.metrics.tiers[tier].admitted.increment(1);
                    self.accounts.admitted[tier.rank()].fetch_add(1, Ordering::Relaxed);
                }
                if undecided {
                    self.record_decision(original, Decision::Admitted);
                }
                let mut hold = None;
                for removed in evicted {
                    let e = match removed {
                        Removed::Evicted(e) => e,
                        // Room made by discarding what had outlived its deadline.
                        Removed::Expired(e) => {
                            self.expire(e.into_inner());
                            continue;
                        }
                    };
                    let victim = e.into_inner();
                    let t = victim.tier();
                    self.accounts.refusals.add(t, Refusal::Evicted);
                    if let Offer::Hold(v) = self.refuse(victim, Refusal::Evicted) {
                        // A count-bounded queue evicts at most one item per push; a byte budget
                        // may evict more, and those of a Backpressure tier go back to the queue
                        // later via the caller or a retry task.
                        match hold {
                            None => hold = Some(v),
                            Some(_) => self.hold_in_task(v),
                        }
                    }
                }
                match hold {
                    Some(v) => Offer::Evicted(v),
                    None => Offer::Taken,
                }
            }
            Err(err) => {
                let Some(reason) = Refusal::from_queue(err.reason()) else {
                    // Shutting down: released unacknowledged when dropped.
                    drop(err.into_inner());
                    return Offer::Taken;
                };
                self.buckets.refund(grant);
                let mut item = err.into_inner();
                item.admitted_before = !first_admission;
                item.decided = !undecided;
                self.refused(item, reason, started)
            }
        }
    }

    /// The refuse path: counted once per message, then the tier's policy.
    pub(crate) fn refused(
        self: &Arc<Self>,
        mut item: Item<T>,
        r: Refusal,
        started: Option<Instant>,
    ) -> Offer<T> {
        let tier = item.tier();
        self.decide(&mut item, r.decision());
        if !item.refused_before {
            // Count messages, not attempts: a held message is offered again and again.
            item.refused_before = true;
            self.accounts.refusals.add(tier, r);
            self.accounts.refused[tier.rank()].fetch_add(1, Ordering::Relaxed);
        }
        let seq = self.refusals.fetch_add(1, Ordering::Relaxed);
        // The decision ends here: what follows is the policy the operator chose (a Drop's
        // observer call and acknowledgement, a deferral's task), whose cost is the sink's, the
        // observer's and the broker client's, not triage's. Timing it too made the proving
        // ground's workers report their disposition log's file write as the reject cost.
        if let Some(started) = started {
            let cost = self.clock.now().saturating_duration_since(started);
            self.reject_costs.record(seq / REJECT_SAMPLE_EVERY, cost);
        }
        self.refuse(item, r)
    }

    /// Refused because its downstream's circuit is open: the tier's policy (dropped, deferred
    /// with reason `circuit`, or held apart as [`Offer::CircuitHold`]), never a handler call.
    pub(crate) fn refused_circuit(
        self: &Arc<Self>,
        item: Item<T>,
        started: Option<Instant>,
    ) -> Offer<T> {
        match self.refused(item, Refusal::Circuit, started) {
            Offer::Hold(item) => Offer::CircuitHold(item),
            other => other,
        }
    }

    /// The load level handlers see and held messages are re-offered on: the pull-based shed
    /// level, and the queue-age one too once work has been pushed in-process (`try_submit`):
    /// for pulled work alone the queue's age is no overload signal.
    pub(crate) fn load_level(&self) -> u8 {
        let pulled = self
            .shed_level
            .load(Ordering::Relaxed)
            .max(self.live.forced_level());
        if self.pushed_seen.load(Ordering::Relaxed) {
            pulled.max(self.queue.shed_level())
        } else {
            pulled
        }
    }

    /// Recent time (one atomic load), ns since `origin`.
    pub(crate) fn recent_ns(&self) -> u64 {
        crate::queue::time::recent(&self.clock)
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }

    /// Whether no tier above `tier` has work queued now, nor had any queued within
    /// `share_reserve_ms` (0: only "now" counts).
    fn higher_tiers_quiet(&self, tier: Criticality) -> bool {
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
        let reserve = self.config().share_reserve_ms.saturating_mul(1_000_000);
        if reserve == 0 {
            return true;
        }
        let now = self.recent_ns();
        Criticality::ALL
            .iter()
            .filter(|t| t.rank() > tier.rank())
            .all(|t| {
                let last = self.last_work_ns[t.rank()].load(Ordering::Relaxed);
                last == 0 || now.saturating_sub(last) >= reserve
            })
    }

    /// The tiers a worker may take now: those under their share of the limit, plus, with
    /// work-conserving shares, those whose higher tiers are quiet while a slot is idle.
    fn worker_mask(&self) -> TierMask {
        let mask = self.limit.allowed_mask();
        if !self.config().work_conserving || self.limit.in_flight() >= self.limit.limit() {
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

    fn policy(&self, item: &Item<T>) -> RefusalPolicy {
        match self.config().policy[item.tier()] {
            // A deferred copy would be served after the later messages of its key: a keyed
            // message is held instead, and its key waits behind it (`crate::ordering`).
            RefusalPolicy::Defer if item.key.is_some() => RefusalPolicy::Backpressure,
            // Deferred often enough: it waits (in its topic, or held) until served or expired,
            // rather than bouncing between the topics.
            RefusalPolicy::Defer if item.deferrals >= self.config().max_deferrals => {
                RefusalPolicy::Backpressure
            }
            RefusalPolicy::Defer if self.defer.is_none() => RefusalPolicy::Drop,
            RefusalPolicy::Defer if !self.defer_healthy() => RefusalPolicy::Backpressure,
            p => p,
        }
    }

    /// The policy step: what the tier's refusal policy makes of a refused (or evicted) message,
    /// dropped, deferred or held.
    pub(crate) fn refuse(self: &Arc<Self>, mut item: Item<T>, reason: Refusal) -> Offer<T> {
        let tier = item.tier();
        item.last_refusal = Some(reason);
        match self.policy(&item) {
            // `DeferOrDrop` is resolved at start-up and never reaches here.
            RefusalPolicy::Drop | RefusalPolicy::DeferOrDrop => {
                self.accounts.metrics.tiers[item.original].shed[reason.index()].increment(1);
                self.settle(item, Disposition::Shed);
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
                self.settle(item, Disposition::Shed);
                Offer::Taken
            }
            RefusalPolicy::Defer => match Arc::clone(&self.deferring).try_acquire_owned() {
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

    /// Whether a deferred copy of `item` would expire before a drain could bring it back.
    /// The drains are pulled only while nothing is shed and workers have room, so a copy
    /// waits for both:
    /// - while pull admission sheds (its level above 0), the level comes down only once
    ///   arrival has fitted for `admission.recover_ms`. How long the overload will last nobody
    ///   here knows; an episode that has lasted `T` is taken to last about `T` more (the
    ///   Lindy, or Copernican, estimate: without a forecast of arrival, the current episode
    ///   is as likely to be in its first half as in its second): `recover_ms` plus the time
    ///   shedding has lasted;
    /// - while there is a backlog, the workers have no room until it is served: the sources'
    ///   lag plus the messages queued and held, over the estimated capacity (a lower bound:
    ///   arrivals go on meanwhile). A restart's
    ///   backlog of minutes is why a held message of a few seconds' slack is not worth a copy
    ///   even with nothing shed.
    ///
    /// So a spike's first refusals are deferred, a sustained overload's or a long backlog's
    /// short-deadline work is not, where its copy would cost a publish and a fetch to end
    /// `Expired`. Such a message is shed at once instead (`triage_too_late_to_defer_total`).
    /// Forced shedding is not counted: the operator may lift it at any moment.
    pub(crate) fn expires_before_drain(&self, item: &Item<T>) -> bool {
        let Some(deadline) = item.deadline else {
            return false;
        };
        let backlog = Duration::from_nanos(self.backlog_clear_ns.load(Ordering::Relaxed));
        let shedding = self.shed_level.load(Ordering::Relaxed) > 0;
        if !shedding && backlog.is_zero() {
            return false;
        }
        let recent = crate::queue::time::recent(&self.clock);
        let mut eta = backlog;
        if shedding {
            let since = self.shedding_since_ns.load(Ordering::Relaxed);
            let now_ns = recent.saturating_duration_since(self.origin).as_nanos() as u64;
            let lasted = Duration::from_nanos(if since == u64::MAX {
                0
            } else {
                now_ns.saturating_sub(since)
            });
            eta = eta.max(
                Duration::from_millis(self.config().admission.recover_ms).saturating_add(lasted),
            );
        }
        deadline.saturating_duration_since(recent) < eta
    }

    /// Deferrals a full held buffer may start now to make room (see
    /// `RuntimeConfig::defer_held_to_make_room`): the free deferral permits, or 0 without a
    /// healthy defer sink or with the option off.
    pub(crate) fn room_deferrals(&self) -> usize {
        if self.defer.is_none() || !self.config().defer_held_to_make_room || !self.defer_healthy() {
            return 0;
        }
        self.deferring.available_permits()
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
        match Arc::clone(&self.deferring).try_acquire_owned() {
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

    fn now_ns(&self) -> u64 {
        self.clock
            .now()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }

    fn defer_healthy(&self) -> bool {
        self.now_ns() >= self.defer_unhealthy_until.load(Ordering::Relaxed)
    }

    fn republish_info(
        &self,
        item: &Item<T>,
        reason: &'static str,
        error: Option<String>,
    ) -> Republish {
        let deadline = item
            .deadline
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
    async fn defer_until_done(self: Arc<Self>, item: Item<T>, reason: DeferReason) {
        let Some(sink) = self.defer.clone() else {
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
                let until = self.now_ns() + self.config().defer_cooldown_ms * 1_000_000;
                self.defer_unhealthy_until
                    .fetch_max(until, Ordering::Relaxed);
                self.hold_until_queued(item).await;
            }
        }
    }

    /// Spawns a task that owns messages: tracked (shutdown waits for it) and killable
    /// (`kill` drops it, releasing its messages unacknowledged, never recording them twice:
    /// a message is settled inside the task or released by the drop, not both).
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks
            .spawn(self.kill.clone().run_until_cancelled_owned(task));
    }

    pub(crate) fn hold_in_task(self: &Arc<Self>, item: Item<T>) {
        let this = Arc::clone(self);
        self.spawn(async move { this.hold_until_queued(item).await });
    }

    /// Backpressure outside a source: keep offering until taken. On shutdown the item is
    /// dropped, which releases it unacknowledged.
    pub(crate) async fn hold_until_queued(self: &Arc<Self>, mut item: Item<T>) {
        self.held.fetch_add(1, Ordering::Relaxed);
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = tokio::time::sleep(self.poll_interval()) => {}
            }
            if item.deadline.is_some_and(|d| d <= self.clock.now()) {
                self.held.fetch_sub(1, Ordering::Relaxed);
                return self.expire(item);
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
                    self.held.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
                // Ours is queued; the one it evicted is held in its place.
                Offer::Hold(back) | Offer::Evicted(back) | Offer::CircuitHold(back) => item = back,
            }
        }
        self.held.fetch_sub(1, Ordering::Relaxed);
        drop(item);
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
            match self.queue.pop_batch_masked(self.worker_mask(), max, out) {
                Ok(_) => {
                    self.wake_intake();
                    return true;
                }
                Err(TryPopError::Closed) => return false,
                Err(_) => {}
            }
            // Pulls what the intake would, rather than wait for it to; its pushes woke no one,
            // so if this worker's tiers cannot take them now, the others are told.
            if self.pull_for_intake() {
                match self.queue.pop_batch_masked(self.worker_mask(), max, out) {
                    Ok(_) => {
                        self.wake_intake();
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
            match self.queue.pop_batch_masked(self.worker_mask(), max, out) {
                Ok(_) => {
                    self.wake_intake();
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
    /// place to refuse a popped item. Its deadline, exactly (an item whose deadline passed is
    /// never served); its circuit, which may have opened while it was queued, or be half-open
    /// with every probe under way: then it is refused here, before a handler call that would be
    /// bound to fail. `None`: settled or handed to its policy here. `Some`: the item and the
    /// breaker's call to report its outcome to ([`record_downstream`](Self::record_downstream)).
    pub(crate) fn dispatch_check(
        self: &Arc<Self>,
        mut item: Item<T>,
        now: Instant,
    ) -> Option<(Item<T>, Option<crate::admission::Call>)> {
        if let Some(deadline) = item.deadline {
            if deadline <= now {
                self.expire(item);
                return None;
            }
        }
        let call = match item.circuit.as_ref().map(|b| self.breakers.try_call(b)) {
            Some(Some(call)) => Some(call),
            Some(None) => {
                let tier = item.tier();
                // Admitted already: counted as withdrawn, not as a second admission decision.
                if !item.refused_before {
                    item.refused_before = true;
                    self.accounts.metrics.tiers[tier].withdrawn.increment(1);
                    self.accounts.withdrawn[tier.rank()].fetch_add(1, Ordering::Relaxed);
                }
                match self.refused_circuit(item, None) {
                    Offer::Taken => {}
                    Offer::Hold(i) | Offer::Evicted(i) | Offer::CircuitHold(i) => {
                        self.hold_in_task(i)
                    }
                }
                return None;
            }
            None => None,
        };
        Some((item, call))
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

    /// A queued (or taken but not started) item at shutdown: deferred where its policy says so
    /// (and the sink is up), otherwise released unacknowledged for redelivery.
    pub(crate) fn shutdown_item(self: &Arc<Self>, item: Item<T>) {
        let config = self.config();
        let defer = item.key.is_none()
            && item.deferrals < config.max_deferrals
            && self.defer.is_some()
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

    /// An intake pacing its pulls waits for room in the queue: tell it a worker took some;
    /// unless the workers pull for every intake that waits (they pull when they find the queue
    /// empty, see [`pull_for_intake`](Self::pull_for_intake)).
    #[inline]
    fn wake_intake(&self) {
        if self.room_waiters.load(Ordering::Relaxed) > self.pulling_for.load(Ordering::Relaxed) {
            self.room.notify_waiters();
        }
    }

    /// A worker found the queue empty: pulls for an intake that waits for room, if one lets it
    /// (see `intake::PullForIntake`). Whether anything was offered.
    fn pull_for_intake(self: &Arc<Self>) -> bool {
        if self.pulling_for.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let helpers = self.helpers.load();
        helpers.iter().any(|h| h.pull(self))
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

    pub(crate) async fn failed(
        self: &Arc<Self>,
        mut item: Item<T>,
        retryable: bool,
        reason: &'static str,
        error: String,
    ) {
        if retryable && item.attempt < self.config().retry.max_retries {
            item.attempt += 1;
            self.accounts.metrics.tiers[item.tier()]
                .retries
                .increment(1);
            let backoff = self.config().retry.backoff(item.attempt);
            let this = Arc::clone(self);
            self.spawn(async move {
                tokio::select! {
                    _ = this.stop.cancelled() => return drop(item),
                    _ = tokio::time::sleep(backoff) => {}
                }
                if let Offer::Hold(held) | Offer::Evicted(held) | Offer::CircuitHold(held) =
                    this.offer(item)
                {
                    this.hold_until_queued(held).await;
                }
            });
            return;
        }
        self.dead_letter(item, reason, error).await;
    }

    /// Records `Failed` at once without a dead-letter sink; with one, hands the message to a
    /// dead-lettering task, so the caller (a worker) is free at once. Waits only while
    /// `max_dead_lettering` messages are already in the dead-letter path; released
    /// unacknowledged if shutdown begins meanwhile.
    async fn dead_letter(self: &Arc<Self>, item: Item<T>, reason: &'static str, error: String) {
        let Some(sink) = self.dead_letter.clone() else {
            return self.fail(item);
        };
        let permit = tokio::select! {
            biased;
            permit = Arc::clone(&self.dead_lettering).acquire_owned() => match permit {
                Ok(permit) => permit,
                // Never closed; were it, the message would be released, never lost.
                Err(_) => return drop(item),
            },
            _ = self.stop.cancelled() => return drop(item),
        };
        let this = Arc::clone(self);
        self.spawn(async move {
            this.dead_letter_until_done(sink, item, reason, error).await;
            drop(permit);
        });
    }

    fn fail(self: &Arc<Self>, item: Item<T>) {
        self.accounts.metrics.tiers[item.original]
            .failed
            .increment(1);
        self.settle(item, Disposition::Failed);
    }

    /// Publishes the dead letter and only then records `Failed` (the policy is on
    /// [`DeadLetterSink`]): transient errors are retried with the retry backoff; a permanent
    /// one is answered with a reference copy; if that is refused for good too, the message is
    /// held unacknowledged, counted and logged, and tried again after the longest backoff.
    /// Released unacknowledged when shutdown begins while it waits.
    async fn dead_letter_until_done(
        self: Arc<Self>,
        sink: Arc<dyn DeadLetterSink<T>>,
        item: Item<T>,
        reason: &'static str,
        error: String,
    ) {
        let metrics = &self.accounts.metrics;
        let info = self.republish_info(&item, reason, Some(error));
        let mut held: Option<HeldDeadLetter<'_>> = None;
        let mut attempt = 0u32;
        loop {
            let wait = match sink.publish(item.payload(), &info).await {
                Ok(()) => break,
                Err(e) if e.is_permanent() => {
                    let original = info.error.as_deref().unwrap_or_default();
                    let text = format!("dead letter refused for good: {e}; {reason}: {original}");
                    let reference =
                        self.republish_info(&item, DEAD_LETTER_REJECTED, Some(bound(text)));
                    match sink.publish_reference(item.payload(), &reference).await {
                        Ok(()) => {
                            metrics.dead_letter_references.increment(1);
                            break;
                        }
                        Err(r) if r.is_permanent() => {
                            if held.is_none() {
                                metrics.dead_letter_rejected.increment(1);
                                held = Some(HeldDeadLetter::new(&self.dead_letters_held));
                            }
                            self.log_dead_letter_held(&e, &r);
                            // Refused for good, as far as anyone can tell: a topic created or a
                            // limit raised later lets it through, so it is tried again, rarely.
                            self.config().retry.max_backoff()
                        }
                        Err(_) => {
                            metrics.dead_letter_retries.increment(1);
                            attempt = attempt.saturating_add(1);
                            self.config().retry.backoff(attempt)
                        }
                    }
                }
                Err(_) => {
                    metrics.dead_letter_retries.increment(1);
                    attempt = attempt.saturating_add(1);
                    self.config().retry.backoff(attempt)
                }
            };
            tokio::select! {
                // Released unacknowledged: redelivered after a restart, never lost.
                _ = self.stop.cancelled() => return drop(item),
                _ = tokio::time::sleep(wait) => {}
            }
        }
        drop(held);
        self.fail(item);
    }

    /// One warning per [`DEAD_LETTER_LOG_EVERY`] at most: a sink that refuses every message
    /// must not flood the log.
    fn log_dead_letter_held(
        &self,
        full: &crate::runtime::SinkError,
        reference: &crate::runtime::SinkError,
    ) {
        let now = self.now_ns();
        let last = self.dead_letter_logged_at.load(Ordering::Relaxed);
        let every = DEAD_LETTER_LOG_EVERY.as_nanos() as u64;
        if last != u64::MAX && now < last.saturating_add(every) {
            return;
        }
        if self
            .dead_letter_logged_at
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                held = self.dead_letters_held.load(Ordering::Relaxed),
                "dead letter refused for good ({full}) and its reference copy too ({reference}): \
                 the message is held unacknowledged, its source position kept, and tried again \
                 every {:?}",
                self.config().retry.max_backoff()
            );
        }
    }

    /// Gauges and the admission clock, on a timer: nothing here runs per message.
    pub(crate) async fn sampler(self: Arc<Self>) {
        let mut every = Duration::from_millis(self.config().admission.tick_ms);
        let mut pull = PullAdmission::new(&self.config().admission);
        let mut generation = self.live.generation();
        loop {
            // A live reconfiguration: the state machine keeps its window and level.
            if self.live.generation() != generation {
                let config = self.config();
                generation = self.live.generation();
                pull.reconfigure(&config.admission);
                every = Duration::from_millis(config.admission.tick_ms);
            }
            tokio::select! {
                _ = self.stop.cancelled() => {
                    self.flush_reject_costs();
                    self.accounts.publish_counts();
                    return;
                }
                _ = tokio::time::sleep(every) => {}
            }
            self.flush_reject_costs();
            self.accounts.publish_counts();
            let lag = self.lag();
            let sample = PullSample {
                at: self.clock.now().saturating_duration_since(self.origin),
                lag,
                pulled: std::array::from_fn(|r| self.pulled[r].load(Ordering::Relaxed)),
                served: self.served.load(Ordering::Relaxed),
                busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
                limit: self.limit.limit(),
                waiting: (self.queue.len() as u64)
                    .saturating_add(self.held.load(Ordering::Relaxed).max(0) as u64),
                with_deadline: std::array::from_fn(|r| {
                    self.pulled_with_deadline[r].load(Ordering::Relaxed)
                }),
                slack: std::array::from_fn(|r| {
                    Duration::from_micros(self.slack_us[r].load(Ordering::Relaxed))
                }),
            };
            let level = pull.observe(&sample);
            // The work ahead of a drain: the sources' lag and what is pulled and waiting.
            let ahead = sample.lag.unwrap_or(0).saturating_add(sample.waiting);
            let clear_ns = match pull.capacity() {
                Some(capacity) if ahead > 0 && capacity > 0.0 => {
                    (ahead as f64 / capacity * 1e9).min(u64::MAX as f64) as u64
                }
                _ => 0,
            };
            self.backlog_clear_ns.store(clear_ns, Ordering::Relaxed);
            self.sample_toolbox();
            tracing::trace!(
                level,
                arrival = pull.arrival_rate(),
                capacity = pull.capacity(),
                lag = sample.lag,
                wait = ?pull.predicted_wait(),
                "pull-based admission tick"
            );
            let was = self.shed_level.swap(level, Ordering::Relaxed);
            if level == 0 {
                self.shedding_since_ns.store(u64::MAX, Ordering::Relaxed);
            } else if was == 0 {
                self.shedding_since_ns
                    .store(self.recent_ns(), Ordering::Relaxed);
            }
            let m = &self.accounts.metrics;
            let depths = self.queue.depths();
            let ages = self.queue.ages();
            self.queue.refresh_admission();
            for tier in Criticality::ALL {
                m.tiers[tier].depth.set(depths[tier] as f64);
                m.tiers[tier].age.set(ages[tier].as_secs_f64());
            }
            m.shed_level.set(f64::from(level));
            m.arrival_rate.set(pull.arrival_rate());
            m.capacity.set(pull.capacity().unwrap_or(0.0));
            m.lag.set(lag.map_or(-1.0, |l| l as f64));
            m.in_flight.set(self.limit.in_flight() as f64);
            m.limit.set(self.limit.limit() as f64);
            m.held.set(self.held.load(Ordering::Relaxed) as f64);
            m.circuits_open.set(self.breakers.open_count() as f64);
            m.circuits_opened.absolute(self.breakers.opened_total());
            m.breaker_untracked.absolute(self.breakers.untracked());
            m.dead_letters_held
                .set(self.dead_letters_held.load(Ordering::Relaxed) as f64);
            m.ordering_keys.set(self.gate.keys_in_flight() as f64);
            m.ordering_parked.set(self.gate.parked() as f64);
            m.ordering_longest_wait
                .set(self.gate.longest_wait(self.clock.now()).as_secs_f64());
        }
    }

    /// Moves the reject path's sampled costs into `triage_reject_cost_seconds` (the
    /// exporter's histogram may allocate; the refuse path must not).
    pub(crate) fn flush_reject_costs(&self) {
        let histogram = &self.accounts.metrics.reject_cost;
        self.reject_costs
            .drain(|cost| histogram.record(cost.as_secs_f64()));
    }

    /// The sum of the non-drain sources' lags; `None` if any is unknown.
    fn lag(&self) -> Option<u64> {
        let lags = self.lags.lock();
        let mut sum = 0u64;
        for slot in lags.iter() {
            let l = slot.load(Ordering::Relaxed);
            if l == u64::MAX {
                return None;
            }
            sum = sum.saturating_add(l);
        }
        Some(sum)
    }

    /// Queued items at shutdown: deferred where their policy says so (and the sink is up),
    /// otherwise released unacknowledged for redelivery.
    pub(crate) fn drain_queue(self: &Arc<Self>) {
        // Parked messages are released with the queued ones: none may run ahead of the
        // earlier message of its key, which is released or still running.
        drop(self.gate.close());
        for e in self.queue.close() {
            self.shutdown_item(e.into_inner());
        }
    }
}
