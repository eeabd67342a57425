//! Where requests wait for a slot: the bounded weighted-fair entry queue in front of a
//! concurrency limit shared with the worker runtime.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use triage::limit::{ConcurrencyLimit, Permit};
use triage::quanta::{Clock, Instant};
use triage::queue::{Dequeued, Meta, PushError, Removed, TierMask, WfqConfig, WfqQueue};
use triage::{ConfigError, Criticality, PerTier};

use crate::RefusalReason;

/// What a waiting request is told: its permit (a slot of the limit), or why it gets none.
enum Answer {
    Permit(Permit),
    Refused(RefusalReason),
}

struct Waiter {
    tx: oneshot::Sender<Answer>,
}

impl Waiter {
    fn refuse(self, reason: RefusalReason) {
        // A waiter that has gone (its client disconnected, its deadline passed) needs no
        // answer.
        let _ = self.tx.send(Answer::Refused(reason));
    }
}

struct Inner {
    queue: WfqQueue<Waiter>,
    limit: ConcurrencyLimit,
    /// Waits that ended without an answer from the dispatcher (the client went away, or the
    /// deadline passed) since abandoned waiters were last taken out: their waiters may still
    /// hold a place in the queue.
    gone: AtomicUsize,
    /// Notified on every push, so the dispatcher looks again.
    pushed: Notify,
    /// Notified when the last handle is dropped.
    stop: Notify,
    stopped: AtomicBool,
}

/// Closes the queue when the last [`EntryAdmission`] handle goes, answering whoever waits.
struct Owner(Arc<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::Release);
        self.0.stop.notify_one();
        for entry in self.0.queue.close() {
            entry.into_inner().refuse(RefusalReason::Capacity);
        }
    }
}

/// Admission at a service entry: requests wait for a slot of a [`ConcurrencyLimit`] in a
/// bounded [`WfqQueue`], the same objects the worker runtime uses.
///
/// - A request whose tier is refused by queue-age admission (its cut-off: 400/200/80/20 ms by
///   default), or that finds the queue full with nothing lower to evict, is refused at once.
/// - Otherwise it waits; a dispatcher task hands each free slot to the next waiter in
///   weighted-fair order among the tiers whose share of the limit allows one, so a Critical
///   request overtakes a Sheddable backlog. A waiter evicted by a more important request is
///   refused at once.
/// - A waiter whose deadline passes is answered [`RefusalReason::Expired`] at that instant and
///   is never served (the queue also discards it at dequeue).
/// - A waiter whose client goes away (its wait dropped) gives its place back: a push that
///   finds the queue full, and the dispatcher while requests wait, take abandoned waiters out
///   first, so they neither refuse live requests for capacity nor hold the queue age up.
///
/// The limit is shareable: pass [`Runtime::concurrency_limit`](triage::runtime::Runtime::concurrency_limit)
/// and the HTTP requests and the runtime's background work draw on one capacity; a release on
/// either side wakes the most critical waiter of either side first. Each tier's share of the
/// limit is strict here (the runtime's work-conserving borrowing is not applied to requests).
///
/// Cloning is cheap and clones share the queue; when the last clone is dropped the queue
/// closes and waiting requests are refused.
///
/// # Examples
///
/// ```
/// use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
/// use triage::queue::WfqConfig;
/// use triage::Criticality;
/// use triage_tower::EntryAdmission;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limit = ConcurrencyLimit::new(Fixed::new(1)?.into(), TierShares::default());
/// let entry = EntryAdmission::new(WfqConfig { capacity: 64.try_into()?, ..WfqConfig::default() }, limit)?;
/// let slot = entry.admit(Criticality::High, None).await?;
/// // The only slot is taken: the next request waits until it is released.
/// let next = tokio::spawn({
///     let entry = entry.clone();
///     async move { entry.admit(Criticality::Critical, None).await.is_ok() }
/// });
/// drop(slot);
/// assert!(next.await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EntryAdmission {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
}

impl std::fmt::Debug for EntryAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryAdmission")
            .field("waiting", &self.inner.queue.len())
            .field("limit", &self.inner.limit)
            .finish()
    }
}

