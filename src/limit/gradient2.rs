//! The latency-gradient limit; see [`Gradient2`].

use serde::{Deserialize, Serialize};

use super::error::{check_bounds, Fields, LimitConfigError, MAX_LIMIT};
use super::Sample;

/// Samples averaged arithmetically before the long average turns exponential,
/// so that the very first sample does not dominate the baseline for
/// `long_window` samples (Netflix `ExpAvgMeasurement` warm-up of 10).
const WARMUP_SAMPLES: u32 = 10;

/// Ratio `long_rtt / short_rtt` above which the baseline is decayed.
const DRIFT_RATIO: f64 = 2.0;

/// Per-sample decay of the baseline while it is above `DRIFT_RATIO × short_rtt`.
const DRIFT_DECAY: f64 = 0.95;

/// Lowest gradient: one sample can cut the pre-smoothing estimate by at most half.
const MIN_GRADIENT: f64 = 0.5;

/// Parameters of [`Gradient2`]; also the `{ kind = "gradient2", .. }` config section.
///
/// Every field has a default, so `{ kind = "gradient2" }` alone is valid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Gradient2Config {
    /// Limit at startup, in concurrent jobs. Default 20 (Netflix). Allowed `[min, max]`.
    pub initial: usize,
    /// Lowest limit, in concurrent jobs. Default 1 (Netflix: 20; see
    /// [`Gradient2`]). Allowed `[1, MAX_LIMIT]`.
    pub min: usize,
    /// Highest limit, in concurrent jobs. Default 200 (Netflix's
    /// `maxConcurrency`). Allowed `[min, MAX_LIMIT]`.
    pub max: usize,
    /// How much slower than the baseline the present may be before the limit
    /// shrinks: 1.5 tolerates a 50 % latency increase. Default 1.5 (Netflix's
    /// `rttTolerance`). Allowed `[1, 100]`.
    pub tolerance: f64,
    /// Weight of the new estimate in each update; higher reacts faster and
    /// oscillates more. Default 0.2 (Netflix). Allowed `(0, 1]`.
    pub smoothing: f64,
    /// Samples in the long (baseline) exponential average. Default 600
    /// (Netflix's `longWindow`). Allowed `[1, 1000000]`.
    pub long_window: u32,
    /// Samples in the short exponential average; 1 uses the current sample
    /// alone. Default 1 (Netflix). Raise it (e.g. 10) when job latencies vary a
    /// lot from message to message. Allowed `[1, long_window]`.
    pub short_window: u32,
    /// Fixed growth allowance, in jobs. Default absent, meaning `√limit`
    /// (see [`Gradient2`]). Allowed `[1, MAX_LIMIT]` when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_size: Option<usize>,
}

impl Default for Gradient2Config {
    fn default() -> Self {
        Self {
            initial: 20,
            min: 1,
            max: 200,
            tolerance: 1.5,
            smoothing: 0.2,
            long_window: 600,
            short_window: 1,
            queue_size: None,
        }
    }
}

impl Gradient2Config {
    /// Checks every field against its documented range.
    ///
    /// # Errors
    ///
    /// [`LimitConfigError`] naming the first offending field, e.g.
    /// `limit.smoothing = 0 is out of range: allowed (0, 1]`.
    pub fn validate(&self) -> Result<(), LimitConfigError> {
        check_bounds(
            Fields {
                initial: "limit.initial",
                min: "limit.min",
                max: "limit.max",
            },
            self.initial,
            self.min,
            self.max,
        )?;
        // Negated conjunctions so that NaN is rejected too.
        if !(self.tolerance >= 1.0 && self.tolerance <= 100.0) {
            return Err(LimitConfigError::new(
                "limit.tolerance",
                self.tolerance,
                "[1, 100]",
            ));
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err(LimitConfigError::new(
                "limit.smoothing",
                self.smoothing,
                "(0, 1]",
            ));
        }
        if !(1..=1_000_000).contains(&self.long_window) {
            return Err(LimitConfigError::new(
                "limit.long_window",
                self.long_window,
                "[1, 1000000]",
            ));
        }
        if !(1..=self.long_window).contains(&self.short_window) {
            return Err(LimitConfigError::new(
                "limit.short_window",
                self.short_window,
                format!("[1, {} (long_window)]", self.long_window),
            ));
        }
        if let Some(q) = self.queue_size {
            if !(1..=MAX_LIMIT).contains(&q) {
                return Err(LimitConfigError::new(
                    "limit.queue_size",
                    q,
                    format!("[1, {MAX_LIMIT}]"),
                ));
            }
        }
        Ok(())
    }
}

