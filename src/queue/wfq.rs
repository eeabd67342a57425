//! `WfqQueue`: the thread-safe bounded weighted-fair queue. The rules live in `core.rs`; this
//! file holds the type, its construction, the push and pop paths around the one lock, and what
//! each change publishes for readers without the lock. Beside it, by role: `wfq/waiting.rs`
//! (the async pop and the waiter protocol), `wfq/control.rs` (reconfiguring, withdrawing items,
//! putting popped ones back) and `wfq/view.rs` (what can be read: lengths, ages, stats).

use std::time::Duration;

use crossbeam_utils::CachePadded;
use event_listener::Event;
use quanta::{Clock, Instant};

use super::core::Core;
use super::lock::SpinLock;
use super::{Dequeued, Entry, Evictions, Meta, PushError, TierMask, TryPopError, WfqConfig};
use crate::admission::{admits_at, QueueAgeAdmission};
use crate::loom::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use crate::{ConfigError, Criticality};

mod control;
#[cfg(test)]
mod tests;
mod view;
mod waiting;

/// Shed level that refuses every tier because the queue is closed (levels 0..=4 are admission's).
const CLOSED_LEVEL: u8 = u8::MAX;

/// The core first (`repr(C)`): its hot fields share the lock's cache line.
#[repr(C)]
struct State<T> {
    core: Core<T>,
    admission: QueueAgeAdmission,
    config: WfqConfig,
}

/// The queue's state published after each change, read without the lock.
#[repr(C)]
struct Published {
    /// Items held (the low [`LEN_BITS`] bits), and the non-empty tiers, a bit per rank (the
    /// bits above): with the length, whether a push of a tier would find nothing below it to
    /// evict. One word, so that a push or pop publishes both in one store.
    len_backlog: AtomicU64,
    /// Items taken out by pops (served or expired): lets a holder of refused items see cheaply
    /// whether room may have appeared since it last tried.
    pops: AtomicU64,
}

/// The bits of [`Published::len_backlog`] that hold the length.
const LEN_BITS: u32 = 56;

impl Published {
    /// Items held.
    #[inline]
    fn len(&self) -> usize {
        (self.len_backlog.load(Ordering::Relaxed) & ((1 << LEN_BITS) - 1)) as usize
    }

    /// Items held, and the non-empty tiers.
    #[inline]
    fn len_and_backlog(&self) -> (usize, u8) {
        let v = self.len_backlog.load(Ordering::Relaxed);
        ((v & ((1 << LEN_BITS) - 1)) as usize, (v >> LEN_BITS) as u8)
    }

    #[inline]
    fn set(&self, len: usize, backlog: u8) {
        // A length past 2^56 items is past any memory; saturated rather than mixed in.
        let len = (len as u64).min((1 << LEN_BITS) - 1);
        self.len_backlog
            .store(len | (u64::from(backlog) << LEN_BITS), Ordering::Relaxed);
    }
}

