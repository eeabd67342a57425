//! The retry-reappearance ratio: how many shed requests come back as retries within the
//! backoff window, the direct measure of whether shedding reduced demand or only relabelled it
//! (seed 000: "ratio of shed requests that reappear as retries within the backoff window").

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge};
use parking_lot::Mutex;
use triage::quanta::{Clock, Instant};
use triage::{Criticality, PerTier};

use crate::ReappearanceConfig;

/// Slices in the ring: the window is `SLICES - 1` of them, plus the one being filled.
const SLICES: usize = 5;

/// Remembers the ids of shed requests for a window and counts those that come back.
///
/// A time-sliced set: five slices of a quarter of the window each, the newest taking the ids
/// shed now; when the newest is a quarter-window old the oldest is cleared and reused. So an
/// id is remembered for between one and one and a quarter windows. Each slice holds at most
/// `max_ids / 5` ids; further sheds in a full slice are not tracked (counted in
/// [`ReappearanceStats::untracked`]), so memory is fixed at construction: five hash maps of
/// 64-bit id hashes and a tier, pre-allocated, `5 x 17 x next_pow2(ceil(max_ids / 5 x 8 / 7))`
/// bytes, about 1.4 MiB for the default 65,536 ids. Ids are hashed with a per-process random
/// key (SipHash), so a client cannot aim collisions; two ids colliding in 64 bits is
/// negligible.
///
/// A shed id counts once: when it reappears it is forgotten, and if it is shed again it is
/// remembered again. The ratio is thus `reappeared / shed` in `[0, 1]`, per tier of the shed
/// request.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::Criticality;
/// use triage_tower::{Reappearance, ReappearanceConfig};
///
/// let (clock, mock) = triage::quanta::Clock::mock();
/// let tracker = Reappearance::with_clock(ReappearanceConfig::default(), clock);
/// let id = tracker.hash(b"req-1");
/// tracker.shed(id, Criticality::Sheddable);
/// mock.increment(Duration::from_secs(2));
/// assert_eq!(tracker.arrived(id), Some(Criticality::Sheddable));
/// assert_eq!(tracker.arrived(id), None, "counted once");
/// let stats = tracker.stats();
/// assert_eq!(stats.ratio(Criticality::Sheddable), Some(1.0));
/// ```
pub struct Reappearance {
    state: Mutex<State>,
    slice: Duration,
    per_slice: usize,
    hasher: RandomState,
    clock: Clock,
    shed: [AtomicU64; 4],
    reappeared: [AtomicU64; 4],
    untracked: AtomicU64,
    metrics: Option<TrackerMetrics>,
}

struct TrackerMetrics {
    shed: [Counter; 4],
    reappeared: [Counter; 4],
    ratio: [Gauge; 4],
}

struct State {
    slices: [HashMap<u64, Criticality>; SLICES],
    /// Sheds and reappearances counted in each slice, by tier rank: the windowed ratio.
    counts: [[(u64, u64); 4]; SLICES],
    current: usize,
    started: Instant,
}

impl std::fmt::Debug for Reappearance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reappearance")
            .field("slice", &self.slice)
            .field("per_slice", &self.per_slice)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Counts since the tracker started, per tier of the shed request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReappearanceStats {
    /// Shed requests whose id was remembered.
    pub shed: PerTier<u64>,
    /// Of those, the ones whose id arrived again within the window.
    pub reappeared: PerTier<u64>,
    /// Shed requests with an id that was not remembered: the slice was full.
    pub untracked: u64,
}

impl ReappearanceStats {
    /// `reappeared / shed` for `tier`; `None` before anything of it was shed.
    pub fn ratio(&self, tier: Criticality) -> Option<f64> {
        let shed = self.shed[tier];
        (shed > 0).then(|| self.reappeared[tier] as f64 / shed as f64)
    }