/// Latency-gradient concurrency limit after Netflix concurrency-limits'
/// `Gradient2Limit`, itself a descendant of TCP Vegas (L. Brakmo, L. Peterson,
/// "TCP Vegas: End to End Congestion Avoidance on a Global Internet", IEEE JSAC
/// 1995): instead of waiting for losses, watch latency and back off as soon as
/// queueing shows up.
///
/// Two exponential averages of handler latency are kept: a long one (the
/// baseline, `long_window` samples) and a short one (the present, `short_window`
/// samples; 1 means "the current sample", as in Netflix). When the present is
/// slower than the baseline, work is queueing somewhere downstream, so the limit
/// shrinks in proportion:
///
/// ```text
/// gradient  = clamp(tolerance × long_rtt / short_rtt, 0.5, 1.0)
/// new_limit = limit × gradient + queue_size
/// limit     = clamp(limit × (1 − smoothing) + new_limit × smoothing, min, max)
/// ```
///
/// At steady latency `gradient = 1` and the limit grows by `smoothing × queue_size`
/// per sample; `queue_size` is the queueing the algorithm is willing to cause.
/// The 0.5 floor keeps one outlier from halving the limit.
///
/// Recovery: after a sustained slowdown the baseline has absorbed the slow
/// latencies, and when latency returns to normal `long_rtt` may be several times
/// `short_rtt`. Whenever `long_rtt / short_rtt > 2` the baseline is multiplied by
/// 0.95 per sample (Netflix's earlier releases; current ones use 0.9) so it
/// converges on the new normal in tens of samples instead of `long_window`.
///
/// As in Netflix, a good sample with `in_flight < limit / 2` changes only the
/// averages, not the limit: the worker was not using its limit, so the latency
/// says nothing about what a higher (or lower) limit would do.
///
/// Departures from Netflix, all deliberate:
/// - `queue_size` defaults to `√limit` rather than Netflix `Gradient2Limit`'s
///   constant 4 (Netflix's older `GradientLimit` uses `max(4, ⌊√limit⌋)`):
///   growth then scales with the limit, equal to Netflix's 4 at a limit of 16.
/// - A sample marked `dropped` is an explicit overload signal. Netflix's
///   `Gradient2Limit` ignores it, but a job that failed fast because a downstream
///   rejected it reports a *short* latency that would otherwise read as "healthy,
///   grow". Here it updates neither average and applies the largest decrease the
///   formula allows (`gradient = 0.5`), whether or not the limit is in use.
/// - `min` defaults to 1, not Netflix's 20: a worker must be able to go down to
///   one job at a time when its downstream is struggling.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use triage::limit::{Gradient2, Gradient2Config, Sample};
///
/// let mut g = Gradient2::new(Gradient2Config::default())?;
/// let sample = |ms, in_flight| Sample { latency: Duration::from_millis(ms), in_flight, dropped: false };
///
/// // Steady 10 ms latency with the limit in use: the limit grows.
/// for _ in 0..50 {
///     let l = g.limit();
///     g.on_sample(sample(10, l));
/// }
/// let before = g.limit();
/// assert!(before > 20);
///
/// // Latency jumps to 50 ms: queueing, so the limit falls.
/// for _ in 0..50 {
///     let l = g.limit();
///     g.on_sample(sample(50, l));
/// }
/// assert!(g.limit() < before / 2);
/// # Ok::<(), triage::limit::LimitConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Gradient2 {
    /// Fractional so that small smoothed increments accumulate.
    estimate: f64,
    min: f64,
    max: f64,
    tolerance: f64,
    smoothing: f64,
    long_factor: f64,
    short_factor: f64,
    queue_size: Option<f64>,
    /// Baseline latency in nanoseconds; meaningless while `long_count == 0`.
    long_rtt: f64,
    long_count: u32,
    /// Present latency in nanoseconds; meaningless while `long_count == 0`.
    short_rtt: f64,
}

