//! The broker's patience: a message never waits in the runtime until its source's broker
//! takes it back by force.
//!
//! # Why
//!
//! RabbitMQ closes a consumer's channel when a delivery stays unacknowledged longer than its
//! `consumer_timeout` (30 minutes by default; per queue with `x-consumer-timeout` from 3.12).
//! Every unsettled delivery on that channel is then delivered again, those whose handlers had
//! already finished included: their acknowledgements fail with the channel, so their work is
//! done twice, and in a long incident this repeats every timeout. triage keeps a message
//! waiting that long by design: under a sustained Critical backlog the concurrency shares keep
//! a Sheddable message queued (work-conserving borrowing needs no higher tier queued), an
//! intake holds a refused message under Backpressure for as long as the overload lasts, and a
//! message parked behind a slow ordering key waits for its key.
//!
//! # What happens
//!
//! A source states its patience ([`Source::patience`](crate::runtime::Source::patience)).
//! Each of its messages gets, when it is received, a *hand-back instant*: its receipt plus
//! [`patience_share`](crate::runtime::ExpertConfig::patience_share) of the patience, less
//! the time it already waited in the source ([`Envelope::waited`](crate::runtime::Envelope::waited)).
//! A message still waiting at that instant is handed back:
//! - **deferred** (reason `patience`) when its tier's policy is `defer` (sink healthy, not
//!   keyed, deferred fewer than `max_deferrals` times), a copy can still come back before its
//!   deadline, and a deferral permit is free: it ends `Deferred`, acknowledged once the copy
//!   is confirmed;
//! - **released** otherwise: dropped unacknowledged ([`AckSink::release`](crate::runtime::AckSink::release),
//!   `basic.nack` with `requeue` on RabbitMQ), so the broker delivers it again, to this
//!   consumer or another, with a patience of its own;
//! - **expired** if its deadline has passed meanwhile, as it would be at dequeue.
//!
//! A released message of an ordering key takes the messages parked behind it with it (they
//! would otherwise run before it comes back), and its key is free; a parked message handed back
//! takes the later ones of its key. Each deferred or released one is counted in
//! `triage_handed_back_total` (tier, where it waited, outcome) and in
//! [`RuntimeStats::handed_back`](crate::runtime::RuntimeStats::handed_back).
//!
//! # The ledger
//!
//! A released message is counted `released`, not given a disposition, exactly as a message
//! released at shutdown or by a revocation: the invariant reads
//! `consumed = completed + failed + deferred + expired + shed + released + queued + in_flight`,
//! and its redelivery is consumed (counted) again and ends in exactly one disposition. So every
//! consumption ends once: in a disposition, or released.
//!
//! # Where, and how often
//!
//! On the sampler's tick (`admission.tick_ms`, 100 ms by default: it runs whether messages
//! flow or not), the queue hands over what is due ([`WfqQueue::take_due`]: its heads, and a
//! tier's other items only when one may be due, never a scan per message) and the key gate
//! its parked messages once the earliest hand-back among them has come (a scan then, bounded
//! by `max_parked`, at most once per tick). Each intake looks at its held messages once the
//! earliest hand-back among them has come, and asks its source to release what waited too
//! long in its own buffer ([`Source::release_waiting`](crate::runtime::Source::release_waiting)):
//! a paused source, or a tier queue not read while its tier is shed, keeps up to its prefetch
//! there. A message waiting out a retry backoff is checked once offered again; a held task
//! (outside an intake) at each of its polls. Not handed back: a message in a handler (its run
//! must fit in the rest of the patience), one being deferred or dead-lettered (a publish
//! waiting for its confirm), and one held unacknowledged because its dead letter is refused for
//! good.
//!
//! [`WfqQueue::take_due`]: crate::queue::WfqQueue::take_due

use crate::sync::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use quanta::Instant;

use crate::runtime::item::Item;
use crate::{Criticality, PerTier};

/// Where a message handed back waited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// In the queue.
    Queued,
    /// Held under backpressure (by an intake, or by a task).
    Held,
    /// Parked behind its ordering key.
    Parked,
}

impl Waited {
    /// Its place in the per-place metric handles.
    pub(crate) fn index(self) -> usize {
        match self {
            Waited::Queued => 0,
            Waited::Held => 1,
            Waited::Parked => 2,
        }
    }
}

