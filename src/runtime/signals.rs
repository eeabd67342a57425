//! The signals the runtime measures per message, for the sampler (`sampler.rs`) to read on its
//! tick, and what the sampler concludes from them for the gate and the deferral part to read:
//! the shed level, how long shedding has lasted, how long the backlog takes to clear.

use crate::sync::{AtomicBool, AtomicI64, AtomicU16, AtomicU64, Count, Ordering, PerThread};
use std::sync::Arc;
use std::time::Duration;

use crate::admission::{CohortSet, COHORTS, PARTIAL_TIERS};

/// Measured per message, concluded per tick.
#[derive(Default)]
pub(crate) struct Signals {
    /// Pull-based admission's shed level (high byte: pulled messages of tiers with
    /// `rank() < level` are refused) and the cohorts of the highest refused tier admitted all
    /// the same (low byte, `0..=COHORTS`), in one word so the gate reads a consistent pair.
    /// Written by the sampler.
    shed: AtomicU16,
    /// Which cohorts of the highest refused tier are admitted (a `CohortSet` in two words,
    /// low cohorts first), written by the sampler just before `shed`. A message judged
    /// while a tick's update is under way may see one tick's set with the other's level:
    /// one decision at the edge of a tick, either way.
    cohort_set: [AtomicU64; 2],
    /// When pull admission's level last rose from 0 (ns since the runtime's origin;
    /// `u64::MAX` while it is 0): how long the current shedding episode has lasted. Written by
    /// the sampler.
    pub(crate) shedding_since_ns: AtomicU64,
    /// The time the work ahead (the sources' lag, and the messages queued and held) takes to
    /// clear at the estimated capacity, in ns (0: none, or no estimate yet). Written by the
    /// sampler: while a backlog lasts the workers have no room, and the drains are pulled only
    /// into room.
    pub(crate) backlog_clear_ns: AtomicU64,
    /// How many messages the intake may hold queued and parked behind busy keys while not
    /// overloaded, derived from the measured capacity and deadline slack (0: not derived).
    /// Written by the sampler.
    pub(crate) lookahead: AtomicU64,
    /// How many messages the intake may hold queued while not overloaded, when more than the
    /// prefetch: the look-ahead, at most half the queue's capacity (0: not derived). Written
    /// by the sampler.
    pub(crate) pull_ahead: AtomicU64,
    /// What every message adds to, one copy per thread (see `crate::sync`), summed by the
    /// sampler.
    pub(crate) measured: PerThread<Measured>,
    /// Each non-drain source's lag, written by its intake (`u64::MAX`: unknown).
    pub(crate) lags: parking_lot::Mutex<Vec<Arc<AtomicU64>>>,
    /// Messages held by backpressure (by the intakes and by hold tasks).
    pub(crate) held: AtomicI64,
    /// Whether anything was ever offered with `try_submit` (queue-age admission then counts
    /// in the load level).
    pub(crate) pushed_seen: AtomicBool,
}

/// One thread's copy of [`Signals::measured`].
#[derive(Default)]
pub(crate) struct Measured {
    /// Messages pulled from non-drain sources, per tier rank: the arrival mix (a wrapping
    /// count: a message taken back is counted out on whichever thread).
    pub(crate) pulled: [Count; 4],
    /// Of those, the ones with a deadline, and the sum of their deadline slack at intake in µs
    /// (each at most `u32::MAX`), per tier rank: what pull-based admission predicts deadline
    /// misses from.
    pub(crate) pulled_with_deadline: [Count; 4],
    pub(crate) slack_us: [Count; 4],
    /// Messages pulled from non-drain sources per cohort of each tier that can be admitted
    /// in part (a wrapping count, as `pulled`): which cohorts carry the capacity left.
    pub(crate) cohort_pulled: CohortCounts,
    /// Handler runs finished, and their summed run time in ns: the capacity estimate.
    pub(crate) served: Count,
    pub(crate) busy_ns: Count,
    /// The longest handler run seen per tier (rank), ns, the largest of the copies: how long
    /// a job of that tier may hold a worker (see the queue's deadline-ordered service).
    pub(crate) longest_run_ns: [Count; 4],
    /// When each tier (rank) last had an item queued, ns since the runtime's origin (0: never):
    /// the latest of the copies.
    pub(crate) last_work_ns: [Count; 4],
}

