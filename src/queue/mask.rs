//! `TierMask`: a set of criticality tiers, for the pops that serve only some of them.

use crate::Criticality;

/// A set of tiers, for the pops that serve only some of them
/// ([`WfqQueue::try_pop_masked`](super::WfqQueue::try_pop_masked)).
///
/// # Examples
///
/// ```
/// use triage::queue::TierMask;
/// use triage::Criticality;
///
/// let mask = TierMask::NONE.with(Criticality::Critical).with(Criticality::High);
/// assert!(mask.contains(Criticality::High));
/// assert!(!mask.contains(Criticality::Sheddable));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TierMask(pub(crate) u8);

impl TierMask {
    /// Every tier.
    pub const ALL: TierMask = TierMask(0b1111);
    /// No tier.
    pub const NONE: TierMask = TierMask(0);

    /// From bits, bit `rank` per tier (higher bits ignored).
    pub const fn from_bits(bits: u8) -> TierMask {
        TierMask(bits & 0b1111)
    }

    /// This set plus `tier`.
    #[must_use]
    pub const fn with(self, tier: Criticality) -> TierMask {
        TierMask(self.0 | (1 << tier.rank()))
    }

    /// The tiers of this set that are not in `other`.
    #[must_use]
    pub const fn without(self, other: TierMask) -> TierMask {
        TierMask(self.0 & !other.0)
    }

    /// The tiers a shed `level` refuses: ranks below it (0: none; 1: Sheddable; ...; 4 or
    /// more: all).
    pub const fn below(level: u8) -> TierMask {
        let level = if level > 4 { 4 } else { level };
        TierMask((1u8 << level) - 1)
    }

    /// Whether `tier` is in the set.
    pub const fn contains(self, tier: Criticality) -> bool {
        self.0 & (1 << tier.rank()) != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}
