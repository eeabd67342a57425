//! Pulling from a source: one task per attached source.
//!
//! # Pull is not push
//!
//! The broker is the buffer. While the worker is not overloaded (pull-based admission's shed
//! level is 0), the intake pulls only while fewer than `prefetch_per_slot ×` the concurrency
//! limit messages are queued: every worker has work, and a backlog stays in the broker and is
//! served in offset order, never deferred for being a backlog. While overloaded (arrival beyond
//! capacity), the intake pulls as fast as admission decides, so the refused lower tiers are
//! moved out of the way (deferred, dropped or held, per their policy) and the more important
//! work behind them in the same partition or queue is reached in time. A refused tier is
//! refused only while the queue holds at least that prefetch: workers never idle next to held
//! work; a source with a topic
//! per tier is told which tiers are shed ([`Source::pause_tiers`]) and stops pulling them.
//!
//! Every pulled message whose deadline has already passed is expired at once, from its headers
//! alone, before it is queued: the free shed.
//!
//! A message refused under the Backpressure policy is *held* by the intake and offered again as
//! capacity returns. Holding one message and stopping would put every message behind it in the
//! same partition behind it too: a held High message would make the Critical ones after it
//! wait in the broker past their deadlines (head-of-line blocking). So the intake keeps pulling
//! while it holds fewer than `max_held` messages, re-offers the held ones oldest first, and
//! pauses the source only when that buffer is full, unless it must make room: if the source
//! delivered a tier above the lowest held one within the last second, whose messages arrive
//! with less deadline slack than twice the time the workers need to serve what is held and
//! queued, the more important work is (most likely) behind the held messages in the same
//! partition or queue, and pausing would leave it waiting in the broker past its deadline. So
//! the held messages of the tiers below it are deferred (reason `make_room`), lowest tier first and newest first within a tier (as the
//! queue evicts), down to three quarters of `max_held`, and the intake reads on. This is the one
//! place where a Backpressure tier is deferred: sustained arrival beyond capacity with more
//! important work behind it (`RuntimeConfig::defer_held_to_make_room`; only with a healthy
//! defer sink, never a keyed message). A held message whose time left is less
//! than the mean handler run (busy time over calls, at most 1 s) is expired at its turn rather
//! than offered: oldest first, under sustained overload it would otherwise reach a worker right
//! at its deadline and finish after it. Memory stays bounded: at most
//! `capacity + in flight + max_held` messages per runtime and source, plus `max_parked` per
//! runtime behind busy ordering keys (`crate::ordering`): the intake pauses its source while
//! the key gate holds that many.
//!
//! A message refused because its downstream's circuit is open, under Backpressure, is held
//! apart from those: its refusal says nothing about the load, so other messages of its tier
//! are still offered, and it is offered again only when a circuit changes state (or a poll
//! interval passed, to expire it on time). They count against `max_held` too.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::queue::TierMask;
use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::Item;
use crate::runtime::pacing::PullForIntake;
use crate::runtime::refusal::Refusal;
use crate::runtime::Source;

/// How a source is pulled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Pull whenever the held buffer has room.
    Normal,
    /// Deferred work coming back: pull only while nothing is shed and workers are idle. Its
    /// copies keep the tier they were deferred with; one deferred `max_deferrals` times is not
    /// deferred again.
    Drain,
}

