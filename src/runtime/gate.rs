//! The admission gate: the checks an offered message meets before it is queued, in one order,
//! and the push into the queue of what they admit. What they refuse goes to the policy step
//! (`policy.rs`) with its [`Refusal`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::admission::{admits_at, Decision};
use crate::queue::{Meta, Removed};
use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::Item;
use crate::runtime::refusal::Refusal;
use crate::runtime::RefusalPolicy;

impl<T: Send + Sync + 'static> Inner<T> {
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

    pub(crate) fn offer_with(self: &Arc<Self>, mut item: Item<T>, quiet: bool) -> Offer<T> {
        let tier = item.tier();
        let started = self.reject_costs.sampling().then(|| self.clock.now());
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
            && !admits_at(self.signals.shed_level(), tier)
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
                let last_work = &self.signals.last_work_ns[tier.rank()];
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
}
