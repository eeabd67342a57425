//! The admission gate: one question per offered message, answered by [`decide`] with a grant,
//! or why not: past its deadline, or one [`Refusal`]. Then the push into the queue of what it
//! admits. What it refuses goes to the policy step (`policy.rs`); what expired is settled
//! `Expired` at once (no policy applies to what is useless).
//!
//! # The checks, in order
//!
//! 1. **Expired** (decision `shed-expired`): a message whose deadline passed (on recent time)
//!    is useless, whatever the load: settled `Expired`, neither refused nor deferred. First,
//!    so that nothing is spent on it (no token, no memory, no queue slot).
//! 2. **Circuit** (`circuit`): a message bound for a downstream whose circuit is open would only
//!    fail; refused whatever the load.
//! 3. **Forced level** (`forced`): the operator's switch refuses the lowest tiers whatever the
//!    signals say (seed 002: one switch).
//! 4. **Shed level** (`overloaded`, pulled messages only): pull-based admission's level refuses
//!    the lowest tiers while arrival is beyond capacity, but only while the workers have the
//!    prefetch queued: refusal makes room for more important work, and idle workers next to
//!    held work make none. Of the highest refused tier, the messages whose cohort is among
//!    those admitted (the capacity left, see `admission::cohort`) pass.
//! 5. **Memory** (`memory`): the bytes held against the tier's share of the memory budget.
//! 6. **Queue full** (`full`, pulled messages whose policy is Backpressure only): a message that
//!    would wait for a full queue with nothing below its tier to evict is refused on the
//!    queue's published length and backlog, without its lock (taken against every worker's
//!    pop); held by the intake, it is offered again after the next pop. The hint counts items
//!    past their deadline that a push would discard; they leave at the next pop too.
//! 7. **Rate** (`rate`): the tier's token bucket, and its lenders'. Last, so that no token is
//!    spent on a message refused anyway.
//!
//! Then the push, which may still refuse (`full`, `too_large`, or `overloaded` for pushed
//! work, which queue-age admission decides) and gives the token back if so, or evict lower
//! tiers (`evicted`), each victim going to its own tier's policy.
//!
//! # Expiry outside the gate
//!
//! Every offer asks check 1: a message released by its key, offered again after a hold, a
//! retry, pushed work. Expiry is also decided where no offer is made:
//! - **at intake**, from the headers alone, before the key gate (`receive.rs`:
//!   `expired_at_intake`, decision `shed-expired`): an expired keyed message never waits for
//!   its key;
//! - **while held**, without an offer: the intake's held messages whose deadline passes (or
//!   would before a handler could finish) and hold tasks (`intake/held.rs`, `policy.rs`), and
//!   a message handed back to its broker (`hand_back.rs`);
//! - **after admission**, in the queue: a push that needs room discards what expired, and a pop
//!   discards an expired item instead of serving it ("discard at dequeue"), and the worker's
//!   dispatch check settles one that expired between its pop and its handler call
//!   (`dispatch.rs`).
//!
//! The rules are a plain function over [`Checks`], tested alone with a fake; the runtime's
//! implementation reads its parts (`Against`).

use crate::sync::Ordering;
use std::sync::Arc;

use crate::admission::{admits_at, admits_cohort, Decision, Grant};
use crate::queue::{Evictions, Meta, Removed};
use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::{Item, Origin};
use crate::runtime::metric_counts::Counted;
use crate::runtime::refusal::Refusal;
use crate::runtime::settle::Freed;
use crate::runtime::RefusalPolicy;
use crate::Criticality;

/// What the gate knows of the offered message itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offered {
    /// The tier it is offered at (demoted once per retry).
    pub(crate) tier: Criticality,
    /// Pushed by an in-process producer (`try_submit`): queue-age admission decides at the
    /// push, not the pull-based level.
    pub(crate) origin: Origin,
}

/// Why the gate does not admit a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// Its deadline passed: settled `Expired`, no policy applies.
    Expired,
    /// Refused: to its tier's policy.
    Refused(Refusal),
}

impl From<Refusal> for Denied {
    fn from(r: Refusal) -> Self {
        Denied::Refused(r)
    }
}

