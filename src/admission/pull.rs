//! Pull-based admission: the shed level a consumer derives from arrival against capacity.

use std::collections::VecDeque;
use std::time::Duration;

use crate::admission::cohort_arrival::CohortArrival;
use crate::admission::{CohortPulls, CohortSet, PullAdmissionConfig};
use crate::Criticality;

/// One reading of a runtime's cumulative counters, taken every `tick_ms`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PullSample {
    /// When it was taken, as time since any fixed origin (monotonic).
    pub at: Duration,
    /// Messages waiting in the brokers for the attached sources (drains excluded), a count;
    /// `None` when any source cannot tell.
    pub lag: Option<u64>,
    /// Messages pulled from the attached sources (drains excluded) since start, per tier,
    /// indexed by [`Criticality::rank`].
    pub pulled: [u64; 4],
    /// Handler runs finished since start (any outcome).
    pub served: u64,
    /// Sum of the handler run times since start.
    pub busy: Duration,
    /// The concurrency limit now, in handlers.
    pub limit: usize,
    /// Messages pulled and waiting inside the runtime now (queued, or held under
    /// backpressure), a count: work ahead of whatever is pulled next.
    pub waiting: u64,
    /// Messages pulled with a deadline since start (drains excluded), per tier, indexed by
    /// [`Criticality::rank`]: the messages summed in `slack`.
    pub with_deadline: [u64; 4],
    /// Sum of the deadline slack at intake of those messages since start, per tier: for each,
    /// its deadline minus the moment it was pulled (zero for one already past it).
    pub slack: [Duration; 4],
}