/// A bounded, weighted-fair, multi-producer multi-consumer queue with one FIFO per criticality
/// tier.
///
/// - **Weighted-fair dequeue** by stride scheduling: with every tier backlogged, each tier gets
///   `weight / sum(weights)` of the dequeues (default 8/4/2/1), interleaved, and no backlogged
///   tier is ever starved (see the module docs for the bound).
/// - **Bounded** by a count of items and optionally a byte budget. A push into a full queue
///   evicts the **newest** item of the **lowest non-empty tier strictly below** the incoming
///   one and hands it back; with nothing below, the push is refused and the item handed back.
///   Nothing is ever dropped inside the queue.
/// - **Deadlines**: a pop never returns an expired item as ready; it hands it back as
///   [`Dequeued::Expired`], uncharged to its tier's share.
/// - **Queue-age admission** at push, per tier, with hysteresis ([`QueueAgeAdmission`]): the
///   decision is one atomic load, taken before the lock, so refusing costs almost nothing.
/// - Pops that return at once ([`try_pop`](Self::try_pop)), that take a batch under one lock
///   ([`pop_batch`](Self::pop_batch)), and that wait for an item ([`pop`](Self::pop), async);
///   a push never waits: a full queue hands the item back. [`close`](Self::close) wakes every
///   waiting pop and hands every held item back. The module docs say why these forms and no
///   others.
///
/// Time comes from an injectable [`quanta::Clock`] ([`Clock::mock`] in tests).
///
/// # Examples
///
/// ```
/// use triage::queue::{Dequeued, Meta, PushError, WfqConfig, WfqQueue};
/// use triage::Criticality;
///
/// let queue = WfqQueue::new(WfqConfig { capacity: 2.try_into()?, ..WfqConfig::default() })?;
/// assert!(queue.push("analytics", Meta::new(Criticality::Sheddable))?.is_empty());
/// assert!(queue.push("search", Meta::new(Criticality::High))?.is_empty());
///
/// // Full: a Critical push evicts the newest Sheddable item and hands it back.
/// let evicted: Vec<_> = queue.push("checkout", Meta::new(Criticality::Critical)).unwrap().collect();
/// assert_eq!(evicted[0].item(), &"analytics");
///
/// // Full with nothing below Sheddable: refused, and the item comes back in the error.
/// let err = queue.push("prefetch", Meta::new(Criticality::Sheddable)).unwrap_err();
/// assert!(matches!(err, PushError::Full("prefetch")));
///
/// // Critical is served first (ties go to the more critical tier).
/// match queue.try_pop()? {
///     Dequeued::Ready(entry) => assert_eq!(entry.into_inner(), "checkout"),
///     Dequeued::Expired(_) => unreachable!("no deadline was set"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WfqQueue<T> {
    state: CachePadded<SpinLock<State<T>>>,
    /// Queue-age admission's decision, or [`CLOSED_LEVEL`]: read without the lock at push.
    shed_level: CachePadded<AtomicU8>,
    /// What every push or pop writes for readers without the lock, on a cache line of its own:
    /// the fields every operation only reads (the waiter count, the clock) are not
    /// invalidated on other cores by each write of these.
    published: CachePadded<Published>,
    /// The count bound, mirrored for `looks_full_for`, which reads it without the lock.
    capacity_hint: AtomicUsize,
    /// Pushes refused by admission, per rank: counted outside the lock.
    overloaded: [CachePadded<AtomicU64>; 4],
    not_empty: Event,
    /// Consumers registered on `not_empty`. A push notifies only when it is non-zero: the
    /// notification itself takes the event's lock and a fence, most of a push's cost otherwise.
    /// A consumer counts itself before its last check under the queue lock, and a producer
    /// reads the count after pushing under that lock, so the lock orders the two and no wake-up
    /// is lost (`wfq/waiting.rs`; modelled in `tests/loom_queue.rs`).
    waiters: AtomicUsize,
    clock: Clock,
}

impl<T> WfqQueue<T> {
    /// A queue with `config` on the system clock.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `config` fails [`WfqConfig::validate`].
    pub fn new(config: WfqConfig) -> Result<Self, ConfigError> {
        WfqQueue::with_clock(config, Clock::new())
    }

    /// A queue with `config` that reads time from `clock` (use [`Clock::mock`] in tests).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `config` fails [`WfqConfig::validate`].
    pub fn with_clock(config: WfqConfig, clock: Clock) -> Result<Self, ConfigError> {
        config.validate()?;
        super::time::start_upkeep();
        let capacity = config.capacity.get();
        let core = Core::new(
            config.capacity.get(),
            config.max_bytes.map(|b| b.get()),
            weights_by_rank(&config),
        );
        let admission = QueueAgeAdmission::new(&config.admission);
        Ok(WfqQueue {
            state: CachePadded::new(SpinLock::new(State {
                core,
                admission,
                config,
            })),
            shed_level: CachePadded::new(AtomicU8::new(0)),
            published: CachePadded::new(Published {
                len_backlog: AtomicU64::new(0),
                pops: AtomicU64::new(0),
            }),
            capacity_hint: AtomicUsize::new(capacity),
            overloaded: Default::default(),
            not_empty: Event::new(),
            waiters: AtomicUsize::new(0),
            clock,
        })
    }