/// Messages held under backpressure, and what the last sweep over them learned.
struct Held<T> {
    items: VecDeque<Item<T>>,
    /// Highest rank refused by the last sweep, and why: tiers at or below it would be refused
    /// too (admission sheds a bottom prefix; a full queue with nothing below a tier has nothing
    /// below the lower ones either), so new messages of those tiers are held at once, behind
    /// the older ones, without an offer.
    refused_floor: Option<(usize, Refusal)>,
    /// Tiers (a bit per rank) refused by their token bucket in the last sweep: a bucket is per
    /// tier, so the later messages of such a tier are held at once, behind the older ones (in
    /// order, and without an offer each that would fail the same way), until the next sweep.
    rate_refused: u8,
    /// The queue's pop count and shed level at the last sweep: until one of them moves (or a
    /// poll interval passes), offering the held messages again would be refused again.
    swept_pops: u64,
    swept_level: u8,
    swept_at: tokio::time::Instant,
    /// Refused by their downstream's circuit (Backpressure): offered again when the breakers'
    /// generation moves, expired when their deadline passes.
    circuit: VecDeque<Item<T>>,
    circuit_generation: u64,
    circuit_at: tokio::time::Instant,
    /// When this source last delivered a message of each rank (the engine's recent time, ns;
    /// 0: never): what a full buffer knows of the work behind it (see `make_room`).
    seen_ns: [u64; 4],
    /// The deadline slack this source's messages of each rank arrive with, ns, a moving mean
    /// (each new one weighs 1/8); `u64::MAX` while none with a deadline was seen.
    slack_ns: [u64; 4],
}