/// Decides which tiers a pull-based consumer refuses, from the arrival rate it infers from the
/// broker's lag, the service capacity it measures and the deadline slack its messages arrive
/// with.
///
/// # Why not queue age
///
/// The seeds measure overload by queue age, which in a service that is pushed to is the wait of
/// the people at the door. A consumer pulls: the broker is the buffer, and the age of the
/// runtime's own queue says how eagerly the intake pulled, not whether the worker is
/// overloaded. After a deploy with lag, every consumer has a backlog; serving it in order is
/// right, deferring it doubles broker I/O and demotes work for nothing.
///
/// # A backlog is not an overload
///
/// Overload, in `DESIGN.md`'s words, is *arrival beyond capacity, or work that would miss its
/// deadline*. A tier is refused only on evidence of the first that the second confirms, in
/// these terms:
///
/// - **Arrival rate** `A` = rate of pulling + trend of the lag (`d lag / dt`), over a sliding
///   window (`window_ms`): the lower of the estimates over its two halves, so a step in the
///   lag that is not arrival (a source's first measurement, partitions assigned in a
///   rebalance) lands in one half only. A backlog being served has a falling lag: `A` is the
///   rate of new records only, whatever the backlog's size. Each tier's share of `A` comes
///   from what was pulled; a tier that is not pulled because it is shed and paused (a topic
///   per tier) keeps its last measured rate, and its arrival still shows in the lag. Over a
///   span where a source had not measured its lag (or cannot), the arrival is unknown and
///   taken as none: pulls alone show how fast the runtime reads, not how fast work arrives.
/// - **Capacity** `C` = concurrency limit / mean handler run time over the same window: the
///   completions per second the workers could sustain (Little's law), measured even when they
///   are not saturated.
/// - **Rate excess**: the arrival of the tiers admitted now exceeds `overload_ratio × C`
///   (default 1.05). Necessary for any refusal, never sufficient: over one second, arrival
///   that reaches the broker in bursts (a producer or a broker that stalls, then catches up:
///   common on a loaded machine) and a capacity that dips for a moment (a worker descheduled)
///   both look like it, at 0.8x and at 1x.
/// - **Predicted deadline miss**: the *sojourn* the next messages face is the time to clear
///   the work ahead of them at capacity, `wait = (lag × admitted share + waiting) / C`. The
///   *deadline slack* the lowest admitted tier arrives with is measured at intake (mean of
///   deadline − moment of pulling, over the window, for that tier's messages with a deadline;
///   the last measured value while none are pulled). A miss is predicted when
///   `wait > slack`: the backlog would not clear before that tier's messages run out of time.
///   The comparison is deliberately early (the slack at intake already lost the broker wait
///   of the messages pulled so far, and `wait` counts the whole backlog again): at a steady
///   lag `L` it fires once `2 L / C` exceeds the tier's window, so the refusal comes while
///   the more important tiers behind still have time. A tier with no deadline predicts no
///   miss.
/// - **Sustained excess**: the rate excess holds over the longer window too (`sustained_ms`,
///   default 3 s, arrival and capacity both measured over it) and the backlog (`lag +
///   waiting`) grew over it by at least `(overload_ratio − 1) × C` per second. Bursts average
///   out over it; a worker at 1x whose lag stays flat is not overloaded whatever its
///   capacity estimate does; sustained arrival beyond capacity is overload even with no
///   deadline to miss (Critical's and High's records, with the Kafka source's default
///   windows, have none or hours).
/// - **Shed level**: on a rate excess confirmed by a predicted miss or by sustained excess,
///   the highest tiers whose combined arrival fits `headroom × C` (default 0.95) stay
///   admitted and the rest are refused, from Sheddable up: a bottom prefix of the ladder, as
///   with queue age. Critical is never refused by this rule. Of the highest refused tier,
///   the cohorts (slices of its users, see [`admitted_set`](Self::admitted_set)) whose
///   measured arrival fits the capacity left are admitted, re-evaluated every tick: the
///   excess is refused, no more, and always from the same users.
/// - **Recovery** is bottom-up: the level falls to the lowest level at which the admitted
///   arrival fits `headroom × C`, or fits `overload_ratio × C` over both windows with no
///   miss predicted for its lowest tier, once that has held for `recover_ms`. The gap between
///   the two ratios is the hysteresis while deadlines are at stake; when they are not (a
///   worker offered exactly its capacity whose lag stays small), a level raised by a moment's
///   dip in capacity comes down after `recover_ms` instead of latching for as long as arrival
///   stays above `headroom × C`.
///
/// What a refused tier's messages then become is its refusal policy's business (defer, drop or
/// backpressure): deferral moves them out of the way so that more important work behind them
/// in the same partition or queue is reached in time (a predicted miss), or absorbs sustained
/// arrival beyond capacity. What is past its deadline is expired at intake by the runtime,
/// for free, whatever the level.
///
/// # Limits
///
/// A burst whose backlog does not clear inside the lowest admitted tier's slack is refused
/// while it lasts, even at 0.8x: with Sheddable's window at 400 ms, a stall of half a second
/// at 1x (a backlog of about 0.5 s of work) predicts a miss and defers the Sheddable records
/// of the catch-up, and those records would have expired at intake if served in order. The
/// mean slack is measured over `window_ms`, so a tier whose window suddenly shortens is seen
/// a window late. Records without a deadline are refused only on sustained excess, at
/// earliest half a `window_ms` after it starts.
///
/// The state machine is clock-free: feed it [`PullSample`]s.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::admission::{PullAdmission, PullAdmissionConfig, PullSample};
/// use triage::Criticality;
///
/// let mut admission = PullAdmission::new(&PullAdmissionConfig::default());
/// let ms = Duration::from_millis;
/// // Eight handlers of 10 ms: capacity 800/s. Records arrive at 2,400/s (mix 10/20/30/40 %),
/// // the worker pulls 800/s and the lag grows by 1,600/s: sustained arrival beyond capacity.
/// let mut s = PullSample { limit: 8, lag: Some(0), ..PullSample::default() };
/// for tick in 1..=10u64 {
///     s.at = ms(100 * tick);
///     s.pulled = [32 * tick, 24 * tick, 16 * tick, 8 * tick]; // by rank: Sheddable first
///     s.served = 80 * tick;
///     s.busy = ms(800 * tick);
///     s.lag = Some(160 * tick);
///     admission.observe(&s);
/// }
/// // Critical (240/s) and High (480/s) fit in 0.95 × 800; Medium and Sheddable are refused.
/// assert!(admission.admits(Criticality::High));
/// assert!(!admission.admits(Criticality::Medium));
///
/// // A backlog with no arrivals: pulling at capacity while the lag falls.
/// let mut backlog = PullAdmission::new(&PullAdmissionConfig::default());
/// let mut s = PullSample { limit: 8, lag: Some(20_000), ..PullSample::default() };
/// for tick in 1..=10u64 {
///     s.at = ms(100 * tick);
///     s.pulled = [0, 80 * tick, 0, 0];
///     s.served = 80 * tick;
///     s.busy = ms(100 * tick);
///     s.lag = Some(20_000 - 80 * tick);
///     backlog.observe(&s);
/// }
/// assert_eq!(backlog.level(), 0);
/// ```
#[derive(Clone, Debug)]
pub struct PullAdmission {
    config: PullAdmissionConfig,
    samples: VecDeque<PullSample>,
    /// Per-tier arrival rates, messages/s, indexed by rank.
    rates: [f64; 4],
    /// Arrival over `window_ms` (the lower half-window estimate), messages/s.
    arrival: f64,
    /// Arrival over `sustained_ms`, messages/s.
    arrival_sustained: f64,
    capacity: Option<f64>,
    /// Capacity over `sustained_ms`, messages/s.
    capacity_sustained: Option<f64>,
    /// Whether the backlog grew over `sustained_ms` at least as fast as a rate excess would.
    growing: bool,
    /// Mean deadline slack at intake per tier, seconds (`None`: no message with a deadline
    /// pulled yet).
    slack: [Option<f64>; 4],
    /// The work ahead of the next pulled message, messages: the lag and what the runtime holds.
    lag: f64,
    waiting: f64,
    level: u8,
    /// Cohorts of the highest refused tier admitted (none at level 0), and the level they
    /// were chosen at.
    cohorts: CohortSet,
    cohorts_level: u8,
    /// Each partly admissible tier's pulls per cohort, over the longer window.
    cohort_arrival: CohortArrival,
    /// Since when the level has been allowed to fall.
    fitting_since: Option<Duration>,
}