/// How often the dispatcher re-evaluates queue-age admission while requests wait and no slot
/// frees (pushes and pops re-evaluate it too): the age signal's resolution when nothing moves.
const TICK: Duration = Duration::from_millis(10);

impl EntryAdmission {
    /// An entry queue with `queue`'s capacity, weights and queue-age cut-offs in front of
    /// `limit`, on the system clock.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `queue` is out of range.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns its dispatcher task).
    pub fn new(queue: WfqConfig, limit: ConcurrencyLimit) -> Result<Self, ConfigError> {
        Self::with_clock(queue, limit, Clock::new())
    }

    /// As [`new`](Self::new), reading time from `clock`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    ///
    /// # Panics
    ///
    /// As [`new`](Self::new).
    pub fn with_clock(
        queue: WfqConfig,
        limit: ConcurrencyLimit,
        clock: Clock,
    ) -> Result<Self, ConfigError> {
        let inner = Arc::new(Inner {
            queue: WfqQueue::with_clock(queue, clock)?,
            limit,
            gone: AtomicUsize::new(0),
            pushed: Notify::new(),
            stop: Notify::new(),
            stopped: AtomicBool::new(false),
        });
        tokio::spawn(dispatch(Arc::clone(&inner)));
        Ok(EntryAdmission {
            _owner: Arc::new(Owner(Arc::clone(&inner))),
            inner,
        })
    }

    /// The shared concurrency limit.
    pub fn limit(&self) -> &ConcurrencyLimit {
        &self.inner.limit
    }

    /// Requests waiting, per tier.
    pub fn waiting(&self) -> PerTier<usize> {
        self.inner.queue.depths()
    }

    /// The queue's clock (deadlines are instants on it).
    pub fn clock(&self) -> &Clock {
        self.inner.queue.clock()
    }

    /// A slot for a `tier` request now, without waiting: only when nobody waits (so no one is
    /// overtaken) and the tier's share allows one.
    pub(crate) fn try_now(&self, tier: Criticality) -> Option<Permit> {
        if self.inner.queue.is_empty() {
            self.inner.limit.try_acquire(tier)
        } else {
            None
        }
    }

    /// Queues a waiter; answers the ones its push evicted or found expired.
    fn enqueue(
        &self,
        tier: Criticality,
        deadline: Option<Instant>,
    ) -> Result<oneshot::Receiver<Answer>, RefusalReason> {
        // Queue-age admission is one atomic load: refuse before allocating the channel.
        if !self.inner.queue.admits(tier) {
            return Err(RefusalReason::Capacity);
        }
        let (tx, rx) = oneshot::channel();
        let meta = Meta::new(tier).deadline_opt(deadline);
        let mut pushed = self.inner.queue.push(Waiter { tx }, meta);
        if let Err(PushError::Full(waiter)) = pushed {
            // Room held by waiters nobody waits for is no reason to refuse a live one.
            pushed = if self.inner.take_out_abandoned() {
                self.inner.queue.push(waiter, meta)
            } else {
                Err(PushError::Full(waiter))
            };
        }
        match pushed {
            Ok(removed) => {
                for r in removed {
                    match r {
                        Removed::Expired(e) => e.into_inner().refuse(RefusalReason::Expired),
                        Removed::Evicted(e) => e.into_inner().refuse(RefusalReason::Capacity),
                    }
                }
                self.inner.pushed.notify_one();
                Ok(rx)
            }
            // Queue-age admission, full with nothing lower, closed: all "no capacity now".
            Err(_) => Err(RefusalReason::Capacity),
        }
    }

    /// Waits for a slot for a `tier` request that is useless after `deadline` (an instant on
    /// [`clock`](Self::clock); `None` waits as long as it takes).
    ///
    /// # Errors
    ///
    /// [`RefusalReason::Capacity`] when refused at once or evicted while waiting,
    /// [`RefusalReason::Expired`] when the deadline passes first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped waiter is skipped, and a slot handed to it just before goes to
    /// the next waiter.
    pub async fn admit(
        &self,
        tier: Criticality,
        deadline: Option<Instant>,
    ) -> Result<Permit, RefusalReason> {
        if deadline.is_some_and(|d| d <= self.clock().now()) {
            return Err(RefusalReason::Expired);
        }
        if let Some(permit) = self.try_now(tier) {
            return Ok(permit);
        }
        let rx = self.enqueue(tier, deadline)?;
        self.wait(rx, deadline).await
    }

