//! The runtime's accounts: what every message counts in (the ledger, the items alive, the
//! metrics, the memory budget, admission's counts), shared by everything that creates or settles
//! items, and the handles on them that items hold.

use std::sync::Arc;

use quanta::Instant;

use crate::admission::{Decision, Decisions, MemoryBudget};
use crate::ledger::Ledger;
use crate::runtime::metric_counts::MetricCounts;
use crate::runtime::metrics::Metrics;
use crate::runtime::refusal::Refusal;
use crate::sync::{AtomicU64, Count, Ordering, PerThread};
use crate::Criticality;

/// Counters shared by everything that creates or settles items.
pub(crate) struct Accounts {
    /// The runtime's origin on its clock (`Inner::origin`): an item's hand-back instant is
    /// kept as an offset from it, in 8 bytes rather than an `Option<Instant>`'s 16.
    pub(crate) clock_origin: Instant,
    /// The cohorts' rotation period now (`admission::rotation_period`), kept up to date by
    /// the sampler so that no message reads the wall clock.
    pub(crate) cohort_period: AtomicU64,
    pub(crate) ledger: Ledger,
    pub(crate) metrics: Metrics,
    /// The metrics every message updates, counted per thread and published on the sampler's
    /// tick (see `metric_counts.rs`).
    pub(crate) metric_counts: MetricCounts,
    /// The counters every message writes: items alive, and what admission decided about
    /// them, one copy per thread (see `crate::sync`), summed on read.
    pub(crate) counts: PerThread<Counts>,
    /// Notified when `alive` falls to 0 with no source pulling (see
    /// [`leave`](Accounts::leave)), for `wait_idle`.
    pub(crate) idle: tokio::sync::Notify,
    /// No source is pulling (`Inner::pulling` is 0): only then is `alive` falling to 0 worth
    /// telling `wait_idle` (while sources pull it does so after every batch).
    pub(crate) sources_done: crate::sync::AtomicBool,
    /// The payload bytes of the items alive, against the memory budget: added when an item is
    /// built, removed when it is settled or released.
    pub(crate) memory: MemoryBudget,
    /// Each item's first admission decision, per original tier.
    pub(crate) decisions: Decisions,
    /// The decision counts already added to `triage_admission_decisions_total`.
    pub(crate) decisions_published: [[AtomicU64; 6]; 4],
    /// Refusals per tier and reason, for `triage_refused_total`.
    pub(crate) refusals: RefusalCounts,
}

/// One thread's copy of [`Accounts::counts`].
#[derive(Default)]
pub(crate) struct Counts {
    /// Items alive: consumed and neither settled nor released (queued, held, deferring, in a
    /// handler, waiting to retry), as a wrapping difference. Counted by construction and
    /// destruction of [`Item`], not by the ledger, so comparing the two is a real check.
    alive: Count,
    /// Messages refused at admission at least once, per tier (rank) they were offered at.
    pub(crate) refused: [Count; 4],
    /// Messages admitted into the queue at least once, per tier (rank) they were queued at.
    pub(crate) admitted: [Count; 4],
    /// Admitted messages taken back at dequeue by their circuit, per tier (rank).
    pub(crate) withdrawn: [Count; 4],
}

/// Refusals per tier (rank) and [`Refusal`], counted on the refuse path and added to
/// `triage_refused_total` by the runtime's sampler (every admission tick, and at shutdown).
///
/// Why not the metric's handle directly: a refusal that is rare among many admissions (a held
/// Critical message offered again under overload, one per pop) would find the handle, the
/// exporter's counter behind it and the decision count each out of cache, and pay a memory
/// access for each: several times the cost of the decision itself. Here a tier's reasons share
/// one cache line (the struct is aligned to it), so a refusal touches that line and its
/// decision count's. BENCHMARKS.md has the figures.
#[repr(align(64))]
#[derive(Default)]
pub(crate) struct RefusalCounts {
    counts: [[AtomicU64; Refusal::COUNT]; 4],
    published: [[AtomicU64; Refusal::COUNT]; 4],
}

impl RefusalCounts {
    /// One refusal of a message of `tier` for `reason`.
    #[inline]
    pub(crate) fn add(&self, tier: Criticality, reason: Refusal) {
        self.counts[tier.rank()][reason.index()].fetch_add(1, Ordering::Relaxed);
    }
}