impl<T: Send + Sync + 'static> Held<T> {
    fn new() -> Self {
        Held {
            items: VecDeque::new(),
            refused_floor: None,
            rate_refused: 0,
            swept_pops: 0,
            swept_level: 0,
            swept_at: tokio::time::Instant::now(),
            circuit: VecDeque::new(),
            circuit_generation: 0,
            circuit_at: tokio::time::Instant::now(),
            seen_ns: [0; 4],
            slack_ns: [u64::MAX; 4],
        }
    }

    /// A full held buffer makes room for more important work behind it in the source when
    /// pausing would make that work miss its deadline: the held messages of the tiers below
    /// the highest tier at risk are deferred, lowest tier first and newest first within a
    /// tier (as the queue evicts), until the buffer is three quarters of `max_held`.
    ///
    /// A tier is at risk when this source delivered it within [`SEEN_WINDOW_NS`] and its
    /// messages arrive with less deadline slack (a moving mean) than twice the time the
    /// workers take to serve what is held and queued (`(held + queued) × mean handler run /
    /// limit`, the time until pausing would let the source be read again), or with any
    /// deadline before a handler run was measured, or with no deadline at all (nothing bounds
    /// how long it would wait in the broker: on a topic whose producers stamp no deadline,
    /// Critical has none by default). Pausing instead would leave that work
    /// waiting in the broker, in the same partition, behind what is held; with time to spare
    /// (a restart's backlog with long deadlines) pausing costs it nothing, and the held
    /// messages are served in time rather than deferred. Nothing is deferred without a healthy
    /// defer sink (the buffer pauses the source as before), nor past the free deferral
    /// permits, nor a keyed message or one deferred `max_deferrals` times already. A held
    /// message of a `Defer` tier whose copy would expire before a drain could bring it back is
    /// shed to make the room instead (`Inner::defer_to_make_room`).
    fn make_room(&mut self, inner: &Arc<Inner<T>>, max_held: usize) {
        let permits = inner.room_deferrals();
        if permits == 0 || self.len() < max_held {
            return;
        }
        let now = inner.recent_ns();
        let queued = (self.len() + inner.queue.len()) as u128;
        let mean = inner.signals.mean_service().as_nanos();
        let limit = inner.limit.limit().max(1) as u128;
        let drain_ns = u64::try_from(queued * mean / limit).unwrap_or(u64::MAX);
        let at_risk = |r: usize| {
            self.seen_ns[r] != 0
                && now.saturating_sub(self.seen_ns[r]) < SEEN_WINDOW_NS
                && (self.slack_ns[r] == u64::MAX
                    || mean == 0
                    || self.slack_ns[r] < drain_ns.saturating_mul(2))
        };
        let Some(top) = (0..self.seen_ns.len()).rev().find(|&r| at_risk(r)) else {
            return;
        };
        let mut excess = (self.len() - max_held * 3 / 4).min(permits);
        for rank in 0..top {
            if excess == 0 {
                break;
            }
            let candidates = self
                .items
                .iter()
                .filter(|i| i.tier().rank() == rank && inner.deferrable(i))
                .count();
            if candidates == 0 {
                continue;
            }
            // The oldest `keep` of this tier stay: they are offered first as capacity returns.
            let mut keep = candidates.saturating_sub(excess);
            let mut kept = VecDeque::with_capacity(self.items.len());
            for item in self.items.drain(..) {
                if item.tier().rank() != rank || !inner.deferrable(&item) {
                    kept.push_back(item);
                } else if keep > 0 {
                    keep -= 1;
                    kept.push_back(item);
                } else {
                    match inner.defer_to_make_room(item) {
                        Ok(()) => {
                            inner.signals.held.fetch_sub(1, Ordering::Relaxed);
                            excess -= 1;
                        }
                        Err(item) => kept.push_back(item),
                    }
                }
            }
            self.items = kept;
        }
    }

    /// Messages held for load and for their circuit: what `max_held` bounds.
    fn len(&self) -> usize {
        self.items.len() + self.circuit.len()
    }

    fn circuit_due(&self, inner: &Inner<T>) -> bool {
        !self.circuit.is_empty()
            && (inner.breakers.generation() != self.circuit_generation
                || self.circuit_at.elapsed() >= inner.poll_interval())
    }

    /// Offers the circuit-held messages whose circuit admits them again; expires those past their
    /// deadline.
    fn sweep_circuit(&mut self, inner: &Arc<Inner<T>>) {
        self.circuit_generation = inner.breakers.generation();
        self.circuit_at = tokio::time::Instant::now();
        let now = inner.clock.now();
        for _ in 0..self.circuit.len() {
            let Some(item) = self.circuit.pop_front() else {
                break;
            };
            if item.deadline.is_some_and(|d| d <= now) {
                inner.signals.held.fetch_sub(1, Ordering::Relaxed);
                inner.expire(item);
                continue;
            }
            if item
                .circuit
                .as_ref()
                .is_some_and(|b| !inner.breakers.admits(b))
            {
                self.circuit.push_back(item);
                continue;
            }
            match inner.offer(item) {
                Offer::Taken => {
                    inner.signals.held.fetch_sub(1, Ordering::Relaxed);
                }
                Offer::CircuitHold(item) => self.circuit.push_back(item),
                Offer::Hold(item) | Offer::Evicted(item) => self.items.push_back(item),
            }
        }
    }

    fn sweep_due(&self, inner: &Inner<T>) -> bool {
        !self.items.is_empty()
            && (inner.queue.pop_count() != self.swept_pops
                || inner.load_level() != self.swept_level
                || self.swept_at.elapsed() >= inner.poll_interval())
    }

    /// Offers the held messages again, oldest first, skipping tiers already refused in this
    /// sweep, and settles as expired those whose deadline passed while held.
    fn sweep(&mut self, inner: &Arc<Inner<T>>) {
        self.swept_pops = inner.queue.pop_count();
        self.swept_level = inner.load_level();
        self.swept_at = tokio::time::Instant::now();
        self.refused_floor = None;
        self.rate_refused = 0;
        // A held message with less time left than a handler run takes cannot complete in time:
        // the oldest held is offered first, so under sustained overload it would reach a
        // worker right at its deadline and finish just after it, spending a worker for nothing.
        let horizon = inner.clock.now() + inner.signals.mean_service();
        for _ in 0..self.items.len() {
            let Some(item) = self.items.pop_front() else {
                break;
            };
            if item.deadline.is_some_and(|d| d <= horizon) {
                inner.signals.held.fetch_sub(1, Ordering::Relaxed);
                inner.expire(item);
                continue;
            }
            let rank = item.tier().rank();
            if self.refused_now(rank).is_some() {
                self.items.push_back(item);
                continue;
            }
            match inner.offer(item) {
                Offer::Taken => {
                    inner.signals.held.fetch_sub(1, Ordering::Relaxed);
                }
                Offer::Hold(item) => {
                    self.note_refused(rank, item.last_refusal);
                    self.items.push_back(item);
                }
                // Ours is queued; the lower one it evicted is held in its place.
                Offer::Evicted(victim) => self.items.push_back(victim),
                Offer::CircuitHold(item) => self.circuit.push_back(item),
            }
        }
    }

    /// Why a message of `rank` would be refused, as one was in the last sweep; `None` if it
    /// would be offered.
    fn refused_now(&self, rank: usize) -> Option<Refusal> {
        match self.refused_floor {
            Some((floor, reason)) if rank <= floor => Some(reason),
            _ if self.rate_refused & (1 << rank) != 0 => Some(Refusal::Rate),
            _ => None,
        }
    }

    /// Remembers a refusal of `rank` for `reason` until the next sweep: the tiers at or below
    /// it for a bottom-prefix reason, that tier alone for its bucket.
    fn note_refused(&mut self, rank: usize, reason: Option<Refusal>) {
        match reason {
            Some(reason) if reason.refuses_bottom_prefix() => {
                let floor = self.refused_floor.map_or(rank, |(f, _)| f.max(rank));
                self.refused_floor = Some((floor, reason));
            }
            Some(Refusal::Rate) => self.rate_refused |= 1 << rank,
            _ => {}
        }
    }

    /// A new message: held at once behind older ones of a refused tier, else offered.
    fn offer_new(&mut self, inner: &Arc<Inner<T>>, item: Item<T>) {
        let rank = item.tier().rank();
        // One recent-time read for both: when this rank was seen, and its slack.
        let recent = crate::queue::time::recent(&inner.clock);
        let now = (recent.saturating_duration_since(inner.origin).as_nanos() as u64).max(1);
        if self.seen_ns[rank] != now {
            self.seen_ns[rank] = now;
        }
        if let Some(deadline) = item.deadline {
            let slack = deadline.saturating_duration_since(recent).as_nanos();
            let slack = u64::try_from(slack).unwrap_or(u64::MAX - 1);
            let mean = &mut self.slack_ns[rank];
            *mean = if *mean == u64::MAX {
                slack
            } else {
                *mean - *mean / 8 + slack / 8
            };
        }
        if let Some(reason) = self.refused_now(rank) {
            inner.signals.held.fetch_add(1, Ordering::Relaxed);
            let mut item = item;
            item.last_refusal = Some(reason);
            item.mark_waiting();
            self.items.push_back(item);
            return;
        }
        let offer = inner.offer(item);
        self.absorb(inner, rank, offer);
    }

    /// What an offer of a new message of `rank` left to hold: held here, behind the older ones.
    fn absorb(&mut self, inner: &Inner<T>, rank: usize, offer: Offer<T>) {
        match offer {
            Offer::Taken => {}
            Offer::Hold(item) => {
                inner.signals.held.fetch_add(1, Ordering::Relaxed);
                self.note_refused(rank, item.last_refusal);
                self.items.push_back(item);
            }
            Offer::Evicted(victim) => {
                inner.signals.held.fetch_add(1, Ordering::Relaxed);
                self.items.push_back(victim);
            }
            Offer::CircuitHold(item) => {
                inner.signals.held.fetch_add(1, Ordering::Relaxed);
                self.circuit.push_back(item);
            }
        }
    }

    /// Whether a new message would be offered at once, as a worker pulling for the intake
    /// offers it: nothing held, and no tier refused by the last sweep.
    fn clear(&self) -> bool {
        self.len() == 0 && self.refused_floor.is_none() && self.rate_refused == 0
    }
}

