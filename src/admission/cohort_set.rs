//! A set of cohorts: which slices of the highest refused tier's users are admitted.

use crate::admission::COHORTS;

/// A set of cohorts (`0..`[`COHORTS`]), as pull-based admission admits them of the highest
/// refused tier: a bit per cohort.
///
/// # Examples
///
/// ```
/// use triage::admission::CohortSet;
///
/// let first = CohortSet::first(3);
/// assert!(first.contains(2) && !first.contains(3));
/// assert_eq!(first.with(100).len(), 4);
/// assert!(CohortSet::default().is_empty());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CohortSet(u128);

impl CohortSet {
    /// The set of cohorts `0..n` (every cohort from [`COHORTS`] up).
    #[must_use]
    pub fn first(n: u8) -> Self {
        if n >= COHORTS {
            CohortSet(u128::MAX)
        } else {
            CohortSet((1u128 << n) - 1)
        }
    }

    /// The set with `cohort` added (a cohort past [`COHORTS`] `- 1` adds nothing).
    #[must_use]
    pub fn with(self, cohort: u8) -> Self {
        CohortSet(self.0 | 1u128.checked_shl(u32::from(cohort)).unwrap_or(0))
    }

    /// The set with `cohort` taken out (a cohort past [`COHORTS`] `- 1` takes nothing).
    #[must_use]
    pub fn without(self, cohort: u8) -> Self {
        CohortSet(self.0 & !1u128.checked_shl(u32::from(cohort)).unwrap_or(0))
    }

    /// Whether `cohort` is in the set.
    #[inline]
    pub fn contains(self, cohort: u8) -> bool {
        cohort < COHORTS && self.0 >> cohort & 1 == 1
    }

    /// Cohorts in the set, `0..=COHORTS`.
    pub fn len(self) -> u8 {
        self.0.count_ones() as u8
    }

    /// Whether no cohort is in the set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The set as two words, low cohorts first: to store in atomics.
    pub(crate) fn to_words(self) -> [u64; 2] {
        [self.0 as u64, (self.0 >> 64) as u64]
    }

    /// The set stored by [`to_words`](Self::to_words).
    pub(crate) fn from_words(words: [u64; 2]) -> Self {
        CohortSet(u128::from(words[0]) | u128::from(words[1]) << 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_with_and_words() {
        assert_eq!(CohortSet::first(0), CohortSet::default());
        assert_eq!(CohortSet::first(COHORTS).len(), COHORTS);
        assert_eq!(CohortSet::first(200).len(), COHORTS);
        let s = CohortSet::first(5).with(70).with(127).with(200);
        assert_eq!(s.len(), 7);
        assert!(s.contains(70) && s.contains(127) && !s.contains(5) && !s.contains(200));
        assert_eq!(CohortSet::from_words(s.to_words()), s);
    }
}