impl Default for Gradient2 {
    fn default() -> Self {
        Self::from_valid(&Gradient2Config::default())
    }
}

impl Gradient2 {
    /// A gradient limit starting at `config.initial`.
    ///
    /// # Errors
    ///
    /// [`LimitConfigError`] if `config` fails [`Gradient2Config::validate`].
    pub fn new(config: Gradient2Config) -> Result<Self, LimitConfigError> {
        config.validate()?;
        Ok(Self::from_valid(&config))
    }

    fn from_valid(c: &Gradient2Config) -> Self {
        Self {
            estimate: c.initial as f64,
            min: c.min as f64,
            max: c.max as f64,
            tolerance: c.tolerance,
            smoothing: c.smoothing,
            long_factor: 2.0 / (f64::from(c.long_window) + 1.0),
            short_factor: 2.0 / (f64::from(c.short_window) + 1.0),
            queue_size: c.queue_size.map(|q| q as f64),
            long_rtt: 0.0,
            long_count: 0,
            short_rtt: 0.0,
        }
    }

    /// The current limit, in concurrent jobs; always within `[min, max]`.
    pub fn limit(&self) -> usize {
        // The estimate is clamped to [min, max] ⊂ [1, MAX_LIMIT], so the cast is exact.
        self.estimate as usize
    }

    /// The baseline (long-term average) latency, or `None` before the first
    /// non-dropped sample. For metrics and debugging.
    pub fn long_rtt(&self) -> Option<std::time::Duration> {
        (self.long_count > 0).then(|| nanos_to_duration(self.long_rtt))
    }

    /// The present (short-term average) latency, or `None` before the first
    /// non-dropped sample. For metrics and debugging.
    pub fn short_rtt(&self) -> Option<std::time::Duration> {
        (self.long_count > 0).then(|| nanos_to_duration(self.short_rtt))
    }

    /// Applies one completed job and returns the new limit.
    pub fn on_sample(&mut self, sample: Sample) -> usize {
        let gradient = if sample.dropped {
            MIN_GRADIENT
        } else {
            let (long, short) = self.observe(sample.latency);
            if (sample.in_flight as f64) < self.estimate / 2.0 {
                return self.limit();
            }
            (self.tolerance * long / short).clamp(MIN_GRADIENT, 1.0)
        };
        let queue_size = self.queue_size.unwrap_or_else(|| self.estimate.sqrt());
        let target = self.estimate * gradient + queue_size;
        let smoothed = self.estimate * (1.0 - self.smoothing) + target * self.smoothing;
        self.estimate = smoothed.clamp(self.min, self.max);
        self.limit()
    }

    /// Folds a latency into both averages and returns `(long, short)` as they
    /// were before any drift decay, in nanoseconds.
    fn observe(&mut self, latency: std::time::Duration) -> (f64, f64) {
        // At least 1 ns so the ratio below never divides by zero.
        let rtt = (latency.as_nanos() as f64).max(1.0);
        if self.long_count == 0 {
            self.long_rtt = rtt;
            self.short_rtt = rtt;
        } else {
            self.short_rtt += (rtt - self.short_rtt) * self.short_factor;
            if self.long_count < WARMUP_SAMPLES {
                self.long_rtt += (rtt - self.long_rtt) / f64::from(self.long_count + 1);
            } else {
                self.long_rtt += (rtt - self.long_rtt) * self.long_factor;
            }
        }
        self.long_count = self.long_count.saturating_add(1);
        let (long, short) = (self.long_rtt, self.short_rtt);
        if long / short > DRIFT_RATIO {
            self.long_rtt *= DRIFT_DECAY;
        }
        (long, short)
    }
}

