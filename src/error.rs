//! Errors shared by every component's configuration.

use std::fmt;

/// A configuration value outside its allowed range, or a field that no longer exists.
///
/// The message names the field by its path in the config file, the value given, and the range
/// allowed, e.g. `expert.queue.weights.high = 0 is out of range: allowed 1..=1000`; for a field
/// that no longer exists, what replaced it ([`ConfigError::replaced`]).
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
/// assert_eq!(err.allowed(), "1..=400 (at most cutoff_ms.critical: a lower tier is shed first)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    value: String,
    allowed: String,
    replaced: bool,
    /// Where the field lives now, when the file wrote it at its place in the layout before the
    /// expert group (`field` is then the path as written).
    moved_to: Option<String>,
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
            replaced: false,
            moved_to: None,
        }
    }

    /// A `field` (its path in the config file) that no longer exists, with what replaced it:
    /// `replacement` says what to write instead, e.g. ``write `expert.queue` only``.
    pub fn replaced(field: impl Into<String>, replacement: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            value: String::new(),
            allowed: replacement.into(),
            replaced: true,
            moved_to: None,
        }
    }

    /// Path of the offending field, e.g. `queue.capacity`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The value that was given, as text (empty for a field that no longer exists).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The allowed range or set, as text; for a field that no longer exists, what replaced it.
    pub fn allowed(&self) -> &str {
        &self.allowed
    }

    /// A `field` written at its place in the layout before the expert group and also at its
    /// new place `now`: which of the two to keep would be a guess.
    pub(crate) fn given_twice(field: impl Into<String>, now: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            value: String::new(),
            allowed: String::new(),
            replaced: true,
            moved_to: Some(now.into()),
        }
    }

    /// Where the field lives now, when the file named it at its place in the layout before
    /// the expert group ([`field`](Self::field) is then the path as written), e.g.
    /// `expert.queue.capacity` for a file's `queue.capacity`.
    pub fn moved_to(&self) -> Option<&str> {
        self.moved_to.as_deref()
    }

    /// The same error for a field the file wrote at `written` (its old place), which lives at
    /// `now`.
    #[must_use]
    pub(crate) fn written_at(mut self, written: String, now: String) -> Self {
        self.field = written;
        self.moved_to = Some(now);
        self
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
        if self.replaced {
            return match &self.moved_to {
                Some(now) => write!(
                    f,
                    "{} is given at its old place and at its new one, `{now}`: write it there \
                     only",
                    self.field
                ),
                None => write!(f, "{} no longer exists: {}", self.field, self.allowed),
            };
        }
        write!(
            f,
            "{} = {} is out of range: allowed {}",
            self.field, self.value, self.allowed
        )?;
        if let Some(now) = &self.moved_to {
            write!(f, " (the setting is now `{now}`: write it there)")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
