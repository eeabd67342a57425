//! Pulling from a source: one task per attached source.
//!
//! A message refused under the Backpressure policy is *held* by the intake and offered again as
//! capacity returns. Holding one message and stopping would put every message behind it in the
//! same partition behind it too: a held High message would make the Critical ones after it
//! wait in the broker past their deadlines (head-of-line blocking). So the intake keeps pulling
//! while it holds fewer than `max_held` messages, re-offers the held ones oldest first, and
//! pauses the source only when that buffer is full. Memory stays bounded: at most
//! `capacity + in flight + max_held` messages per runtime and source.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::Item;
use crate::runtime::Source;
use crate::Criticality;

/// How a source is pulled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Pull whenever the held buffer has room.
    Normal,
    /// Deferred work coming back: pull only while the Sheddable tier is admitted and workers
    /// are idle, and never defer it again.
    Drain,
}

/// Re-offers held items oldest first; keeps the ones still refused, in order.
fn reoffer<T: Send + Sync + 'static>(inner: &Arc<Inner<T>>, held: &mut VecDeque<Item<T>>) {
    for _ in 0..held.len() {
        let Some(item) = held.pop_front() else { break };
        match inner.offer(item) {
            Offer::Taken => {
                inner.held.fetch_sub(1, Ordering::Relaxed);
            }
            Offer::Hold(item) => held.push_back(item),
        }
    }
}

/// Whether deferred work may be pulled now: the load is below Sheddable's cut-off and the
/// queue has no backlog for the workers (queue age alone lags a burst of fresh items).
fn drain_allowed<T: Send + Sync + 'static>(inner: &Inner<T>) -> bool {
    inner.queue.admits(Criticality::Sheddable)
        && inner.queue.len() < inner.config.workers.get()
        && inner.limit.in_flight() < inner.limit.limit()
}

enum Pulled<T> {
    Message(crate::runtime::Envelope<T>),
    Nothing,
    Finished,
}

async fn pull<S: Source>(source: &mut S, wait: Option<Duration>) -> Pulled<S::Payload> {
    let next = match wait {
        None => Some(source.next().await),
        Some(wait) => tokio::time::timeout(wait, source.next()).await.ok(),
    };
    match next {
        Some(Some(e)) => Pulled::Message(e),
        Some(None) => Pulled::Finished,
        None => Pulled::Nothing,
    }
}

/// Pulls `source` until shutdown, then waits for the workers to finish (`drained`) before the
/// source's final acknowledgement, bounded by `final_ack`.
pub(crate) async fn run<S: Source>(
    inner: Arc<Inner<S::Payload>>,
    mut source: S,
    mode: Mode,
    drained: CancellationToken,
    final_ack: Arc<parking_lot::Mutex<Option<tokio::time::Instant>>>,
) where
    S::Payload: Send + Sync + 'static,
{
    let mut held: VecDeque<Item<S::Payload>> = VecDeque::new();
    let max_held = inner.config.max_held.get();
    let mut paused = false;
    let poll = inner.poll_interval();
    let mut finished = false;
    loop {
        if !held.is_empty() {
            reoffer(&inner, &mut held);
        }
        let full = held.len() >= max_held;
        if full != paused {
            if full {
                source.pause();
            } else {
                source.resume();
            }
            paused = full;
        }
        let may_pull = !full && !finished && (mode == Mode::Normal || drain_allowed(&inner));
        if !may_pull {
            if finished && held.is_empty() {
                break;
            }
            tokio::select! {
                _ = inner.stop.cancelled() => break,
                _ = tokio::time::sleep(poll) => {}
            }
            continue;
        }
        // While holding, pull only until the next poll, then come back to the held ones.
        let wait = if held.is_empty() { None } else { Some(poll) };
        let pulled = tokio::select! {
            biased;
            _ = inner.stop.cancelled() => break,
            p = pull(&mut source, wait) => p,
        };
        let envelope = match pulled {
            Pulled::Message(e) => e,
            Pulled::Nothing => continue,
            Pulled::Finished => {
                finished = true;
                continue;
            }
        };
        let item = Item::consumed(envelope, mode == Mode::Drain, &inner.accounts);
        if let Offer::Hold(item) = inner.offer(item) {
            inner.held.fetch_add(1, Ordering::Relaxed);
            held.push_back(item);
        }
    }
    inner.held.fetch_sub(held.len() as i64, Ordering::Relaxed);
    // Dropping them releases them unacknowledged.
    drop(held);
    inner.pulling.fetch_sub(1, Ordering::AcqRel);
    // Every message taken is resolved or released before the final acknowledgement, so the
    // watermark it commits is the last one.
    drained.cancelled().await;
    let until = *final_ack.lock();
    match until {
        Some(until) => {
            let _ = tokio::time::timeout_at(until, source.shutdown()).await;
        }
        None => {
            let _ = tokio::time::timeout(Duration::from_secs(30), source.shutdown()).await;
        }
    }
}
