//! Configuration of circuit-breaker-aware admission.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Settings shared by every downstream's circuit breaker (see
/// [`Breakers`](super::Breakers)). The `[breaker]` table of a
/// [`RuntimeConfig`](crate::runtime::RuntimeConfig).
///
/// # Examples
///
/// ```
/// use triage::admission::BreakerConfig;
///
/// let config: BreakerConfig = toml::from_str("failure_rate = 0.25\nrecovery_ms = 10000\n")?;
/// config.validate()?;
/// assert_eq!(config.min_calls, 20);
///
/// let bad: BreakerConfig = toml::from_str("failure_rate = 1.5")?;
/// assert_eq!(bad.validate().unwrap_err().field(), "failure_rate");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Whether messages are mapped to downstream keys and refused while their key's circuit
    /// is open. When `false` the runtime never calls the downstream mapping and reports from
    /// handlers are ignored. Default `true` (inert until a mapping is given with
    /// [`RuntimeBuilder::downstream`](crate::runtime::RuntimeBuilder::downstream) or a handler
    /// reports a [`HandlerError::downstream`](crate::runtime::HandlerError::downstream)).
    pub enabled: bool,
    /// A closed circuit opens when, over the last `window_ms`, at least `min_calls` calls were
    /// recorded for its key and this fraction or more of them failed. A fraction. Allowed
    /// `0.0 < failure_rate <= 1.0`. Default `0.5`.
    pub failure_rate: f64,
    /// The sliding window the failure rate is measured over, in milliseconds (ten buckets of a
    /// tenth each). Allowed `100..=3_600_000`. Default `10_000`.
    pub window_ms: u64,
    /// Calls within the window before the failure rate may open the circuit: a handful of
    /// failures on a quiet key is not a dependency outage. Allowed `1..=1_000_000`. Default
    /// `20`.
    #[serde(deserialize_with = "crate::config_de::int::<_, _, 1, 1_000_000>")]
    pub min_calls: u32,
    /// How long an open circuit refuses its key's messages before half-open probes are let
    /// through, in milliseconds. Allowed `1..=3_600_000`. Default `5_000`.
    pub recovery_ms: u64,
    /// Probe calls a half-open circuit lets through; it closes after this many succeed, and
    /// opens again (for another `recovery_ms`) at the first that fails. Messages beyond the
    /// probes are refused while they are under way. Allowed `1..=10_000`. Default `3`.
    #[serde(deserialize_with = "crate::config_de::int::<_, _, 1, 10_000>")]
    pub half_open_probes: u32,
    /// Downstream keys tracked at most. A message whose key is not yet tracked once this many
    /// are is admitted as if it had no key (counted in `triage_breaker_untracked_total`): a key
    /// taken from message content must not grow memory without bound. Lowered live, closed
    /// circuits stop being tracked down to the new bound at once; open and half-open ones are
    /// kept until they close. Allowed `1..=100_000`. Default `1024`.
    #[serde(deserialize_with = "crate::config_de::int::<_, _, 1, 100_000>")]
    pub max_keys: usize,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            enabled: true,
            failure_rate: 0.5,
            window_ms: 10_000,
            min_calls: 20,
            recovery_ms: 5_000,
            half_open_probes: 3,
            max_keys: 1024,
        }
    }
}

impl BreakerConfig {
    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range (paths relative to this table).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.failure_rate > 0.0 && self.failure_rate <= 1.0) {
            return Err(ConfigError::new(
                "failure_rate",
                self.failure_rate,
                "0.0 < failure_rate <= 1.0",
            ));
        }
        if !(100..=3_600_000).contains(&self.window_ms) {
            return Err(ConfigError::new(
                "window_ms",
                self.window_ms,
                "100..=3600000",
            ));
        }
        if !(1..=1_000_000).contains(&self.min_calls) {
            return Err(ConfigError::new("min_calls", self.min_calls, "1..=1000000"));
        }
        if !(1..=3_600_000).contains(&self.recovery_ms) {
            return Err(ConfigError::new(
                "recovery_ms",
                self.recovery_ms,
                "1..=3600000",
            ));
        }
        if !(1..=10_000).contains(&self.half_open_probes) {
            return Err(ConfigError::new(
                "half_open_probes",
                self.half_open_probes,
                "1..=10000",
            ));
        }
        if !(1..=100_000).contains(&self.max_keys) {
            return Err(ConfigError::new("max_keys", self.max_keys, "1..=100000"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_each_bound_is_named() {
        BreakerConfig::default().validate().unwrap();
        type Break = fn(&mut BreakerConfig);
        let cases: [(&str, Break); 7] = [
            ("failure_rate", |c| c.failure_rate = 0.0),
            ("failure_rate", |c| c.failure_rate = f64::NAN),
            ("window_ms", |c| c.window_ms = 99),
            ("min_calls", |c| c.min_calls = 0),
            ("recovery_ms", |c| c.recovery_ms = 0),
            ("half_open_probes", |c| c.half_open_probes = 10_001),
            ("max_keys", |c| c.max_keys = 0),
        ];
        for (field, break_it) in cases {
            let mut c = BreakerConfig::default();
            break_it(&mut c);
            let err = c.validate().unwrap_err();
            assert_eq!(err.field(), field, "{err}");
        }
    }
}
