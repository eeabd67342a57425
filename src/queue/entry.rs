//! What the queue holds and hands back.

use quanta::Instant;

use crate::Criticality;

/// Scheduling facts about an item, given at push.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::queue::Meta;
/// use triage::Criticality;
///
/// let clock = quanta::Clock::new();
/// let meta = Meta::new(Criticality::High)
///     .deadline(clock.now() + Duration::from_secs(2))
///     .size_bytes(512);
/// assert_eq!(meta.criticality, Criticality::High);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Tier the item is queued in.
    pub criticality: Criticality,
    /// Instant after which serving the item is useless; `None` never expires.
    pub deadline: Option<Instant>,
    /// Size counted against the queue's byte budget, in bytes. Default 0.
    pub size_bytes: usize,
}

impl Meta {
    /// Facts for an item of `criticality` with no deadline and size 0.
    pub const fn new(criticality: Criticality) -> Self {
        Meta {
            criticality,
            deadline: None,
            size_bytes: 0,
        }
    }

    /// Sets the deadline.
    #[must_use]
    pub const fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the deadline, or clears it with `None`.
    #[must_use]
    pub const fn deadline_opt(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets the size in bytes.
    #[must_use]
    pub const fn size_bytes(mut self, size_bytes: usize) -> Self {
        self.size_bytes = size_bytes;
        self
    }
}

/// An item with its scheduling facts, as held by the queue and handed back by it.
///
/// Held flat rather than as a [`Meta`] beside the item: every field a whole 8 bytes but the
/// last two bytes, and no `Option<Instant>` (16 bytes with its tag). A push builds the entry
/// from the fields of its `Meta`, and a pop copies it out in the same 16-byte pieces the push
/// wrote it in. With the `Meta` copied in whole, the copy's 16-byte loads straddled the
/// narrower stores that had just written the `Meta` (a tier byte beside a size), and so did
/// the pop's loads of what the push had just written: each such load waits for the stores to
/// retire instead of being forwarded from them, which `perf annotate` put at about a third
/// of a single-threaded push+pop (BENCHMARKS.md).
pub struct Entry<T> {
    pub(crate) item: T,
    pub(crate) enqueued_at: Instant,
    /// The deadline when `has_deadline`, else `enqueued_at` (any instant: never read).
    deadline_at: Instant,
    pub(crate) size_bytes: usize,
    pub(crate) criticality: Criticality,
    has_deadline: bool,
}

impl<T> Entry<T> {
    /// An entry for `item` with the facts of `meta`, queued at `now`.
    #[inline]
    pub(crate) fn new(item: T, meta: Meta, now: Instant) -> Self {
        Entry {
            item,
            enqueued_at: now,
            deadline_at: meta.deadline.unwrap_or(now),
            size_bytes: meta.size_bytes,
            criticality: meta.criticality,
            has_deadline: meta.deadline.is_some(),
        }
    }

    /// The item.
    pub fn item(&self) -> &T {
        &self.item
    }

    /// The item, mutably.
    pub fn item_mut(&mut self) -> &mut T {
        &mut self.item
    }

    /// Takes the item out.
    pub fn into_inner(self) -> T {
        self.item
    }

    /// Tier the item was queued in.
    pub fn criticality(&self) -> Criticality {
        self.criticality
    }

    /// Deadline given at push, if any.
    #[inline]
    pub fn deadline(&self) -> Option<Instant> {
        self.has_deadline.then_some(self.deadline_at)
    }

    /// Size given at push, in bytes.
    pub fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    /// The facts given at push.
    pub fn meta(&self) -> Meta {
        Meta {
            criticality: self.criticality,
            deadline: self.deadline(),
            size_bytes: self.size_bytes,
        }
    }

    /// When the item was accepted, on the queue's clock.
    pub fn enqueued_at(&self) -> Instant {
        self.enqueued_at
    }

    /// Sojourn time up to `now`: how long the item waited in the queue.
    pub fn sojourn(&self, now: Instant) -> std::time::Duration {
        now.saturating_duration_since(self.enqueued_at)
    }

    /// Whether the deadline has passed at `now` (a deadline equal to `now` has passed).
    #[inline]
    pub fn is_expired(&self, now: Instant) -> bool {
        self.has_deadline && self.deadline_at <= now
    }
}

impl<T> std::fmt::Debug for Entry<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("criticality", &self.criticality)
            .field("deadline", &self.deadline())
            .field("size_bytes", &self.size_bytes)
            .field("enqueued_at", &self.enqueued_at)
            .finish_non_exhaustive()
    }
}

/// What a pop returns: an item to serve, or one whose deadline passed while it waited.
///
/// Expired items are handed back rather than dropped so the caller can record them; they are
/// not charged to their tier's share, since discarding them costs a comparison.
#[derive(Debug)]
#[must_use = "an expired entry must be recorded, a ready one served"]
pub enum Dequeued<T> {
    /// Serve this one: its deadline (if any) had not passed at dequeue.
    Ready(Entry<T>),
    /// Its deadline passed while it waited: record it as expired, do not serve it.
    Expired(Entry<T>),
}

impl<T> Dequeued<T> {
    /// The entry, whichever variant.
    pub fn into_entry(self) -> Entry<T> {
        match self {
            Dequeued::Ready(e) | Dequeued::Expired(e) => e,
        }
    }

    /// The entry, whichever variant.
    pub fn entry(&self) -> &Entry<T> {
        match self {
            Dequeued::Ready(e) | Dequeued::Expired(e) => e,
        }
    }