    /// `reappeared / shed` over every tier; `None` before anything was shed.
    pub fn total_ratio(&self) -> Option<f64> {
        let shed: u64 = self.shed.iter().map(|(_, n)| n).sum();
        let back: u64 = self.reappeared.iter().map(|(_, n)| n).sum();
        (shed > 0).then(|| back as f64 / shed as f64)
    }
}

impl Reappearance {
    /// A tracker on the system clock, not reporting metrics.
    pub fn new(config: ReappearanceConfig) -> Self {
        Self::with_clock(config, Clock::new())
    }

    /// A tracker reading time from `clock`, not reporting metrics.
    pub fn with_clock(config: ReappearanceConfig, clock: Clock) -> Self {
        let per_slice = config.max_ids.get().div_ceil(SLICES).max(1);
        let started = clock.now();
        Reappearance {
            state: Mutex::new(State {
                slices: std::array::from_fn(|_| HashMap::with_capacity(per_slice)),
                counts: [[(0, 0); 4]; SLICES],
                current: 0,
                started,
            }),
            slice: (config.window / (SLICES as u32 - 1)).max(Duration::from_millis(1)),
            per_slice,
            hasher: RandomState::new(),
            clock,
            shed: Default::default(),
            reappeared: Default::default(),
            untracked: AtomicU64::new(0),
            metrics: None,
        }
    }

    /// Reports through the `metrics` facade: `triage_http_shed_tracked_total`,
    /// `triage_http_reappeared_total` and the windowed `triage_http_reappearance_ratio`, each
    /// by `tier`.
    pub(crate) fn with_metrics(mut self) -> Self {
        crate::metrics::describe();
        self.metrics = Some(TrackerMetrics {
            shed: crate::metrics::per_rank(
                |t| metrics::counter!(crate::metrics::SHED_TRACKED, "tier" => t.as_str()),
            ),
            reappeared: crate::metrics::per_rank(
                |t| metrics::counter!(crate::metrics::REAPPEARED, "tier" => t.as_str()),
            ),
            ratio: crate::metrics::per_rank(
                |t| metrics::gauge!(crate::metrics::REAPPEARANCE_RATIO, "tier" => t.as_str()),
            ),
        });
        self
    }

    /// The 64-bit key of an id (a request-id header's bytes, a client key).
    pub fn hash(&self, id: &[u8]) -> u64 {
        self.hasher.hash_one(id)
    }

    /// Rotates the ring to `now`: clears the slices that fell out of the window.
    fn rotate(&self, st: &mut State, now: Instant) {
        let elapsed = now.saturating_duration_since(st.started);
        if elapsed < self.slice {
            return;
        }
        let steps = (elapsed.as_nanos() / self.slice.as_nanos()).min(SLICES as u128) as usize;
        for _ in 0..steps {
            st.current = (st.current + 1) % SLICES;
            st.slices[st.current].clear();
            st.counts[st.current] = [(0, 0); 4];
        }
        st.started = if steps == SLICES {
            now
        } else {
            st.started + self.slice * steps as u32
        };
        if let Some(m) = &self.metrics {
            for tier in Criticality::ALL {
                let (shed, back) = st.counts.iter().fold((0u64, 0u64), |(s, b), c| {
                    (s + c[tier.rank()].0, b + c[tier.rank()].1)
                });
                if shed > 0 {
                    m.ratio[tier.rank()].set(back as f64 / shed as f64);
                }
            }
        }
    }