    /// Queues a `tier` request now and returns the wait for its slot, or the refusal at once.
    pub(crate) fn start_wait(
        &self,
        tier: Criticality,
        deadline: Option<Instant>,
    ) -> Result<
        impl std::future::Future<Output = Result<Permit, RefusalReason>> + Send,
        RefusalReason,
    > {
        let rx = self.enqueue(tier, deadline)?;
        let this = self.clone();
        Ok(async move { this.wait(rx, deadline).await })
    }

    async fn wait(
        &self,
        rx: oneshot::Receiver<Answer>,
        deadline: Option<Instant>,
    ) -> Result<Permit, RefusalReason> {
        // Counts the wait as abandoned unless the dispatcher answered it.
        let mut leaving = Leaving {
            gone: &self.inner.gone,
            answered: false,
        };
        let granted = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(self.clock().now());
                match tokio::time::timeout(left, rx).await {
                    Ok(granted) => granted,
                    Err(_) => return Err(RefusalReason::Expired),
                }
            }
            None => rx.await,
        };
        leaving.answered = true;
        match granted {
            Ok(Answer::Permit(permit)) => Ok(permit),
            Ok(Answer::Refused(reason)) => Err(reason),
            // The dispatcher dropped the waiter: the queue closed.
            Err(_) => Err(RefusalReason::Capacity),
        }
    }
}

/// Marks a wait that ends without the dispatcher's answer (dropped, or its deadline passed
/// first) as abandoned: its waiter may still hold a place in the queue.
struct Leaving<'a> {
    gone: &'a AtomicUsize,
    answered: bool,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.gone.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Inner {
    /// Takes out of the queue the waiters nobody waits for any more (their receiver gone),
    /// when some wait was abandoned since the last time: one pass over the queue under its
    /// lock, only then. Whether any was taken out.
    fn take_out_abandoned(&self) -> bool {
        if self.gone.swap(0, Ordering::Relaxed) == 0 {
            return false;
        }
        !self.queue.drain_where(|w| w.tx.is_closed()).is_empty()
    }
}

/// The highest tier with requests waiting.
fn top_waiting(queue: &WfqQueue<Waiter>) -> Option<Criticality> {
    if queue.is_empty() {
        return None;
    }
    let depths = queue.depths();
    Criticality::ALL.into_iter().find(|t| depths[*t] > 0)
}

