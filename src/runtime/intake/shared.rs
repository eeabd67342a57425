//! A source shared by its intake and the workers: while the intake waits for room with nothing
//! to hold, a worker that finds the queue empty pulls from the source itself.

use crate::sync::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::FutureExt;

use crate::runtime::engine::{Inner, Offer};
use crate::runtime::intake::receive::{pulled_ahead, receive, Mode, PULL_BATCH};
use crate::runtime::pacing::PullForIntake;
use crate::runtime::Source;

/// A source as its intake and the workers share it: the workers pull from it themselves while
/// its intake waits for room with nothing to hold (see [`PullForIntake`]).
pub(crate) struct Shared<S: Source> {
    pub(crate) source: tokio::sync::Mutex<S>,
    /// Whether a worker may pull now: set by the intake just before it waits for room, only
    /// while it holds nothing and no tier is refused or paused; cleared when it wakes, before
    /// it takes `source` back (so after the intake has the lock, no worker pulls).
    pub(crate) open: AtomicBool,
    /// Offers a worker's pull left to hold (refused under Backpressure, say): the intake holds
    /// them, behind the older ones, at its next turn. With the tier rank offered.
    pub(crate) returned: parking_lot::Mutex<Vec<(usize, Offer<S::Payload>)>>,
    /// A worker's pull found the source finished.
    pub(crate) finished: AtomicBool,
    pub(crate) lag: Arc<AtomicU64>,
}

/// A worker pulling for an intake that waits for room (see `Shared`): what the intake would
/// pull next, the worker pulls itself, when it finds the queue empty. In steady state, a worker
/// then serves what it pulled without waking the intake, and the intake without waking a
/// worker: the task switches (and, on a multi-threaded runtime, the wake-ups of the other
/// thread) that a queue of `prefetch` messages costs every few dozen messages are gone. Each
/// message still goes through the same path ([`receive`], then [`Inner::offer`]), under the
/// same bound (`prefetch`), and the worker stops (hands the source back to the intake, and
/// wakes it) at anything the intake has to decide: a message refused, the shed level or the
/// operator's level above 0, the key gate or the memory budget full, a source with nothing
/// ready now, or finished.
impl<S: Source> PullForIntake<Inner<S::Payload>> for Shared<S>
where
    S::Payload: Send + Sync + 'static,
{
    fn pull(&self, inner: &Arc<Inner<S::Payload>>) -> bool {
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        let Ok(mut source) = self.source.try_lock() else {
            return false;
        };
        // The intake clears `open` before it takes the lock: checked again under it.
        if !self.open.load(Ordering::Acquire) {
            return false;
        }
        let prefetch = inner.prefetch();
        let max_parked = inner.config().expert.max_parked.get();
        // Read before the pulls, to stamp what they take (see `recall.rs`).
        let stamp = inner.recalls.stamp();
        let mut offered = false;
        let mut hand_back = false;
        for _ in 0..PULL_BATCH {
            let level = inner.pulled_level();
            if level != 0 || inner.keys.parked() >= max_parked || !inner.accounts.memory.may_pull()
            {
                hand_back = true;
                break;
            }
            if pulled_ahead(inner, prefetch) {
                break;
            }
            let envelope = match source.next().now_or_never() {
                Some(Some(envelope)) => envelope,
                Some(None) => {
                    self.finished.store(true, Ordering::Release);
                    hand_back = true;
                    break;
                }
                // Nothing ready: the intake waits for the source, with a waker.
                None => {
                    hand_back = true;
                    break;
                }
            };
            let patience = source.patience();
            let Some(item) = receive(inner, Mode::Normal, envelope, patience, stamp) else {
                continue;
            };
            let rank = item.tier().rank();
            match inner.offer_quiet(item) {
                Offer::Taken => offered = true,
                other => {
                    self.returned.lock().push((rank, other));
                    hand_back = true;
                    break;
                }
            }
        }
        self.lag
            .store(source.lag().unwrap_or(u64::MAX), Ordering::Relaxed);
        if hand_back {
            self.open.store(false, Ordering::Release);
            drop(source);
            inner.pacing.room.notify_waiters();
        }
        offered
    }
}

/// Keeps a source open to the workers' pulls while the intake waits; closed when dropped.
pub(crate) struct Opened<'a, S: Source> {
    shared: &'a Shared<S>,
    inner: &'a Inner<S::Payload>,
}

impl<'a, S: Source> Opened<'a, S> {
    pub(crate) fn new(shared: &'a Shared<S>, inner: &'a Inner<S::Payload>) -> Self {
        inner.pacing.pulling_for.fetch_add(1, Ordering::Relaxed);
        shared.open.store(true, Ordering::Release);
        Opened { shared, inner }
    }
}

impl<S: Source> Drop for Opened<'_, S> {
    fn drop(&mut self) {
        self.shared.open.store(false, Ordering::Release);
        self.inner
            .pacing
            .pulling_for
            .fetch_sub(1, Ordering::Relaxed);
    }
}
