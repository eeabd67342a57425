//! Concurrency limits: how many jobs a worker may run at once, and how much of
//! that each criticality tier may use.
//!
//! Little's law ties concurrency, throughput and latency together: past the
//! point where a downstream saturates, more concurrent jobs add only latency
//! (and eventually timeouts and retries). A *limit algorithm* searches for that
//! point from per-job feedback, the way TCP congestion control searches for a
//! path's capacity from acknowledgements:
//!
//! - [`Fixed`]: a static limit.
//! - [`Aimd`]: loss-based additive-increase / multiplicative-decrease (TCP,
//!   Jacobson 1988; Netflix concurrency-limits `AIMDLimit`).
//! - [`Gradient2`]: latency-based, comparing recent latency to a long-term
//!   baseline (TCP Vegas; Netflix concurrency-limits `Gradient2Limit`).
//!
//! [`Limiter`] is an enum over the three rather than a trait object: the set is
//! closed, dispatch is a jump on a tag, and no allocation is needed.
//!
//! [`TierShares`] scales the limit per tier ("Load Shedding: drop low-priority
//! work to save the rest", priority-scaled concurrency shares), and
//! [`ConcurrencyLimit`] puts both behind a lock-free admission check that worker
//! tasks share.
//!
//! No algorithm reads a clock: each [`Sample`] carries its own latency, so tests
//! drive the algorithms with virtual time.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::loom::{fence, AtomicUsize, Mutex, Ordering};
use crate::Criticality;

mod aimd;
mod config;
mod error;
mod fixed;
mod gradient2;
mod shares;

pub use aimd::{Aimd, AimdConfig};
pub use config::LimitConfig;
pub use error::{LimitConfigError, MAX_LIMIT};
pub use fixed::Fixed;
pub use gradient2::{Gradient2, Gradient2Config};
pub use shares::TierShares;

/// What one completed job tells a limit algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Handler run time, from start to completion (not including time queued).
    pub latency: Duration,
    /// Jobs in flight when this job started, this job included.
    pub in_flight: usize,
    /// The job was dropped or failed *because of overload* (downstream rejected
    /// it, a pool was exhausted, its deadline expired while running). Ordinary
    /// failures must report `false`: they say nothing about capacity.
    pub dropped: bool,
}

/// One of the limit algorithms.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use triage::limit::{Aimd, Limiter, Sample};
///
/// let mut limiter = Limiter::from(Aimd::default());
/// let sample = Sample { latency: Duration::from_millis(5), in_flight: 20, dropped: false };
/// assert_eq!(limiter.on_sample(sample), 21);
/// assert_eq!(limiter.limit(), 21);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Limiter {
    /// See [`Fixed`].
    Fixed(Fixed),
    /// See [`Aimd`].
    Aimd(Aimd),
    /// See [`Gradient2`].
    Gradient2(Gradient2),
}

impl Limiter {
    /// The current limit, in concurrent jobs; at least 1.
    pub fn limit(&self) -> usize {
        match self {
            Limiter::Fixed(l) => l.limit(),
            Limiter::Aimd(l) => l.limit(),
            Limiter::Gradient2(l) => l.limit(),
        }
    }

    /// Applies one completed job and returns the new limit.
    pub fn on_sample(&mut self, sample: Sample) -> usize {
        match self {
            Limiter::Fixed(l) => l.on_sample(sample),
            Limiter::Aimd(l) => l.on_sample(sample),
            Limiter::Gradient2(l) => l.on_sample(sample),
        }
    }
}

impl From<Fixed> for Limiter {
    fn from(l: Fixed) -> Self {
        Limiter::Fixed(l)
    }
}

impl From<Aimd> for Limiter {
    fn from(l: Aimd) -> Self {
        Limiter::Aimd(l)
    }
}

impl From<Gradient2> for Limiter {
    fn from(l: Gradient2) -> Self {
        Limiter::Gradient2(l)
    }
}