impl Accounts {
    /// Adds to the refusal and decision metrics what was counted since the last call. Each
    /// count is taken once (`swap`), so concurrent calls never add it twice, and several
    /// runtimes in one process add up in the same series, as increments would.
    pub(crate) fn publish_counts(&self) {
        self.metric_counts.publish(&self.metrics);
        let decisions = self.decisions.snapshot();
        for tier in Criticality::ALL {
            let m = &self.metrics.tiers[tier];
            let rank = tier.rank();
            for (r, counter) in m.refused.iter().enumerate() {
                let now = self.refusals.counts[rank][r].load(Ordering::Relaxed);
                let before = self.refusals.published[rank][r].swap(now, Ordering::Relaxed);
                if now > before {
                    counter.increment(now - before);
                }
            }
            for d in Decision::ALL {
                let now = decisions[tier].get(d);
                let before = self.decisions_published[rank][d.index()].swap(now, Ordering::Relaxed);
                if now > before {
                    m.decisions[d.index()].increment(now - before);
                }
            }
        }
    }
}

impl Accounts {
    /// One more item alive.
    #[inline]
    pub(crate) fn enter(&self) {
        self.counts.local().alive.add(1, Ordering::Relaxed);
    }

    /// `n` items left the runtime (settled or released): counted out of `alive`, and a waiter
    /// of `wait_idle` is told when none is left once no source pulls.
    #[inline]
    pub(crate) fn leave(&self, n: i64) {
        // Sequentially consistent, with the reads in `alive`: of two threads counting out the
        // last items at once, the later one sees both, so one of them tells `wait_idle`.
        self.counts.local().alive.sub(n as u64, Ordering::SeqCst);
        // A stale `sources_done` only delays `wait_idle` to its next poll.
        if self.sources_done.load(Ordering::SeqCst) && self.alive() == 0 {
            self.idle.notify_waiters();
        }
    }

    /// Items alive now: the sum of every thread's count. While messages are consumed as it
    /// reads, the sum may miss some (read where counted out before they were counted in);
    /// once no source pulls, it is exact.
    pub(crate) fn alive(&self) -> i64 {
        self.counts
            .iter()
            .map(|c| c.alive.load(Ordering::SeqCst))
            .fold(0u64, u64::wrapping_add) as i64
    }

    /// Sums one per-tier counter of [`Counts`] over the threads.
    pub(crate) fn per_tier(&self, field: impl Fn(&Counts) -> &[Count; 4]) -> crate::PerTier<u64> {
        crate::PerTier::from_fn(|t| self.counts.sum(|c| &field(c)[t.rank()]))
    }
}

/// Most handles a thread keeps spare in [`SPARES`].
const MAX_SPARES: usize = 64;

thread_local! {
    /// Handles on one runtime's accounts that items dropped on this thread let go of, for the
    /// items made on this thread next (see [`Accounts::share`]).
    static SPARES: std::cell::RefCell<Vec<Arc<Accounts>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Accounts {
    /// A handle for a new item. Every item holds one (its drop needs the accounts), and a
    /// handle's clone and drop write its reference count, a line every thread writes: so an
    /// item takes a spare handle that an item dropped on this thread left, when there is one,
    /// and only clones otherwise (a shared write, counted: see `crate::sync`).
    #[inline]
    pub(crate) fn share(accounts: &Arc<Accounts>) -> Arc<Accounts> {
        let spare = SPARES
            .try_with(|spares| {
                let mut spares = spares.borrow_mut();
                match spares.last() {
                    Some(last) if Arc::ptr_eq(last, accounts) => spares.pop(),
                    _ => None,
                }
            })
            .ok()
            .flatten();
        spare.unwrap_or_else(|| {
            crate::sync::note_shared_writes(1);
            Arc::clone(accounts)
        })
    }

    /// A dropped item's handle, kept spare for the next item made on this thread, unless the
    /// thread has enough (then dropped: a shared write, counted). The spares are of one
    /// runtime at a time: another's replace them, so a thread keeps no stopped runtime's
    /// accounts alive but the last one's.
    #[inline]
    pub(crate) fn give_back(accounts: Arc<Accounts>) {
        let left = SPARES.try_with(move |spares| {
            let Ok(mut spares) = spares.try_borrow_mut() else {
                return Some(accounts);
            };
            if spares
                .first()
                .is_some_and(|first| !Arc::ptr_eq(first, &accounts))
            {
                spares.clear();
            }
            if spares.len() >= MAX_SPARES {
                return Some(accounts);
            }
            spares.push(accounts);
            None
        });
        if let Ok(Some(accounts)) = left {
            crate::sync::note_shared_writes(1);
            drop(accounts);
        }
    }
}
