//! A message inside the runtime: the envelope plus the accounting that makes "exactly one
//! disposition" structural.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use quanta::Instant;

use crate::admission::CircuitBreaker;
use crate::ledger::Disposition;
use crate::runtime::accounts::Accounts;
use crate::runtime::ack::SinkId;
use crate::runtime::metric_counts::Counted;
use crate::runtime::refusal::Refusal;
use crate::runtime::{Ack, Envelope};
use crate::sync::Ordering;
use crate::Criticality;

/// The message, owned until a handler first needs a shared handle: admission and refusal never
/// allocate for it.
enum Payload<T> {
    Owned(T),
    Shared(Arc<T>),
    /// Only while switching from `Owned` to `Shared`.
    Moving,
}

/// What [`Item::settle_later`] leaves to its caller.
pub(crate) struct Settled<T> {
    /// To resolve once the disposition is in the ledger.
    pub(crate) ack: Option<Ack>,
    /// To take out of the memory budget after the ack.
    pub(crate) bytes: u64,
    /// The payload's shared handle, if a handler had one (see [`Item::share_reusing`]).
    pub(crate) payload: Option<Arc<T>>,
}

/// Where a message came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Pulled from an attached source: admitted by the pull-based level, and counted in the
    /// arrival it measures.
    Pulled,
    /// Pulled from a drain (deferred work coming back, `Runtime::attach_drain`): admitted by
    /// the pull-based level, not counted in its arrival.
    Drained,
    /// Offered by an in-process producer (`try_submit`): admitted by queue age, not by the
    /// pull-based level.
    Pushed,
}

/// Where a message stands with admission: what has been counted of it, so that each message is
/// counted at most once as admitted, at most once as refused (a held message is offered again
/// and again; an evicted one is queued again), and has one first decision
/// (`triage_admission_decisions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Consumed, no decision yet.
    New,
    /// Admitted into the queue, never refused.
    Admitted,
    /// Refused (or withdrawn at dispatch), never admitted.
    Refused,
    /// Both: admitted and later refused or withdrawn, or refused and later admitted.
    Both,
}

impl Standing {
    /// Whether its first decision is counted.
    #[inline]
    pub(crate) fn decided(self) -> bool {
        self != Standing::New
    }

    /// Whether it was counted as admitted.
    #[inline]
    pub(crate) fn admitted(self) -> bool {
        matches!(self, Standing::Admitted | Standing::Both)
    }

    /// Whether it was counted as refused (or withdrawn).
    #[inline]
    pub(crate) fn refused(self) -> bool {
        matches!(self, Standing::Refused | Standing::Both)
    }

    /// The standing once admitted.
    #[inline]
    pub(crate) fn and_admitted(self) -> Standing {
        match self {
            Standing::New | Standing::Admitted => Standing::Admitted,
            Standing::Refused | Standing::Both => Standing::Both,
        }
    }

    /// The standing once refused (or withdrawn).
    #[inline]
    pub(crate) fn and_refused(self) -> Standing {
        match self {
            Standing::New | Standing::Refused => Standing::Refused,
            Standing::Admitted | Standing::Both => Standing::Both,
        }
    }
}