/// A limiter shared by all workers of a runtime: admission is a lock-free
/// check-and-increment, and only job completion takes a lock.
///
/// Cloning is cheap (one `Arc`) and clones share state.
///
/// A lowered limit applies to new admissions only: permits already granted are
/// never revoked, so `in_flight()` may briefly exceed a limit that has just
/// fallen, and drains below it as jobs finish.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use triage::Criticality;
/// use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
///
/// let limit = ConcurrencyLimit::new(Fixed::new(4)?.into(), TierShares::default());
///
/// // Sheddable work may use half of the limit: 2 slots.
/// let a = limit.try_acquire(Criticality::Sheddable).expect("slot 1 of 2");
/// let b = limit.try_acquire(Criticality::Sheddable).expect("slot 2 of 2");
/// assert!(limit.try_acquire(Criticality::Sheddable).is_none());
/// // Critical work may still use the rest.
/// let c = limit.try_acquire(Criticality::Critical).expect("slot 3 of 4");
/// assert_eq!(c.in_flight_at_start(), 3);
/// assert_eq!(limit.in_flight(), 3);
///
/// a.record(Duration::from_millis(12), false); // feeds the algorithm, releases
/// drop(b);                                    // releases without a sample
/// drop(c);
/// assert_eq!(limit.in_flight(), 0);
/// # Ok::<(), triage::limit::LimitConfigError>(())
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimit {
    inner: Arc<Inner>,
}

struct Inner {
    /// Per tier rank, notified when a slot that tier may use is released: a release wakes
    /// only as many waiters as it lets proceed (one per free slot), not every worker.
    released: [event_listener::Event; 4],
    /// Per tier rank, waiters registered on `released`. A waiter counts itself, then a
    /// `SeqCst` fence, then its last check of `in_flight`; a release lowers `in_flight`, then a
    /// `SeqCst` fence, then reads the count: the two fences order the pairs, so either the
    /// check sees the free slot or the release sees the waiter (checked by
    /// `tests/loom_queue.rs`; loom models fences exactly, `SeqCst` accesses only as `AcqRel`).
    waiting: [AtomicUsize; 4],
    algorithm: Mutex<Limiter>,
    /// Mirror of `algorithm.limit()`, written only under the lock, so that
    /// admission never takes it.
    limit: AtomicUsize,
    /// Whether the algorithm is [`Fixed`], which learns nothing from a sample: then a
    /// completion takes no lock (written with `algorithm`, under its lock).
    fixed: crate::sync::AtomicBool,
    in_flight: AtomicUsize,
    /// Each tier's share in fixed point (`TierShares::fixed`), indexed by rank: atomics, so
    /// that [`ConcurrencyLimit::set_shares`] applies live while admission reads without a lock.
    /// A reader may see old and new shares of different tiers for an instant; each value is
    /// valid, and the next read sees the new set.
    shares_fixed: [crate::sync::AtomicU64; 4],
    /// The shares as configured, for [`ConcurrencyLimit::shares`].
    shares: Mutex<TierShares>,
}

impl fmt::Debug for ConcurrencyLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("shares", &*self.inner.shares.lock())
            .field("algorithm", &*self.inner.algorithm.lock())
            .finish()
    }
}

impl ConcurrencyLimit {
    /// Shares `algorithm` between workers, scaling its limit per tier by `shares`.
    pub fn new(algorithm: Limiter, shares: TierShares) -> Self {
        let limit = algorithm.limit();
        Self {
            inner: Arc::new(Inner {
                released: Default::default(),
                waiting: Default::default(),
                fixed: crate::sync::AtomicBool::new(matches!(algorithm, Limiter::Fixed(_))),
                algorithm: Mutex::new(algorithm),
                limit: AtomicUsize::new(limit),
                in_flight: AtomicUsize::new(0),
                shares_fixed: shares.fixed().map(crate::sync::AtomicU64::new),
                shares: Mutex::new(shares),
            }),
        }
    }

    /// The current limit, in concurrent jobs (all tiers together).
    pub fn limit(&self) -> usize {
        self.inner.limit.load(Ordering::Relaxed)
    }

