//! The held buffer: the messages an intake holds under backpressure (refused for load, or for
//! their downstream's circuit), offered again as capacity returns, and what the last sweep over
//! them learned. The module docs of `intake` say why an intake holds rather than stops.

use crate::sync::Ordering;
use std::collections::VecDeque;
use std::sync::Arc;

use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::Item;
use crate::runtime::patience::{HeldFloor, Waited};
use crate::runtime::refusal::Refusal;
use crate::runtime::RefusalPolicy;

/// How recently a source must have delivered a tier for a full held buffer to make room for it
/// (`HeldBuffer::make_room`), in ns: one second.
const SEEN_WINDOW_NS: u64 = 1_000_000_000;

/// Messages held under backpressure, and what the last sweep over them learned.
pub(crate) struct HeldBuffer<T> {
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
    /// The earliest hand-back instant among the messages held (see `patience.rs`): until it
    /// comes, none of them needs looking at.
    hand_back: HeldFloor,
}

impl<T: Send + Sync + 'static> HeldBuffer<T> {
    pub(crate) fn new() -> Self {
        HeldBuffer {
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
            hand_back: HeldFloor::default(),
        }
    }

    /// Hands back the messages held (for load or for their circuit) whose hand-back instant
    /// has come, once the earliest of them has (see `patience.rs`).
    pub(crate) fn hand_back_due(&mut self, inner: &Arc<Inner<T>>) {
        if self.hand_back.is_none() {
            return;
        }
        let now = inner.clock.now();
        if !self.hand_back.due(now) {
            return;
        }
        let mut due = Vec::new();
        self.hand_back.reset();
        self.hand_back.take_due(&mut self.items, now, &mut due);
        self.hand_back.take_due(&mut self.circuit, now, &mut due);
        inner
            .signals
            .held
            .fetch_sub(due.len() as i64, Ordering::Relaxed);
        for item in due {
            inner.hand_back(item, Waited::Held);
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
    pub(crate) fn make_room(&mut self, inner: &Arc<Inner<T>>, max_held: usize) {
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

    /// Takes out the held messages (for load and for their circuit) for which `pred` returns
    /// `true`, counted out of the runtime's held messages; the others keep their order. For
    /// messages that must leave without being offered again: those their source took back
    /// (`recall.rs`). Each message is past the key gate: the caller frees its key.
    pub(crate) fn drain_where(
        &mut self,
        inner: &Inner<T>,
        mut pred: impl FnMut(&mut Item<T>) -> bool,
    ) -> Vec<Item<T>> {
        let mut out = Vec::new();
        for list in [&mut self.items, &mut self.circuit] {
            if list.is_empty() {
                continue;
            }
            let mut kept = VecDeque::with_capacity(list.len());
            for mut item in list.drain(..) {
                if pred(&mut item) {
                    out.push(item);
                } else {
                    kept.push_back(item);
                }
            }
            *list = kept;
        }
        inner
            .signals
            .held
            .fetch_sub(out.len() as i64, Ordering::Relaxed);
        out
    }

    /// Messages held for load and for their circuit: what `max_held` bounds.
    pub(crate) fn len(&self) -> usize {
        self.items.len() + self.circuit.len()
    }

    pub(crate) fn circuit_due(&self, inner: &Inner<T>) -> bool {
        !self.circuit.is_empty()
            && (inner.breakers.generation() != self.circuit_generation
                || self.circuit_at.elapsed() >= inner.poll_interval())
    }

    /// Offers the circuit-held messages whose circuit admits them again; expires those past their
    /// deadline.
    pub(crate) fn sweep_circuit(&mut self, inner: &Arc<Inner<T>>) {
        self.circuit_generation = inner.breakers.generation();
        self.circuit_at = tokio::time::Instant::now();
        let now = inner.clock.now();
        for _ in 0..self.circuit.len() {
            let Some(item) = self.circuit.pop_front() else {
                break;
            };
            if item.deadline().is_some_and(|d| d <= now) {
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
                Offer::Hold(item) | Offer::Evicted(item) => {
                    self.hand_back.note(item.hand_back_at());
                    self.items.push_back(item);
                }
            }
        }
    }

    pub(crate) fn sweep_due(&self, inner: &Inner<T>) -> bool {
        !self.items.is_empty()
            && (inner.queue.pop_count() != self.swept_pops
                || inner.load_level() != self.swept_level
                || self.swept_at.elapsed() >= inner.poll_interval())
    }

    /// Offers the held messages again, oldest first, skipping tiers already refused in this
    /// sweep, and settles as expired those whose deadline passed while held.
    pub(crate) fn sweep(&mut self, inner: &Arc<Inner<T>>) {
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
            if item.deadline().is_some_and(|d| d <= horizon) {
                inner.signals.held.fetch_sub(1, Ordering::Relaxed);
                inner.expire(item);
                continue;
            }
            let rank = item.tier().rank();
            if self.refused_now(rank).is_some() && holds(inner, &item) {
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
                Offer::Evicted(victim) => {
                    self.hand_back.note(victim.hand_back_at());
                    self.items.push_back(victim);
                }
                Offer::CircuitHold(item) => self.circuit.push_back(item),
            }
        }
    }

    /// Why a message of `rank` would be refused, as one was in the last sweep; `None` if it
    /// would be offered. Only a message its policy would hold is held on this answer without
    /// an offer (see [`holds`]); the others are offered, to go through their own policy.
    pub(crate) fn refused_now(&self, rank: usize) -> Option<Refusal> {
        match self.refused_floor {
            Some((floor, reason)) if rank <= floor => Some(reason),
            _ if self.rate_refused & (1 << rank) != 0 => Some(Refusal::Rate),
            _ => None,
        }
    }

    /// Remembers a refusal of `rank` for `reason` until the next sweep: the tiers at or below
    /// it for a bottom-prefix reason, that tier alone for its bucket.
    pub(crate) fn note_refused(&mut self, rank: usize, reason: Option<Refusal>) {
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
    pub(crate) fn offer_new(&mut self, inner: &Arc<Inner<T>>, item: Item<T>) {
        let rank = item.tier().rank();
        // One recent-time read for both: when this rank was seen, and its slack.
        let recent = crate::queue::time::recent(&inner.clock);
        let now = (recent.saturating_duration_since(inner.origin).as_nanos() as u64).max(1);
        if self.seen_ns[rank] != now {
            self.seen_ns[rank] = now;
        }
        if let Some(deadline) = item.deadline() {
            let slack = deadline.saturating_duration_since(recent).as_nanos();
            let slack = u64::try_from(slack).unwrap_or(u64::MAX - 1);
            let mean = &mut self.slack_ns[rank];
            *mean = if *mean == u64::MAX {
                slack
            } else {
                *mean - *mean / 8 + slack / 8
            };
        }
        if let Some(reason) = self.refused_now(rank).filter(|_| holds(inner, &item)) {
            inner.signals.held.fetch_add(1, Ordering::Relaxed);
            let mut item = item;
            item.last_refusal = Some(reason);
            item.mark_waiting();
            self.hand_back.note(item.hand_back_at());
            self.items.push_back(item);
            return;
        }
        let offer = inner.offer(item);
        self.absorb(inner, rank, offer);
    }

    /// What an offer of a new message of `rank` left to hold: held here, behind the older ones.
    pub(crate) fn absorb(&mut self, inner: &Inner<T>, rank: usize, offer: Offer<T>) {
        match offer {
            Offer::Taken => {}
            Offer::Hold(item) => {
                inner.signals.held.fetch_add(1, Ordering::Relaxed);
                self.note_refused(rank, item.last_refusal);
                self.hand_back.note(item.hand_back_at());
                self.items.push_back(item);
            }
            Offer::Evicted(victim) => {
                inner.signals.held.fetch_add(1, Ordering::Relaxed);
                self.hand_back.note(victim.hand_back_at());
                self.items.push_back(victim);
            }
            Offer::CircuitHold(item) => {
                inner.signals.held.fetch_add(1, Ordering::Relaxed);
                self.hand_back.note(item.hand_back_at());
                self.circuit.push_back(item);
            }
        }
    }

    /// Whether a new message would be offered at once, as a worker pulling for the intake
    /// offers it: nothing held, and no tier refused by the last sweep.
    pub(crate) fn clear(&self) -> bool {
        self.len() == 0 && self.refused_floor.is_none() && self.rate_refused == 0
    }
}

/// Whether `item`'s tier holds it when refused (Backpressure, after the policy step's own
/// conversions: a keyed message of a Defer tier, one deferred `max_deferrals` times, a Defer
/// tier whose sink is failing). Only such a message may wait behind an older refused one
/// without an offer of its own: a Defer or Drop tier's message behind a held High one must be
/// deferred or dropped as its policy says, not held until the High one gets in.
fn holds<T: Send + Sync + 'static>(inner: &Inner<T>, item: &Item<T>) -> bool {
    inner.policy(item) == RefusalPolicy::Backpressure
}
