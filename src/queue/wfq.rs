//! `WfqQueue`: the thread-safe bounded weighted-fair queue.

use std::time::Duration;

use crossbeam_utils::CachePadded;
use event_listener::{Event, IntoNotification, Listener};
use quanta::{Clock, Instant};

use super::core::Core;
use super::lock::SpinLock;
use super::{
    Closed, Dequeued, Entry, Evictions, Meta, PopTimeoutError, PushError, QueueStats, Removed,
    TryPopError, WfqConfig,
};
use crate::admission::{admits_at, QueueAgeAdmission};
use crate::loom::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use crate::{ConfigError, Criticality, PerTier};

/// Shed level that refuses every tier because the queue is closed (levels 0..=4 are admission's).
const CLOSED_LEVEL: u8 = u8::MAX;

/// A consumer counted in `waiters`; uncounted on drop, so a cancelled pop uncounts too.
pub(crate) struct WaitRegistration<'a>(&'a AtomicUsize);

impl<'a> WaitRegistration<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        WaitRegistration(count)
    }
}

impl Drop for WaitRegistration<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a blocking push or pop keeps trying before it parks its thread: a few rounds of
/// spinning (exponential, as crossbeam's `Backoff`), then up to [`Patience::YIELDS`] yields of
/// the thread. With more threads than cores, a yield hands the core to the thread that will
/// make room or an item, for less than a park and an unpark cost.
struct Patience {
    step: u32,
}

impl Patience {
    const SPINS: u32 = 6;
    const YIELDS: u32 = 32;

    fn new() -> Self {
        Patience { step: 0 }
    }