    /// Jobs currently holding a [`Permit`].
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Relaxed)
    }

    /// How many jobs may be in flight for a `tier` job to start, at the current
    /// limit; see [`TierShares::allowed`].
    pub fn allowed(&self, tier: Criticality) -> usize {
        self.inner.allowed(self.limit(), tier)
    }

    /// Bit `rank` set for each tier that may start a job now (`in_flight < allowed(tier)`).
    pub fn allowed_mask(&self) -> crate::queue::TierMask {
        let limit = self.limit();
        let in_flight = self.in_flight();
        let mut mask = 0;
        for tier in Criticality::ALL {
            if in_flight < self.inner.allowed(limit, tier) {
                mask |= 1 << tier.rank();
            }
        }
        crate::queue::TierMask::from_bits(mask)
    }

    /// Takes a slot for one `tier` job, waiting (async) while [`allowed`](Self::allowed) jobs
    /// are in flight. A release wakes one waiter per slot it frees, not every waiter.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the permit is taken only in the poll that returns it, and a wake-up the
    /// dropped future had received passes to another waiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
    /// use triage::Criticality;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limit = ConcurrencyLimit::new(Fixed::new(1)?.into(), TierShares::default());
    /// let first = limit.acquire(Criticality::High).await;
    /// let second = tokio::spawn({
    ///     let limit = limit.clone();
    ///     async move { limit.acquire(Criticality::High).await.in_flight_at_start() }
    /// });
    /// drop(first); // wakes the waiting task
    /// assert_eq!(second.await.unwrap(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn acquire(&self, tier: Criticality) -> Permit {
        loop {
            if let Some(p) = self.try_acquire(tier) {
                return p;
            }
            let released = self.listen(tier);
            if let Some(p) = self.try_acquire(tier) {
                return p;
            }
            released.await;
        }
    }

    /// A waiter for a slot that a `tier` job may use, counted until dropped: woken when a
    /// release frees such a slot. Take it before the last [`try_acquire`](Self::try_acquire)
    /// (or the last check of [`allowed_mask`](Self::allowed_mask)), then await it.
    pub(crate) fn listen(&self, tier: Criticality) -> ReleaseListener<'_> {
        let rank = tier.rank();
        self.inner.waiting[rank].fetch_add(1, Ordering::Relaxed);
        let listener = ReleaseListener {
            waiting: &self.inner.waiting[rank],
            listener: self.inner.released[rank].listen(),
        };
        fence(Ordering::SeqCst);
        listener
    }

    /// Among `tiers`, the one allowed the most jobs at the current limit (the first that a
    /// release lets through), or `None` if `tiers` is empty.
    pub(crate) fn most_allowed(&self, tiers: crate::queue::TierMask) -> Option<Criticality> {
        let limit = self.limit();
        Criticality::ALL
            .into_iter()
            .filter(|t| tiers.contains(*t))
            .max_by_key(|t| (self.inner.allowed(limit, *t), t.rank()))
    }

    /// The shares of the limit per tier.
    pub fn shares(&self) -> TierShares {
        *self.inner.shares.lock()
    }

    /// Replaces the shares of the limit per tier, live (a runtime's
    /// [`reconfigure`](crate::runtime::Runtime::reconfigure)). Jobs already running keep their
    /// slots; larger shares wake the waiters they let through.
    pub fn set_shares(&self, shares: TierShares) {
        let mut current = self.inner.shares.lock();
        for (slot, fixed) in self.inner.shares_fixed.iter().zip(shares.fixed()) {
            slot.store(fixed, crate::sync::Ordering::Relaxed);
        }
        *current = shares;
        drop(current);
        fence(Ordering::SeqCst);
        self.inner.wake(self.in_flight());
    }

    /// Replaces the limit algorithm, live, starting from `algorithm`'s current limit (a
    /// runtime's [`reconfigure`](crate::runtime::Runtime::reconfigure) with a changed
    /// `[limit]`). Jobs already running keep their slots, as with any lowered limit; a higher
    /// limit wakes the waiters it lets through.
    pub fn set_algorithm(&self, algorithm: Limiter) {
        let mut current = self.inner.algorithm.lock();
        self.inner.limit.store(algorithm.limit(), Ordering::Relaxed);
        self.inner.fixed.store(
            matches!(algorithm, Limiter::Fixed(_)),
            crate::sync::Ordering::Relaxed,
        );
        *current = algorithm;
        drop(current);
        fence(Ordering::SeqCst);
        self.inner.wake(self.in_flight());
    }

    /// Takes a slot for one `tier` job if fewer than [`allowed`](Self::allowed)
    /// jobs are in flight; `None` means "not now" (queue, defer or shed it).
    ///
    /// Lock-free and allocation-free: a compare-and-swap loop on the in-flight
    /// count.
    pub fn try_acquire(&self, tier: Criticality) -> Option<Permit> {
        self.try_acquire_up_to(tier, self.allowed(tier))
    }

    /// Takes a slot for one `tier` job if fewer than `allowed` jobs of any tier are in flight
    /// (capped at the limit): for a tier that may borrow idle slots beyond its share
    /// (work-conserving shares, decided by the caller); `None` means "not now".
    pub fn try_acquire_up_to(&self, tier: Criticality, allowed: usize) -> Option<Permit> {
        let in_flight_at_start = self.inner.claim(allowed.min(self.limit()))?;
        Some(Permit(Taken {
            inner: Arc::clone(&self.inner),
            in_flight_at_start,
            tier,
        }))
    }

    /// [`try_acquire_up_to`](Self::try_acquire_up_to) with a permit that borrows the limit
    /// rather than sharing it: for the runtime's workers, which outlive their jobs, so that a
    /// job's permit costs no reference count (two atomic read-modify-writes, on a line every
    /// worker shares). The same semantics in every other respect.
    pub(crate) fn try_acquire_ref_up_to(
        &self,
        tier: Criticality,
        allowed: usize,
    ) -> Option<PermitRef<'_>> {
        let in_flight_at_start = self.inner.claim(allowed.min(self.limit()))?;
        Some(PermitRef(Taken {
            inner: &*self.inner,
            in_flight_at_start,
            tier,
        }))
    }

    /// [`try_acquire`](Self::try_acquire), as a [`PermitRef`].
    pub(crate) fn try_acquire_ref(&self, tier: Criticality) -> Option<PermitRef<'_>> {
        self.try_acquire_ref_up_to(tier, self.allowed(tier))
    }

    /// [`acquire`](Self::acquire), as a [`PermitRef`].
    pub(crate) async fn acquire_ref(&self, tier: Criticality) -> PermitRef<'_> {
        loop {
            if let Some(p) = self.try_acquire_ref(tier) {
                return p;
            }
            let released = self.listen(tier);
            if let Some(p) = self.try_acquire_ref(tier) {
                return p;
            }
            released.await;
        }
    }
}