impl PullAdmission {
    /// A state machine with every tier admitted. The config is taken as given; call
    /// [`PullAdmissionConfig::validate`] first.
    pub fn new(config: &PullAdmissionConfig) -> Self {
        PullAdmission {
            config: config.clone(),
            samples: VecDeque::new(),
            rates: [0.0; 4],
            arrival: 0.0,
            arrival_sustained: 0.0,
            capacity: None,
            capacity_sustained: None,
            growing: false,
            slack: [None; 4],
            lag: 0.0,
            waiting: 0.0,
            level: 0,
            cohorts: CohortSet::default(),
            cohorts_level: 0,
            cohort_arrival: CohortArrival::default(),
            fitting_since: None,
        }
    }

    /// Applies new settings; the current level is kept and re-evaluated on the next sample.
    pub fn reconfigure(&mut self, config: &PullAdmissionConfig) {
        self.config = config.clone();
        if !config.enabled {
            self.level = 0;
            self.cohorts = CohortSet::default();
        }
    }

    /// Feeds what the runtime pulled per cohort of each tier that can be admitted in part,
    /// cumulative since start, read at `at` (the instant of the [`PullSample`] fed next with
    /// [`observe`](Self::observe)). Without it, the cohorts admitted of the highest refused
    /// tier are its first `share × COHORTS`, as if its users were spread evenly over them;
    /// with it, those whose measured arrival fits the capacity left (see
    /// [`admitted_set`](Self::admitted_set)).
    pub fn observe_cohorts(&mut self, at: Duration, pulled: &CohortPulls) {
        let span = Duration::from_millis(self.config.window_ms.max(self.config.sustained_ms));
        // What was admitted since the last reading: the level and cohorts chosen then.
        let (level, cohorts) = (usize::from(self.level), self.cohorts);
        self.cohort_arrival
            .record(at, pulled, span, |rank, cohort| {
                rank >= level || (rank + 1 == level && cohorts.contains(cohort))
            });
    }

    /// The newest kept sample at least `span` older than `now`, else the oldest kept.
    fn start_of(&self, now: Duration, span: Duration) -> Option<PullSample> {
        self.samples
            .iter()
            .rev()
            .find(|s| now.saturating_sub(s.at) >= span)
            .or_else(|| self.samples.front())
            .copied()
    }