/// What the checks read: the signals and parts behind each of them. Each is asked only when
/// the checks before it admitted the message.
pub(crate) trait Checks {
    /// Whether its deadline has passed.
    fn expired(&self) -> bool;
    /// Whether its downstream's circuit admits it (true without a downstream).
    fn circuit_admits(&mut self) -> bool;
    /// The operator's forced shed level.
    fn forced_level(&self) -> u8;
    /// Whether pull-based admission admits it: its tier above the shed level, or its cohort
    /// among those admitted of the highest refused tier.
    fn shed_admits(&self, tier: Criticality) -> bool;
    /// Whether the queue holds the prefetch: every worker has work.
    fn workers_busy(&self) -> bool;
    /// Whether the memory budget admits its bytes.
    fn memory_admits(&mut self, tier: Criticality) -> bool;
    /// Whether the queue looks full for `tier`, with nothing below it to evict.
    fn looks_full_for(&self, tier: Criticality) -> bool;
    /// Whether its tier's policy holds it when refused (Backpressure).
    fn waits_when_refused(&self) -> bool;
    /// A token of its tier's bucket (or a lender's), if there is one.
    fn take_token(&mut self, tier: Criticality) -> Option<Grant>;
}

/// The gate's answer for `offered`: a grant (the token to give back if the push refuses), or
/// the first check in the order of the module docs that does not admit it.
#[inline]
pub(crate) fn decide(offered: Offered, checks: &mut impl Checks) -> Result<Grant, Denied> {
    let tier = offered.tier;
    if checks.expired() {
        return Err(Denied::Expired);
    }
    if !checks.circuit_admits() {
        return Err(Refusal::Circuit.into());
    }
    if !admits_at(checks.forced_level(), tier) {
        return Err(Refusal::Forced.into());
    }
    let pulled = offered.origin != Origin::Pushed;
    if pulled && !checks.shed_admits(tier) && checks.workers_busy() {
        return Err(Refusal::Overloaded.into());
    }
    if !checks.memory_admits(tier) {
        return Err(Refusal::Memory.into());
    }
    if pulled && checks.looks_full_for(tier) && checks.waits_when_refused() {
        return Err(Refusal::Full.into());
    }
    checks.take_token(tier).ok_or(Refusal::Rate.into())
}

/// The runtime's [`Checks`] for one item.
struct Against<'a, T> {
    inner: &'a Inner<T>,
    item: &'a mut Item<T>,
}

impl<T: Send + Sync + 'static> Checks for Against<'_, T> {
    #[inline]
    fn expired(&self) -> bool {
        self.item
            .deadline()
            .is_some_and(|d| d <= crate::queue::time::recent(&self.inner.clock))
    }

    #[inline]
    fn circuit_admits(&mut self) -> bool {
        self.item
            .circuit
            .as_ref()
            .is_none_or(|b| self.inner.breakers.admits(b))
    }

    #[inline]
    fn forced_level(&self) -> u8 {
        self.inner.live.forced_level()
    }

    #[inline]
    fn shed_admits(&self, tier: Criticality) -> bool {
        let level = self.inner.signals.shed_level();
        let rank = tier.rank();
        // The set is read only for the tier admitted in part.
        rank >= usize::from(level)
            || admits_cohort(
                level,
                self.inner.signals.cohort_set(),
                rank,
                self.item.cohort,
            )
    }

    fn workers_busy(&self) -> bool {
        self.inner.queue.len() >= self.inner.prefetch()
    }

    #[inline]
    fn memory_admits(&mut self, tier: Criticality) -> bool {
        // Offered again after waiting under backpressure: back in the memory working set.
        self.item.unmark_waiting();
        self.inner
            .accounts
            .memory
            .admits(tier, self.item.size_bytes as u64)
    }

    #[inline]
    fn looks_full_for(&self, tier: Criticality) -> bool {
        self.inner.queue.looks_full_for(tier)
    }

    fn waits_when_refused(&self) -> bool {
        self.inner.policy(self.item) == RefusalPolicy::Backpressure
    }

    #[inline]
    fn take_token(&mut self, tier: Criticality) -> Option<Grant> {
        self.inner.buckets.try_acquire(tier)
    }
}

