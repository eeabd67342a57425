//! Pull-based admission: the shed level a consumer derives from arrival against capacity.

use std::collections::VecDeque;
use std::time::Duration;

use crate::admission::PullAdmissionConfig;
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
}

/// Decides which tiers a pull-based consumer refuses, from the arrival rate it infers from the
/// broker's lag and the service capacity it measures.
///
/// # Why not queue age
///
/// The seeds measure overload by queue age, which in a service that is pushed to is the wait of
/// the people at the door. A consumer pulls: the broker is the buffer, and the age of the
/// runtime's own queue says how eagerly the intake pulled, not whether the worker is
/// overloaded. After a deploy with lag, every consumer has a backlog; serving it in order is
/// right, deferring it doubles broker I/O and demotes work for nothing. So for a pull-based
/// source, in the terms of `DESIGN.md`:
///
/// - **Arrival rate** `A` = rate of pulling + trend of the lag (`d lag / dt`), over a sliding
///   window (`window_ms`). A backlog being served has a falling lag: `A` is the rate of new
///   records only, whatever the backlog's size.
/// - **Capacity** `C` = concurrency limit / mean handler run time over the same window: the
///   completions per second the workers could sustain (Little's law), measured even when they
///   are not saturated.
/// - **Overload** is `A > overload_ratio × C` (default 1.05: a worker offered exactly its
///   capacity sheds nothing). Then the highest tiers whose combined arrival fits `headroom × C`
///   (default 0.95) are admitted and the rest are refused, from Sheddable up: the *shed level*,
///   a bottom prefix of the ladder as with queue age. Each tier's share of the arrival comes
///   from what was pulled; a tier that is not pulled because it is shed and paused (a topic
///   per tier) keeps its last measured rate, and its arrival still shows in the lag.
///   Critical is never refused by this rule.
/// - **Recovery** is bottom-up: once the arrival with more tiers admitted has fitted
///   `headroom × C` for `recover_ms`, the level falls to the lowest that fits (the most
///   important refused tier first, Sheddable last). A raise needs the admitted tiers to exceed
///   `overload_ratio × C`, a re-admission needs them to fit `headroom × C`: the gap between
///   the two is the hysteresis.
///
/// What a refused tier's messages then become is its refusal policy's business (defer, drop or
/// backpressure); what is past its deadline is expired at intake by the runtime, for free,
/// whatever the level.
///
/// # Limits
///
/// Arrival that reaches the broker in bursts less than a window apart (a producer or a broker
/// that stalls, then catches up) looks like overload while two bursts fall in the window: in a
/// model of 0.88x (640/s against a capacity of 727/s) arriving as 0.8 s of nothing and then
/// 512 records at once, the second burst raises the level (estimated arrival about 1,000/s),
/// and the lowest tier is refused for that burst. On the proving ground at a load average of
/// 17, one 0.8x run deferred 111 Sheddable records this way; the same stalls also delivered
/// records already past their deadline, which no admission can serve.
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
/// // the worker pulls 800/s and the lag grows by 1,600/s.
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
    arrival: f64,
    capacity: Option<f64>,
    level: u8,
    /// Since when the arrival has fitted with one more tier admitted.
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
            capacity: None,
            level: 0,
            fitting_since: None,
        }
    }

    /// Applies new settings; the current level is kept and re-evaluated on the next sample.
    pub fn reconfigure(&mut self, config: &PullAdmissionConfig) {
        self.config = config.clone();
        if !config.enabled {
            self.level = 0;
        }
    }

    /// Feeds a sample and returns the new shed level (tiers with `rank() < level` are refused).
    pub fn observe(&mut self, sample: &PullSample) -> u8 {
        let window = Duration::from_millis(self.config.window_ms);
        self.samples.push_back(*sample);
        // Keep the newest sample at least `window` old, so the window is always covered.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|s| sample.at.saturating_sub(s.at) >= window)
        {
            self.samples.pop_front();
        }
        let Some(first) = self.samples.front().copied() else {
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
        }
        // The arrival over each half of the window, and the lower of the two: a step in the lag
        // that is not arrival (a source's first measurement, partitions assigned in a
        // rebalance) lands in one half only, while sustained arrival beyond capacity shows in
        // both.
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
        let served = sample.served.saturating_sub(first.served) as f64;
        let busy = sample.busy.saturating_sub(first.busy).as_secs_f64();
        if served > 0.0 && busy > 0.0 {
            self.capacity = Some(sample.limit.max(1) as f64 * served / busy);
        }
        if !self.config.enabled {
            self.level = 0;
            return 0;
        }
        let Some(capacity) = self.capacity else {
            return self.level;
        };
        // The level whose admitted tiers fit `headroom × capacity`: where a raise goes, and how
        // far a recovery may come down. A raise needs the tiers admitted now to exceed
        // `overload_ratio × capacity`; a tier re-admitted fits `headroom ×` it, so the two
        // thresholds do not chase each other.
        let target = self.fitting_level(capacity * self.config.headroom);
        let admitted = self.arrival * self.admitted_share(self.level);
        // Raise only on a window at least half covered: two samples 100 ms apart say little.
        let covered = dt * 2.0 >= window.as_secs_f64();
        if covered && admitted > capacity * self.config.overload_ratio && target > self.level {
            self.level = target;
            self.fitting_since = None;
        } else if target < self.level {
            let since = *self.fitting_since.get_or_insert(sample.at);
            if sample.at.saturating_sub(since) >= Duration::from_millis(self.config.recover_ms) {
                self.level = target;
                self.fitting_since = None;
            }
        } else {
            self.fitting_since = None;
        }
        self.level
    }

    /// The share of the arrival of the tiers admitted at `level` (1.0 at level 0).
    fn admitted_share(&self, level: u8) -> f64 {
        let total: f64 = self.rates.iter().sum();
        if total <= 0.0 {
            return 1.0;
        }
        self.rates[level as usize..].iter().sum::<f64>() / total
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

    /// Whether `tier` is admitted at the current level.
    pub fn admits(&self, tier: Criticality) -> bool {
        tier.rank() >= self.level as usize
    }

    /// The estimated arrival rate, messages/s, over the last window.
    pub fn arrival_rate(&self) -> f64 {
        self.arrival
    }

    /// The estimated capacity, messages/s (`None` until a handler has finished).
    pub fn capacity(&self) -> Option<f64> {
        self.capacity
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

/// Messages/s that arrived between two samples: pulled plus the lag's change (pulled only
/// when either lag is unknown); `None` for samples at the same instant.
fn arrival(from: &PullSample, to: &PullSample) -> Option<f64> {
    let dt = to.at.saturating_sub(from.at).as_secs_f64();
    if dt <= 0.0 {
        return None;
    }
    let pulled: u64 = (0..4)
        .map(|r| to.pulled[r].saturating_sub(from.pulled[r]))
        .sum();
    let trend = match (from.lag, to.lag) {
        (Some(a), Some(b)) => b as f64 - a as f64,
        _ => 0.0,
    };
    Some(((pulled as f64 + trend) / dt).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// Runs `ticks` ticks of 100 ms: capacity 8 handlers of 10 ms, arrivals `rate`/s with the
    /// mix 10/20/30/40 (Critical first), the worker pulling `pull`/s.
    fn drive(a: &mut PullAdmission, s: &mut PullSample, ticks: u64, rate: f64, pull: f64) {
        let mix = [0.4, 0.3, 0.2, 0.1]; // by rank
        for _ in 0..ticks {
            s.at += ms(100);
            for (r, share) in mix.iter().enumerate() {
                s.pulled[r] += (pull * share / 10.0) as u64;
            }
            let served = (pull.min(800.0) / 10.0) as u64;
            s.served += served;
            s.busy += ms(10) * served as u32;
            let lag = s.lag.unwrap_or(0) as f64 + (rate - pull) / 10.0;
            s.lag = Some(lag.max(0.0) as u64);
            a.observe(s);
        }
    }

    fn fresh() -> (PullAdmission, PullSample) {
        let s = PullSample {
            limit: 8,
            lag: Some(0),
            ..PullSample::default()
        };
        (PullAdmission::new(&PullAdmissionConfig::default()), s)
    }

    #[test]
    fn one_x_and_below_shed_nothing() {
        for rate in [400.0, 640.0, 800.0, 830.0] {
            let (mut a, mut s) = fresh();
            drive(&mut a, &mut s, 50, rate, rate);
            assert_eq!(a.level(), 0, "rate {rate}");
        }
    }

    #[test]
    fn overload_sheds_from_the_bottom_by_mix() {
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 2400.0, 800.0);
        assert_eq!(a.level(), 2, "3x: Critical+High = 720/s fit 760/s");
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 8000.0, 800.0);
        assert_eq!(a.level(), 3, "10x: Critical only");
        assert!(a.admits(Criticality::Critical));
    }

    #[test]
    fn deferring_the_refused_tiers_does_not_hide_the_overload() {
        // Once Medium and Sheddable are deferred the worker pulls at the arrival rate and the
        // lag stops growing: the arrival estimate must stay 2,400/s.
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 2400.0, 800.0);
        drive(&mut a, &mut s, 50, 2400.0, 2400.0);
        assert_eq!(a.level(), 2);
        assert!(
            (a.arrival_rate() - 2400.0).abs() < 100.0,
            "{}",
            a.arrival_rate()
        );
    }

    #[test]
    fn recovery_is_bottom_up_after_recover_ms() {
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 2400.0, 800.0);
        assert_eq!(a.level(), 2);
        // Arrival falls to 1.3x (1,040/s): Medium fits again, Sheddable not yet.
        drive(&mut a, &mut s, 30, 1040.0, 1040.0);
        assert_eq!(a.level(), 1);
        // Then to 0.5x: everything is admitted again.
        drive(&mut a, &mut s, 30, 400.0, 400.0);
        assert_eq!(a.level(), 0);
    }

    #[test]
    fn a_backlog_without_arrivals_is_not_overload() {
        let (mut a, mut s) = fresh();
        s.lag = Some(30_000);
        for tick in 0..100 {
            s.at += ms(100);
            s.pulled[1] += 80; // all Medium
            s.served += 80;
            s.busy += ms(800);
            s.lag = s.lag.map(|l| l.saturating_sub(80));
            a.observe(&s);
            assert_eq!(a.level(), 0, "tick {tick}");
        }
        assert!(a.arrival_rate() < 1.0, "{}", a.arrival_rate());
    }

    #[test]
    fn a_step_in_the_lag_is_not_arrival() {
        // A source reports 0 before its first measurement, then the backlog it found; or a
        // rebalance assigns partitions with lag. One step, then the lag falls: no overload.
        let (mut a, mut s) = fresh();
        for tick in 0..60u64 {
            s.at += ms(100);
            s.pulled[1] += 80;
            s.served += 80;
            s.busy += ms(800);
            s.lag = Some(match tick {
                0..=4 => 0,
                _ => 20_000 - 80 * (tick - 4),
            });
            a.observe(&s);
            assert_eq!(a.level(), 0, "tick {tick}: arrival {}", a.arrival_rate());
        }
    }

    #[test]
    fn disabled_never_sheds() {
        let mut a = PullAdmission::new(&PullAdmissionConfig::disabled());
        let mut s = PullSample {
            limit: 8,
            lag: Some(0),
            ..PullSample::default()
        };
        drive(&mut a, &mut s, 20, 8000.0, 800.0);
        assert_eq!(a.level(), 0);
    }
}
