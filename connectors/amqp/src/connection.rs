//! Connecting to RabbitMQ on tokio, and the schedule of reconnection attempts.
//!
//! Backoff follows "Exponential Backoff And Jitter" (AWS Architecture Blog, 2015), *full
//! jitter*: after `n` failures in a row the next attempt waits a uniformly random time in
//! `[0, min(max, initial * 2^n)]`. Many consumers losing the same broker then come back spread
//! out instead of in lockstep. The schedule is the core's one helper,
//! [`BackoffConfig::backoff`], the one the runtime's handler retries use, not a copy.

use std::time::Duration;

use lapin::{Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use triage::runtime::BackoffConfig;
use triage::ConfigError;

/// How to retry a lost connection.
///
/// # Examples
///
/// ```
/// use triage_amqp::ReconnectConfig;
///
/// let config: ReconnectConfig = toml::from_str("initial_backoff_ms = 50")?;
/// assert_eq!(config.initial_backoff_ms, 50);
/// assert_eq!(config.max_backoff_ms, 10_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconnectConfig {
    /// Upper bound of the first retry's random wait, in milliseconds. Default 100.
    pub initial_backoff_ms: u64,
    /// Cap on the upper bound of any retry's random wait, in milliseconds. Default 10,000.
    pub max_backoff_ms: u64,
    /// Time allowed for the TCP connect and the AMQP handshake, in milliseconds.
    /// Default 5,000.
    pub connect_timeout_ms: u64,
}

impl Default for ReconnectConfig {
    fn default() -> Self {
        ReconnectConfig {
            initial_backoff_ms: 100,
            max_backoff_ms: 10_000,
            connect_timeout_ms: 5_000,
        }
    }
}

impl ReconnectConfig {
    /// Checks the ranges: `initial_backoff_ms` in `1..=max_backoff_ms`, `max_backoff_ms` at
    /// most one hour, `connect_timeout_ms` in `1..=600000`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first field out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_backoff_ms == 0 || self.max_backoff_ms > 3_600_000 {
            return Err(ConfigError::new(
                "max_backoff_ms",
                self.max_backoff_ms,
                "1..=3600000",
            ));
        }
        if self.initial_backoff_ms == 0 || self.initial_backoff_ms > self.max_backoff_ms {
            return Err(ConfigError::new(
                "initial_backoff_ms",
                self.initial_backoff_ms,
                format!("1..={}", self.max_backoff_ms),
            ));
        }
        if self.connect_timeout_ms == 0 || self.connect_timeout_ms > 600_000 {
            return Err(ConfigError::new(
                "connect_timeout_ms",
                self.connect_timeout_ms,
                "1..=600000",
            ));
        }
        Ok(())
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// The wait before the next attempt after `failures` failed attempts in a row (0 after a
    /// loss, before the first attempt): full jitter below `min(max, initial * 2^failures)`.
    pub fn backoff(&self, failures: u32) -> Duration {
        BackoffConfig {
            base_backoff_ms: self.initial_backoff_ms.max(1),
            max_backoff_ms: self.max_backoff_ms.max(1),
        }
        .backoff(failures)
    }
}

/// Opens a connection on the current tokio runtime, bounded by the connect timeout.
pub(crate) async fn connect(
    uri: &str,
    name: &str,
    config: &ReconnectConfig,
) -> Result<Connection, lapin::Error> {
    let properties = ConnectionProperties::default()
        .with_connection_name(name.into())
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    match tokio::time::timeout(
        config.connect_timeout(),
        Connection::connect(uri, properties),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(lapin::Error::from(lapin::ErrorKind::IOError(
            std::sync::Arc::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connect timed out",
            )),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_bound_doubles_up_to_the_cap() {
        let c = ReconnectConfig {
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
            connect_timeout_ms: 1,
        };
        for (failures, bound) in [
            (0, 100),
            (1, 200),
            (2, 400),
            (3, 800),
            (4, 1_000),
            (60, 1_000),
        ] {
            let most = (0..200).map(|_| c.backoff(failures)).max().unwrap();
            assert!(most <= Duration::from_millis(bound), "{failures}: {most:?}");
            assert!(
                most > Duration::from_millis(bound / 2),
                "{failures}: {most:?}"
            );
        }
    }

    #[test]
    fn validate_names_the_field() {
        let bad = ReconnectConfig {
            initial_backoff_ms: 20_000,
            ..ReconnectConfig::default()
        };
        let err = bad.validate().unwrap_err();
        assert_eq!(err.field(), "initial_backoff_ms");
        assert_eq!(err.allowed(), "1..=10000");
        assert!(ReconnectConfig::default().validate().is_ok());
    }
}