    /// Queues `item` in the tier of `meta.criticality`.
    ///
    /// Returns the items evicted to make room (empty unless the queue was full): each is the
    /// newest of the lowest non-empty tier strictly below the item's. Record them (shed, or
    /// deferred) rather than dropping them.
    ///
    /// Never blocks on a full queue: backpressure is the caller's decision, taken with the item
    /// handed back.
    ///
    /// # Errors
    ///
    /// The item comes back inside the error:
    /// - [`PushError::Overloaded`] when queue-age admission refuses the tier (one atomic load,
    ///   no lock, no allocation);
    /// - [`PushError::Full`] when the queue is full and holds nothing of a lower tier, or
    ///   only an eviction would make room and the item's own deadline has already passed;
    /// - [`PushError::TooLarge`] when `meta.size_bytes` alone is above the byte budget;
    /// - [`PushError::Closed`] after [`close`](Self::close).
    #[inline]
    pub fn push(&self, item: T, meta: Meta) -> Result<Evictions<T>, PushError<T>> {
        let mut removed = Evictions::none();
        self.push_into(item, meta, false, &mut removed)?;
        Ok(removed)
    }

    /// Like [`push`](Self::push), without the queue-age check: for a caller that admits by a
    /// signal of its own, such as a pull-based consumer (see
    /// [`PullAdmission`](crate::admission::PullAdmission)), where the queue's age measures how
    /// eagerly the intake pulled, not overload. Capacity, byte budget and eviction apply as
    /// usual.
    ///
    /// # Errors
    ///
    /// As [`push`](Self::push), except [`PushError::Overloaded`].
    #[inline]
    pub fn push_admitted(&self, item: T, meta: Meta) -> Result<Evictions<T>, PushError<T>> {
        let mut removed = Evictions::none();
        self.push_into(item, meta, true, &mut removed)?;
        Ok(removed)
    }

    /// Like [`push_admitted`](Self::push_admitted), but wakes no consumer: for a consumer that
    /// pushes what it pulled itself and pops right after (the runtime's worker pulling for its
    /// intake, `runtime::intake::PullForIntake`), so that its pushes do not wake others to
    /// race it for them; a pop that leaves items wakes the next consumer as usual. What the
    /// push removed goes to `removed`, as with [`push_into`](Self::push_into).
    pub(crate) fn push_admitted_quiet(
        &self,
        item: T,
        meta: Meta,
        removed: &mut Evictions<T>,
    ) -> Result<(), PushError<T>> {
        let now = self.now();
        let mut st = self.state.lock();
        st.core
            .push(item, meta, now, || self.clock.now(), removed)?;
        self.changed(&mut st, now);
        drop(st);
        Ok(())
    }

