//! The layer's configuration: the entry queue, deadlines, `Retry-After`, the paths never shed,
//! and the reappearance tracker.

use std::num::NonZeroUsize;
use std::time::Duration;

use triage::queue::WfqConfig;
use triage::{ConfigError, Criticality, PerTier};

use crate::RefusalReason;

/// How a [`TriageLayer`](crate::TriageLayer) admits and answers. Every field has a documented
/// default; [`validate`](Self::validate) names the field and range of anything out of range.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::Criticality;
/// use triage_tower::TriageConfig;
///
/// let mut config = TriageConfig::default();
/// config.never_shed.push("/internal/ready".to_owned());
/// config.retry_after_jitter = Duration::from_secs(4);
/// config.default_tier = Criticality::Sheddable;
/// config.validate()?;
/// # Ok::<(), triage::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TriageConfig {
    /// The entry queue where requests wait for a slot: bounded, weighted-fair, with queue-age
    /// admission at push (the same [`WfqQueue`](triage::queue::WfqQueue) the worker runtime
    /// uses). Default: 1,024 requests, weights 8/4/2/1, cut-offs 400/200/80/20 ms.
    pub queue: WfqConfig,
    /// The tier of a request that names none (no trusted header, no route, no closure answer)
    /// or names an unknown one; such requests are counted (`triage_http_unclassified_total`).
    /// Default [`Criticality::Medium`].
    pub default_tier: Criticality,
    /// How long a request of each tier is useful without a deadline of its own
    /// (`triage-deadline-ms` or `grpc-timeout`): it is answered, never served, once that long
    /// has passed since it arrived. A deadline from a client the classifier does not trust
    /// may shorten it, never lengthen it. Allowed 1 ms to 1 hour each. Default 1,000 / 500 / 250 /
    /// 100 ms (the worker runtime's overload example uses the same windows).
    pub tier_window: PerTier<Duration>,
    /// The least `Retry-After` for each refusal reason that invites a retry. Allowed 1 s to
    /// 1 day each (the header counts whole seconds). Default: capacity 1 s, rate 1 s, circuit
    /// 30 s (an open circuit suggests a longer backoff than a capacity shed: seed 003 says 30
    /// to 60 s). A [`Gate`](crate::Gate) may give its own wait for the refusals it makes. An
    /// expired request gets no `Retry-After`: retrying it is useless.
    pub retry_after: RetryAfter,
    /// Uniform jitter added to every `Retry-After`, in whole seconds drawn from
    /// `0..=retry_after_jitter`, so refused clients do not come back in step. Allowed 0 to
    /// 1 hour. Default 2 s.
    pub retry_after_jitter: Duration,
    /// Request paths that are never shed, matched exactly (health, readiness, metrics): served
    /// at once, without a slot, at any load. Default `/healthz`, `/readyz`, `/metrics`.
    pub never_shed: Vec<String>,
    /// The retry-reappearance tracker.
    pub reappearance: ReappearanceConfig,
}

/// The least `Retry-After` per refusal reason (see [`TriageConfig::retry_after`]). There is
/// none for [`RefusalReason::Expired`]: a request whose deadline has passed cannot succeed
/// on a retry, so its answer carries no `Retry-After`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryAfter {
    /// For a capacity shed (queue full, queue-age admission, evicted). Default 1 s.
    pub capacity: Duration,
    /// For a rate refusal (a caller over its budget). Default 1 s.
    pub rate: Duration,
    /// For an open circuit. Default 30 s.
    pub circuit: Duration,
}

impl RetryAfter {
    /// The least wait for `reason`; zero for [`RefusalReason::Expired`] (no `Retry-After`).
    pub fn of(&self, reason: RefusalReason) -> Duration {
        match reason {
            RefusalReason::Capacity => self.capacity,
            RefusalReason::Expired => Duration::ZERO,
            RefusalReason::Rate => self.rate,
            RefusalReason::Circuit => self.circuit,
        }
    }
}

impl Default for RetryAfter {
    fn default() -> Self {
        RetryAfter {
            capacity: Duration::from_secs(1),
            rate: Duration::from_secs(1),
            circuit: Duration::from_secs(30),
        }
    }
}

/// The retry-reappearance tracker (see [`Reappearance`](crate::Reappearance)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReappearanceConfig {
    /// How long a shed id is remembered: a request with that id arriving within it counts as
    /// a reappearance. Allowed 1 s to 1 hour. Default 10 s (covers a client that honours a
    /// `Retry-After` of up to 3 s and backs off a few times).
    pub window: Duration,
    /// The most ids remembered at once, across the window's slices. Allowed 16 to 2^24.
    /// Default 65,536 (about 1.4 MiB, see [`Reappearance`](crate::Reappearance)).
    pub max_ids: NonZeroUsize,
}

impl Default for ReappearanceConfig {
    fn default() -> Self {
        ReappearanceConfig {
            window: Duration::from_secs(10),
            max_ids: NonZeroUsize::new(65_536).expect("non-zero"),
        }
    }
}

impl Default for TriageConfig {
    fn default() -> Self {
        TriageConfig {
            queue: WfqConfig::default(),
            default_tier: Criticality::Medium,
            tier_window: PerTier::new(
                Duration::from_millis(1_000),
                Duration::from_millis(500),
                Duration::from_millis(250),
                Duration::from_millis(100),
            ),
            retry_after: RetryAfter::default(),
            retry_after_jitter: Duration::from_secs(2),
            never_shed: vec!["/healthz".into(), "/readyz".into(), "/metrics".into()],
            reappearance: ReappearanceConfig::default(),
        }
    }
}

const HOUR: Duration = Duration::from_secs(3600);

fn check(
    field: impl Into<String>,
    value: Duration,
    min: Duration,
    max: Duration,
    allowed: &str,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(
            field.into(),
            format!("{value:?}"),
            allowed.to_owned(),
        ));
    }
    Ok(())
}

impl TriageConfig {
    /// Checks every field against its documented range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range, its value and the range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.queue.validate()?;
        for tier in Criticality::ALL {
            check(
                format!("tier_window.{}", tier.as_str()),
                self.tier_window[tier],
                Duration::from_millis(1),
                HOUR,
                "1ms..=1h",
            )?;
        }
        for reason in RefusalReason::ALL {
            if !reason.invites_retry() {
                continue;
            }
            check(
                format!("retry_after.{}", reason.as_str()),
                self.retry_after.of(reason),
                Duration::from_secs(1),
                triage::wire::MAX_RETRY_AFTER,
                "1s..=1d",
            )?;
        }
        check(
            "retry_after_jitter",
            self.retry_after_jitter,
            Duration::ZERO,
            HOUR,
            "0s..=1h",
        )?;
        check(
            "reappearance.window",
            self.reappearance.window,
            Duration::from_secs(1),
            HOUR,
            "1s..=1h",
        )?;
        let ids = self.reappearance.max_ids.get();
        if !(16..=1 << 24).contains(&ids) {
            return Err(ConfigError::new(
                "reappearance.max_ids",
                ids.to_string(),
                "16..=16777216",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_errors_name_the_field() {
        TriageConfig::default().validate().unwrap();
        let mut c = TriageConfig::default();
        c.retry_after.circuit = Duration::from_millis(10);
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains("retry_after.circuit"), "{e}");
        let mut c = TriageConfig::default();
        c.tier_window.high = Duration::ZERO;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("tier_window.high"));
        let mut c = TriageConfig::default();
        c.reappearance.max_ids = NonZeroUsize::new(3).unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("reappearance.max_ids"));
    }
}
