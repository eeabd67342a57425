//! Configuration of queue-age admission.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{ConfigError, Criticality, PerTier};

/// Largest cut-off accepted, in milliseconds (one hour): beyond it admission is off in all but
/// name, so a typo is more likely than intent.
pub const MAX_CUTOFF_MS: u64 = 3_600_000;

/// Queue-age admission: each tier is admitted only while the queue age it sees is below its
/// cut-off.
///
/// Defaults come from the criticality-ladder load-shedding article: Critical 400 ms, High 200 ms,
/// Medium 80 ms, Sheddable 20 ms, and re-admission once the signal falls to half the cut-off.
///
/// # Examples
///
/// ```
/// use triage::admission::QueueAgeConfig;
///
/// let config: QueueAgeConfig = toml::from_str(
///     "enabled = true\nexit_ratio = 0.6\n[cutoff_ms]\ncritical = 500\nhigh = 250\nmedium = 100\nsheddable = 25\n",
/// )?;
/// config.validate()?;
/// assert_eq!(config.cutoff(triage::Criticality::High).as_millis(), 250);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueAgeConfig {
    /// Whether queue-age admission refuses anything at all. Default `true`. When `false` the
    /// queue is bounded only by its capacity.
    pub enabled: bool,
    /// Per-tier cut-off on queue age, in milliseconds. A tier is refused once the queue age it
    /// sees reaches its cut-off. Allowed `1..=3_600_000`, non-increasing from Critical down to
    /// Sheddable. Default `400 / 200 / 80 / 20`.
    pub cutoff_ms: PerTier<u64>,
    /// Hysteresis: a refused tier is admitted again once its queue age falls to
    /// `exit_ratio × cut-off` or below. Allowed `0.0..1.0` (a ratio of 1.0 would flap on every
    /// sample around the cut-off). Default `0.5`.
    pub exit_ratio: f64,
}

impl Default for QueueAgeConfig {
    fn default() -> Self {
        QueueAgeConfig {
            enabled: true,
            cutoff_ms: PerTier::new(400, 200, 80, 20),
            exit_ratio: 0.5,
        }
    }
}

impl QueueAgeConfig {
    /// Queue-age admission switched off.
    pub fn disabled() -> Self {
        QueueAgeConfig {
            enabled: false,
            ..QueueAgeConfig::default()
        }
    }

    /// The cut-off of `tier` as a duration.
    pub fn cutoff(&self, tier: Criticality) -> Duration {
        Duration::from_millis(self.cutoff_ms[tier])
    }

    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range (paths relative to this table,
    /// e.g. `cutoff_ms.high`): a cut-off of 0 or above one hour, cut-offs that increase from a
    /// higher tier to a lower one, or an `exit_ratio` outside `0.0..1.0`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (tier, &ms) in self.cutoff_ms.iter() {
            if !(1..=MAX_CUTOFF_MS).contains(&ms) {
                return Err(ConfigError::new(
                    format!("cutoff_ms.{tier}"),
                    ms,
                    format!("1..={MAX_CUTOFF_MS}"),
                ));
            }
        }
        for pair in Criticality::ALL.windows(2) {
            let (upper, lower) = (pair[0], pair[1]);
            if self.cutoff_ms[lower] > self.cutoff_ms[upper] {
                return Err(ConfigError::new(
                    format!("cutoff_ms.{lower}"),
                    self.cutoff_ms[lower],
                    format!(
                        "1..={} (at most cutoff_ms.{upper}: a lower tier is shed first)",
                        self.cutoff_ms[upper]
                    ),
                ));
            }
        }
        if !(0.0..1.0).contains(&self.exit_ratio) {
            return Err(ConfigError::new(
                "exit_ratio",
                self.exit_ratio,
                "0.0..1.0 (exclusive of 1.0)",
            ));
        }
        Ok(())
    }
}