    /// Waits a little; `false` once patience is exhausted (always under loom, whose models
    /// need the parking path).
    fn wait(&mut self) -> bool {
        if cfg!(loom) || self.step >= Self::SPINS + Self::YIELDS {
            return false;
        }
        if self.step < Self::SPINS {
            for _ in 0..1u32 << self.step {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
        self.step += 1;
        true
    }
}

/// A set of tiers, for [`WfqQueue::try_pop_masked`].
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
    /// Items held.
    len: AtomicUsize,
    /// Items taken out by pops (served or expired): lets a holder of refused items see cheaply
    /// whether room may have appeared since it last tried.
    pops: AtomicU64,
    /// The non-empty tiers, a bit per rank: with `len`, whether a push of a tier would find
    /// nothing below it to evict.
    backlog: AtomicU8,
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
/// - Blocking ([`pop_timeout`](Self::pop_timeout)) and async ([`pop`](Self::pop)) consumers;
///   [`close`](Self::close) wakes them all and hands every held item back.
///
/// Time comes from an injectable [`quanta::Clock`] ([`Clock::mock`] in tests).
///
/// # Examples
///
/// ```
/// use triage::queue::{Dequeued, Meta, PushError, WfqConfig, WfqQueue};
/// use triage::Criticality;
///
/// let queue = WfqQueue::new(WfqConfig::with_capacity(2))?;
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
    /// the fields every operation only reads (the waiter counts, the clock) are not
    /// invalidated on other cores by each write of these.
    published: CachePadded<Published>,
    /// The count bound, mirrored for blocked producers that poll for room without the lock.
    capacity_hint: AtomicUsize,
    /// Pushes refused by admission, per rank: counted outside the lock.
    overloaded: [CachePadded<AtomicU64>; 4],
    not_empty: Event,
    /// Consumers registered on `not_empty`. A push notifies only when it is non-zero: the
    /// notification itself takes the event's lock and a fence, most of a push's cost otherwise.
    /// A consumer counts itself before its last check under the queue lock, and a producer
    /// reads the count after pushing under that lock, so the lock orders the two and no wake-up
    /// is lost (see `tests/queue_concurrency.rs`).
    waiters: AtomicUsize,
    /// Producers waiting for room in [`push_timeout`](Self::push_timeout) or
    /// [`push_wait`](Self::push_wait); same protocol as `waiters`.
    not_full: Event,
    full_waiters: AtomicUsize,
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
                len: AtomicUsize::new(0),
                pops: AtomicU64::new(0),
                backlog: AtomicU8::new(0),
            }),
            capacity_hint: AtomicUsize::new(capacity),
            overloaded: Default::default(),
            not_empty: Event::new(),
            waiters: AtomicUsize::new(0),
            not_full: Event::new(),
            full_waiters: AtomicUsize::new(0),
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
        let tier = meta.criticality;
        let level = self.shed_level.load(Ordering::Relaxed);
        // After `close` the core refuses the push itself, counted like any other refusal.
        if !admits_at(level, tier) && level != CLOSED_LEVEL {
            self.overloaded[tier.rank()].fetch_add(1, Ordering::Relaxed);
            return Err(PushError::Overloaded(item));
        }
        self.push_unchecked(item, meta)
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
        self.push_unchecked(item, meta)
    }

    /// Like [`push_admitted`](Self::push_admitted), but wakes no consumer: for a consumer that
    /// pushes what it pulled itself and pops right after (the runtime's worker pulling for its
    /// intake, `runtime::intake::PullForIntake`), so that its pushes do not wake others to
    /// race it for them; a pop that leaves items wakes the next consumer as usual.
    pub(crate) fn push_admitted_quiet(
        &self,
        item: T,
        meta: Meta,
    ) -> Result<Evictions<T>, PushError<T>> {
        let now = self.now();
        let mut st = self.state.lock();
        let (evicted, _) = st.core.push(item, meta, now, || self.clock.now())?;
        self.changed(&mut st, now);
        drop(st);
        Ok(evicted)
    }

    #[inline]
    fn push_unchecked(&self, item: T, meta: Meta) -> Result<Evictions<T>, PushError<T>> {
        let now = self.now();
        let mut st = self.state.lock();
        let (evicted, _) = st.core.push(item, meta, now, || self.clock.now())?;
        self.changed(&mut st, now);
        drop(st);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.wake_one();
        }
        Ok(evicted)
    }

    /// After a pop that left `left` items: a consumer that is waiting is woken to take them
    /// (unless one is woken already). With pushes waking one consumer at a time, this chain is
    /// what lets every waiting consumer join in while items remain.
    #[inline]
    fn wake_next(&self, left: usize) {
        if left > 0 && self.waiters.load(Ordering::Relaxed) > 0 {
            self.wake_one();
        }
    }

    /// Wakes one waiting consumer, unless one is woken already. Not `additional`: a consumer
    /// woken already and not yet back takes the new item too, and wakes the next one if it
    /// leaves any (see `wake_next`), so a stream of pushes wakes one consumer per turn, not one
    /// per item. Out of line: the hot paths only test the waiter count.
    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        self.not_empty.notify(1);
    }

    /// Wakes up to `n` more producers waiting for room (out of line, as `wake_one`).
    #[cold]
    #[inline(never)]
    fn wake_producers(&self, n: usize) {
        self.not_full.notify(n.additional());
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
        match st.core.pop(now, || self.clock.now(), mask.0) {
            Some(d) => {
                self.changed(&mut st, now);
                let pops = st.core.pops();
                let left = st.core.len();
                drop(st);
                self.published.pops.store(pops, Ordering::Relaxed);
                self.wake_next(left);
                if self.full_waiters.load(Ordering::Relaxed) > 0 {
                    self.wake_producers(1);
                }
                Ok(d)
            }
            None if st.core.is_closed() && st.core.len() == 0 => Err(TryPopError::Closed),
            None => Err(TryPopError::Empty),
        }
    }

    /// Queues every item of `items` in order, each decided as [`push`](Self::push) would
    /// decide it, under one lock acquisition and with one wake-up for the consumers.
    ///
    /// Items removed to make room (expired or evicted) are appended to `removed`, refused
    /// items (inside their [`PushError`]) to `refused`: nothing is dropped. Reuse both vectors
    /// from batch to batch and a steady stream of batches allocates nothing. Returns how many
    /// items were queued.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::queue::{Meta, TierMask, WfqConfig, WfqQueue};
    /// use triage::Criticality;
    ///
    /// let queue = WfqQueue::new(WfqConfig::with_capacity(2))?;
    /// let (mut removed, mut refused) = (Vec::new(), Vec::new());
    /// let batch = [("a", Criticality::Sheddable), ("b", Criticality::High), ("c", Criticality::Critical)];
    /// let queued = queue.push_batch(
    ///     batch.map(|(item, tier)| (item, Meta::new(tier))),
    ///     &mut removed,
    ///     &mut refused,
    /// );
    /// assert_eq!(queued, 3);
    /// assert_eq!(removed.len(), 1); // "c" evicted "a"
    /// assert!(refused.is_empty());
    ///
    /// let mut served = Vec::new();
    /// assert_eq!(queue.pop_batch_masked(TierMask::ALL, 8, &mut served)?, 2);
    /// let served: Vec<_> = served.into_iter().map(|d| d.into_entry().into_inner()).collect();
    /// assert_eq!(served, ["c", "b"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn push_batch<I>(
        &self,
        items: I,
        removed: &mut Vec<Removed<T>>,
        refused: &mut Vec<PushError<T>>,
    ) -> usize
    where
        I: IntoIterator<Item = (T, Meta)>,
    {
        let now = self.now();
        let mut queued = 0;
        let mut precise = None;
        let mut st = self.state.lock();
        for (item, meta) in items {
            let tier = meta.criticality;
            // Our own re-evaluations below may move the level within the batch.
            let level = self.shed_level.load(Ordering::Relaxed);
            // After `close` the core's push refuses (and counts) the item.
            if !admits_at(level, tier) && level != CLOSED_LEVEL {
                self.overloaded[tier.rank()].fetch_add(1, Ordering::Relaxed);
                refused.push(PushError::Overloaded(item));
                continue;
            }
            let clock = || *precise.get_or_insert_with(|| self.clock.now());
            match st.core.push(item, meta, now, clock) {
                Ok((evicted, _)) => {
                    removed.extend(evicted);
                    queued += 1;
                    self.changed(&mut st, now);
                }
                Err(e) => refused.push(e),
            }
        }
        drop(st);
        if queued > 0 && self.waiters.load(Ordering::Relaxed) > 0 {
            self.not_empty.notify(queued.additional());
        }
        queued
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
            match st.core.pop(now, clock, mask.0) {
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
        if self.full_waiters.load(Ordering::Relaxed) > 0 {
            self.not_full.notify(n.additional());
        }
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

    /// Like [`push`](Self::push), but while the queue is full with nothing lower to evict,
    /// blocks the thread up to `timeout` (wall time) for room: backpressure for an in-process
    /// producer. Any other refusal returns at once.
    ///
    /// # Errors
    ///
    /// As [`push`](Self::push); [`PushError::Full`] once `timeout` has passed without room.
    pub fn push_timeout(
        &self,
        item: T,
        meta: Meta,
        timeout: Duration,
    ) -> Result<Evictions<T>, PushError<T>> {
        let mut item = match self.push(item, meta) {
            Err(PushError::Full(item)) => item,
            other => return other,
        };
        // The clock is read only on the way to sleep: a push that succeeds reads none.
        let started = std::time::Instant::now();
        // Spin, then yield, before sleeping, retrying only when a pop may have made room:
        // parking and unparking a thread costs microseconds, a pop on another core
        // nanoseconds (crossbeam-channel does the same).
        let mut patience = Patience::new();
        let mut pops = self.pop_count();
        while patience.wait() {
            // Retry only when a pop happened and the count has room: a retry that finds the
            // queue full again would only take the lock from the consumers.
            let room = self.len() < self.capacity_hint.load(Ordering::Relaxed);
            if (self.pop_count() != pops && room) || self.is_closed() {
                pops = self.pop_count();
                item = match self.push(item, meta) {
                    Err(PushError::Full(item)) => item,
                    other => return other,
                };
            }
        }
        let until = started.checked_add(timeout);
        loop {
            let waiting = WaitRegistration::new(&self.full_waiters);
            let listener = self.not_full.listen();
            item = match self.push(item, meta) {
                Err(PushError::Full(item)) => item,
                other => return other,
            };
            let woken = match until {
                Some(until) => listener.wait_deadline(until).is_some(),
                None => {
                    listener.wait();
                    true
                }
            };
            drop(waiting);
            if !woken {
                return self.push(item, meta);
            }
            item = match self.push(item, meta) {
                Err(PushError::Full(item)) => item,
                other => return other,
            };
        }
    }

    /// Like [`push`](Self::push), but while the queue is full with nothing lower to evict,
    /// waits (async) for room. Any other refusal returns at once.
    ///
    /// # Errors
    ///
    /// As [`push`](Self::push), except [`PushError::Full`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the item is inside the future, and dropping the future drops it. Wrap
    /// it in a timeout only if losing the item is acceptable, or use [`push`](Self::push) and
    /// keep the item yourself.
    pub async fn push_wait(&self, item: T, meta: Meta) -> Result<Evictions<T>, PushError<T>> {
        let mut item = match self.push(item, meta) {
            Err(PushError::Full(item)) => item,
            other => return other,
        };
        // Let the executor run others (a consumer, likely) once before registering to sleep:
        // a task's yield costs less than a listener and a wake-up.
        if !cfg!(loom) {
            let pops = self.pop_count();
            tokio::task::yield_now().await;
            if self.pop_count() != pops || self.is_closed() {
                item = match self.push(item, meta) {
                    Err(PushError::Full(item)) => item,
                    other => return other,
                };
            }
        }
        loop {
            let waiting = WaitRegistration::new(&self.full_waiters);
            let listener = self.not_full.listen();
            item = match self.push(item, meta) {
                Err(PushError::Full(item)) => item,
                other => return other,
            };
            listener.await;
            drop(waiting);
            item = match self.push(item, meta) {
                Err(PushError::Full(item)) => item,
                other => return other,
            };
        }
    }

    /// Serves the next item by weight, waiting (async) while the queue is empty.
    ///
    /// # Errors
    ///
    /// [`Closed`] once the queue is closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an item is removed only in the poll that returns it, so dropping the future
    /// loses nothing, and a wake-up it had received passes to another waiter.
    pub async fn pop(&self) -> Result<Dequeued<T>, Closed> {
        let mut yielded = false;
        loop {
            // `len` is a hint read without the lock: when it says empty, go straight to
            // registering; the check under the lock below decides.
            if !self.is_empty() || self.is_closed() {
                match self.try_pop() {
                    Ok(d) => return Ok(d),
                    Err(TryPopError::Closed) => return Err(Closed),
                    Err(TryPopError::Empty) => {}
                }
            }
            if !yielded && !cfg!(loom) {
                // As in `push_wait`: yield once before registering to sleep.
                yielded = true;
                tokio::task::yield_now().await;
                continue;
            }
            let waiting = self.wait_registration();
            let listener = self.not_empty.listen();
            match self.try_pop() {
                Ok(d) => return Ok(d),
                Err(TryPopError::Closed) => return Err(Closed),
                Err(TryPopError::Empty) => {}
            }
            listener.await;
            drop(waiting);
        }
    }

    /// Serves the next item by weight, blocking the thread up to `timeout` (wall time) while
    /// the queue is empty.
    ///
    /// # Errors
    ///
    /// [`PopTimeoutError::Timeout`] if nothing arrived in time, [`PopTimeoutError::Closed`] once
    /// the queue is closed.
    pub fn pop_timeout(&self, timeout: Duration) -> Result<Dequeued<T>, PopTimeoutError> {
        match self.try_pop() {
            Ok(d) => return Ok(d),
            Err(TryPopError::Closed) => return Err(PopTimeoutError::Closed),
            Err(TryPopError::Empty) => {}
        }
        // The clock is read only on the way to sleep: a pop that succeeds reads none.
        let until = std::time::Instant::now().checked_add(timeout);
        // As in `push_timeout`: spin, then yield, while nothing is queued, before sleeping.
        let mut patience = Patience::new();
        while patience.wait() {
            if !self.is_empty() || self.is_closed() {
                match self.try_pop() {
                    Ok(d) => return Ok(d),
                    Err(TryPopError::Closed) => return Err(PopTimeoutError::Closed),
                    Err(TryPopError::Empty) => {}
                }
            }
        }
        loop {
            match self.try_pop() {
                Ok(d) => return Ok(d),
                Err(TryPopError::Closed) => return Err(PopTimeoutError::Closed),
                Err(TryPopError::Empty) => {}
            }
            let waiting = self.wait_registration();
            let listener = self.not_empty.listen();
            match self.try_pop() {
                Ok(d) => return Ok(d),
                Err(TryPopError::Closed) => return Err(PopTimeoutError::Closed),
                Err(TryPopError::Empty) => {}
            }
            let woken = match until {
                Some(until) => listener.wait_deadline(until).is_some(),
                None => {
                    listener.wait();
                    true
                }
            };
            drop(waiting);
            if !woken {
                return self.try_pop().map_err(|e| match e {
                    TryPopError::Closed => PopTimeoutError::Closed,
                    _ => PopTimeoutError::Timeout,
                });
            }
        }
    }

    /// Closes the queue: later pushes are refused with [`PushError::Closed`], every waiting
    /// consumer wakes with [`Closed`], and every held item is handed back, most critical tier
    /// first, oldest first within a tier. Closing twice returns nothing the second time.
    pub fn close(&self) -> Vec<Entry<T>> {
        let items = {
            let mut st = self.state.lock();
            self.shed_level.store(CLOSED_LEVEL, Ordering::Relaxed);
            let items = st.core.close();
            self.published.len.store(0, Ordering::Relaxed);
            self.published.backlog.store(0, Ordering::Relaxed);
            items
        };
        self.not_empty.notify(usize::MAX);
        self.not_full.notify(usize::MAX);
        items
    }

    /// Takes out every held item for which `pred` returns `true` and hands them back, most
    /// critical tier first and oldest first within a tier, counted in
    /// [`TierStats::drained`](super::TierStats::drained); the others keep their places and
    /// their order. For a caller that must withdraw some of what it queued without serving it:
    /// the messages of a source that lost them (a revoked partition), or those that have
    /// waited as long as their broker allows unacknowledged.
    ///
    /// Visits every item once, under the lock: a scan of the queue, for events (a
    /// revocation), not for every message.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::queue::{Meta, WfqConfig, WfqQueue};
    /// use triage::Criticality;
    ///
    /// let queue = WfqQueue::new(WfqConfig::with_capacity(8))?;
    /// for (partition, offset) in [(0, 10), (1, 20), (0, 11), (1, 21)] {
    ///     assert!(queue.push((partition, offset), Meta::new(Criticality::High))?.is_empty());
    /// }
    /// // Partition 1 was revoked: its records leave, the others stay in order.
    /// let revoked: Vec<_> = queue
    ///     .drain_where(|&(p, _)| p == 1)
    ///     .into_iter()
    ///     .map(|e| e.into_inner())
    ///     .collect();
    /// assert_eq!(revoked, [(1, 20), (1, 21)]);
    /// assert_eq!(queue.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drain_where(&self, pred: impl FnMut(&T) -> bool) -> Vec<Entry<T>> {
        let mut st = self.state.lock();
        let out = st.core.drain_where(pred);
        if out.is_empty() {
            return out;
        }
        // Younger heads: queue-age admission is re-evaluated now, as after a pop.
        let now = self.now();
        self.observe(&mut st, now);
        drop(st);
        self.not_full.notify(usize::MAX);
        out
    }

    /// From now on, reads each item's *hand-back instant* with `hand_back_of`: the instant by
    /// which the item must leave the queue, served or not (`None`: it may wait for ever). For
    /// a consumer whose broker takes a delivery back by force when it stays unacknowledged too
    /// long (RabbitMQ's `consumer_timeout`): [`take_due`](Self::take_due) then takes out what
    /// is due, so it can be handed back in time. The function must be cheap and pure (the same
    /// answer for an item whenever it is asked): a push calls it once. Calling this again
    /// replaces the function. The items already held are scanned once, under the lock.
    pub fn track_hand_backs(&self, hand_back_of: fn(&T) -> Option<Instant>) {
        self.state.lock().core.track_hand_backs(hand_back_of);
    }

    /// Takes out every held item whose hand-back instant (see
    /// [`track_hand_backs`](Self::track_hand_backs)) is at or before the clock's time now, and
    /// hands them back, most critical tier first and oldest first within a tier, counted in
    /// [`TierStats::drained`](super::TierStats::drained); the others keep their places and
    /// their order. Empty until `track_hand_backs` is called.
    ///
    /// Cheap enough for a timer tick, whatever the queue holds: it looks at each tier's head
    /// while it is due, and scans a tier only when an item queued behind a later one (a
    /// message offered again after waiting elsewhere, a retry, one of a source with less
    /// patience, or one behind an item that may wait for ever) may be due: at most once per
    /// such item handed back, never per message (see `hand_back.rs` for the bounds that make
    /// this exact).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use triage::quanta::{Clock, Instant};
    /// use triage::queue::{Meta, WfqConfig, WfqQueue};
    /// use triage::Criticality;
    ///
    /// let (clock, mock) = Clock::mock();
    /// let queue: WfqQueue<(&str, Option<Instant>)> =
    ///     WfqQueue::with_clock(WfqConfig::with_capacity(8), clock.clone())?;
    /// queue.track_hand_backs(|&(_, by)| by);
    /// let soon = clock.now() + Duration::from_secs(1);
    /// for item in [("a", Some(soon)), ("b", None), ("c", Some(soon + Duration::from_secs(5)))] {
    ///     assert!(queue.push(item, Meta::new(Criticality::Sheddable))?.is_empty());
    /// }
    /// assert!(queue.take_due().is_empty());
    /// mock.increment(Duration::from_secs(1));
    /// let due: Vec<_> = queue.take_due().into_iter().map(|e| e.into_inner().0).collect();
    /// assert_eq!(due, ["a"]);
    /// mock.increment(Duration::from_secs(5));
    /// // "c" waited behind "b", which may wait for ever: found all the same.
    /// let due: Vec<_> = queue.take_due().into_iter().map(|e| e.into_inner().0).collect();
    /// assert_eq!(due, ["c"]);
    /// assert_eq!(queue.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn take_due(&self) -> Vec<Entry<T>> {
        let mut out = Vec::new();
        let mut st = self.state.lock();
        // A precise read: a periodic caller must not keep the clock's upkeep thread awake
        // (see the `time` module).
        let now = self.clock.now();
        st.core.take_due(now, &mut out);
        if out.is_empty() {
            return out;
        }
        self.observe(&mut st, now);
        drop(st);
        self.not_full.notify(usize::MAX);
        out
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shed_level.load(Ordering::Relaxed) == CLOSED_LEVEL
    }

    /// Applies a new configuration to the live queue: weights, bounds and cut-offs.
    ///
    /// Shrinking the bounds evicts by the push rule (newest item of the lowest non-empty tier
    /// first) until the queue fits, and returns what it evicted.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `config` fails [`WfqConfig::validate`]; the
    /// queue is then unchanged.
    pub fn reconfigure(&self, config: WfqConfig) -> Result<Vec<Entry<T>>, ConfigError> {
        config.validate()?;
        let mut st = self.state.lock();
        st.core.set_weights(weights_by_rank(&config));
        let evicted = st
            .core
            .set_bounds(config.capacity.get(), config.max_bytes.map(|b| b.get()));
        st.admission.reconfigure(&config.admission);
        self.capacity_hint
            .store(config.capacity.get(), Ordering::Relaxed);
        st.config = config;
        let now = self.now();
        self.observe(&mut st, now);
        drop(st);
        // A larger bound may have made room for blocked producers.
        self.not_full.notify(usize::MAX);
        Ok(evicted)
    }

    /// Whether a push of `tier` would, as the queue was last published, find it full by count
    /// with nothing of a lower tier to evict: three relaxed loads, no lock. A hint, not a
    /// promise: it may be stale either way, and it ignores expired items a push would discard
    /// and the byte budget. For a holder of refused items deciding whether an offer is worth
    /// its lock (`runtime::engine`: a pulled message that would wait for room anyway).
    pub(crate) fn looks_full_for(&self, tier: Criticality) -> bool {
        let below = (1u8 << tier.rank()) - 1;
        self.published.len.load(Ordering::Relaxed) >= self.capacity_hint.load(Ordering::Relaxed)
            && self.published.backlog.load(Ordering::Relaxed) & below == 0
    }

    /// Items taken out by pops so far (served or expired), read without the lock.
    pub(crate) fn pop_count(&self) -> u64 {
        self.published.pops.load(Ordering::Relaxed)
    }

    /// Counts a consumer as waiting until the guard drops. Take it before the listener and
    /// before the last check of the queue.
    pub(crate) fn wait_registration(&self) -> WaitRegistration<'_> {
        WaitRegistration::new(&self.waiters)
    }

    /// The event a push or a close notifies: for a consumer's own listener (the
    /// `event_listener::listener!` macro keeps it on the waiting task's stack). Hold a
    /// [`wait_registration`](Self::wait_registration) while using it.
    pub(crate) fn not_empty(&self) -> &Event {
        &self.not_empty
    }

    /// Puts entries popped as ready but not served back at the head of their tiers, keeping
    /// their stamps and refunding their tiers' scheduling charges, under one lock, as far as the
    /// bounds allow: for a consumer that took a batch, served its item of tier `after` and
    /// cannot serve the rest soon.
    ///
    /// `batch` holds the pops that came right after that one, in **reverse** serving order (the
    /// last element is the next to serve, as a worker holds its batch). The queue takes them
    /// from the front of `batch` (the last popped first), so what goes back is always the tail
    /// of the batch's pops and the weighted-fair order goes on as if they had not been popped.
    /// It stops at the first that would exceed the count bound or the byte budget (pushes may
    /// have filled the room the batch left) or that is not [`Dequeued::Ready`]: those stay in
    /// `batch`, for the caller to serve itself, in the same order. So the queue never holds more
    /// than its bounds, and nothing is evicted or refused for an item that was already admitted.
    ///
    /// Returns how many went back. Once the queue is closed, takes nothing and returns
    /// [`Closed`]: the caller hands every entry of `batch` on as a queued item at shutdown.
    pub(crate) fn requeue(
        &self,
        batch: &mut Vec<Dequeued<T>>,
        after: Criticality,
    ) -> Result<usize, Closed> {
        let mut st = self.state.lock();
        if st.core.is_closed() {
            return Err(Closed);
        }
        let mut count = 0;
        let mut bytes: usize = 0;
        let fits = batch
            .iter()
            .take_while(|d| match d {
                Dequeued::Ready(e) => {
                    count += 1;
                    // A sum past `usize::MAX` exceeds any budget.
                    match bytes.checked_add(st.core.budgeted(e.size_bytes)) {
                        Some(sum) => {
                            bytes = sum;
                            st.core.has_room(count, bytes)
                        }
                        None => false,
                    }
                }
                Dequeued::Expired(_) => false,
            })
            .count();
        if fits == 0 {
            return Ok(0);
        }
        // The service the requeued pops came after: the latest ready one this caller keeps,
        // else the one it is serving.
        let last_kept = batch[fits..]
            .iter()
            .find_map(|d| match d {
                Dequeued::Ready(e) => Some(e.criticality),
                Dequeued::Expired(_) => None,
            })
            .unwrap_or(after);
        for d in batch.drain(..fits) {
            st.core.requeue_front(d.into_entry());
        }
        st.core.requeued_after(last_kept.rank());
        let now = self.now();
        // Older heads again: admission is re-evaluated now, not at its next recheck.
        self.observe(&mut st, now);
        let pops = st.core.pops();
        drop(st);
        self.published.pops.store(pops, Ordering::Relaxed);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.not_empty.notify(usize::MAX.additional());
        }
        Ok(fits)
    }

    /// The tiers holding items now.
    pub(crate) fn backlog(&self) -> TierMask {
        TierMask(self.state.lock().core.backlogged())
    }

    /// Re-evaluates queue-age admission now. Pushes and pops already do so; call this from a
    /// timer if the queue can sit idle while shed, so the shed level still reflects time passing.
    pub fn refresh_admission(&self) {
        let mut st = self.state.lock();
        // A precise read: a periodic caller must not count as a use that keeps the clock's
        // upkeep thread awake in an idle process (see the `time` module).
        let now = self.clock.now();
        self.observe(&mut st, now);
    }

    /// After a push or pop changed the queue at `now`: publishes the length and re-evaluates
    /// queue-age admission unless it provably cannot change.
    /// Publishes the length and the backlog bitmask that readers poll without the lock
    /// (`len`, `looks_full_for`).
    #[inline]
    fn publish(&self, st: &State<T>) {
        self.published.len.store(st.core.len(), Ordering::Relaxed);
        self.published
            .backlog
            .store(st.core.backlogged(), Ordering::Relaxed);
    }

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

    /// Whether a push of `tier` would pass queue-age admission right now: one atomic load.
    /// Check it before doing anything expensive for a message (deserialising, classifying by
    /// payload), so refusing stays cheap.
    #[inline]
    pub fn admits(&self, tier: Criticality) -> bool {
        admits_at(self.shed_level.load(Ordering::Relaxed), tier)
    }

    /// Queue-age admission's shed level: tiers with `rank() < level` are refused (0 admits
    /// everything, 4 refuses everything).
    pub fn shed_level(&self) -> u8 {
        self.shed_level.load(Ordering::Relaxed).min(4)
    }

    /// Items held, across tiers. Read without the lock, so possibly a moment stale.
    #[inline]
    pub fn len(&self) -> usize {
        self.published.len.load(Ordering::Relaxed)
    }

    /// Whether nothing is held. Read without the lock.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most items held, from the current configuration.
    pub fn capacity(&self) -> usize {
        self.state.lock().config.capacity.get()
    }

    /// The current configuration.
    pub fn config(&self) -> WfqConfig {
        self.state.lock().config.clone()
    }

    /// Items held per tier.
    pub fn depths(&self) -> PerTier<usize> {
        let [s, m, h, c] = self.state.lock().core.depths();
        PerTier::new(c, h, m, s)
    }

    /// The queue age each tier sees now: the wait of the oldest item at that tier or above
    /// (zero when none waits). The global queue age is `ages().sheddable`.
    pub fn ages(&self) -> PerTier<Duration> {
        let st = self.state.lock();
        // Precise, as `refresh_admission`: read by periodic reporters.
        let [s, m, h, c] = st.core.ages(self.clock.now());
        PerTier::new(c, h, m, s)
    }

    /// Age of the oldest item held, any tier (zero when empty).
    pub fn queue_age(&self) -> Duration {
        self.ages().sheddable
    }

    /// A snapshot of the counters per tier.
    pub fn stats(&self) -> QueueStats {
        let st = self.state.lock();
        let overloaded = [0, 1, 2, 3].map(|r| self.overloaded[r].load(Ordering::Relaxed));
        st.core.stats(self.shed_level(), overloaded)
    }

    /// The clock the queue reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::QueueAgeConfig;

    fn queue(capacity: usize) -> WfqQueue<u32> {
        let config = WfqConfig::with_capacity(capacity).admission(QueueAgeConfig::disabled());
        WfqQueue::with_clock(config, Clock::mock().0).expect("valid config")
    }

    fn items(q: &WfqQueue<u32>) -> Vec<u32> {
        std::iter::from_fn(|| q.try_pop().ok().map(|d| d.into_entry().into_inner())).collect()
    }

    /// Asking a batch pop for nothing takes nothing and is not an error while items are held.
    #[test]
    fn a_batch_pop_of_zero_items_is_ok_zero() {
        let q = queue(4);
        let mut out = Vec::new();
        assert_eq!(q.pop_batch(0, &mut out), Ok(0));
        assert_eq!(
            q.push(1, Meta::new(Criticality::High))
                .expect("room")
                .count(),
            0
        );
        assert_eq!(q.pop_batch(0, &mut out), Ok(0));
        assert!(out.is_empty());
        assert_eq!(q.len(), 1);
        assert_eq!(q.close().len(), 1);
        assert_eq!(q.pop_batch(0, &mut out), Err(TryPopError::Closed));
    }

    /// A push refused because the queue is closed is counted like any other refusal, by every
    /// push path, and the stats still balance.
    #[test]
    fn pushes_after_close_are_counted_as_refused_closed() {
        let q = queue(4);
        q.close();
        assert!(matches!(
            q.push(1, Meta::new(Criticality::High)),
            Err(PushError::Closed(1))
        ));
        assert!(matches!(
            q.push_admitted(2, Meta::new(Criticality::High)),
            Err(PushError::Closed(2))
        ));
        let (mut removed, mut refused) = (Vec::new(), Vec::new());
        let batch = [(3, Meta::new(Criticality::Sheddable))];
        assert_eq!(q.push_batch(batch, &mut removed, &mut refused), 0);
        assert!(matches!(refused[..], [PushError::Closed(3)]));
        let stats = q.stats();
        let high = stats.tier(Criticality::High);
        assert_eq!(high.refused_for(crate::queue::RefuseReason::Closed), 2);
        assert_eq!(high.pushed, 2);
        let sheddable = stats.tier(Criticality::Sheddable);
        assert_eq!(sheddable.refused_for(crate::queue::RefuseReason::Closed), 1);
        assert!(stats.balances(), "{stats}");
    }

    /// A full queue does not evict a live item for one whose own deadline has passed: the
    /// incoming item is refused and the live one kept. Room made by discarding expired items
    /// alone is still used.
    #[test]
    fn an_item_expired_on_arrival_evicts_no_live_item() {
        let (clock, mock) = Clock::mock();
        let config = WfqConfig::with_capacity(1).admission(QueueAgeConfig::disabled());
        let q = WfqQueue::with_clock(config, clock.clone()).expect("valid config");
        mock.increment(Duration::from_secs(1));
        let past = clock.now() - Duration::from_millis(1);
        assert_eq!(
            q.push(1, Meta::new(Criticality::Sheddable))
                .expect("room")
                .count(),
            0
        );
        let dead = Meta::new(Criticality::Critical).deadline(past);
        assert!(matches!(q.push(2, dead), Err(PushError::Full(2))));
        assert_eq!(items(&q), [1]);
        // The held item expired: discarding it makes room, no live item is evicted.
        let soon = clock.now() + Duration::from_millis(5);
        assert_eq!(
            q.push(3, Meta::new(Criticality::Sheddable).deadline(soon))
                .expect("room")
                .count(),
            0
        );
        mock.increment(Duration::from_millis(10));
        let removed: Vec<_> = q.push(4, dead).unwrap().collect();
        assert!(matches!(removed[..], [Removed::Expired(_)]));
        assert!(q.stats().balances());
    }

    /// Sizes near `usize::MAX` neither overflow the byte counters nor exceed the budget: what
    /// cannot be held is refused.
    #[test]
    fn sizes_near_usize_max_are_refused_not_overflowed() {
        let config = WfqConfig::with_capacity(4)
            .admission(QueueAgeConfig::disabled())
            .max_bytes(std::num::NonZeroUsize::new(usize::MAX));
        let q = WfqQueue::with_clock(config, Clock::mock().0).expect("valid config");
        let none = q
            .push(
                1,
                Meta::new(Criticality::Sheddable).size_bytes(usize::MAX - 1),
            )
            .expect("room");
        assert_eq!(none.count(), 0);
        // Room by bytes only by evicting the Sheddable item.
        let evicted: Vec<_> = q
            .push(2, Meta::new(Criticality::Critical).size_bytes(10))
            .unwrap()
            .map(Removed::into_inner)
            .collect();
        assert_eq!(evicted, [1]);
        // Nothing below Critical to evict: refused, the held item kept.
        assert!(matches!(
            q.push(
                3,
                Meta::new(Criticality::Critical).size_bytes(usize::MAX - 1)
            ),
            Err(PushError::Full(3))
        ));
        assert_eq!(q.stats().tier(Criticality::Critical).bytes, 10);
        assert!(q.stats().balances());
    }

    /// Without a byte budget the queue bounds by count only, however large the sizes: sizes
    /// adding up past `usize::MAX` evict nothing and are not refused while slots are free, and
    /// the byte stats saturate rather than wrap.
    #[test]
    fn without_a_budget_sizes_past_usize_max_are_bounded_by_count_only() {
        let config = WfqConfig::with_capacity(4).admission(QueueAgeConfig::disabled());
        let q = WfqQueue::with_clock(config, Clock::mock().0).expect("valid config");
        let huge = usize::MAX - 1;
        for (item, tier) in [
            (1, Criticality::Sheddable),
            (2, Criticality::Critical),
            (3, Criticality::Critical),
            (4, Criticality::Sheddable),
        ] {
            let removed = q
                .push(item, Meta::new(tier).size_bytes(huge))
                .expect("a free slot admits any size without a budget");
            assert_eq!(removed.count(), 0, "item {item} evicted something");
        }
        assert_eq!(q.len(), 4);
        assert_eq!(q.stats().tier(Criticality::Critical).bytes, u64::MAX);
        assert_eq!(
            q.stats().tier(Criticality::Sheddable).bytes,
            u64::MAX,
            "two sizes of usize::MAX - 1 saturate"
        );
        // Full by count: a Critical push evicts the newest Sheddable, as with small sizes.
        let evicted: Vec<_> = q
            .push(5, Meta::new(Criticality::Critical).size_bytes(huge))
            .expect("room by eviction")
            .map(Removed::into_inner)
            .collect();
        assert_eq!(evicted, [4]);
        assert_eq!(
            q.stats().tier(Criticality::Sheddable).bytes,
            huge as u64,
            "exact again once the total fits"
        );
        // Setting a budget evicts until the held sizes fit it, lowest tier first, newest first.
        let evicted: Vec<u32> = q
            .reconfigure(
                WfqConfig::with_capacity(4)
                    .admission(QueueAgeConfig::disabled())
                    .max_bytes(std::num::NonZeroUsize::new(usize::MAX)),
            )
            .expect("valid config")
            .into_iter()
            .map(Entry::into_inner)
            .collect();
        assert_eq!(evicted, [1, 5, 3]);
        assert_eq!(q.stats().tier(Criticality::Critical).bytes, huge as u64);
        // The budget now counts: one byte more than it leaves is refused.
        assert!(matches!(
            q.push(6, Meta::new(Criticality::Critical).size_bytes(2)),
            Err(PushError::Full(6))
        ));
        assert!(q.stats().balances());
    }

    /// The lock-free hint agrees with what a push would do: full by count with nothing below
    /// a tier refuses that tier, an item of a lower tier makes room for it, and a pop opens room.
    #[test]
    fn looks_full_for_matches_the_push() {
        let q = queue(2);
        assert!(!q.looks_full_for(Criticality::Critical));
        assert_eq!(q.push(1, Meta::new(Criticality::High)).unwrap().count(), 0);
        assert_eq!(
            q.push(2, Meta::new(Criticality::Medium)).unwrap().count(),
            0
        );
        // Full: Critical and High could evict the Medium item, Medium and Sheddable could not.
        assert!(!q.looks_full_for(Criticality::Critical));
        assert!(!q.looks_full_for(Criticality::High));
        assert!(q.looks_full_for(Criticality::Medium));
        assert!(q.looks_full_for(Criticality::Sheddable));
        assert!(matches!(
            q.push(3, Meta::new(Criticality::Medium)),
            Err(PushError::Full(3))
        ));
        // High evicts the Medium item: now nothing below High.
        let evicted = q.push(4, Meta::new(Criticality::High)).unwrap();
        assert_eq!(evicted.count(), 1);
        assert!(q.looks_full_for(Criticality::High));
        assert!(!q.looks_full_for(Criticality::Critical));
        assert!(matches!(
            q.push(5, Meta::new(Criticality::High)),
            Err(PushError::Full(5))
        ));
        // A pop makes room for every tier.
        assert_eq!(q.try_pop().unwrap().into_entry().into_inner(), 1);
        assert!(!q.looks_full_for(Criticality::Sheddable));
        drop(q.close());
        assert!(!q.looks_full_for(Criticality::Critical));
    }

    /// A worker took a batch of 8 from a full queue of 8, served the first, and while its
    /// handler waits the intake filled 6 of the 8 slots again: only 2 of the 7 it hands back
    /// fit. They are the last 2 of the batch's pops; the first 5 stay with the worker, in
    /// order, and the queue holds 8, never 13 (it held 13 before: the bound was ignored).
    #[test]
    fn requeue_stays_within_capacity() {
        let q = queue(8);
        for i in 0..8 {
            assert!(q.push(i, Meta::new(Criticality::High)).unwrap().is_empty());
        }
        let mut batch = Vec::new();
        assert_eq!(q.pop_batch(8, &mut batch), Ok(8));
        batch.reverse();
        let served = batch.pop().unwrap().into_entry().into_inner();
        assert_eq!(served, 0);
        for i in 100..106 {
            assert!(q.push(i, Meta::new(Criticality::High)).unwrap().is_empty());
        }
        assert_eq!(q.requeue(&mut batch, Criticality::High), Ok(2));
        assert_eq!(q.len(), 8);
        let kept: Vec<u32> = batch
            .into_iter()
            .rev()
            .map(|d| d.into_entry().into_inner())
            .collect();
        assert_eq!(kept, [1, 2, 3, 4, 5]);
        assert_eq!(items(&q), [6, 7, 100, 101, 102, 103, 104, 105]);
    }

    /// With room, everything goes back, and the weighted-fair order goes on as if the batch
    /// had not been taken: the same sequence as a queue that only served the first item.
    #[test]
    fn requeue_with_room_restores_the_order() {
        let fill = |q: &WfqQueue<u32>| {
            for i in 0..16 {
                let tier = Criticality::ALL[(i % 4) as usize];
                assert!(q.push(i, Meta::new(tier)).unwrap().is_empty());
            }
        };
        let (a, b) = (queue(32), queue(32));
        fill(&a);
        fill(&b);
        let mut batch = Vec::new();
        assert_eq!(a.pop_batch(6, &mut batch), Ok(6));
        batch.reverse();
        let first = batch.pop().unwrap().into_entry();
        assert_eq!(a.requeue(&mut batch, first.criticality()), Ok(5));
        assert!(batch.is_empty());
        let only_first = b.try_pop().unwrap().into_entry();
        assert_eq!(first.into_inner(), only_first.into_inner());
        assert_eq!(items(&a), items(&b));
    }

    /// `drain_where` takes exactly the matches, most critical first and oldest first, leaves
    /// the others in their order, counts what it took as drained (the stats balance), makes
    /// room for a push, and re-evaluates queue-age admission at once: draining the old head
    /// that shed a tier admits it again without waiting for a push or a pop.
    #[test]
    fn drain_where_takes_the_matches_and_rereads_the_ages() {
        let (clock, mock) = Clock::mock();
        let config = WfqConfig::with_capacity(4);
        let q = WfqQueue::with_clock(config, clock).expect("valid config");
        for (i, tier) in [
            Criticality::Sheddable,
            Criticality::High,
            Criticality::Sheddable,
            Criticality::High,
        ]
        .into_iter()
        .enumerate()
        {
            assert!(q.push(i as u32, Meta::new(tier)).unwrap().is_empty());
        }
        mock.increment(Duration::from_secs(1));
        q.refresh_admission();
        assert!(!q.admits(Criticality::Sheddable), "aged a second");
        let taken: Vec<u32> = q
            .drain_where(|&i| i != 2)
            .into_iter()
            .map(|e| e.into_inner())
            .collect();
        assert_eq!(taken, [1, 3, 0]);
        let stats = q.stats();
        assert_eq!(stats.tier(Criticality::High).drained, 2);
        assert_eq!(stats.tier(Criticality::Sheddable).drained, 1);
        assert!(stats.balances(), "{stats}");
        assert_eq!(q.len(), 1);
        assert!(q.drain_where(|_| false).is_empty());
        // The one left is as old as the drained ones: still shed. Drained too, the queue is
        // empty and admits again at once.
        assert!(!q.admits(Criticality::Sheddable));
        assert_eq!(q.drain_where(|_| true).len(), 1);
        assert!(q.admits(Criticality::Sheddable));
        assert_eq!(q.len(), 0);
    }

    /// A worker hands back to the head of its tier an item due later than the one now at the
    /// head: the earlier one, behind it, is found when due all the same (it straggles), and
    /// so is one queued behind an item that may wait for ever.
    #[test]
    fn take_due_finds_an_item_behind_a_later_one() {
        type Item = (u32, Option<Instant>);
        let (clock, mock) = Clock::mock();
        let config = WfqConfig::with_capacity(8).admission(QueueAgeConfig::disabled());
        let q: WfqQueue<Item> = WfqQueue::with_clock(config, clock.clone()).expect("valid");
        q.track_hand_backs(|&(_, by)| by);
        let at = |ms| Some(clock.now() + Duration::from_millis(ms));
        let tier = Meta::new(Criticality::Sheddable);
        assert!(q.push((1, at(50)), tier).unwrap().is_empty());
        let mut batch = Vec::new();
        assert_eq!(q.pop_batch(1, &mut batch), Ok(1));
        assert!(q.push((2, at(10)), tier).unwrap().is_empty());
        assert!(q.push((3, None), tier).unwrap().is_empty());
        assert!(q.push((4, at(20)), tier).unwrap().is_empty());
        // Item 1 goes back in front of item 2, which is due sooner.
        assert_eq!(q.requeue(&mut batch, Criticality::High), Ok(1));
        let ids = |v: Vec<Entry<Item>>| v.into_iter().map(|e| e.into_inner().0).collect::<Vec<_>>();
        assert!(q.take_due().is_empty());
        mock.increment(Duration::from_millis(10));
        assert_eq!(ids(q.take_due()), [2]);
        mock.increment(Duration::from_millis(10));
        assert_eq!(ids(q.take_due()), [4]);
        mock.increment(Duration::from_millis(30));
        assert_eq!(ids(q.take_due()), [1]);
        let stats = q.stats();
        assert_eq!(stats.tier(Criticality::Sheddable).drained, 3);
        assert!(stats.balances(), "{stats}");
        assert_eq!(ids(q.close()), [3]);
    }

    #[test]
    fn requeue_after_close_takes_nothing() {
        let q = queue(4);
        assert!(q.push(1, Meta::new(Criticality::High)).unwrap().is_empty());
        assert!(q.push(2, Meta::new(Criticality::High)).unwrap().is_empty());
        let mut batch = Vec::new();
        assert_eq!(q.pop_batch(2, &mut batch), Ok(2));
        let _ = q.close();
        assert_eq!(q.requeue(&mut batch, Criticality::High), Err(Closed));
        assert_eq!(batch.len(), 2);
    }
}
