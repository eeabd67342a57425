//! What can be read of the queue: its admission decision, its length and depths, its ages,
//! its counters and configuration. The lengths, the shed level and the pop count are read
//! without the lock (published by each change); the others take it.

use std::time::Duration;

use quanta::Clock;

use super::WfqQueue;
use crate::admission::admits_at;
use crate::loom::Ordering;
use crate::queue::{QueueStats, TierMask, WfqConfig};
use crate::{Criticality, PerTier};

impl<T> WfqQueue<T> {
    /// Whether a push of `tier` would pass queue-age admission right now: one atomic load.
    /// Check it before doing anything expensive for a message (deserialising, classifying by
    /// payload), so refusing stays cheap.
    #[inline]
    pub fn admits(&self, tier: Criticality) -> bool {
        admits_at(self.shed_level.load(Ordering::Relaxed), tier)
    }

    /// Queue-age admission's shed level: tiers with `rank() < level` are refused (0 admits
    /// everything, 4 refuses everything).
    pub fn shed_level(&self) -> u8 {
        self.shed_level.load(Ordering::Relaxed).min(4)
    }

    /// Items held, across tiers. Read without the lock, so possibly a moment stale.
    #[inline]
    pub fn len(&self) -> usize {
        self.published.len()
    }

    /// Whether nothing is held. Read without the lock.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most items held, from the current configuration.
    pub fn capacity(&self) -> usize {
        self.state.lock().config.capacity.get()
    }

    /// The current configuration.
    pub fn config(&self) -> WfqConfig {
        self.state.lock().config.clone()
    }

    /// Items held per tier.
    pub fn depths(&self) -> PerTier<usize> {
        let [s, m, h, c] = self.state.lock().core.depths();
        PerTier::new(c, h, m, s)
    }

    /// The queue age each tier sees now: the wait of the oldest item at that tier or above
    /// (zero when none waits). The global queue age is `ages().sheddable`.
    pub fn ages(&self) -> PerTier<Duration> {
        let st = self.state.lock();
        // Precise, as `refresh_admission`: read by periodic reporters.
        let [s, m, h, c] = st.core.ages(self.clock.now());
        PerTier::new(c, h, m, s)
    }

    /// Age of the oldest item held, any tier (zero when empty).
    pub fn queue_age(&self) -> Duration {
        self.ages().sheddable
    }

    /// A snapshot of the counters per tier.
    pub fn stats(&self) -> QueueStats {
        let st = self.state.lock();
        let overloaded = [0, 1, 2, 3].map(|r| self.overloaded[r].load(Ordering::Relaxed));
        st.core.stats(self.shed_level(), overloaded)
    }

    /// The clock the queue reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Whether a push of `tier` would, as the queue was last published, find it full by count
    /// with nothing of a lower tier to evict: two relaxed loads, no lock. A hint, not a
    /// promise: it may be stale either way, and it ignores expired items a push would discard
    /// and the byte budget. For a holder of refused items deciding whether an offer is worth
    /// its lock (`runtime::gate`: a pulled message that would wait for room anyway).
    pub(crate) fn looks_full_for(&self, tier: Criticality) -> bool {
        let below = (1u8 << tier.rank()) - 1;
        let (len, backlog) = self.published.len_and_backlog();
        len >= self.capacity_hint.load(Ordering::Relaxed) && backlog & below == 0
    }

    /// Items taken out by pops so far (served or expired), read without the lock.
    pub(crate) fn pop_count(&self) -> u64 {
        self.published.pops.load(Ordering::Relaxed)
    }

    /// The tiers holding items now.
    pub(crate) fn backlog(&self) -> TierMask {
        TierMask(self.state.lock().core.backlogged())
    }
}