    /// [`push`](Self::push) (`admitted` false) or [`push_admitted`](Self::push_admitted)
    /// (`admitted` true) for a caller that keeps the removed items in `removed` (left as it is
    /// when nothing was removed): an item is moved into the queue and nowhere else, where a
    /// returned [`Evictions`], room for an item inline, is moved on its way back.
    #[inline]
    pub(crate) fn push_into(
        &self,
        item: T,
        meta: Meta,
        admitted: bool,
        removed: &mut Evictions<T>,
    ) -> Result<(), PushError<T>> {
        if !admitted {
            let tier = meta.criticality;
            let level = self.shed_level.load(Ordering::Relaxed);
            // After `close` the core refuses the push itself, counted like any other refusal.
            if !admits_at(level, tier) && level != CLOSED_LEVEL {
                self.overloaded[tier.rank()].fetch_add(1, Ordering::Relaxed);
                return Err(PushError::Overloaded(item));
            }
        }
        let now = self.now();
        let mut st = self.state.lock();
        st.core
            .push(item, meta, now, || self.clock.now(), removed)?;
        self.changed(&mut st, now);
        drop(st);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.wake_one();
        }
        Ok(())
    }

    /// The queue's notion of now: recent time while the upkeep thread keeps it fresh, else a
    /// clock read (see the `time` module).
    #[inline]
    fn now(&self) -> Instant {
        super::time::recent(&self.clock)
    }

    /// Serves the next item by weight without waiting.
    ///
    /// # Errors
    ///
    /// [`TryPopError::Empty`] when nothing is queued, [`TryPopError::Closed`] after
    /// [`close`](Self::close).
    #[inline]
    pub fn try_pop(&self) -> Result<Dequeued<T>, TryPopError> {
        self.try_pop_masked(TierMask::ALL)
    }

    /// Serves the next item by weight among the tiers in `mask` only, without waiting.
    ///
    /// Used to give each tier a share of a concurrency limit: a tier that has used its share
    /// is left out of the mask, and the weighted-fair order among the others is unchanged.
    ///
    /// # Errors
    ///
    /// [`TryPopError::Empty`] when no tier in `mask` holds anything, [`TryPopError::Closed`]
    /// after [`close`](Self::close).
    #[inline]
    pub fn try_pop_masked(&self, mask: TierMask) -> Result<Dequeued<T>, TryPopError> {
        let now = self.now();
        let mut st = self.state.lock();
        match st.core.pop(now, || self.clock.now(), mask.0, Some(0)) {
            Some(d) => {
                self.changed(&mut st, now);
                let pops = st.core.pops();
                let left = st.core.len();
                drop(st);
                self.published.pops.store(pops, Ordering::Relaxed);
                self.wake_next(left);
                Ok(d)
            }
            None if st.core.is_closed() && st.core.len() == 0 => Err(TryPopError::Closed),
            None => Err(TryPopError::Empty),
        }
    }

    /// Serves up to `max` items by weight among the tiers in `mask`, in the order single pops
    /// would serve them, under one lock acquisition and with one clock read at most; appends
    /// them to `out` and returns how many. Expired items come out as [`Dequeued::Expired`]
    /// and count toward `max`.
    ///
    /// # Errors
    ///
    /// [`TryPopError::Empty`] when no tier in `mask` holds anything (nothing appended),
    /// [`TryPopError::Closed`] once the queue is closed and empty. With `max` 0 nothing is
    /// taken and the result is `Ok(0)` unless the queue is closed and empty.
    pub fn pop_batch_masked(
        &self,
        mask: TierMask,
        max: usize,
        out: &mut Vec<Dequeued<T>>,
    ) -> Result<usize, TryPopError> {
        self.pop_batch_borrowing(mask, Some(TierMask::NONE), max, out)
    }

    /// [`pop_batch_masked`](Self::pop_batch_masked), where the tiers of `borrowing` may also be
    /// served when deadline-ordered service takes them ahead of the weighted order (see
    /// [`set_drain`](Self::set_drain)): the runtime's tiers past their share of the concurrency
    /// limit. With `borrowing` `None`, served by weight alone whatever `set_drain` set.
    pub(crate) fn pop_batch_borrowing(
        &self,
        mask: TierMask,
        borrowing: Option<TierMask>,
        max: usize,
        out: &mut Vec<Dequeued<T>>,
    ) -> Result<usize, TryPopError> {
        if max == 0 {
            // Asked for nothing: nothing taken, the queue's state reported as a pop would.
            return if self.is_closed() && self.is_empty() {
                Err(TryPopError::Closed)
            } else {
                Ok(0)
            };
        }
        let now = self.now();
        let mut precise = None;
        let mut st = self.state.lock();
        let mut n = 0;
        while n < max {
            let clock = || *precise.get_or_insert_with(|| self.clock.now());
            match st.core.pop(now, clock, mask.0, borrowing.map(|b| b.0)) {
                Some(d) => {
                    out.push(d);
                    n += 1;
                    // Ages only fall during a batch, so admission after the first pop and
                    // after the last decides exactly as after every single pop.
                    if n == 1 {
                        self.changed(&mut st, now);
                    }
                }
                None => break,
            }
        }
        if n == 0 {
            return Err(if st.core.is_closed() && st.core.len() == 0 {
                TryPopError::Closed
            } else {
                TryPopError::Empty
            });
        }
        self.changed(&mut st, now);
        let pops = st.core.pops();
        let left = st.core.len();
        drop(st);
        self.published.pops.store(pops, Ordering::Relaxed);
        self.wake_next(left);
        Ok(n)
    }

    /// [`pop_batch_masked`](Self::pop_batch_masked) over every tier.
    ///
    /// # Errors
    ///
    /// As [`pop_batch_masked`](Self::pop_batch_masked).
    pub fn pop_batch(&self, max: usize, out: &mut Vec<Dequeued<T>>) -> Result<usize, TryPopError> {
        self.pop_batch_masked(TierMask::ALL, max, out)
    }

    /// Closes the queue: later pushes are refused with [`PushError::Closed`], every waiting
    /// consumer wakes with [`Closed`](super::Closed), and every held item is handed back, most
    /// critical tier first, oldest first within a tier. Closing twice returns nothing the
    /// second time.
    pub fn close(&self) -> Vec<Entry<T>> {
        let items = {
            let mut st = self.state.lock();
            self.shed_level.store(CLOSED_LEVEL, Ordering::Relaxed);
            let items = st.core.close();
            self.published.set(0, 0);
            items
        };
        self.not_empty.notify(usize::MAX);
        items
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shed_level.load(Ordering::Relaxed) == CLOSED_LEVEL
    }

    /// Publishes the length and the backlog bitmask that readers poll without the lock
    /// (`len`, `looks_full_for`).
    #[inline]
    fn publish(&self, st: &State<T>) {
        self.published.set(st.core.len(), st.core.backlogged());
    }

    /// After a push or pop changed the queue at `now`: publishes the length and re-evaluates
    /// queue-age admission unless it provably cannot change.
    #[inline]
    fn changed(&self, st: &mut State<T>, now: Instant) {
        self.publish(st);
        if st.core.recheck_at.is_some_and(|at| now < at) {
            return;
        }
        self.observe(st, now);
    }

    /// Re-evaluates queue-age admission from the ages at `now`.
    ///
    /// At level 0 (everything admitted) the only way out is the oldest item's age reaching the
    /// lowest cut-off, and until then nothing a push or pop does can make that age grow: a push
    /// adds a younger item, a pop replaces a head with a younger one. So the instant it could
    /// first happen is kept in `recheck_at`, and pushes and pops before it skip this (the
    /// computation of four ages and the state machine were a third of a push+pop). Above level
    /// 0, every change re-evaluates, as hysteresis needs the ages as they fall.
    fn observe(&self, st: &mut State<T>, now: Instant) {
        self.publish(st);
        if !st.config.admission.enabled {
            // Nothing to re-evaluate until `reconfigure` enables it (which observes).
            st.core.recheck_at = now.checked_add(Duration::from_secs(86_400));
            return;
        }
        let level = st.admission.observe(st.core.ages(now));
        st.core.recheck_at = if level == 0 {
            // Items queued after `now` are younger than `now`, so `now` bounds an empty queue.
            let oldest = st.core.oldest().map_or(now, |o| o.min(now));
            oldest.checked_add(st.config.admission.cutoff(Criticality::Sheddable))
        } else {
            None
        };
        if !st.core.is_closed() {
            self.shed_level.store(level, Ordering::Relaxed);
        }
    }
}

fn weights_by_rank(config: &WfqConfig) -> [u32; 4] {
    config.weights.map(|_, w| w.get()).into_rank_array()
}

impl<T> std::fmt::Debug for WfqQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WfqQueue")
            .field("len", &self.len())
            .field("shed_level", &self.shed_level())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}
