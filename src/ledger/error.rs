//! Errors of [`AckTracker`](super::AckTracker).

use thiserror::Error;

use super::Epoch;

/// Why [`AckTracker::track`](super::AckTracker::track) refused an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TrackError {
    /// The partition is not assigned to this tracker (never assigned, or revoked).
    #[error("offset {offset}: partition is not assigned")]
    NotAssigned {
        /// The refused offset.
        offset: u64,
    },
    /// Offsets of a partition must be tracked in strictly increasing order.
    #[error("offset {offset} is not above the last tracked offset {last}")]
    NotIncreasing {
        /// The refused offset.
        offset: u64,
        /// The last offset tracked on the partition in this epoch.
        last: u64,
    },
    /// `u64::MAX` cannot be tracked: its commit position would not fit in a `u64`.
    #[error("offset {offset} is out of range")]
    OutOfRange {
        /// The refused offset.
        offset: u64,
    },
}

/// Why [`AckTracker::resolve`](super::AckTracker::resolve) refused a token.
///
/// None of these changes the tracker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The token belongs to an epoch that is no longer the partition's current
    /// one: the partition was revoked or reassigned since it was tracked (or the
    /// token comes from another tracker). Its offset will be redelivered to the
    /// partition's next owner; it must not be acknowledged.
    #[error("offset {offset}: token of {epoch} is stale (partition revoked or reassigned)")]
    Stale {
        /// The token's offset.
        offset: u64,
        /// The token's epoch.
        epoch: Epoch,
    },
    /// The offset already has a disposition: a second one is refused so it is
    /// never counted twice. Also reported for an offset below the commit
    /// position, where the tracker no longer keeps per-offset state.
    #[error("offset {offset} already has a disposition")]
    AlreadyResolved {
        /// The token's offset.
        offset: u64,
    },
    /// The offset was never tracked in the token's epoch (a gap, or beyond the
    /// last tracked offset). Only reachable with tokens built by
    /// [`AckToken::from_parts`](super::AckToken::from_parts).
    #[error("offset {offset} was never tracked in this epoch")]
    Unknown {
        /// The token's offset.
        offset: u64,
    },
}
