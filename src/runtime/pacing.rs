//! Pacing: an intake that is not overloaded pulls only while the queue holds less than the
//! prefetch, and waits for room otherwise; a worker that takes work tells it. While it waits
//! with nothing to hold, the workers may pull for it (see [`PullForIntake`]).

use crate::sync::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A source a worker that finds the queue empty may pull from itself, for its intake, while
/// that intake waits for room (implemented by the intake's shared source, `intake.rs`). `R` is
/// the runtime the pulled messages are offered to.
pub(crate) trait PullForIntake<R>: Send + Sync {
    /// Pulls up to a batch of messages and offers them to `runtime`. Returns whether it
    /// offered any.
    fn pull(&self, runtime: &Arc<R>) -> bool;
}

/// The intakes waiting for room, and the sources the workers may pull from meanwhile.
pub(crate) struct Pacing<R> {
    /// Woken when a worker takes an item while an intake waits for room.
    pub(crate) room: tokio::sync::Notify,
    pub(crate) room_waiters: AtomicUsize,
    /// The sources a worker that finds the queue empty may pull from itself, for their intake;
    /// read once per empty queue.
    pub(crate) helpers: arc_swap::ArcSwap<Vec<Arc<dyn PullForIntake<R>>>>,
    /// Of the intakes waiting for room, those whose source the workers pull from meanwhile:
    /// a pop need not wake them.
    pub(crate) pulling_for: AtomicUsize,
}

impl<R> Pacing<R> {
    pub(crate) fn new() -> Self {
        Pacing {
            room: tokio::sync::Notify::new(),
            room_waiters: AtomicUsize::new(0),
            helpers: Default::default(),
            pulling_for: AtomicUsize::new(0),
        }
    }

    /// An intake pacing its pulls waits for room in the queue: tell it a worker took some;
    /// unless the workers pull for every intake that waits (they pull when they find the queue
    /// empty, see [`PullForIntake`]).
    #[inline]
    pub(crate) fn wake_intake(&self) {
        if self.room_waiters.load(Ordering::Relaxed) > self.pulling_for.load(Ordering::Relaxed) {
            self.room.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pop_wakes_an_intake_only_if_no_worker_pulls_for_it() {
        let pacing: Pacing<()> = Pacing::new();
        let room = pacing.room.notified();
        tokio::pin!(room);
        room.as_mut().enable();
        pacing.room_waiters.fetch_add(1, Ordering::Relaxed);
        pacing.pulling_for.fetch_add(1, Ordering::Relaxed);
        pacing.wake_intake();
        assert!(futures_util::FutureExt::now_or_never(room.as_mut()).is_none());
        pacing.pulling_for.fetch_sub(1, Ordering::Relaxed);
        pacing.wake_intake();
        assert!(futures_util::FutureExt::now_or_never(room.as_mut()).is_some());
    }
}