/// Whether deferred work may be pulled now: nothing is shed and the queue has no backlog for
/// the workers.
fn drain_allowed<T: Send + Sync + 'static>(inner: &Inner<T>) -> bool {
    inner.load_level() == 0
        && inner.queue.len() < inner.config().workers.get()
        && inner.limit.in_flight() < inner.limit.limit()
}

/// How far past the prefetch the intake may pull while not overloaded, counting the messages
/// parked behind a busy ordering key, as a multiple of the prefetch. Parked messages wait for
/// their key, not for a worker, so the intake looks past them for keys that are ready (as a
/// parallel consumer does); but not without bound: everything pulled counts as arrival to
/// pull-based admission, and a look-ahead of thousands of parked messages, pulled faster than
/// the lag probe sees them leave the broker, read as arrival beyond capacity and shed a keyed
/// backlog (11,283 of 20,000 Medium records once on Kafka). A backlog stays in the broker.
const ORDERING_LOOKAHEAD: usize = 8;

/// Whether the intake, not overloaded, has pulled as far ahead as it should: the queue holds
/// the prefetch, or the queue and the messages parked behind busy keys hold
/// [`ORDERING_LOOKAHEAD`] times it.
fn pulled_ahead<T: Send + Sync + 'static>(inner: &Inner<T>, prefetch: usize) -> bool {
    let queued = inner.queue.len();
    queued >= prefetch || queued + inner.keys.parked() >= prefetch * ORDERING_LOOKAHEAD
}

