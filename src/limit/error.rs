//! The one error this module returns: a configuration value outside its allowed range.

/// A limit or share setting is out of range.
///
/// Displays as `"<field> = <value> is out of range: allowed <range>"`, e.g.
/// `limit.backoff_ratio = 1.5 is out of range: allowed (0, 1)`, so that an
/// operator can find the offending key in the config file without reading code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value} is out of range: allowed {allowed}")]
#[non_exhaustive]
pub struct LimitConfigError {
    /// Dotted config path of the offending field, e.g. `limit.backoff_ratio`.
    pub field: &'static str,
    /// The rejected value, formatted with `Display`.
    pub value: String,
    /// The allowed range in interval notation, e.g. `(0, 1)` or `[1, 200]`.
    pub allowed: String,
}

impl LimitConfigError {
    pub(crate) fn new(
        field: &'static str,
        value: impl std::fmt::Display,
        allowed: impl Into<String>,
    ) -> Self {
        Self {
            field,
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// Largest limit any algorithm accepts. Far above any real worker's concurrency;
/// it exists so that `f64` arithmetic on limits stays exact and a typo such as
/// `max = 20000000000` is caught at startup rather than silently meaning "no limit".
pub const MAX_LIMIT: usize = 1_000_000;

/// Checks the shared `initial`/`min`/`max` triple of the adaptive algorithms.
pub(crate) fn check_bounds(
    prefix: Fields,
    initial: usize,
    min: usize,
    max: usize,
) -> Result<(), LimitConfigError> {
    if !(1..=MAX_LIMIT).contains(&min) {
        return Err(LimitConfigError::new(
            prefix.min,
            min,
            format!("[1, {MAX_LIMIT}]"),
        ));
    }
    if !(min..=MAX_LIMIT).contains(&max) {
        return Err(LimitConfigError::new(
            prefix.max,
            max,
            format!("[{min} (min), {MAX_LIMIT}]"),
        ));
    }
    if !(min..=max).contains(&initial) {
        return Err(LimitConfigError::new(
            prefix.initial,
            initial,
            format!("[{min} (min), {max} (max)]"),
        ));
    }
    Ok(())
}

/// Field names of one algorithm's bounds, for error messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fields {
    pub(crate) initial: &'static str,
    pub(crate) min: &'static str,
    pub(crate) max: &'static str,
}

/// A limit setting out of range is a configuration error like any other, naming the same field.
impl From<LimitConfigError> for crate::ConfigError {
    fn from(e: LimitConfigError) -> Self {
        crate::ConfigError::new(e.field, e.value, e.allowed)
    }
}