/// One consumed message. Settled exactly once: [`Item::settle`] records its disposition and
/// resolves its ack; dropped unsettled (shutdown, an aborted task), it is *released*: counted,
/// and its ack tells the source not to acknowledge it.
pub(crate) struct Item<T> {
    payload: Payload<T>,
    pub(crate) original: Criticality,
    pub(crate) attempt: u32,
    /// Earlier deferrals of this message (its copies' `triage-deferrals`).
    pub(crate) deferrals: u32,
    /// Its deadline when `flags` has [`HAS_DEADLINE`], any instant otherwise (never read):
    /// read with [`deadline`](Self::deadline). Not an `Option<Instant>`, whose tag took 8 more
    /// bytes (see [`ITEM_BYTES`]).
    deadline_at: Instant,
    pub(crate) size_bytes: usize,
    /// Pulled from a source, or pushed by an in-process producer.
    pub(crate) origin: Origin,
    /// What admission has counted of it so far.
    pub(crate) standing: Standing,
    /// Its ordering key (see `crate::ordering`): while it is inside the runtime past the key
    /// gate, the later messages of its key wait in the gate.
    pub(crate) key: Option<u64>,
    /// The circuit breaker of its downstream, looked up once when it was consumed.
    pub(crate) circuit: Option<Arc<CircuitBreaker>>,
    /// By when it must be handed back to its source if it is still waiting (queued, held,
    /// parked), as one plus the nanoseconds after `accounts.clock_origin`: its source's
    /// patience runs out soon after (see `patience.rs`). `None`: its source has no such
    /// limit. Read with [`hand_back_at`](Self::hand_back_at).
    hand_back: Option<NonZeroU64>,
    /// [`WAITING`], [`ACKED`] and [`HAS_DEADLINE`], in one byte.
    flags: u8,
    /// Why it was last refused or evicted; `None` while it never was.
    pub(crate) last_refusal: Option<Refusal>,
    /// Its acknowledgement, until [`take_ack`](Self::take_ack) (then a no-op ack and
    /// [`ACKED`]: an `Option<Ack>` would take 8 more bytes, and an item is moved several times
    /// per message).
    ack: Ack,
    /// The runtime's recall generation when it was pulled (read before the pull), or when its
    /// source last said it still has it: a recall since then may have taken it back (see
    /// `recall.rs`). Sixteen bits: within [`ITEM_BYTES`].
    pub(crate) recall_stamp: u16,
    /// Its cohort within its tier (`0..COHORTS`, see `admission::cohort`): the slice of users
    /// it belongs to when its tier is admitted in part.
    pub(crate) cohort: u8,
    /// The runtime's accounts; `None` only once dropped (it goes back to the thread's spares,
    /// see [`Accounts::share`]).
    accounts: Option<Arc<Accounts>>,
}

/// In `Item::flags`: waiting (held under backpressure, or parked behind its ordering key), its
/// bytes out of the memory budget's working set.
const WAITING: u8 = 1;
/// In `Item::flags`: the ack was taken (settled, released or handed back).
const ACKED: u8 = 2;
/// In `Item::flags`: `deadline_at` is its deadline.
const HAS_DEADLINE: u8 = 4;

/// The most bytes an [`Item`] of a small payload may take: a move of more is a call to
/// `memcpy` rather than a few register moves, and an item is moved several times per message
/// (measured on the runtime bench, issue 30: 41-42 ms of CPU per 100,000 messages at 128
/// bytes, 51-53 ms at 136). Checked at compile time, below.
pub(crate) const ITEM_BYTES: usize = 128;

// A field that makes an item of a small payload larger than `ITEM_BYTES` fails the build.
const _: () = assert!(std::mem::size_of::<Item<u64>>() <= ITEM_BYTES);

impl<T> Item<T> {
    pub(crate) fn consumed(env: Envelope<T>, accounts: &Arc<Accounts>) -> Self {
        let original = env.criticality;
        accounts.ledger.record_consumed(original);
        accounts.metric_counts.add(Counted::Consumed, original, 1);
        accounts.enter();
        accounts.memory.add(env.size_bytes as u64);
        Item {
            payload: Payload::Owned(env.payload),
            original,
            attempt: env.attempt,
            deferrals: env.deferrals,
            deadline_at: env.deadline.unwrap_or(accounts.clock_origin),
            size_bytes: env.size_bytes,
            origin: Origin::Pulled,
            standing: Standing::New,
            key: env.ordering_key,
            circuit: None,
            hand_back: None,
            flags: if env.deadline.is_some() {
                HAS_DEADLINE
            } else {
                0
            },
            last_refusal: None,
            ack: env.ack,
            recall_stamp: 0,
            // The ordering key stands for the user; a message with neither is its own user,
            // in a cohort drawn at random (no clock mixed in: a seeded run stays the same).
            // A source's own value is held in range: any value is some cohort, never one
            // that no admission level can reach.
            cohort: env
                .cohort
                .map(|c| c % crate::admission::COHORTS)
                .unwrap_or_else(|| match env.ordering_key {
                    Some(key) => crate::admission::cohort(
                        key,
                        accounts.cohort_period.load(Ordering::Relaxed),
                    ),
                    None => fastrand::u8(..crate::admission::COHORTS),
                }),
            accounts: Some(Accounts::share(accounts)),
        }
    }

    /// The instant after which serving it is useless; `None` never expires.
    #[inline]
    pub(crate) fn deadline(&self) -> Option<Instant> {
        (self.flags & HAS_DEADLINE != 0).then_some(self.deadline_at)
    }

    #[inline]
    fn waiting(&self) -> bool {
        self.flags & WAITING != 0
    }