/// How recently a source must have delivered a tier for a full held buffer to make room for it
/// (`Held::make_room`), in ns: one second.
const SEEN_WINDOW_NS: u64 = 1_000_000_000;

/// Most messages taken from a source in one turn of the intake loop (see `run`).
const PULL_BATCH: usize = 32;

/// One message pulled: counted, expired at once if its deadline passed, through the key gate,
/// then offered (or held behind older ones of a refused tier).
fn take<T: Send + Sync + 'static>(
    inner: &Arc<Inner<T>>,
    held: &mut Held<T>,
    mode: Mode,
    envelope: crate::runtime::Envelope<T>,
) {
    if let Some(item) = receive(inner, mode, envelope) {
        held.offer_new(inner, item);
    }
}

/// What every pulled message goes through before its offer, whoever pulled it (the intake, or
/// a worker pulling for it): counted, expired at once if its deadline passed, through the key
/// gate. `None` when it was settled or parked here.
fn receive<T: Send + Sync + 'static>(
    inner: &Arc<Inner<T>>,
    mode: Mode,
    envelope: crate::runtime::Envelope<T>,
) -> Option<Item<T>> {
    let tier = envelope.criticality;
    let mut item = Item::consumed(envelope, &inner.accounts);
    inner.map_downstream(&mut item);
    let now = crate::queue::time::recent(&inner.clock);
    if mode == Mode::Normal {
        inner.signals.pulled[tier.rank()].fetch_add(1, Ordering::Relaxed);
        // The deadline slack it arrives with: what admission predicts deadline misses from.
        // In µs, at most `u32::MAX` (71 minutes) each, so the sum lasts 4 billion messages.
        if let Some(deadline) = item.deadline {
            let slack = deadline.saturating_duration_since(now).as_micros();
            inner.signals.pulled_with_deadline[tier.rank()].fetch_add(1, Ordering::Relaxed);
            inner.signals.slack_us[tier.rank()].fetch_add(
                u64::try_from(slack).map_or(u64::from(u32::MAX), |s| s.min(u64::from(u32::MAX))),
                Ordering::Relaxed,
            );
        }
    }
    // Past its deadline already: expired from its headers alone, before any queueing.
    if item.deadline.is_some_and(|d| d <= now) {
        inner.expire_at_intake(item);
        return None;
    }
    // Behind a busy key: parked, offered when the key's earlier message is settled.
    inner.pass_gate(item)
}

enum Pulled<T> {
    Message(crate::runtime::Envelope<T>),
    Nothing,
    Finished,
}

