//! Waiting for an item: the async [`WfqQueue::pop`] and the waiter protocol it shares with the
//! runtime's workers, which wait on the same event with a listener of their own.
//!
//! A consumer about to sleep counts itself in `waiters` (a [`WaitRegistration`]), creates its
//! listener on `not_empty`, and only then checks the queue once more, under its lock. A push
//! (or a `requeue`) notifies only when it reads a non-zero count after changing the queue under
//! that lock, so the lock orders the two: either the push's change is seen by the last check,
//! or the consumer's count is seen by the push, whose notification reaches the listener created
//! before the check. A pop that leaves items wakes the next waiting consumer (`wake_next`), so
//! pushes that woke one consumer still reach all of them while items remain. `close` notifies
//! every listener. `tests/loom_queue.rs` runs every interleaving of it.

use event_listener::Event;

use super::WfqQueue;
use crate::loom::{AtomicUsize, Ordering};
use crate::queue::{Closed, Dequeued, TryPopError};

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

impl<T> WfqQueue<T> {
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
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use triage::queue::{Meta, WfqConfig, WfqQueue};
    /// use triage::Criticality;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let queue = WfqQueue::new(WfqConfig { capacity: 8.try_into()?, ..WfqConfig::default() })?;
    /// // Nothing queued: a timeout ends the wait, and takes nothing with it.
    /// assert!(tokio::time::timeout(Duration::from_millis(1), queue.pop()).await.is_err());
    /// assert!(queue.push("checkout", Meta::new(Criticality::Critical))?.is_empty());
    /// let served = queue.pop().await?.ready().expect("no deadline was set");
    /// assert_eq!(served.into_inner(), "checkout");
    /// # Ok(())
    /// # }
    /// ```
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
                // Let the executor run others (a producer, likely) once before registering
                // to sleep: a task's yield costs less than a listener and a wake-up.
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

    /// After a pop that left `left` items: a consumer that is waiting is woken to take them
    /// (unless one is woken already). With pushes waking one consumer at a time, this chain is
    /// what lets every waiting consumer join in while items remain.
    #[inline]
    pub(super) fn wake_next(&self, left: usize) {
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
    pub(super) fn wake_one(&self) {
        self.not_empty.notify(1);
    }
}
