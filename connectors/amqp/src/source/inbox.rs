//! Deliveries received by the link task and not yet taken by [`next`](super::AmqpSource):
//! the state the two share, in a file of its own so that neither imports the other.
//!
//! One buffer per consumed queue (by its index in read order), each bounded by the prefetch:
//! the broker sends a consumer at most `prefetch` unsettled deliveries, and nothing here is
//! settled before it has been taken. A queue whose tier the runtime is shedding is skipped by
//! [`Inbox::pop`] (`Source::pause_tiers`): its deliveries stay in the buffer, the broker keeps
//! the rest of that queue, and the other queues are read as usual.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lapin::message::Delivery;
use tokio::sync::Notify;
use tokio::time::Instant;

/// One received delivery: its queue's index, the epoch of the channel it came on, and when the link
/// task received it (the broker's consumer timeout runs from about then).
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) queue: usize,
    pub(crate) epoch: u64,
    pub(crate) at: Instant,
    pub(crate) delivery: Delivery,
}

#[derive(Debug)]
struct State {
    /// Per consumed queue, oldest first: epoch, receipt, delivery.
    buffers: Vec<VecDeque<(u64, Instant, Delivery)>>,
    /// Per consumed queue, whether its tier is paused.
    paused: Vec<bool>,
    /// The link task has stopped: nothing more will arrive.
    finished: bool,
}

/// The buffers, a wake-up for `next`, and the lag the link task measured.
#[derive(Debug)]
pub(crate) struct Inbox {
    state: Mutex<State>,
    arrived: Notify,
    /// Ready messages in the consumed queues at the last measurement; `u64::MAX`: unknown.
    lag: AtomicU64,
}

impl Inbox {
    pub(crate) fn new(queues: usize) -> Self {
        Inbox {
            state: Mutex::new(State {
                buffers: (0..queues).map(|_| VecDeque::new()).collect(),
                paused: vec![false; queues],
                finished: false,
            }),
            arrived: Notify::new(),
            lag: AtomicU64::new(u64::MAX),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every step under the lock is a single push, pop or clear: a panic elsewhere cannot
        // leave it half done, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Deliveries arrived in channel `epoch`, each with its queue's index.
    pub(crate) fn push_all(&self, epoch: u64, deliveries: impl Iterator<Item = (usize, Delivery)>) {
        let at = Instant::now();
        let readable = {
            let mut state = self.lock();
            let mut readable = false;
            for (queue, delivery) in deliveries {
                state.buffers[queue].push_back((epoch, at, delivery));
                readable |= !state.paused[queue];
            }
            readable
        };
        if readable {
            self.arrived.notify_one();
        }
    }

    /// The channel is gone: the broker has requeued everything it sent on it, so the buffered
    /// deliveries are dropped unseen. Returns how many.
    pub(crate) fn clear(&self) -> usize {
        let mut state = self.lock();
        let mut dropped = 0;
        for buffer in &mut state.buffers {
            dropped += buffer.len();
            buffer.clear();
        }
        dropped
    }

    /// The oldest delivery of the first queue (in read order) that is not paused.
    pub(crate) fn pop(&self) -> Option<Received> {
        let mut state = self.lock();
        let State {
            buffers, paused, ..
        } = &mut *state;
        buffers
            .iter_mut()
            .zip(paused.iter())
            .enumerate()
            .find_map(|(queue, (buffer, &paused))| {
                if paused {
                    return None;
                }
                buffer.pop_front().map(|(epoch, at, delivery)| Received {
                    queue,
                    epoch,
                    at,
                    delivery,
                })
            })
    }

    /// Takes out of every queue's buffer, paused or not, the deliveries received `waited` or
    /// longer ago: the oldest of each first, stopping at the first younger one (a buffer is in
    /// order of receipt).
    pub(crate) fn take_waited(&self, waited: Duration) -> Vec<Received> {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut state = self.lock();
        for (queue, buffer) in state.buffers.iter_mut().enumerate() {
            while buffer
                .front()
                .is_some_and(|(_, at, _)| now.saturating_duration_since(*at) >= waited)
            {
                if let Some((epoch, at, delivery)) = buffer.pop_front() {
                    out.push(Received {
                        queue,
                        epoch,
                        at,
                        delivery,
                    });
                }
            }
        }
        out
    }

    /// Pauses (`true`) or resumes each queue (by index); wakes `next` when a queue with
    /// deliveries resumes.
    pub(crate) fn set_paused(&self, paused: impl Fn(usize) -> bool) {
        let wake = {
            let mut state = self.lock();
            let mut wake = false;
            for queue in 0..state.paused.len() {
                let now = paused(queue);
                wake |= state.paused[queue] && !now && !state.buffers[queue].is_empty();
                state.paused[queue] = now;
            }
            wake
        };
        if wake {
            self.arrived.notify_one();
        }
    }

    /// Whether the link task has stopped and every readable delivery was taken.
    pub(crate) fn is_finished(&self) -> bool {
        self.lock().finished
    }

    /// The link task stopped.
    pub(crate) fn finish(&self) {
        self.lock().finished = true;
        self.arrived.notify_one();
    }

    /// Waits for a push, a resume or the end (or returns at once if one happened since the
    /// last wait: `Notify` keeps one permit).
    pub(crate) async fn wait(&self) {
        self.arrived.notified().await;
    }

    pub(crate) fn set_lag(&self, lag: Option<u64>) {
        self.lag.store(
            lag.map_or(u64::MAX, |l| l.min(u64::MAX - 1)),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn lag(&self) -> Option<u64> {
        match self.lag.load(Ordering::Relaxed) {
            u64::MAX => None,
            l => Some(l),
        }
    }
}