async fn pull<S: Source>(source: &mut S, wait: Option<Duration>) -> Pulled<S::Payload> {
    let next = match wait {
        None => Some(source.next().await),
        Some(wait) => tokio::time::timeout(wait, source.next()).await.ok(),
    };
    match next {
        Some(Some(e)) => Pulled::Message(e),
        Some(None) => Pulled::Finished,
        None => Pulled::Nothing,
    }
}

/// A source as its intake and the workers share it: the workers pull from it themselves while
/// its intake waits for room with nothing to hold (see [`PullForIntake`]).
struct Shared<S: Source> {
    source: tokio::sync::Mutex<S>,
    /// Whether a worker may pull now: set by the intake just before it waits for room, only
    /// while it holds nothing and no tier is refused or paused; cleared when it wakes, before
    /// it takes `source` back (so after the intake has the lock, no worker pulls).
    open: AtomicBool,
    /// Offers a worker's pull left to hold (refused under Backpressure, say): the intake holds
    /// them, behind the older ones, at its next turn. With the tier rank offered.
    returned: parking_lot::Mutex<Vec<(usize, Offer<S::Payload>)>>,
    /// A worker's pull found the source finished.
    finished: AtomicBool,
    lag: Arc<AtomicU64>,
}

/// A worker pulling for an intake that waits for room (see `Shared`): what the intake would
/// pull next, the worker pulls itself, when it finds the queue empty. In steady state, a worker
/// then serves what it pulled without waking the intake, and the intake without waking a
/// worker: the task switches (and, on a multi-threaded runtime, the wake-ups of the other
/// thread) that a queue of `prefetch` messages costs every few dozen messages are gone. Each
/// message still goes through the same path ([`receive`], then [`Inner::offer`]), under the
/// same bound (`prefetch`), and the worker stops (hands the source back to the intake, and
/// wakes it) at anything the intake has to decide: a message refused, the shed level or the
/// operator's level above 0, the key gate or the memory budget full, a source with nothing
/// ready now, or finished.
impl<S: Source> PullForIntake<Inner<S::Payload>> for Shared<S>
where
    S::Payload: Send + Sync + 'static,
{
    fn pull(&self, inner: &Arc<Inner<S::Payload>>) -> bool {
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        let Ok(mut source) = self.source.try_lock() else {
            return false;
        };
        // The intake clears `open` before it takes the lock: checked again under it.
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        let prefetch = inner.prefetch();
        let max_parked = inner.config().max_parked.get();
        let mut offered = false;
        let mut hand_back = false;
        for _ in 0..PULL_BATCH {
            let level = inner.signals.shed_level().max(inner.live.forced_level());
            if level != 0 || inner.keys.parked() >= max_parked || !inner.accounts.memory.may_pull()
            {
                hand_back = true;
                break;
            }
            if pulled_ahead(inner, prefetch) {
                break;
            }
            let envelope = match source.next().now_or_never() {
                Some(Some(envelope)) => envelope,
                Some(None) => {
                    self.finished.store(true, Ordering::Release);
                    hand_back = true;
                    break;
                }
                // Nothing ready: the intake waits for the source, with a waker.
                None => {
                    hand_back = true;
                    break;
                }
            };
            let Some(item) = receive(inner, Mode::Normal, envelope) else {
                continue;
            };
            let rank = item.tier().rank();
            match inner.offer_quiet(item) {
                Offer::Taken => offered = true,
                other => {
                    self.returned.lock().push((rank, other));
                    hand_back = true;
                    break;
                }
            }
        }
        self.lag
            .store(source.lag().unwrap_or(u64::MAX), Ordering::Relaxed);
        if hand_back {
            self.open.store(false, Ordering::Release);
            drop(source);
            inner.pacing.room.notify_waiters();
        }
        offered
    }
}

/// Keeps a source open to the workers' pulls while the intake waits; closed when dropped.
struct Opened<'a, S: Source> {
    shared: &'a Shared<S>,
    inner: &'a Inner<S::Payload>,
}