fn nanos_to_duration(nanos: f64) -> std::time::Duration {
    std::time::Duration::from_nanos(nanos as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn feed(g: &mut Gradient2, ms: u64, n: usize) {
        for _ in 0..n {
            let l = g.limit();
            g.on_sample(Sample {
                latency: Duration::from_millis(ms),
                in_flight: l,
                dropped: false,
            });
        }
    }

    fn falls_then_recovers(cfg: Gradient2Config) -> (usize, usize, usize) {
        let mut g = Gradient2::new(cfg).unwrap();
        feed(&mut g, 10, 200);
        let before = g.limit();
        feed(&mut g, 50, 200);
        let during = g.limit();
        feed(&mut g, 10, 2000);
        (before, during, g.limit())
    }

    #[test]
    fn limit_falls_when_latency_rises_and_recovers_after() {
        // Defaults: 200 steady samples saturate at max = 200.
        let (before, during, after) = falls_then_recovers(Gradient2Config::default());
        assert_eq!(before, 200);
        assert!(during * 10 < before * 6, "during = {during}");
        assert_eq!(after, 200);

        // Unsaturated: the pre-rise limit is below max, and must be regained.
        let (before, during, after) = falls_then_recovers(Gradient2Config {
            max: 10_000,
            ..Gradient2Config::default()
        });
        assert!(before > 200 && before < 10_000, "before = {before}");
        assert!(during * 10 < before * 6, "during = {during}");
        assert!(after >= before, "after = {after}, before = {before}");
    }

    #[test]
    fn steady_latency_grows_by_smoothed_queue_size() {
        let cfg = Gradient2Config {
            queue_size: Some(5),
            ..Gradient2Config::default()
        };
        let mut g = Gradient2::new(cfg).unwrap();
        // 20 × 0.8 + (20 + 5) × 0.2 = 21.
        feed(&mut g, 10, 1);
        assert_eq!(g.limit(), 21);
        feed(&mut g, 10, 9);
        assert_eq!(g.limit(), 30);
        assert_eq!(g.long_rtt(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn unused_limit_does_not_grow() {
        let mut g = Gradient2::default();
        for _ in 0..100 {
            g.on_sample(Sample {
                latency: Duration::from_millis(10),
                in_flight: 9,
                dropped: false,
            });
        }
        assert_eq!(g.limit(), 20);
        assert_eq!(g.short_rtt(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn drop_is_maximal_decrease() {
        let cfg = Gradient2Config {
            initial: 100,
            queue_size: Some(10),
            ..Gradient2Config::default()
        };
        let mut g = Gradient2::new(cfg).unwrap();
        // 100 × 0.8 + (100 × 0.5 + 10) × 0.2 = 92, even with nothing in flight.
        let l = g.on_sample(Sample {
            latency: Duration::from_millis(1),
            in_flight: 0,
            dropped: true,
        });
        assert_eq!(l, 92);
        assert_eq!(g.long_rtt(), None, "dropped samples are not latency data");
    }

    #[test]
    fn zero_latency_is_harmless() {
        let mut g = Gradient2::default();
        for _ in 0..10 {
            let l = g.limit();
            g.on_sample(Sample {
                latency: Duration::ZERO,
                in_flight: l,
                dropped: false,
            });
        }
        assert!((1..=200).contains(&g.limit()));
    }

    #[test]
    fn validate_names_field_and_range() {
        let e = Gradient2Config {
            smoothing: 0.0,
            ..Gradient2Config::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "limit.smoothing = 0 is out of range: allowed (0, 1]"
        );
        let e = Gradient2Config {
            tolerance: 0.9,
            ..Gradient2Config::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "limit.tolerance = 0.9 is out of range: allowed [1, 100]"
        );
        let e = Gradient2Config {
            short_window: 601,
            ..Gradient2Config::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "limit.short_window = 601 is out of range: allowed [1, 600 (long_window)]"
        );
        let e = Gradient2Config {
            long_window: 0,
            ..Gradient2Config::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "limit.long_window");
        let e = Gradient2Config {
            queue_size: Some(0),
            ..Gradient2Config::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "limit.queue_size");
        let e = Gradient2Config {
            max: 0,
            ..Gradient2Config::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "limit.max");
        assert!(Gradient2Config::default().validate().is_ok());
    }
}
