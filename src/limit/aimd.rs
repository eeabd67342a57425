//! Additive-increase / multiplicative-decrease, the loss-based rule of TCP
//! congestion avoidance (V. Jacobson, "Congestion Avoidance and Control",
//! SIGCOMM 1988), as adapted to concurrency by Netflix concurrency-limits'
//! `AIMDLimit`.
//!
//! Every good sample taken while the limit is actually in use adds one slot;
//! every overload signal (a job dropped or failed because of overload, or a job
//! slower than `timeout`) multiplies the limit by `backoff_ratio`. The limit
//! therefore probes upward slowly and retreats quickly, which is what keeps a
//! saturated downstream from being driven into collapse. The rule reacts only to
//! explicit overload signals, never to latency drift below `timeout`, so it does
//! not shed work because job latencies are merely noisy.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{check_bounds, Fields, LimitConfigError};
use super::Sample;

/// Parameters of [`Aimd`]; also the `{ kind = "aimd", .. }` config section.
///
/// Every field has a default, so `{ kind = "aimd" }` alone is valid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AimdConfig {
    /// Limit at startup, in concurrent jobs. Default 20 (Netflix `AIMDLimit`
    /// uses 10; 20 matches `Gradient2Limit` so switching algorithms does not
    /// change cold-start behaviour). Allowed `[min, max]`.
    pub initial: usize,
    /// Lowest limit, in concurrent jobs. Default 1: a worker must always be able
    /// to make progress. Allowed `[1, MAX_LIMIT]`.
    pub min: usize,
    /// Highest limit, in concurrent jobs. Default 200 (Netflix's
    /// `maxConcurrency`). Allowed `[min, MAX_LIMIT]`.
    pub max: usize,
    /// Factor applied to the limit on an overload signal. Default 0.9 (Netflix
    /// `AIMDLimit`). Allowed `(0, 1)`.
    pub backoff_ratio: f64,
    /// Handler latency above which a job counts as an overload signal, in
    /// milliseconds. Default 5000 (5 s, Netflix's `DEFAULT_TIMEOUT`): well above
    /// typical job latencies (milliseconds to a few seconds) yet far below
    /// Kafka's `max.poll.interval.ms` (300 s) and RabbitMQ's `consumer_timeout`
    /// (30 min), so stalls are caught long before the broker redelivers. Set it
    /// to 2–3× the handler's normal p99. Allowed `[1, u64::MAX]`.
    pub timeout_ms: u64,
}

impl Default for AimdConfig {
    fn default() -> Self {
        Self {
            initial: 20,
            min: 1,
            max: 200,
            backoff_ratio: 0.9,
            timeout_ms: 5_000,
        }
    }
}

impl AimdConfig {
    /// Checks every field against its documented range.
    ///
    /// # Errors
    ///
    /// [`LimitConfigError`] naming the first offending field, e.g.
    /// `limit.backoff_ratio = 1.5 is out of range: allowed (0, 1)`.
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
        // Written as a negated conjunction so that NaN is rejected too.
        if !(self.backoff_ratio > 0.0 && self.backoff_ratio < 1.0) {
            return Err(LimitConfigError::new(
                "limit.backoff_ratio",
                self.backoff_ratio,
                "(0, 1)",
            ));
        }
        if self.timeout_ms == 0 {
            return Err(LimitConfigError::new(
                "limit.timeout_ms",
                self.timeout_ms,
                format!("[1, {}]", u64::MAX),
            ));
        }
        Ok(())
    }
}

/// Loss-based additive-increase / multiplicative-decrease limit: TCP congestion
/// avoidance (Jacobson, SIGCOMM 1988) as adapted to concurrency by Netflix
/// concurrency-limits' `AIMDLimit`. It probes upward slowly and retreats fast,
/// and reacts only to explicit overload signals, never to latency noise below
/// `timeout`.
///
/// On each sample, in order:
/// - dropped, or `latency > timeout`: `limit = max(min, min(limit − 1, ⌊limit × backoff_ratio⌋))`
///   (the `limit − 1` guarantees a decrease even where `⌊limit × 0.9⌋ = limit`
///   would not, as in Netflix's `AIMDLimit`);
/// - otherwise, if `in_flight × 2 ≥ limit`: `limit = min(max, limit + 1)`;
/// - otherwise the worker is not using its limit, so a good sample proves nothing
///   and the limit stays.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use triage::limit::{Aimd, AimdConfig, Sample};
///
/// let mut aimd = Aimd::new(AimdConfig { initial: 10, ..AimdConfig::default() })?;
/// let ok = Sample { latency: Duration::from_millis(20), in_flight: 10, dropped: false };
/// assert_eq!(aimd.on_sample(ok), 11);
/// assert_eq!(aimd.on_sample(Sample { dropped: true, ..ok }), 9); // ⌊11 × 0.9⌋
/// let idle = Sample { in_flight: 1, ..ok };
/// assert_eq!(aimd.on_sample(idle), 9); // limit not in use: no increase
/// # Ok::<(), triage::limit::LimitConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Aimd {
    limit: usize,
    min: usize,
    max: usize,
    backoff_ratio: f64,
    timeout: Duration,
}