/// One admitted job's slot; releases it when dropped.
///
/// Call [`record`](Self::record) when the job completes so the algorithm learns
/// from it; merely dropping the permit (a cancelled job, a panic unwinding)
/// releases the slot without a sample.
#[must_use = "dropping a Permit releases its slot at once"]
pub struct Permit(Taken<Arc<Inner>>);

/// A [`Permit`] that borrows its limit rather than sharing it (see
/// [`ConcurrencyLimit::try_acquire_ref_up_to`]).
#[must_use = "dropping a PermitRef releases its slot at once"]
pub(crate) struct PermitRef<'a>(Taken<&'a Inner>);

/// A slot taken, whatever holds the limit: released when dropped.
struct Taken<P: std::ops::Deref<Target = Inner>> {
    inner: P,
    in_flight_at_start: usize,
    tier: Criticality,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("tier", &self.0.tier)
            .field("in_flight_at_start", &self.0.in_flight_at_start)
            .finish_non_exhaustive()
    }
}

impl Permit {
    /// Jobs in flight when this one was admitted, itself included.
    pub fn in_flight_at_start(&self) -> usize {
        self.0.in_flight_at_start
    }

    /// The tier this slot was admitted under.
    pub fn tier(&self) -> Criticality {
        self.0.tier
    }

    /// Reports the job's handler `latency` and whether it was `dropped` because
    /// of overload (see [`Sample::dropped`]), releases the slot, and returns the
    /// new limit.
    pub fn record(self, latency: Duration, dropped: bool) -> usize {
        self.0.record(latency, dropped)
    }
}