    /// By when it must be handed back if it is still waiting (see `patience.rs`).
    #[inline]
    pub(crate) fn hand_back_at(&self) -> Option<Instant> {
        self.hand_back
            .map(|ns| self.accounts().clock_origin + Duration::from_nanos(ns.get() - 1))
    }

    /// Sets by when it must be handed back (at the runtime's origin at the earliest).
    pub(crate) fn set_hand_back_at(&mut self, at: Option<Instant>) {
        self.hand_back = at.map(|at| {
            let ns = at
                .saturating_duration_since(self.accounts().clock_origin)
                .as_nanos();
            let ns = u64::try_from(ns).unwrap_or(u64::MAX - 1);
            NonZeroU64::MIN.saturating_add(ns)
        });
    }

    /// The message.
    pub(crate) fn payload(&self) -> &T {
        match &self.payload {
            Payload::Owned(t) => t,
            Payload::Shared(a) => a,
            // `share` leaves `Moving` only inside its own body.
            Payload::Moving => unreachable!("payload observed while moving"),
        }
    }

    /// A shared handle for a handler, allocated on first use (once per message served).
    pub(crate) fn share(&mut self) -> Arc<T> {
        if let Payload::Shared(a) = &self.payload {
            return Arc::clone(a);
        }
        let arc = match std::mem::replace(&mut self.payload, Payload::Moving) {
            Payload::Owned(t) => Arc::new(t),
            Payload::Shared(a) => a,
            Payload::Moving => unreachable!("payload moved twice"),
        };
        self.payload = Payload::Shared(Arc::clone(&arc));
        arc
    }

    /// Hands the message back to an in-process caller: counted as released (it was consumed
    /// but gets no disposition here), its ack untouched and returned inside the envelope.
    /// `Err(self)` if a handler still shares the payload (then it cannot be handed back).
    pub(crate) fn hand_back(mut self) -> Result<Envelope<T>, Self> {
        let payload = match std::mem::replace(&mut self.payload, Payload::Moving) {
            Payload::Owned(t) => t,
            Payload::Shared(a) => match Arc::try_unwrap(a) {
                Ok(t) => t,
                Err(a) => {
                    self.payload = Payload::Shared(a);
                    return Err(self);
                }
            },
            Payload::Moving => unreachable!("payload moved twice"),
        };
        let ack = self.take_ack().unwrap_or_else(Ack::noop);
        self.accounts().ledger.record_released(self.original);
        self.accounts().metrics.tiers[self.original]
            .released
            .increment(1);
        // The bytes first: `wait_idle` reads the budget once nothing is alive.
        self.leave_memory();
        self.accounts().leave(1);
        Ok(Envelope {
            payload,
            criticality: self.original,
            attempt: self.attempt,
            deferrals: self.deferrals,
            deadline: self.deadline(),
            size_bytes: self.size_bytes,
            ack,
            ordering_key: self.key,
            waited: std::time::Duration::ZERO,
            cohort: Some(self.cohort),
        })
    }

    /// The tier it is queued and served at: demoted once per retry.
    #[inline]
    pub(crate) fn tier(&self) -> Criticality {
        self.original.demoted_by(self.attempt)
    }

    /// A shared handle for a handler, like [`share`](Self::share), in the allocation of `spare`
    /// (the previous message's handle) when nobody else holds that one any more: a worker
    /// serving message after message allocates no handle. The previous payload is dropped here,
    /// so a worker keeps the last payload it served until it serves the next.
    pub(crate) fn share_reusing(&mut self, spare: &mut Option<Arc<T>>) -> Arc<T> {
        if let (Payload::Owned(_), Some(mut arc)) = (&self.payload, spare.take()) {
            if let Some(slot) = Arc::get_mut(&mut arc) {
                let Payload::Owned(t) = std::mem::replace(&mut self.payload, Payload::Moving)
                else {
                    unreachable!("checked above")
                };
                drop(std::mem::replace(slot, t));
                self.payload = Payload::Shared(Arc::clone(&arc));
                return arc;
            }
        }
        self.share()
    }

    /// Records the disposition (per original criticality) and resolves the ack. Returns the
    /// payload's shared handle, if it has one, for [`share_reusing`](Self::share_reusing).
    pub(crate) fn settle(mut self, disposition: Disposition) -> Option<Arc<T>> {
        self.accounts().ledger.record(self.original, disposition);
        if let Some(ack) = self.take_ack() {
            ack.resolve(disposition);
        }
        // The bytes first: `wait_idle` reads the budget once nothing is alive.
        self.leave_memory();
        self.accounts().leave(1);
        match std::mem::replace(&mut self.payload, Payload::Moving) {
            Payload::Shared(arc) => Some(arc),
            _ => None,
        }
    }

