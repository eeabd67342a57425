//! Configuration of the memory budget.

use serde::{Deserialize, Serialize};

use crate::{ConfigError, Criticality, PerTier};

/// Largest budget accepted, in bytes (1 PiB).
pub const MAX_BUDGET_BYTES: u64 = 1 << 50;

/// A budget on the payload bytes the process holds, with a threshold per tier (seeds 001 and
/// 002: memory pressure as a shedding signal, "prevents OOM kills"; Envoy's overload manager
/// triggers its actions at fractions of a fixed heap size).
///
/// ```toml
/// [memory]
/// budget_bytes = 67108864        # 64 MiB
/// [memory.thresholds]            # fractions of the budget
/// critical = 1.0
/// high = 0.85
/// medium = 0.7
/// sheddable = 0.5
/// ```
///
/// # Examples
///
/// ```
/// use triage::admission::MemoryConfig;
/// use triage::Criticality;
///
/// let config: MemoryConfig = toml::from_str("budget_bytes = 1000\n")?;
/// config.validate()?;
/// assert_eq!(config.limit_bytes(Criticality::Medium), Some(700));
///
/// let bad: MemoryConfig = toml::from_str("budget_bytes = 1000\n[thresholds]\ncritical = 1.0\nhigh = 0.5\nmedium = 0.7\nsheddable = 0.5\n")?;
/// assert_eq!(bad.validate().unwrap_err().field(), "thresholds.medium");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// The budget on the payload bytes (each message's `size_bytes`) the process holds at once:
    /// queued, held under backpressure, deferring, waiting to retry and in a handler. In bytes.
    /// Allowed `1..=2^50`. Default none (no budget).
    pub budget_bytes: Option<u64>,
    /// Per tier, the fraction of the budget above which its new messages are refused with
    /// reason `memory`. Allowed `0.0 < t <= 1.0`, non-increasing from Critical down to
    /// Sheddable. Default `1.0 / 0.85 / 0.70 / 0.50`.
    pub thresholds: PerTier<f64>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            budget_bytes: None,
            thresholds: PerTier::new(1.0, 0.85, 0.70, 0.50),
        }
    }
}

impl MemoryConfig {
    /// The bytes above which `tier` is refused (`threshold × budget`, rounded down); `None`
    /// without a budget.
    pub fn limit_bytes(&self, tier: Criticality) -> Option<u64> {
        self.budget_bytes
            .map(|b| (b as f64 * self.thresholds[tier]).floor() as u64)
    }

    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range (paths relative to this table):
    /// a budget of 0 or above 2^50, a threshold outside `0.0 < t <= 1.0`, or a lower tier's
    /// threshold above a higher one's.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(b) = self.budget_bytes {
            if !(1..=MAX_BUDGET_BYTES).contains(&b) {
                return Err(ConfigError::new(
                    "budget_bytes",
                    b,
                    format!("1..={MAX_BUDGET_BYTES} (bytes)"),
                ));
            }
        }
        for (tier, &t) in self.thresholds.iter() {
            if !(t > 0.0 && t <= 1.0) {
                return Err(ConfigError::new(
                    format!("thresholds.{tier}"),
                    t,
                    "0.0 < threshold <= 1.0 (a fraction of budget_bytes)",
                ));
            }
        }
        for pair in Criticality::ALL.windows(2) {
            let (upper, lower) = (pair[0], pair[1]);
            if self.thresholds[lower] > self.thresholds[upper] {
                return Err(ConfigError::new(
                    format!("thresholds.{lower}"),
                    self.thresholds[lower],
                    format!(
                        "0.0 < threshold <= {} (at most thresholds.{upper}: a lower tier is refused first)",
                        self.thresholds[upper]
                    ),
                ));
            }
        }
        Ok(())
    }
}