impl<'a, S: Source> Opened<'a, S> {
    fn new(shared: &'a Shared<S>, inner: &'a Inner<S::Payload>) -> Self {
        inner.pacing.pulling_for.fetch_add(1, Ordering::Relaxed);
        shared.open.store(true, Ordering::Release);
        Opened { shared, inner }
    }
}

impl<S: Source> Drop for Opened<'_, S> {
    fn drop(&mut self) {
        self.shared.open.store(false, Ordering::Release);
        self.inner
            .pacing
            .pulling_for
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Pulls `source` until shutdown, then waits for the workers to finish (`drained`) before the
/// source's final acknowledgement, bounded by `final_ack`.
pub(crate) async fn run<S: Source>(
    inner: Arc<Inner<S::Payload>>,
    source: S,
    mode: Mode,
    lag: Arc<AtomicU64>,
    drained: CancellationToken,
    final_ack: Arc<parking_lot::Mutex<Option<tokio::time::Instant>>>,
) where
    S::Payload: Send + Sync + 'static,
{
    let shared = Arc::new(Shared {
        source: tokio::sync::Mutex::new(source),
        open: AtomicBool::new(false),
        returned: parking_lot::Mutex::new(Vec::new()),
        finished: AtomicBool::new(false),
        lag: Arc::clone(&lag),
    });
    // Deferred work is pulled only while the workers are idle: the intake alone decides that.
    if mode == Mode::Normal {
        let helper: Arc<dyn PullForIntake<Inner<S::Payload>>> = shared.clone();
        inner.pacing.helpers.rcu(|list| {
            let mut list = Vec::clone(list);
            list.push(Arc::clone(&helper));
            list
        });
    }
    let mut held: Held<S::Payload> = Held::new();
    let mut paused = false;
    let mut finished = false;
    let mut paused_tiers = TierMask::NONE;
    loop {
        // A worker may be pulling (only while `open`, cleared when this intake woke): it holds
        // the source for one batch at most.
        let mut source = shared.source.lock().await;
        for (rank, offer) in shared.returned.lock().drain(..) {
            held.absorb(&inner, rank, offer);
        }
        if shared.finished.load(Ordering::Acquire) {
            finished = true;
        }
        // Read each turn: a live reconfiguration may change it.
        let poll = inner.poll_interval();
        lag.store(source.lag().unwrap_or(u64::MAX), Ordering::Relaxed);
        let level = inner.signals.shed_level().max(inner.live.forced_level());
        if mode == Mode::Normal {
            let shed = TierMask::below(level);
            if shed != paused_tiers {
                source.pause_tiers(shed);
                paused_tiers = shed;
            }
        }
        if held.sweep_due(&inner) {
            held.sweep(&inner);
        }
        if held.circuit_due(&inner) {
            held.sweep_circuit(&inner);
        }
        // Parked messages (behind a busy ordering key) have a bound of their own. Both bounds
        // are read each turn: a live reconfiguration may change them.
        let config = inner.config();
        let (max_held, max_parked) = (config.max_held.get(), config.max_parked.get());
        drop(config);
        if mode == Mode::Normal {
            held.make_room(&inner, max_held);
        }
        let full = held.len() >= max_held || inner.keys.parked() >= max_parked;
        if full != paused {
            if full {
                source.pause();
            } else {
                source.resume();
            }
            paused = full;
        }
        // The memory budget is kept by not pulling: a pulled message is in memory already.
        let may_pull = !full
            && !finished
            && (mode == Mode::Normal || drain_allowed(&inner))
            && inner.accounts.memory.may_pull();
        // Not overloaded: pull only what the workers will serve soon; the broker keeps the rest.
        let prefetch = inner.prefetch();
        if may_pull && mode == Mode::Normal && level == 0 && pulled_ahead(&inner, prefetch) {
            drop(source);
            let room = inner.pacing.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            inner.pacing.room_waiters.fetch_add(1, Ordering::Relaxed);
            if pulled_ahead(&inner, prefetch) {
                // With nothing to hold and nothing refused, the workers may pull what this
                // intake would, while it waits (closed again when it wakes).
                let _open = held.clear().then(|| Opened::new(&shared, &inner));
                tokio::select! {
                    _ = inner.lifecycle.stop.cancelled() => {
                        inner.pacing.room_waiters.fetch_sub(1, Ordering::Relaxed);
                        break;
                    }
                    _ = &mut room => {}
                    _ = tokio::time::sleep(poll) => {}
                }
            }
            inner.pacing.room_waiters.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        if !may_pull {
            drop(source);
            if finished && held.len() == 0 {
                break;
            }
            tokio::select! {
                _ = inner.lifecycle.stop.cancelled() => break,
                _ = tokio::time::sleep(poll) => {}
            }
            continue;
        }
        // While holding, pull only until the next poll, then come back to the held ones; while
        // tiers are paused, likewise, so they are resumed even if nothing else arrives.
        let wait = if held.len() == 0 && paused_tiers.is_empty() {
            None
        } else {
            Some(poll)
        };
        let pulled = tokio::select! {
            biased;
            _ = inner.lifecycle.stop.cancelled() => break,
            p = pull(&mut *source, wait) => p,
        };
        let envelope = match pulled {
            Pulled::Message(e) => e,
            Pulled::Nothing => continue,
            Pulled::Finished => {
                finished = true;
                continue;
            }
        };
        take(&inner, &mut held, mode, envelope);
        // Messages the source already has are taken in the same turn, up to `PULL_BATCH`,
        // without the per-pull work above (the stop signal's registration, the lag, the
        // sweep, the pause state): each is still admitted on its own, and the limits that
        // stop pulling (the held buffer, the prefetch while not overloaded) still apply.
        if mode == Mode::Normal {
            for _ in 1..PULL_BATCH {
                if held.len() >= max_held
                    || inner.keys.parked() >= max_parked
                    || !inner.accounts.memory.may_pull()
                    || (level == 0 && pulled_ahead(&inner, prefetch))
                {
                    break;
                }
                match source.next().now_or_never() {
                    Some(Some(envelope)) => take(&inner, &mut held, mode, envelope),
                    Some(None) => {
                        finished = true;
                        break;
                    }
                    None => break,
                }
            }
        }
    }
    if mode == Mode::Normal {
        let ours: Arc<dyn PullForIntake<Inner<S::Payload>>> = shared.clone();
        inner.pacing.helpers.rcu(|list| {
            list.iter()
                .filter(|h| !Arc::ptr_eq(h, &ours))
                .cloned()
                .collect::<Vec<_>>()
        });
    }
    // `open` is cleared (the guard is dropped with the loop's scope): once the lock is ours, no
    // worker pulls, and what the last one left to hold is ours to release.
    let mut source = shared.source.lock().await;
    for (rank, offer) in shared.returned.lock().drain(..) {
        held.absorb(&inner, rank, offer);
    }
    inner
        .signals
        .held
        .fetch_sub(held.len() as i64, Ordering::Relaxed);
    // Dropping them releases them unacknowledged.
    drop(held);
    if inner.lifecycle.pulling.fetch_sub(1, Ordering::AcqRel) == 1 {
        inner.accounts.sources_done.store(true, Ordering::Release);
    }
    inner.accounts.idle.notify_waiters();
    // Every message taken is resolved or released before the final acknowledgement, so the
    // watermark it commits is the last one.
    drained.cancelled().await;
    let until = *final_ack.lock();
    match until {
        Some(until) => {
            let _ = tokio::time::timeout_at(until, source.shutdown()).await;
        }
        None => {
            let _ = tokio::time::timeout(Duration::from_secs(30), source.shutdown()).await;
        }
    }
}