    /// Remembers that the request with id hash `id` was shed in `tier`.
    pub fn shed(&self, id: u64, tier: Criticality) {
        let now = self.clock.now();
        let mut st = self.state.lock();
        self.rotate(&mut st, now);
        let current = st.current;
        let slice = &mut st.slices[current];
        if slice.len() >= self.per_slice && !slice.contains_key(&id) {
            drop(st);
            self.untracked.fetch_add(1, Ordering::Relaxed);
            return;
        }
        slice.insert(id, tier);
        st.counts[current][tier.rank()].0 += 1;
        drop(st);
        self.shed[tier.rank()].fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.shed[tier.rank()].increment(1);
        }
    }

    /// A request with id hash `id` arrived: if it was shed within the window, forgets it and
    /// returns the tier it was shed in (a reappearance, counted).
    pub fn arrived(&self, id: u64) -> Option<Criticality> {
        let now = self.clock.now();
        let mut st = self.state.lock();
        self.rotate(&mut st, now);
        let mut found = None;
        for slice in st.slices.iter_mut() {
            if let Some(tier) = slice.remove(&id) {
                found = Some(tier);
            }
        }
        let tier = found?;
        let current = st.current;
        st.counts[current][tier.rank()].1 += 1;
        drop(st);
        self.reappeared[tier.rank()].fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.reappeared[tier.rank()].increment(1);
        }
        Some(tier)
    }

    /// The counts since the tracker started.
    pub fn stats(&self) -> ReappearanceStats {
        let load = |a: &[AtomicU64; 4]| PerTier::from_fn(|t| a[t.rank()].load(Ordering::Relaxed));
        ReappearanceStats {
            shed: load(&self.shed),
            reappeared: load(&self.reappeared),
            untracked: self.untracked.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    fn tracker(
        window_s: u64,
        max_ids: usize,
    ) -> (Reappearance, std::sync::Arc<triage::quanta::Mock>) {
        let (clock, mock) = Clock::mock();
        let config = ReappearanceConfig {
            window: Duration::from_secs(window_s),
            max_ids: NonZeroUsize::new(max_ids).unwrap(),
        };
        (Reappearance::with_clock(config, clock), mock)
    }

    #[test]
    fn remembered_for_the_window_then_forgotten() {
        let (t, mock) = tracker(8, 1_000);
        let a = t.hash(b"a");
        let b = t.hash(b"b");
        t.shed(a, Criticality::High);
        t.shed(b, Criticality::Sheddable);
        // Just inside the window: still remembered.
        mock.increment(Duration::from_millis(7_900));
        assert_eq!(t.arrived(a), Some(Criticality::High));
        // Past one and a quarter windows: forgotten.
        mock.increment(Duration::from_millis(2_200));
        assert_eq!(t.arrived(b), None);
        let s = t.stats();
        assert_eq!(s.shed[Criticality::High], 1);
        assert_eq!(s.reappeared[Criticality::High], 1);
        assert_eq!(s.ratio(Criticality::Sheddable), Some(0.0));
        assert_eq!(s.total_ratio(), Some(0.5));
        assert_eq!(s.ratio(Criticality::Critical), None);
    }

    #[test]
    fn bounded_and_counts_what_it_cannot_hold() {
        let (t, mock) = tracker(4, 20);
        // 4 per slice: the fifth shed in the same slice is not remembered.
        for i in 0..5u64 {
            t.shed(i, Criticality::Medium);
        }
        assert_eq!(t.stats().untracked, 1);
        assert_eq!(t.stats().shed[Criticality::Medium], 4);
        // The next slice has room again.
        mock.increment(Duration::from_secs(1));
        t.shed(99, Criticality::Medium);
        assert_eq!(t.stats().untracked, 1);
        assert_eq!(t.arrived(99), Some(Criticality::Medium));
        assert_eq!(t.arrived(4), None, "never remembered");
        assert_eq!(t.arrived(0), Some(Criticality::Medium));
        // A long silence clears everything at once.
        mock.increment(Duration::from_secs(3_600));
        assert_eq!(t.arrived(1), None);
    }

    #[test]
    fn shed_again_counts_again() {
        let (t, mock) = tracker(10, 100);
        let id = t.hash(b"retrying");
        for _ in 0..3 {
            t.shed(id, Criticality::Critical);
            mock.increment(Duration::from_millis(500));
            assert_eq!(t.arrived(id), Some(Criticality::Critical));
        }
        let s = t.stats();
        assert_eq!(
            (
                s.shed[Criticality::Critical],
                s.reappeared[Criticality::Critical]
            ),
            (3, 3)
        );
    }
}
