//! The `limit` config section: which algorithm, and its parameters.
//!
//! ```toml
//! [limit]
//! kind = "fixed"
//! limit = 8
//! ```
//! ```toml
//! [limit]
//! kind = "aimd"        # initial = 20, min = 1, max = 200, backoff_ratio = 0.9, timeout_ms = 5000
//! ```
//! ```toml
//! [limit]
//! kind = "gradient2"   # initial = 20, min = 1, max = 200, tolerance = 1.5, smoothing = 0.2,
//!                      # long_window = 600, short_window = 1, queue_size = √limit if absent
//! ```
//!
//! Unknown keys are rejected, so a misspelt parameter fails at startup instead of
//! silently taking its default.

use serde::{Deserialize, Serialize};

use super::aimd::{Aimd, AimdConfig};
use super::error::LimitConfigError;
use super::fixed::Fixed;
use super::gradient2::{Gradient2, Gradient2Config};
use super::Limiter;

/// Which limit algorithm to run, tagged by `kind`.
///
/// The default is `aimd` with its defaults: it backs off only on explicit
/// overload signals (drops, timeouts), so it never sheds work because job
/// latencies are merely noisy; choose `gradient2` to react to queueing before
/// anything fails.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum LimitConfig {
    /// A static limit; see [`Fixed`].
    Fixed {
        /// Concurrent jobs. No default: a fixed limit must be chosen. Allowed
        /// `[1, MAX_LIMIT]`.
        limit: usize,
    },
    /// Additive-increase / multiplicative-decrease; see [`Aimd`].
    Aimd(AimdConfig),
    /// Latency gradient; see [`Gradient2`].
    Gradient2(Gradient2Config),
}

impl Default for LimitConfig {
    fn default() -> Self {
        LimitConfig::Aimd(AimdConfig::default())
    }
}

impl LimitConfig {
    /// Checks every field against its documented range.
    ///
    /// # Errors
    ///
    /// [`LimitConfigError`] naming the first offending field and its allowed
    /// range, e.g. `limit.backoff_ratio = 1.5 is out of range: allowed (0, 1)`.
    pub fn validate(&self) -> Result<(), LimitConfigError> {
        self.build().map(|_| ())
    }

    /// Validates and builds the configured algorithm, at its initial limit.
    ///
    /// # Errors
    ///
    /// As [`validate`](Self::validate).
    ///
    /// # Example
    ///
    /// ```
    /// use triage::limit::{AimdConfig, LimitConfig};
    ///
    /// let limiter = LimitConfig::Aimd(AimdConfig { initial: 10, ..AimdConfig::default() }).build()?;
    /// assert_eq!(limiter.limit(), 10);
    /// # Ok::<(), triage::limit::LimitConfigError>(())
    /// ```
    pub fn build(&self) -> Result<Limiter, LimitConfigError> {
        Ok(match self {
            LimitConfig::Fixed { limit } => Limiter::Fixed(Fixed::new(*limit)?),
            LimitConfig::Aimd(c) => Limiter::Aimd(Aimd::new(c.clone())?),
            LimitConfig::Gradient2(c) => Limiter::Gradient2(Gradient2::new(c.clone())?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_each_kind() {
        assert!(LimitConfig::default().validate().is_ok());
        assert_eq!(LimitConfig::default().build().unwrap().limit(), 20);
        assert_eq!(LimitConfig::Fixed { limit: 8 }.build().unwrap().limit(), 8);
        let e = LimitConfig::Fixed { limit: 0 }.validate().unwrap_err();
        assert_eq!(e.field, "limit.limit");

        let e = LimitConfig::Aimd(AimdConfig {
            backoff_ratio: 1.5,
            ..AimdConfig::default()
        })
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "limit.backoff_ratio = 1.5 is out of range: allowed (0, 1)"
        );

        let e = LimitConfig::Gradient2(Gradient2Config {
            initial: 0,
            ..Gradient2Config::default()
        })
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "limit.initial = 0 is out of range: allowed [1 (min), 200 (max)]"
        );
        let g = LimitConfig::Gradient2(Gradient2Config {
            initial: 7,
            ..Gradient2Config::default()
        })
        .build()
        .unwrap();
        assert!(matches!(g, Limiter::Gradient2(_)));
        assert_eq!(g.limit(), 7);
    }
}