    /// Feeds a sample and returns the new shed level (tiers with `rank() < level` are refused).
    pub fn observe(&mut self, sample: &PullSample) -> u8 {
        let window = Duration::from_millis(self.config.window_ms);
        let long = window.max(Duration::from_millis(self.config.sustained_ms));
        self.samples.push_back(*sample);
        // Keep the newest sample at least `long` old, so both windows are always covered.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|s| sample.at.saturating_sub(s.at) >= long)
        {
            self.samples.pop_front();
        }
        let (Some(first), Some(oldest)) = (
            self.start_of(sample.at, window),
            self.start_of(sample.at, long),
        ) else {
            return self.level;
        };
        let dt = sample.at.saturating_sub(first.at).as_secs_f64();
        if dt <= 0.0 || self.samples.len() < 2 {
            return self.level;
        }
        for rank in 0..4 {
            let d = sample.pulled[rank].saturating_sub(first.pulled[rank]) as f64;
            // A shed tier that is not pulled at all (its topic paused) keeps its last rate.
            let paused = rank < self.level as usize && d == 0.0;
            if !paused {
                self.rates[rank] = d / dt;
            }
            // Likewise its slack: the last measured, until its messages are pulled again.
            let timed = sample.with_deadline[rank].saturating_sub(first.with_deadline[rank]);
            if timed > 0 {
                let sum = sample.slack[rank].saturating_sub(first.slack[rank]);
                self.slack[rank] = Some(sum.as_secs_f64() / timed as f64);
            }
        }
        let mid_at = first.at + (sample.at - first.at) / 2;
        let mid = self
            .samples
            .iter()
            .find(|s| s.at >= mid_at)
            .copied()
            .unwrap_or(*sample);
        self.arrival = match (arrival(&first, &mid), arrival(&mid, sample)) {
            (Some(a), Some(b)) => a.min(b),
            _ => arrival(&first, sample).unwrap_or(0.0),
        };
        self.arrival_sustained = arrival(&oldest, sample).unwrap_or(0.0);
        if let Some(c) = capacity(&first, sample) {
            self.capacity = Some(c);
        }
        if let Some(c) = capacity(&oldest, sample) {
            self.capacity_sustained = Some(c);
        }
        self.lag = sample.lag.unwrap_or(0) as f64;
        self.waiting = sample.waiting as f64;
        if !self.config.enabled {
            self.level = 0;
            self.cohorts = CohortSet::default();
            return 0;
        }
        let Some(capacity) = self.capacity else {
            return self.level;
        };
        let backlog = |s: &PullSample| s.lag.unwrap_or(0) as f64 + s.waiting as f64;
        let long_dt = sample.at.saturating_sub(oldest.at).as_secs_f64();
        let excess_rate = (self.config.overload_ratio - 1.0) * capacity;
        self.growing = long_dt > 0.0 && backlog(sample) - backlog(&oldest) >= excess_rate * long_dt;
        // The level whose admitted tiers fit `headroom × capacity`: where a raise goes. A raise
        // needs the tiers admitted now to exceed `overload_ratio × capacity`, confirmed by a
        // predicted miss or by sustained excess; a tier re-admitted fits `headroom ×` it (or
        // `overload_ratio ×` it with nothing at stake), so the two do not chase each other.
        let target = self.fitting_level(capacity * self.config.headroom);
        let admitted = self.arrival * self.admitted_share(self.level);
        // Raise only on a window at least half covered: two samples 100 ms apart say little.
        let covered = dt * 2.0 >= window.as_secs_f64();
        let excess = covered && admitted > capacity * self.config.overload_ratio;
        let confirmed = self.misses(self.level, capacity) || self.sustained(self.level);
        let relief = self.relief_level(capacity);
        if excess && confirmed && target > self.level {
            self.level = target;
            self.fitting_since = None;
        } else if relief < self.level {
            let since = *self.fitting_since.get_or_insert(sample.at);
            if sample.at.saturating_sub(since) >= Duration::from_millis(self.config.recover_ms) {
                self.level = relief;
                self.fitting_since = None;
            }
        } else {
            self.fitting_since = None;
        }
        self.cohorts = self.partial(capacity);
        self.cohorts_level = self.level;
        self.level
    }

