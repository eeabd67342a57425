//! The classifier's configuration: how a delivery's criticality ([`ClassifyConfig`], with
//! its [`PriorityMapping`]) and deadline ([`DeadlineConfig`]) are chosen (see `classify.rs`).

use serde::{Deserialize, Serialize};
use triage::{ConfigError, Criticality, PerTier};

/// How a delivery is given its criticality, from its properties and headers only.
///
/// In order: on a queue listed in `trusted_queues`, the
/// [`triage-criticality`](triage::wire::CRITICALITY) header (a tier name, any ASCII case);
/// otherwise, or without that header, the AMQP `priority` property through
/// `priority`; otherwise `default_tier`. A trusted header that names no tier, or is not a
/// string, also gives `default_tier`. Every use of `default_tier` is counted in
/// `triage_amqp_unclassified_total{reason}` with `missing`, `unknown` or `malformed`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassifyConfig {
    /// Priority bands. Default `0..=2` Sheddable, `3..=4` Medium, `5..=7` High, `8..=255`
    /// Critical.
    pub priority: PriorityMapping,
    /// Queues whose publishers are trusted to set `triage-criticality`. Default none: anyone who can
    /// publish could otherwise make their messages critical.
    pub trusted_queues: Vec<String>,
    /// Tier of deliveries with no usable label. Default `medium`.
    pub default_tier: Criticality,
    /// Every delivery gets this tier, whatever its priority or header say. Default none.
    pub fixed_tier: Option<Criticality>,
}

impl Default for ClassifyConfig {
    fn default() -> Self {
        ClassifyConfig {
            priority: PriorityMapping::default(),
            trusted_queues: Vec::new(),
            default_tier: Criticality::Medium,
            fixed_tier: None,
        }
    }
}

/// AMQP priority (`0..=255`) to criticality, by the top of each band: priorities up to
/// `sheddable_max` are Sheddable, up to `medium_max` Medium, up to `high_max` High, above
/// Critical.
///
/// # Examples
///
/// ```
/// use triage::Criticality;
/// use triage_amqp::PriorityMapping;
///
/// let m = PriorityMapping::default();
/// assert_eq!(m.map(0), Criticality::Sheddable);
/// assert_eq!(m.map(4), Criticality::Medium);
/// assert_eq!(m.map(7), Criticality::High);
/// assert_eq!(m.map(200), Criticality::Critical);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PriorityMapping {
    /// Highest Sheddable priority. Default 2.
    pub sheddable_max: u8,
    /// Highest Medium priority. Default 4.
    pub medium_max: u8,
    /// Highest High priority. Default 7; everything above is Critical.
    pub high_max: u8,
}

impl Default for PriorityMapping {
    fn default() -> Self {
        PriorityMapping {
            sheddable_max: 2,
            medium_max: 4,
            high_max: 7,
        }
    }
}

impl PriorityMapping {
    /// The tier of `priority`.
    pub fn map(&self, priority: u8) -> Criticality {
        if priority <= self.sheddable_max {
            Criticality::Sheddable
        } else if priority <= self.medium_max {
            Criticality::Medium
        } else if priority <= self.high_max {
            Criticality::High
        } else {
            Criticality::Critical
        }
    }

    /// Checks that the bands are non-empty: `sheddable_max < medium_max < high_max < 255`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first band top out of order.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.medium_max <= self.sheddable_max {
            return Err(ConfigError::new(
                "medium_max",
                self.medium_max,
                format!(
                    "{}..=253 (above sheddable_max)",
                    self.sheddable_max.saturating_add(1)
                ),
            ));
        }
        if self.high_max <= self.medium_max || self.high_max == u8::MAX {
            return Err(ConfigError::new(
                "high_max",
                self.high_max,
                format!(
                    "{}..=254 (above medium_max)",
                    self.medium_max.saturating_add(1)
                ),
            ));
        }
        Ok(())
    }
}

/// How a delivery is given its deadline, from its properties and headers only.
///
/// The [`triage-deadline-ms`](triage::wire::DEADLINE_MS) header (absolute Unix time in
/// milliseconds, an AMQP integer or a decimal string) wins when present and valid. Otherwise the earliest of: the `timestamp` property (Unix
/// seconds, as AMQP defines it) plus the tier's window in `timestamp_window_ms`, and, when
/// `use_expiration` is on, the `expiration` property (a TTL in milliseconds) counted from
/// the timestamp or, without one, from receipt. None of them: no deadline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadlineConfig {
    /// Usefulness window after the `timestamp` property, per tier, in milliseconds. Default
    /// none for every tier (the timestamp alone gives no deadline). Allowed
    /// `1..=31_536_000_000` (a year).
    pub timestamp_window_ms: PerTier<Option<u64>>,
    /// Whether the `expiration` property gives a deadline. Default `true`.
    pub use_expiration: bool,
}

impl Default for DeadlineConfig {
    fn default() -> Self {
        DeadlineConfig {
            timestamp_window_ms: PerTier::splat(None),
            use_expiration: true,
        }
    }
}
