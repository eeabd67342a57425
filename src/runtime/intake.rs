//! Pulling from a source: one task per attached source.

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
    /// Pull whenever nothing is held.
    Normal,
    /// Deferred work coming back: pull only while the Sheddable tier is admitted, and never
    /// defer it again.
    Drain,
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
    let mut held: Option<Item<S::Payload>> = None;
    let mut paused = false;
    let poll = inner.poll_interval();
    loop {
        if let Some(item) = held.take() {
            match inner.offer(item) {
                Offer::Taken => {
                    inner.held.fetch_sub(1, Ordering::Relaxed);
                }
                Offer::Hold(item) => {
                    held = Some(item);
                    if !paused {
                        source.pause();
                        paused = true;
                    }
                    tokio::select! {
                        _ = inner.stop.cancelled() => break,
                        _ = tokio::time::sleep(poll) => {}
                    }
                    continue;
                }
            }
        }
        if paused {
            source.resume();
            paused = false;
        }
        if mode == Mode::Drain && !inner.queue.admits(Criticality::Sheddable) {
            tokio::select! {
                _ = inner.stop.cancelled() => break,
                _ = tokio::time::sleep(poll) => {}
            }
            continue;
        }
        let envelope = tokio::select! {
            biased;
            _ = inner.stop.cancelled() => break,
            e = source.next() => match e {
                Some(e) => e,
                None => break,
            },
        };
        let item = Item::consumed(envelope, mode == Mode::Drain, &inner.accounts);
        if let Offer::Hold(item) = inner.offer(item) {
            inner.held.fetch_add(1, Ordering::Relaxed);
            held = Some(item);
        }
    }
    if held.take().is_some() {
        inner.held.fetch_sub(1, Ordering::Relaxed);
    }
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
