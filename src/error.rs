//! Errors shared by every component's configuration.

use std::fmt;

/// A configuration value outside its allowed range.
///
/// The message names the field by its path in the config file, the value given, and the range
/// allowed, e.g. `queue.weights.high = 0 is out of range: allowed 1..=1000`.
///
/// # Examples
///
/// ```
/// use triage::queue::WfqConfig;
///
/// let mut config = WfqConfig::default();
/// config.admission.cutoff_ms.high = 900; // above critical's 400
/// let err = config.validate().unwrap_err();
/// assert_eq!(err.field(), "queue.admission.cutoff_ms.high");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    value: String,
    allowed: String,
}

impl ConfigError {
    /// A value of `field` (its path in the config file) that is outside `allowed`.
    pub fn new(
        field: impl Into<String>,
        value: impl fmt::Display,
        allowed: impl Into<String>,
    ) -> Self {
        ConfigError {
            field: field.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }

    /// Path of the offending field, e.g. `queue.capacity`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The value that was given, as text.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The allowed range or set, as text.
    pub fn allowed(&self) -> &str {
        &self.allowed
    }

    /// The same error with `prefix.` put in front of the field path.
    #[must_use]
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = format!("{prefix}.{}", self.field);
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {} is out of range: allowed {}",
            self.field, self.value, self.allowed
        )
    }
}

impl std::error::Error for ConfigError {}