    /// Takes the message out of the runtime's accounts without recording anything, for a
    /// worker that records a batch's dispositions at once ([`Settled`] says what it owes).
    /// The caller must, in this order: record the disposition in the ledger, resolve the
    /// returned ack, then count its bytes out of the memory budget and the item out of `alive`.
    pub(crate) fn settle_later(mut self) -> Settled<T> {
        let ack = self.take_ack();
        // An offer takes an item out of waiting: a served one never is; were it, its bytes
        // leave now, the working set's too.
        let bytes = if self.waiting() {
            self.leave_memory();
            0
        } else {
            self.size_bytes as u64
        };
        let payload = match std::mem::replace(&mut self.payload, Payload::Moving) {
            Payload::Shared(arc) => Some(arc),
            _ => None,
        };
        Settled {
            ack,
            bytes,
            payload,
        }
    }

    /// Whether its source still has it to process ([`AckSink::is_current`]); `true` once its
    /// ack was taken.
    ///
    /// [`AckSink::is_current`]: crate::runtime::AckSink::is_current
    pub(crate) fn is_current(&self) -> bool {
        self.flags & ACKED != 0 || self.ack.is_current()
    }

    /// Its ack's sink and reference, while the ack is not taken and reports somewhere.
    #[inline]
    pub(crate) fn ack_ident(&self) -> Option<(SinkId, crate::runtime::AckRef)> {
        if self.flags & ACKED != 0 {
            return None;
        }
        self.ack.ident()
    }

    /// The ack, the first time: `None` once taken.
    #[inline]
    fn take_ack(&mut self) -> Option<Ack> {
        if self.flags & ACKED != 0 {
            return None;
        }
        self.flags |= ACKED;
        Some(std::mem::replace(&mut self.ack, Ack::noop()))
    }

    /// Its bytes leave the memory budget (settled or released: exactly once, as the ack).
    fn leave_memory(&mut self) {
        self.accounts()
            .memory
            .remove(self.size_bytes as u64, self.waiting());
        self.flags &= !WAITING;
    }

    /// It waits (held under backpressure, or parked behind its key): out of the memory
    /// budget's working set until offered again.
    pub(crate) fn mark_waiting(&mut self) {
        if !self.waiting() {
            self.flags |= WAITING;
            self.accounts().memory.mark_waiting(self.size_bytes as u64);
        }
    }

    /// Offered again: back in the working set.
    pub(crate) fn unmark_waiting(&mut self) {
        if self.waiting() {
            self.flags &= !WAITING;
            self.accounts()
                .memory
                .unmark_waiting(self.size_bytes as u64);
        }
    }

    pub(crate) fn accounts(&self) -> &Accounts {
        match &self.accounts {
            Some(accounts) => accounts,
            None => unreachable!("an item's accounts are taken only when it is dropped"),
        }
    }
}

impl<T> Drop for Item<T> {
    fn drop(&mut self) {
        if let Some(ack) = self.take_ack() {
            self.accounts().ledger.record_released(self.original);
            self.accounts().metrics.tiers[self.original]
                .released
                .increment(1);
            self.leave_memory();
            self.accounts().leave(1);
            ack.release();
        }
        if let Some(accounts) = self.accounts.take() {
            Accounts::give_back(accounts);
        }
    }
}

#[cfg(test)]
mod tests {

    use super::Standing::{self, *};

    #[test]
    fn a_standing_counts_each_verdict_once_and_remembers_both() {
        assert!(!New.decided() && !New.admitted() && !New.refused());
        assert_eq!(New.and_admitted(), Admitted);
        assert_eq!(New.and_refused(), Refused);
        assert_eq!(Admitted.and_admitted(), Admitted);
        assert_eq!(Refused.and_refused(), Refused);
        assert_eq!(Admitted.and_refused(), Both);
        assert_eq!(Refused.and_admitted(), Both);
        for s in [Admitted, Refused, Both] {
            assert!(s.decided());
            assert_eq!(s.and_admitted().and_refused(), Both);
        }
        let both: Standing = Both;
        assert!(both.admitted() && both.refused());
    }
}