    /// The cohorts of the highest refused tier whose measured arrival fits the capacity the
    /// admitted tiers leave within `headroom ×` capacity: that tier's share of the excess is
    /// refused, no more (see `cohort_arrival.rs`). The cohorts admitted at this level stay
    /// while they carry the capacity left within half the headroom's margin, so that noise in
    /// the estimate does not move the users at the edge in and out.
    fn partial(&self, capacity: f64) -> CohortSet {
        let Some(boundary) = (self.level as usize).checked_sub(1) else {
            return CohortSet::default();
        };
        let total: f64 = self.rates.iter().sum();
        let own = self.arrival * self.rates[boundary] / total;
        if total <= 0.0 || own <= 0.0 {
            return CohortSet::default();
        }
        let left = capacity * self.config.headroom - self.arrival * self.admitted_share(self.level);
        // Half the headroom's margin, messages/s.
        let band = capacity * (1.0 - self.config.headroom) / 2.0;
        let current = (self.cohorts_level == self.level).then_some(self.cohorts);
        if self.config.derive_bounds {
            if let Some(set) = self
                .cohort_arrival
                .choose_measured(boundary, own, left, band, current)
            {
                return set;
            }
        }
        self.cohort_arrival
            .choose(boundary, left / own, band / own, current)
    }

    /// The share of the arrival of the tiers admitted at `level` (1.0 at level 0).
    fn admitted_share(&self, level: u8) -> f64 {
        let total: f64 = self.rates.iter().sum();
        if total <= 0.0 {
            return 1.0;
        }
        self.rates[level as usize..].iter().sum::<f64>() / total
    }

    /// The time to clear the work ahead of the next pulled message of the tiers admitted at
    /// `level`, at `capacity`, in seconds.
    fn wait_at(&self, level: u8, capacity: f64) -> f64 {
        (self.lag * self.admitted_share(level) + self.waiting) / capacity.max(f64::MIN_POSITIVE)
    }

    /// Whether, at `level`, the lowest admitted tier is predicted to miss its deadlines: the
    /// work ahead takes longer to clear than the slack its messages arrive with.
    fn misses(&self, level: u8, capacity: f64) -> bool {
        let Some(slack) = self.slack.get(level as usize).copied().flatten() else {
            return false;
        };
        self.wait_at(level, capacity) > slack
    }

    /// Whether the arrival of the tiers admitted at `level` exceeds `overload_ratio ×`
    /// capacity over `sustained_ms`, with the backlog growing.
    fn sustained(&self, level: u8) -> bool {
        let Some(capacity) = self.capacity_sustained else {
            return false;
        };
        self.growing
            && self.arrival_sustained * self.admitted_share(level)
                > capacity * self.config.overload_ratio
    }

    /// The lowest level below the current one that may be recovered to: its admitted arrival
    /// fits `headroom × capacity`, or fits `overload_ratio ×` capacity over both windows with no
    /// miss predicted. The current level when none.
    fn relief_level(&self, capacity: f64) -> u8 {
        let ratio = self.config.overload_ratio;
        let sustained_capacity = self.capacity_sustained.unwrap_or(capacity);
        (0..self.level)
            .find(|&level| {
                let share = self.admitted_share(level);
                let admitted = self.arrival * share;
                admitted <= capacity * self.config.headroom
                    || (admitted <= capacity * ratio
                        && self.arrival_sustained * share <= sustained_capacity * ratio
                        && !self.misses(level, capacity))
            })
            .unwrap_or(self.level)
    }

    /// The smallest shed level (0..=3) whose admitted tiers' arrival fits `budget` messages/s;
    /// 3 (Critical only) when even that does not fit.
    fn fitting_level(&self, budget: f64) -> u8 {
        let total: f64 = self.rates.iter().sum();
        if total <= 0.0 {
            return 0;
        }
        let mut admitted = 1.0;
        for level in 0..3u8 {
            if self.arrival * admitted <= budget {
                return level;
            }
            admitted -= self.rates[level as usize] / total;
        }
        3
    }

    /// The current shed level: tiers with `rank() < level` are refused (0 admits everything;
    /// never above 3, Critical is never refused).
    pub fn level(&self) -> u8 {
        self.level
    }

