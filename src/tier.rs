//! `PerTier<T>`: one value per criticality level, addressable by name in config files.

use serde::{Deserialize, Serialize};

use crate::Criticality;

/// One value per criticality level.
///
/// In a config file it is a table with the four lowercase level names as keys:
///
/// ```toml
/// [queue.weights]
/// critical = 8
/// high = 4
/// medium = 2
/// sheddable = 1
/// ```
///
/// # Examples
///
/// ```
/// use triage::{Criticality, PerTier};
///
/// let weights = PerTier::new(8, 4, 2, 1);
/// assert_eq!(weights[Criticality::High], 4);
/// assert_eq!(weights.iter().map(|(_, w)| *w).sum::<u32>(), 15);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerTier<T> {
    /// Value for [`Criticality::Critical`].
    pub critical: T,
    /// Value for [`Criticality::High`].
    pub high: T,
    /// Value for [`Criticality::Medium`].
    pub medium: T,
    /// Value for [`Criticality::Sheddable`].
    pub sheddable: T,
}

impl<T> PerTier<T> {
    /// Builds from the four values, most critical first.
    pub const fn new(critical: T, high: T, medium: T, sheddable: T) -> Self {
        PerTier {
            critical,
            high,
            medium,
            sheddable,
        }
    }

    /// The same value for every level.
    pub fn splat(value: T) -> Self
    where
        T: Clone,
    {
        PerTier::new(value.clone(), value.clone(), value.clone(), value)
    }

    /// Builds each level's value from a function of the level.
    pub fn from_fn(mut f: impl FnMut(Criticality) -> T) -> Self {
        PerTier::new(
            f(Criticality::Critical),
            f(Criticality::High),
            f(Criticality::Medium),
            f(Criticality::Sheddable),
        )
    }

    /// Level and value pairs, most critical first.
    pub fn iter(&self) -> impl Iterator<Item = (Criticality, &T)> {
        Criticality::ALL.into_iter().map(move |c| (c, &self[c]))
    }

    /// Applies `f` to each value.
    pub fn map<U>(self, mut f: impl FnMut(Criticality, T) -> U) -> PerTier<U> {
        PerTier::new(
            f(Criticality::Critical, self.critical),
            f(Criticality::High, self.high),
            f(Criticality::Medium, self.medium),
            f(Criticality::Sheddable, self.sheddable),
        )
    }

    /// The values as an array indexed by [`Criticality::rank`] (`Sheddable` first).
    pub fn into_rank_array(self) -> [T; 4] {
        [self.sheddable, self.medium, self.high, self.critical]
    }
}

impl<T> std::ops::Index<Criticality> for PerTier<T> {
    type Output = T;

    fn index(&self, c: Criticality) -> &T {
        match c {
            Criticality::Critical => &self.critical,
            Criticality::High => &self.high,
            Criticality::Medium => &self.medium,
            Criticality::Sheddable => &self.sheddable,
        }
    }
}

impl<T> std::ops::IndexMut<Criticality> for PerTier<T> {
    fn index_mut(&mut self, c: Criticality) -> &mut T {
        match c {
            Criticality::Critical => &mut self.critical,
            Criticality::High => &mut self.high,
            Criticality::Medium => &mut self.medium,
            Criticality::Sheddable => &mut self.sheddable,
        }
    }
}