/// The patience part: whether any source has a patience, the earliest hand-back among the
/// parked messages, and the counts.
#[derive(Debug)]
pub(crate) struct Patience {
    /// A source with a patience was attached: the queue reads hand-back instants.
    tracking: AtomicBool,
    /// At or before the hand-back instant of every parked message, ns since the runtime's
    /// origin; `u64::MAX`: none has one.
    parked_floor_ns: AtomicU64,
    /// Messages handed back, per original tier (rank).
    handed_back: [AtomicU64; 4],
}

impl Default for Patience {
    fn default() -> Self {
        Patience {
            tracking: AtomicBool::new(false),
            parked_floor_ns: AtomicU64::new(u64::MAX),
            handed_back: Default::default(),
        }
    }
}

impl Patience {
    /// Messages handed back so far, per original tier.
    pub(crate) fn handed_back(&self) -> PerTier<u64> {
        PerTier::from_fn(|t| self.handed_back[t.rank()].load(Ordering::Relaxed))
    }

    /// One more message of original tier `tier` handed back.
    pub(crate) fn count_handed_back(&self, tier: Criticality) {
        self.handed_back[tier.rank()].fetch_add(1, Ordering::Relaxed);
    }

    /// A source with a patience was attached: `true` the first time only, when the queue must
    /// start reading hand-back instants.
    pub(crate) fn start_tracking(&self) -> bool {
        !self.tracking.swap(true, Ordering::AcqRel)
    }

    /// Whether a source with a patience was attached.
    pub(crate) fn tracking(&self) -> bool {
        self.tracking.load(Ordering::Acquire)
    }

    /// A message was parked whose hand-back instant is `at_ns` (ns since the runtime's origin).
    pub(crate) fn parked_until(&self, at_ns: u64) {
        self.parked_floor_ns.fetch_min(at_ns, Ordering::AcqRel);
    }

    /// Whether a parked message may be due at `now_ns`; if so, the floor is cleared for the
    /// caller to recompute from what stays parked ([`parked_until`](Self::parked_until)). A
    /// message parked meanwhile lowers it again after its arrival, so it is never lost.
    pub(crate) fn take_parked_due(&self, now_ns: u64) -> bool {
        if self.parked_floor_ns.load(Ordering::Acquire) > now_ns {
            return false;
        }
        self.parked_floor_ns.store(u64::MAX, Ordering::Release);
        true
    }
}

/// What waits `share` of `patience`: the patience scaled, saturating.
pub(crate) fn share_of(patience: Duration, share: f64) -> Duration {
    Duration::try_from_secs_f64(patience.as_secs_f64() * share).unwrap_or(Duration::MAX)
}

/// The messages an intake holds whose hand-back instant has come, and the earliest of the
/// others: for `HeldBuffer`.
#[derive(Debug, Default)]
pub(crate) struct HeldFloor {
    /// At or before the hand-back instant of every message held; `None`: none has one.
    floor: Option<Instant>,
}

impl HeldFloor {
    /// A message with hand-back instant `at` is held.
    #[inline]
    pub(crate) fn note(&mut self, at: Option<Instant>) {
        if let Some(at) = at {
            self.floor = Some(self.floor.map_or(at, |f| f.min(at)));
        }
    }

    /// Whether no message held has a hand-back instant (nothing to look at, whatever the time).
    #[inline]
    pub(crate) fn is_none(&self) -> bool {
        self.floor.is_none()
    }

    /// Whether a message held may be due at `now`.
    #[inline]
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.floor.is_some_and(|f| f <= now)
    }

    /// Takes out of `list` (in place, in order) every message due at `now`, into `out`,
    /// noting the others.
    pub(crate) fn take_due<T>(
        &mut self,
        list: &mut std::collections::VecDeque<Item<T>>,
        now: Instant,
        out: &mut Vec<Item<T>>,
    ) {
        for _ in 0..list.len() {
            let Some(item) = list.pop_front() else {
                break;
            };
            match item.hand_back_at() {
                Some(at) if at <= now => out.push(item),
                at => {
                    self.note(at);
                    list.push_back(item);
                }
            }
        }
    }

    /// Starts a recount: call [`take_due`](Self::take_due) on every list held after it.
    pub(crate) fn reset(&mut self) {
        self.floor = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_of_a_patience_saturates() {
        assert_eq!(
            share_of(Duration::from_secs(1_800), 0.8),
            Duration::from_secs(1_440)
        );
        assert!(share_of(Duration::MAX, 0.95) <= Duration::MAX);
        assert_eq!(share_of(Duration::ZERO, 0.8), Duration::ZERO);
    }
}