    /// Whether `tier` is admitted whole at the current level (its cohorts aside).
    pub fn admits(&self, tier: Criticality) -> bool {
        tier.rank() >= self.level as usize
    }

    /// How many cohorts (`0..=`[`COHORTS`](crate::admission::COHORTS)) of the highest
    /// refused tier are admitted all the same: the size of [`admitted_set`](Self::admitted_set).
    /// 0 at level 0.
    pub fn admitted_cohorts(&self) -> u8 {
        self.cohorts.len()
    }

    /// The cohorts of the highest refused tier (`rank() == level - 1`) admitted all the same:
    /// taken in cohort order while their arrival, measured per cohort (see
    /// [`observe_cohorts`](Self::observe_cohorts)), fits the capacity the admitted tiers leave
    /// (within `headroom`); a cohort that alone would pass it (a heavy tenant's) is skipped.
    /// A message of that tier is admitted when its [`cohort`](crate::admission::cohort) is in
    /// the set, so the capacity left serves the same users fully (see `cohort.rs`). Cohorts
    /// with no measured arrival are in it (they cost nothing until their users appear, and
    /// are measured from then on). Empty at level 0.
    pub fn admitted_set(&self) -> CohortSet {
        self.cohorts
    }

    /// The estimated arrival rate, messages/s, over the last window.
    pub fn arrival_rate(&self) -> f64 {
        self.arrival
    }

    /// The estimated capacity, messages/s (`None` until a handler has finished).
    pub fn capacity(&self) -> Option<f64> {
        self.capacity
    }

    /// The time the work ahead of the next pulled message of the admitted tiers takes to clear
    /// at the estimated capacity (the predicted sojourn), or `None` before a capacity estimate.
    pub fn predicted_wait(&self) -> Option<Duration> {
        let capacity = self.capacity?;
        Duration::try_from_secs_f64(self.wait_at(self.level, capacity)).ok()
    }

    /// The mean deadline slack at intake of `tier`'s messages over the last window in which
    /// any with a deadline were pulled, or `None` if none ever were.
    pub fn slack(&self, tier: Criticality) -> Option<Duration> {
        self.slack[tier.rank()].and_then(|s| Duration::try_from_secs_f64(s).ok())
    }

    /// Each tier's share of the arrival, in `0.0..=1.0`, indexed by [`Criticality::rank`].
    pub fn mix(&self) -> [f64; 4] {
        let total: f64 = self.rates.iter().sum();
        if total <= 0.0 {
            return [0.0; 4];
        }
        self.rates.map(|r| r / total)
    }
}

/// Handler completions per second the workers could sustain between two samples: the limit
/// over the mean run time; `None` when no handler finished between them.
fn capacity(from: &PullSample, to: &PullSample) -> Option<f64> {
    let served = to.served.saturating_sub(from.served) as f64;
    let busy = to.busy.saturating_sub(from.busy).as_secs_f64();
    (served > 0.0 && busy > 0.0).then(|| to.limit.max(1) as f64 * served / busy)
}

/// Messages/s that arrived between two samples: pulled plus the lag's change; `None` for
/// samples at the same instant or when either lag is unknown.
///
/// Without the lag, the pulls alone say how fast the runtime reads, not how fast work
/// arrives: a consumer starting on a backlog pulls ahead to fill its queue and key gate
/// (faster than it serves, with nothing arriving), and once its buffers are full it pulls
/// only as fast as it serves, whatever arrives. Neither is evidence of arrival beyond
/// capacity, so a span with an unknown lag gives none.
fn arrival(from: &PullSample, to: &PullSample) -> Option<f64> {
    let dt = to.at.saturating_sub(from.at).as_secs_f64();
    let (Some(before), Some(after)) = (from.lag, to.lag) else {
        return None;
    };
    if dt <= 0.0 {
        return None;
    }
    let pulled: u64 = (0..4)
        .map(|r| to.pulled[r].saturating_sub(from.pulled[r]))
        .sum();
    let trend = after as f64 - before as f64;
    Some(((pulled as f64 + trend) / dt).max(0.0))
}

#[cfg(test)]
#[path = "pull_tests.rs"]
pub(super) mod tests;