impl Default for Aimd {
    fn default() -> Self {
        let c = AimdConfig::default();
        Self::from_valid(&c)
    }
}

impl Aimd {
    /// An AIMD limit starting at `config.initial`.
    ///
    /// # Errors
    ///
    /// [`LimitConfigError`] if `config` fails [`AimdConfig::validate`].
    pub fn new(config: AimdConfig) -> Result<Self, LimitConfigError> {
        config.validate()?;
        Ok(Self::from_valid(&config))
    }

    fn from_valid(c: &AimdConfig) -> Self {
        Self {
            limit: c.initial,
            min: c.min,
            max: c.max,
            backoff_ratio: c.backoff_ratio,
            timeout: Duration::from_millis(c.timeout_ms),
        }
    }

    /// The current limit, in concurrent jobs; always within `[min, max]`.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Applies one completed job and returns the new limit.
    pub fn on_sample(&mut self, sample: Sample) -> usize {
        let limit = self.limit;
        let next = if sample.dropped || sample.latency > self.timeout {
            // Limits are at most MAX_LIMIT, so the f64 round trip is exact.
            let scaled = (limit as f64 * self.backoff_ratio) as usize;
            scaled.min(limit.saturating_sub(1))
        } else if sample.in_flight.saturating_mul(2) >= limit {
            limit + 1
        } else {
            limit
        };
        self.limit = next.clamp(self.min, self.max);
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good(in_flight: usize) -> Sample {
        Sample {
            latency: Duration::from_millis(10),
            in_flight,
            dropped: false,
        }
    }

    #[test]
    fn virtual_sequence() {
        let mut a = Aimd::new(AimdConfig::default()).unwrap();
        assert_eq!(a.limit(), 20);
        for expected in 21..=25 {
            let l = a.limit();
            assert_eq!(a.on_sample(good(l)), expected);
        }
        // Exactly half in use still counts as used.
        assert_eq!(a.on_sample(good(13)), 26);
        // Less than half in use: no increase.
        assert_eq!(a.on_sample(good(12)), 26);
        // Drop: ×0.9, floored.
        let dropped = Sample {
            dropped: true,
            ..good(26)
        };
        assert_eq!(a.on_sample(dropped), 23);
        // Timeout: 5 s is the threshold, strictly exceeded.
        let at_timeout = Sample {
            latency: Duration::from_secs(5),
            ..good(23)
        };
        assert_eq!(a.on_sample(at_timeout), 24);
        let slow = Sample {
            latency: Duration::from_millis(5_001),
            ..good(24)
        };
        assert_eq!(a.on_sample(slow), 21);
        // A drop decreases even when the limit is not in use.
        assert_eq!(
            a.on_sample(Sample {
                in_flight: 0,
                ..dropped
            }),
            18
        );
    }

    #[test]
    fn stays_within_bounds() {
        let cfg = AimdConfig {
            initial: 5,
            min: 3,
            max: 12,
            ..AimdConfig::default()
        };
        let mut a = Aimd::new(cfg).unwrap();
        let dropped = Sample {
            dropped: true,
            ..good(0)
        };
        // 5 → 4 (⌊4.5⌋) → 3 (min(⌊3.6⌋, 3)) → clamped at 3.
        assert_eq!(a.on_sample(dropped), 4);
        assert_eq!(a.on_sample(dropped), 3);
        for _ in 0..10 {
            assert_eq!(a.on_sample(dropped), 3);
        }
        for _ in 0..100 {
            let l = a.limit();
            a.on_sample(good(l));
        }
        assert_eq!(a.limit(), 12);
    }

    #[test]
    fn small_limits_still_decrease() {
        let mut a = Aimd::new(AimdConfig {
            initial: 2,
            ..AimdConfig::default()
        })
        .unwrap();
        let dropped = Sample {
            dropped: true,
            ..good(2)
        };
        assert_eq!(a.on_sample(dropped), 1);
        assert_eq!(a.on_sample(dropped), 1);
    }

    #[test]
    fn validate_names_field_and_range() {
        let err = AimdConfig {
            backoff_ratio: 1.5,
            ..AimdConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "limit.backoff_ratio = 1.5 is out of range: allowed (0, 1)"
        );
        let err = AimdConfig {
            backoff_ratio: f64::NAN,
            ..AimdConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "limit.backoff_ratio");
        let err = AimdConfig {
            min: 0,
            ..AimdConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "limit.min");
        let err = AimdConfig {
            min: 10,
            max: 5,
            ..AimdConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "limit.max = 5 is out of range: allowed [10 (min), 1000000]"
        );
        let err = AimdConfig {
            initial: 500,
            ..AimdConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "limit.initial = 500 is out of range: allowed [1 (min), 200 (max)]"
        );
        let err = AimdConfig {
            timeout_ms: 0,
            ..AimdConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(err.field, "limit.timeout_ms");
        assert!(AimdConfig::default().validate().is_ok());
    }
}
