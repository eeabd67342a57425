//! Configuration of the weighted-fair queue.

use std::fmt;
use std::num::{NonZeroU32, NonZeroUsize};

use serde::{Deserialize, Serialize};

use crate::admission::QueueAgeConfig;
use crate::{ConfigError, PerTier};

/// Largest weight accepted. Weights are ratios, so 1000 levels are plenty; the bound keeps the
/// scheduler's integer strides exact enough (see the `scheduler` module).
pub const MAX_WEIGHT: u32 = 1000;

/// Largest capacity accepted, in items: 2^32. A queue that large is a design error, not a
/// buffer.
pub const MAX_CAPACITY: usize = 1 << 32;

/// A tier's weight in the weighted-fair schedule: with every tier backlogged, a tier receives
/// `weight / sum(weights)` of the dequeues. Always in `1..=1000`.
///
/// # Examples
///
/// ```
/// use triage::queue::Weight;
///
/// assert_eq!(Weight::new(8).unwrap().get(), 8);
/// assert!(Weight::new(0).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "u32")]
pub struct Weight(NonZeroU32);

impl Weight {
    /// A weight of `value`.
    ///
    /// # Errors
    ///
    /// [`WeightError`] when `value` is outside `1..=1000`.
    pub fn new(value: i64) -> Result<Weight, WeightError> {
        u32::try_from(value)
            .ok()
            .filter(|v| *v <= MAX_WEIGHT)
            .and_then(NonZeroU32::new)
            .map(Weight)
            .ok_or(WeightError(value))
    }

    /// The weight as a number.
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

impl TryFrom<i64> for Weight {
    type Error = WeightError;

    fn try_from(value: i64) -> Result<Self, Self::Error> {
        Weight::new(value)
    }
}

impl From<Weight> for u32 {
    fn from(w: Weight) -> u32 {
        w.get()
    }
}

/// A weight outside `1..=1000`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightError(i64);

impl fmt::Display for WeightError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "weight {} is out of range: allowed 1..={MAX_WEIGHT}",
            self.0
        )
    }
}

impl std::error::Error for WeightError {}

fn default_weights() -> PerTier<Weight> {
    PerTier::new(8, 4, 2, 1).map(|_, w| Weight(NonZeroU32::new(w).unwrap_or(NonZeroU32::MIN)))
}

/// Configuration of a [`WfqQueue`](crate::queue::WfqQueue): plain public fields, built with
/// struct-update syntax over [`Default`] (`WfqConfig { capacity, ..WfqConfig::default() }`).
///
/// # Examples
///
/// ```
/// use triage::queue::WfqConfig;
///
/// let config: WfqConfig = toml::from_str(r#"
///     capacity = 1000
///     max_bytes = 67108864
///     [weights]
///     critical = 8
///     high = 4
///     medium = 2
///     sheddable = 1
///     [admission.cutoff_ms]
///     critical = 400
///     high = 200
///     medium = 80
///     sheddable = 20
/// "#)?;
/// config.validate()?;
/// assert_eq!(config.capacity.get(), 1000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WfqConfig {
    /// Most items held across all tiers, in items. Allowed `1..=2^32`. Default `1024`.
    #[serde(deserialize_with = "crate::config_de::count::<_, MAX_CAPACITY>")]
    pub capacity: NonZeroUsize,
    /// Optional budget on the summed `size_bytes` of held items, in bytes. `None` (the default)
    /// bounds by count only, whatever the sizes (even sizes adding up past `usize::MAX`). In a
    /// file: leave the key out for none; a value is `1..=2^63-1`.
    #[serde(deserialize_with = "crate::config_de::budget_bytes")]
    pub max_bytes: Option<NonZeroUsize>,
    /// Dequeue weight per tier, `1..=1000` each. Default `8 / 4 / 2 / 1`.
    pub weights: PerTier<Weight>,
    /// Queue-age admission at push. Default: enabled with cut-offs 400 / 200 / 80 / 20 ms.
    pub admission: QueueAgeConfig,
}

impl Default for WfqConfig {
    fn default() -> Self {
        WfqConfig {
            capacity: NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN),
            max_bytes: None,
            weights: default_weights(),
            admission: QueueAgeConfig::default(),
        }
    }
}

impl WfqConfig {
    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range, as a path under `queue.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity.get() > MAX_CAPACITY {
            return Err(ConfigError::new(
                "queue.capacity",
                self.capacity,
                format!("1..={MAX_CAPACITY}"),
            ));
        }
        self.admission
            .validate()
            .map_err(|e| e.within("queue.admission"))
    }
}