    /// The entry if ready, `None` if expired.
    pub fn ready(self) -> Option<Entry<T>> {
        match self {
            Dequeued::Ready(e) => Some(e),
            Dequeued::Expired(_) => None,
        }
    }

    /// Whether it is the expired variant.
    pub fn is_expired(&self) -> bool {
        matches!(self, Dequeued::Expired(_))
    }
}

/// An item a push took out of a full queue to make room, and why.
#[must_use = "a removed item must be recorded: shed or deferred if evicted, expired if expired"]
pub enum Removed<T> {
    /// Evicted for a more critical item: the newest of the lowest non-empty tier below it.
    /// Record it as shed, or defer it.
    Evicted(Entry<T>),
    /// Its deadline had passed: discarded before anything live was evicted. Record it as
    /// expired; it was never served.
    Expired(Entry<T>),
}

impl<T> Removed<T> {
    /// The entry, whichever variant.
    pub fn into_entry(self) -> Entry<T> {
        match self {
            Removed::Evicted(e) | Removed::Expired(e) => e,
        }
    }

    /// The entry, whichever variant.
    pub fn entry(&self) -> &Entry<T> {
        match self {
            Removed::Evicted(e) | Removed::Expired(e) => e,
        }
    }

    /// The item, whichever variant.
    pub fn into_inner(self) -> T {
        self.into_entry().into_inner()
    }

    /// The item, whichever variant.
    pub fn item(&self) -> &T {
        self.entry().item()
    }

    /// Whether it is the expired variant.
    pub fn is_expired(&self) -> bool {
        matches!(self, Removed::Expired(_))
    }
}

impl<T> std::fmt::Debug for Removed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Removed::Evicted(e) => f.debug_tuple("Evicted").field(e).finish(),
            Removed::Expired(e) => f.debug_tuple("Expired").field(e).finish(),
        }
    }
}

/// Items a push removed to make room: first every expired item (as [`Removed::Expired`], most
/// critical tier last, oldest first within a tier), then the evicted ones (as
/// [`Removed::Evicted`], newest of the lowest tier first).
///
/// Empty, or one item held inline, without allocating: a count-bounded queue with nothing
/// expired evicts at most one item per push. A byte budget, or expired items, may remove
/// several, held in a `Vec`.
#[must_use = "removed items must be recorded (shed, deferred or expired), not dropped"]
pub struct Evictions<T> {
    items: Items<T>,
}

enum Items<T> {
    One(Option<Removed<T>>),
    Many(std::vec::IntoIter<Removed<T>>),
}

impl<T> Evictions<T> {
    /// Nothing removed.
    #[inline]
    pub(crate) fn none() -> Self {
        Evictions {
            items: Items::One(None),
        }
    }

    pub(crate) fn from_vec(mut items: Vec<Removed<T>>) -> Self {
        if items.len() <= 1 {
            return Evictions {
                items: Items::One(items.pop()),
            };
        }
        Evictions {
            items: Items::Many(items.into_iter()),
        }
    }

    pub(crate) fn one(item: Removed<T>) -> Self {
        Evictions {
            items: Items::One(Some(item)),
        }
    }

    /// Whether nothing (more) was removed.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Iterator for Evictions<T> {
    type Item = Removed<T>;

    #[inline]
    fn next(&mut self) -> Option<Removed<T>> {
        match &mut self.items {
            Items::One(one) => one.take(),
            Items::Many(many) => many.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.items {
            Items::One(one) => usize::from(one.is_some()),
            Items::Many(many) => many.len(),
        };
        (n, Some(n))
    }
}

impl<T> ExactSizeIterator for Evictions<T> {}

impl<T> std::fmt::Debug for Evictions<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_list();
        match &self.items {
            Items::One(one) => list.entries(one.iter()),
            Items::Many(many) => list.entries(many.as_slice()),
        };
        list.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_entry_gives_back_the_meta_it_was_built_from() {
        let (clock, mock) = quanta::Clock::mock();
        mock.increment(Duration::from_secs(1));
        let now = clock.now();
        let deadline = now + Duration::from_millis(5);
        for meta in [
            Meta::new(Criticality::High),
            Meta::new(Criticality::Sheddable)
                .deadline(deadline)
                .size_bytes(usize::MAX),
            // A deadline equal to the stamp is still a deadline, not "none".
            Meta::new(Criticality::Critical).deadline(now),
        ] {
            let e = Entry::new(7u64, meta, now);
            assert_eq!(e.meta(), meta);
            assert_eq!(e.deadline(), meta.deadline);
            assert_eq!(e.criticality(), meta.criticality);
            assert_eq!(e.size_bytes(), meta.size_bytes);
            assert_eq!(e.enqueued_at(), now);
            // Expired exactly when it has a deadline at or before the instant asked about.
            let later = now + Duration::from_secs(3600);
            assert_eq!(e.is_expired(later), meta.deadline.is_some());
            assert_eq!(e.is_expired(now), meta.deadline.is_some_and(|d| d <= now));
        }
    }

    #[test]
    fn an_entry_of_a_word_is_five_words() {
        // The layout the module docs rely on: no `Option<Instant>` and no nested `Meta`, so a
        // push writes and a pop reads it in the same pieces (it was 48 bytes).
        assert_eq!(std::mem::size_of::<Entry<u64>>(), 40);
        // The tier's niche still makes `Option<Entry<_>>` free.
        assert_eq!(std::mem::size_of::<Option<Entry<u64>>>(), 40);
    }
}