impl PermitRef<'_> {
    /// Reports the job's handler `latency` as [`Permit::record`] does, and keeps the slot for
    /// the worker's next job ([`pass_to`](Self::pass_to)); dropping it releases it.
    pub(crate) fn sample(&self, latency: Duration, dropped: bool) -> usize {
        self.0.sample(latency, dropped)
    }

    /// The same slot for the worker's next job, of `tier`, without releasing it and taking it
    /// again (two writes to the in-flight count every worker writes): only if a `tier` job
    /// could take a slot were this one released, so no share is overrun. `Err` gives the slot
    /// back, to release.
    #[inline]
    pub(crate) fn pass_to(mut self, tier: Criticality) -> Result<Self, Self> {
        let inner = self.0.inner;
        let in_flight = inner.in_flight.load(Ordering::Relaxed);
        // This slot counted in `in_flight`: released, `in_flight - 1` would run.
        if in_flight.saturating_sub(1) < inner.allowed(inner.limit.load(Ordering::Relaxed), tier) {
            self.0.tier = tier;
            self.0.in_flight_at_start = in_flight;
            Ok(self)
        } else {
            Err(self)
        }
    }
}

impl<P: std::ops::Deref<Target = Inner>> Taken<P> {
    fn record(self, latency: Duration, dropped: bool) -> usize {
        self.sample(latency, dropped)
        // `self` drops here, after the sample, and releases the slot.
    }

    fn sample(&self, latency: Duration, dropped: bool) -> usize {
        if self.inner.fixed.load(crate::sync::Ordering::Relaxed) {
            // A fixed limit ignores samples: no lock per completion.
            return self.inner.limit.load(Ordering::Relaxed);
        }
        let sample = Sample {
            latency,
            in_flight: self.in_flight_at_start,
            dropped,
        };
        let mut algorithm = self.inner.algorithm.lock();
        let limit = algorithm.on_sample(sample);
        // Stored under the lock so that concurrent completions publish limits
        // in the order the algorithm produced them.
        self.inner.limit.store(limit, Ordering::Relaxed);
        limit
    }
}

impl<P: std::ops::Deref<Target = Inner>> Drop for Taken<P> {
    fn drop(&mut self) {
        let in_flight = self.inner.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        // Pairs with the fence in `listen` (see `Inner::waiting`).
        fence(Ordering::SeqCst);
        self.inner.wake(in_flight);
    }
}

impl Inner {
    /// Counts one more job in flight if fewer than `allowed` are: the in-flight count it
    /// reached, or `None`.
    #[inline]
    fn claim(&self, allowed: usize) -> Option<usize> {
        // Relaxed suffices: the count is the only datum guarded, and the CAS alone orders
        // increments against each other; a waiter's fence orders its check (see `Inner`).
        let mut current = self.in_flight.load(Ordering::Relaxed);
        loop {
            if current >= allowed {
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                current,
                current + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(current + 1),
                Err(actual) => current = actual,
            }
        }
    }

    fn allowed(&self, limit: usize, tier: Criticality) -> usize {
        let fixed = self.shares_fixed[tier.rank()].load(crate::sync::Ordering::Relaxed);
        shares::allowed_fixed(limit, fixed)
    }

    /// After a release left `in_flight` jobs running: wakes at most one waiter per free slot,
    /// each of a tier allowed to use one, most critical tier first (a tier's share decides
    /// which jobs may start; which waiter takes a slot is the queue's weighted-fair order,
    /// decided again by whoever pops). A woken waiter that loses the slot to a racing
    /// `try_acquire` loses nothing: the winner's release wakes again.
    fn wake(&self, in_flight: usize) {
        let limit = self.limit.load(Ordering::Relaxed);
        let mut free = limit.saturating_sub(in_flight);
        for tier in Criticality::ALL {
            if free == 0 {
                return;
            }
            let rank = tier.rank();
            let waiting = self.waiting[rank].load(Ordering::Relaxed);
            if waiting == 0 {
                continue;
            }
            let room = self.allowed(limit, tier).saturating_sub(in_flight);
            let n = free.min(waiting).min(room);
            if n > 0 {
                // "At least n notified": listeners notified but not yet woken count, so
                // back-to-back releases do not wake more than can proceed.
                self.released[rank].notify(n);
                free -= n;
            }
        }
    }
}

/// A registered waiter for a concurrency slot (see [`ConcurrencyLimit::listen`]): a future
/// that completes when a release may let its tier proceed. Uncounted on drop.
pub(crate) struct ReleaseListener<'a> {
    waiting: &'a AtomicUsize,
    listener: event_listener::EventListener,
}

impl std::future::Future for ReleaseListener<'_> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        std::pin::Pin::new(&mut self.listener).poll(cx)
    }
}

impl Drop for ReleaseListener<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for ReleaseListener<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseListener").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