/// Pulls per cohort of each tier that can be admitted in part (rank, then cohort).
pub(crate) struct CohortCounts(pub(crate) [[Count; COHORTS as usize]; PARTIAL_TIERS]);

impl Default for CohortCounts {
    fn default() -> Self {
        CohortCounts(std::array::from_fn(|_| {
            std::array::from_fn(|_| Count::default())
        }))
    }
}

impl CohortCounts {
    /// Counts one pulled message of tier `rank` in `cohort` (`n` = 1) or one taken back
    /// (`n` = `u64::MAX`, wrapping): nothing for Critical, never admitted in part.
    #[inline]
    pub(crate) fn add(&self, rank: usize, cohort: u8, n: u64) {
        if let Some(count) = self
            .0
            .get(rank)
            .and_then(|tier| tier.get(usize::from(cohort)))
        {
            count.add(n, Ordering::Relaxed);
        }
    }
}

impl Signals {
    pub(crate) fn new() -> Self {
        Signals {
            shedding_since_ns: AtomicU64::new(u64::MAX),
            ..Signals::default()
        }
    }

    /// Pull-based admission's shed level (0: nothing shed).
    #[inline]
    pub(crate) fn shed_level(&self) -> u8 {
        self.shed().0
    }

    /// Pull-based admission's shed level and the cohorts of the highest refused tier it
    /// admits (see `admission::cohort`).
    #[inline]
    pub(crate) fn shed(&self) -> (u8, u8) {
        let v = self.shed.load(Ordering::Relaxed);
        ((v >> 8) as u8, v as u8)
    }

    /// The cohorts of the highest refused tier admitted (see `admission::cohort_arrival`).
    #[inline]
    pub(crate) fn cohort_set(&self) -> CohortSet {
        CohortSet::from_words([
            self.cohort_set[0].load(Ordering::Relaxed),
            self.cohort_set[1].load(Ordering::Relaxed),
        ])
    }

    /// Stores a new shed level and admitted cohorts; returns the previous level.
    pub(crate) fn set_shed(&self, level: u8, cohorts: CohortSet) -> u8 {
        for (slot, word) in self.cohort_set.iter().zip(cohorts.to_words()) {
            if slot.load(Ordering::Relaxed) != word {
                slot.store(word, Ordering::Relaxed);
            }
        }
        let v = (u16::from(level) << 8) | u16::from(cohorts.len());
        (self.shed.swap(v, Ordering::Relaxed) >> 8) as u8
    }

    /// Messages held by backpressure now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed).max(0) as u64
    }

    /// The mean handler run so far (busy time over calls), at most one second; zero before the
    /// first call.
    pub(crate) fn mean_service(&self) -> Duration {
        let served = self.measured.sum(|m| &m.served);
        if served == 0 {
            return Duration::ZERO;
        }
        let busy = self.measured.sum(|m| &m.busy_ns);
        Duration::from_nanos(busy / served).min(Duration::from_secs(1))
    }

    /// The sum of the non-drain sources' lags; `None` if any is unknown.
    pub(crate) fn lag(&self) -> Option<u64> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_service_is_busy_time_over_calls_at_most_a_second() {
        let s = Signals::new();
        assert_eq!(s.mean_service(), Duration::ZERO);
        let m = s.measured.local();
        m.served.set(4);
        m.busy_ns.set(4_000_000);
        assert_eq!(s.mean_service(), Duration::from_millis(1));
        m.busy_ns.set(40_000_000_000);
        assert_eq!(s.mean_service(), Duration::from_secs(1));
    }

    #[test]
    fn the_lag_is_the_sum_or_unknown_if_any_source_cannot_tell() {
        let s = Signals::new();
        assert_eq!(s.lag(), Some(0));
        let a = Arc::new(AtomicU64::new(5));
        let b = Arc::new(AtomicU64::new(7));
        s.lags.lock().extend([Arc::clone(&a), Arc::clone(&b)]);
        assert_eq!(s.lag(), Some(12));
        b.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(s.lag(), None);
    }

    #[test]
    fn nothing_is_shed_and_no_episode_runs_at_start() {
        let s = Signals::new();
        assert_eq!(s.shed_level(), 0);
        assert_eq!(s.shedding_since_ns.load(Ordering::Relaxed), u64::MAX);
        assert_eq!(s.held(), 0);
    }
}
