//! What the queue refuses, handed back to the caller inside the error.

use std::fmt;

/// Why a push was refused. Used as a metric label, so the set is small and fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefuseReason {
    /// Queue-age admission refused the tier: the queue is too far behind for it.
    Overloaded,
    /// The queue is full and holds nothing of a lower tier to evict.
    Full,
    /// The item alone is larger than the byte budget.
    TooLarge,
    /// The queue is closed.
    Closed,
}

impl RefuseReason {
    /// Every reason.
    pub const ALL: [RefuseReason; 4] = [
        RefuseReason::Overloaded,
        RefuseReason::Full,
        RefuseReason::TooLarge,
        RefuseReason::Closed,
    ];

    /// Lowercase name, as used in metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            RefuseReason::Overloaded => "overloaded",
            RefuseReason::Full => "full",
            RefuseReason::TooLarge => "too_large",
            RefuseReason::Closed => "closed",
        }
    }

    pub(crate) const fn index(self) -> usize {
        match self {
            RefuseReason::Overloaded => 0,
            RefuseReason::Full => 1,
            RefuseReason::TooLarge => 2,
            RefuseReason::Closed => 3,
        }
    }
}

impl fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused push, carrying the item back.
///
/// `Debug` prints `Full(..)` so `T` needs no `Debug`.
#[derive(PartialEq, Eq)]
#[non_exhaustive]
pub enum PushError<T> {
    /// Queue-age admission refused the item's tier.
    Overloaded(T),
    /// The queue is full and holds nothing of a tier below the item's to evict (or the item's
    /// own deadline has passed, and only an eviction of a live item would make room).
    Full(T),
    /// The item's size alone is above the byte budget.
    TooLarge(T),
    /// The queue was closed.
    Closed(T),
}

impl<T> PushError<T> {
    /// The refused item.
    pub fn into_inner(self) -> T {
        match self {
            PushError::Overloaded(t)
            | PushError::Full(t)
            | PushError::TooLarge(t)
            | PushError::Closed(t) => t,
        }
    }

    /// Why it was refused.
    pub fn reason(&self) -> RefuseReason {
        match self {
            PushError::Overloaded(_) => RefuseReason::Overloaded,
            PushError::Full(_) => RefuseReason::Full,
            PushError::TooLarge(_) => RefuseReason::TooLarge,
            PushError::Closed(_) => RefuseReason::Closed,
        }
    }

    pub(crate) fn new(reason: RefuseReason, item: T) -> Self {
        match reason {
            RefuseReason::Overloaded => PushError::Overloaded(item),
            RefuseReason::Full => PushError::Full(item),
            RefuseReason::TooLarge => PushError::TooLarge(item),
            RefuseReason::Closed => PushError::Closed(item),
        }
    }
}

impl<T> fmt::Debug for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Overloaded(_) => f.write_str("Overloaded(..)"),
            PushError::Full(_) => f.write_str("Full(..)"),
            PushError::TooLarge(_) => f.write_str("TooLarge(..)"),
            PushError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<T> fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PushError::Overloaded(_) => "queue age is above the tier's cut-off",
            PushError::Full(_) => "queue is full with nothing of a lower tier to evict",
            PushError::TooLarge(_) => "item is larger than the queue's byte budget",
            PushError::Closed(_) => "queue is closed",
        })
    }
}

impl<T> std::error::Error for PushError<T> {}

/// Why [`WfqQueue::try_pop`](crate::queue::WfqQueue::try_pop) returned nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryPopError {
    /// Nothing is queued right now.
    Empty,
    /// The queue is closed; nothing will ever be queued again.
    Closed,
}

impl fmt::Display for TryPopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TryPopError::Empty => "queue is empty",
            TryPopError::Closed => "queue is closed",
        })
    }
}

impl std::error::Error for TryPopError {}

/// The queue is closed; a waiting pop will never get an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed;

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("queue is closed")
    }
}

impl std::error::Error for Closed {}