/// Hands free slots to waiters, until the last handle is dropped.
async fn dispatch(inner: Arc<Inner>) {
    let queue = &inner.queue;
    let limit = &inner.limit;
    while !inner.stopped.load(Ordering::Acquire) {
        let Some(top) = top_waiting(queue) else {
            tokio::select! {
                _ = inner.pushed.notified() => {}
                _ = inner.stop.notified() => return,
            }
            continue;
        };
        // The highest waiting tier has the largest share, so a slot it may take is the first
        // one any waiter may take. A push (perhaps of a higher tier) or the tick makes us
        // look again.
        let permit = tokio::select! {
            p = limit.acquire(top) => p,
            _ = inner.pushed.notified() => continue,
            _ = tokio::time::sleep(TICK) => {
                inner.take_out_abandoned();
                queue.refresh_admission();
                continue;
            }
            _ = inner.stop.notified() => return,
        };
        // The slot may go to any tier whose share allows this many in flight: the queue's
        // weighted-fair order picks among them.
        let in_flight = permit.in_flight_at_start();
        let mask = Criticality::ALL
            .into_iter()
            .filter(|t| in_flight <= limit.allowed(*t))
            .fold(TierMask::NONE, TierMask::with);
        let mut permit = Some(permit);
        while let Some(p) = permit.take() {
            match queue.try_pop_masked(mask) {
                Ok(Dequeued::Ready(entry)) => {
                    if let Err(Answer::Permit(p)) = entry.into_inner().tx.send(Answer::Permit(p)) {
                        // Gone while waiting: the next one takes the slot.
                        permit = Some(p);
                    }
                }
                Ok(Dequeued::Expired(entry)) => {
                    entry.into_inner().refuse(RefusalReason::Expired);
                    permit = Some(p);
                }
                // Nothing it may take (another tier's waiter left): release the slot.
                Err(_) => drop(p),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use triage::admission::QueueAgeConfig;
    use triage::limit::{Fixed, TierShares};

    fn entry(slots: usize, capacity: usize) -> EntryAdmission {
        let limit = ConcurrencyLimit::new(Fixed::new(slots).unwrap().into(), TierShares::default());
        EntryAdmission::new(
            WfqConfig {
                capacity: capacity.try_into().unwrap(),
                ..WfqConfig::default()
            },
            limit,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn critical_overtakes_a_sheddable_backlog() {
        let e = entry(1, 64);
        let held = e.admit(Criticality::Critical, None).await.unwrap();
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, tier) in [
            Criticality::Sheddable,
            Criticality::Sheddable,
            Criticality::Sheddable,
            Criticality::Critical,
        ]
        .into_iter()
        .enumerate()
        {
            let (e2, order) = (e.clone(), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let p = e2.admit(tier, None).await.unwrap();
                order.lock().push((i, tier));
                drop(p);
            }));
            // Queued in this order.
            while e.inner.queue.len() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().clone();
        // Queued last, served first.
        assert_eq!(order[0], (3, Criticality::Critical), "{order:?}");
        assert_eq!(order.len(), 4);
    }

    #[tokio::test]
    async fn evicted_waiters_are_refused_at_once() {
        let e = entry(1, 2);
        let _held = e.admit(Criticality::Critical, None).await.unwrap();
        let low = tokio::spawn({
            let e = e.clone();
            async move { e.admit(Criticality::Sheddable, None).await.err() }
        });
        while e.inner.queue.is_empty() {
            tokio::task::yield_now().await;
        }
        let _h1 = tokio::spawn({
            let e = e.clone();
            async move { e.admit(Criticality::High, None).await.is_ok() }
        });
        while e.inner.queue.len() < 2 {
            tokio::task::yield_now().await;
        }
        // Full: a Critical push evicts the newest Sheddable.
        let rx = e.enqueue(Criticality::Critical, None);
        assert!(rx.is_ok());
        assert_eq!(low.await.unwrap(), Some(RefusalReason::Capacity));
        // Full with nothing lower than High: a High push is refused at once.
        assert_eq!(
            e.enqueue(Criticality::High, None).err(),
            Some(RefusalReason::Capacity)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn expired_while_waiting_is_answered_never_served() {
        let (clock, mock) = Clock::mock();
        let limit = ConcurrencyLimit::new(Fixed::new(1).unwrap().into(), TierShares::default());
        let mut config = WfqConfig {
            capacity: 8.try_into().unwrap(),
            ..WfqConfig::default()
        };
        config.admission = QueueAgeConfig::disabled();
        let e = EntryAdmission::with_clock(config, limit, clock).unwrap();
        let held = e.admit(Criticality::Critical, None).await.unwrap();
        let deadline = e.clock().now() + Duration::from_millis(100);
        let waiting = tokio::spawn({
            let e = e.clone();
            async move { e.admit(Criticality::High, Some(deadline)).await.err() }
        });
        while e.inner.queue.is_empty() {
            tokio::task::yield_now().await;
        }
        mock.increment(Duration::from_millis(150));
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(waiting.await.unwrap(), Some(RefusalReason::Expired));
        // Its slot was never taken: releasing the held one leaves nothing in flight.
        drop(held);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(e.limit().in_flight(), 0);
        // Already past its deadline: refused without queueing.
        let past = e.clock().now();
        assert_eq!(
            e.admit(Criticality::Critical, Some(past)).await.err(),
            Some(RefusalReason::Expired)
        );
    }
}