impl<T: Send + Sync + 'static> Inner<T> {
    /// Admission: push into the queue, apply the policy to whatever is refused or evicted.
    ///
    /// The refuse path (Drop or Backpressure) allocates nothing and logs nothing: a queue push
    /// that fails on one atomic load, counter increments on pre-registered handles, and the
    /// ack's resolve.
    pub(crate) fn offer(self: &Arc<Self>, item: Item<T>) -> Offer<T> {
        let mut freed = Freed::default();
        let offer = self.offer_into(item, false, &mut freed);
        self.release(freed);
        offer
    }

    /// [`offer`](Self::offer) for a worker that pulled the item itself and pops right after:
    /// its push wakes no other worker (see `WfqQueue::push_admitted_quiet`).
    #[inline]
    pub(crate) fn offer_quiet(self: &Arc<Self>, item: Item<T>) -> Offer<T> {
        let mut freed = Freed::default();
        let offer = self.offer_into(item, true, &mut freed);
        self.release(freed);
        offer
    }

    /// [`offer`](Self::offer) inside a step: the keys of the messages it settles (shed by their
    /// policy, expired or evicted by its push) go to `freed`, for the caller's loop.
    pub(crate) fn offer_into(
        self: &Arc<Self>,
        mut item: Item<T>,
        quiet: bool,
        freed: &mut Freed,
    ) -> Offer<T> {
        let tier = item.tier();
        let started = self.reject_costs.sampling().then(|| self.clock.now());
        let offered = Offered {
            tier,
            origin: item.origin,
        };
        let verdict = decide(
            offered,
            &mut Against {
                inner: self,
                item: &mut item,
            },
        );
        let grant = match verdict {
            Ok(grant) => grant,
            Err(Denied::Expired) => {
                self.decide(&item, Decision::ShedExpired);
                self.expire_into(item, freed);
                return Offer::Taken;
            }
            Err(Denied::Refused(Refusal::Circuit)) => {
                return self.refused_circuit(item, started, freed)
            }
            Err(Denied::Refused(reason)) => {
                if reason == Refusal::Memory {
                    self.accounts.memory.note_refusal(tier);
                }
                return self.refused(item, reason, started, freed);
            }
        };
        // Counted as admitted before the push, which takes the item: restored if it refuses.
        let before = item.standing;
        item.standing = before.and_admitted();
        let original = item.original;
        let meta = Meta::new(tier)
            .deadline_opt(item.deadline())
            .size_bytes(item.size_bytes);
        // What the push removes to make room comes back here, not in its result: the usual
        // push, which removes nothing, moves the item into the queue and nothing back.
        let mut evicted = Evictions::none();
        let pushed = if quiet && item.origin != Origin::Pushed {
            self.queue.push_admitted_quiet(item, meta, &mut evicted)
        } else {
            let admitted = item.origin != Origin::Pushed;
            self.queue.push_into(item, meta, admitted, &mut evicted)
        };
        match pushed {
            Ok(()) => {
                // Recent time moves once per millisecond: stored only when it moved, so most
                // pushes only read a line that every thread's pushes would otherwise write.
                let now = self.recent_ns().max(1);
                let last_work = &self.signals.measured.local().last_work_ns[tier.rank()];
                if last_work.load(Ordering::Relaxed) != now {
                    last_work.set(now);
                }
                if !before.admitted() {
                    self.accounts.metric_counts.add(Counted::Admitted, tier, 1);
                    self.accounts.counts.local().admitted[tier.rank()].add(1, Ordering::Relaxed);
                }
                if !before.decided() {
                    self.record_decision(original, Decision::Admitted);
                }
                if evicted.is_empty() {
                    // The usual push: nothing to iterate (taking the inline entry out of an
                    // empty `Evictions` still copies its whole room).
                    return Offer::Taken;
                }
                let mut hold = None;
                for removed in evicted {
                    let e = match removed {
                        Removed::Evicted(e) => e,
                        // Room made by discarding what had outlived its deadline.
                        Removed::Expired(e) => {
                            self.expire_into(e.into_inner(), freed);
                            continue;
                        }
                    };
                    let victim = e.into_inner();
                    let t = victim.tier();
                    self.accounts.refusals.add(t, Refusal::Evicted);
                    if let Offer::Hold(v) = self.refuse(victim, Refusal::Evicted, freed) {
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
                item.standing = before;
                self.refused(item, reason, started, freed)
            }
        }
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
