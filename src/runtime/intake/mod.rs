//! Pulling from a source: one task per attached source.
//!
//! # Pull is not push
//!
//! The broker is the buffer. While the worker is not overloaded (pull-based admission's shed
//! level is 0), the intake pulls only while fewer than `prefetch_per_slot ×` the concurrency
//! limit messages are queued: every worker has work, and a backlog stays in the broker and is
//! served in offset order, never deferred for being a backlog. While overloaded (arrival beyond
//! capacity), the intake pulls as fast as admission decides, so the refused lower tiers are
//! moved out of the way (deferred, dropped or held, per their policy) and the more important
//! work behind them in the same partition or queue is reached in time. A refused tier is
//! refused only while the queue holds at least that prefetch: workers never idle next to held
//! work; a source with a topic
//! per tier is told which tiers are shed ([`Source::pause_tiers`]) and stops pulling them.
//!
//! Every pulled message whose deadline has already passed is expired at once, from its headers
//! alone, before it is queued: the free shed.
//!
//! A message refused under the Backpressure policy is *held* by the intake and offered again as
//! capacity returns. Holding one message and stopping would put every message behind it in the
//! same partition behind it too: a held High message would make the Critical ones after it
//! wait in the broker past their deadlines (head-of-line blocking). So the intake keeps pulling
//! while it holds fewer than `max_held` messages, re-offers the held ones oldest first, and
//! pauses the source only when that buffer is full, unless it must make room: if the source
//! delivered a tier above the lowest held one within the last second, whose messages arrive
//! with less deadline slack than twice the time the workers need to serve what is held and
//! queued, the more important work is (most likely) behind the held messages in the same
//! partition or queue, and pausing would leave it waiting in the broker past its deadline. So
//! the held messages of the tiers below it are deferred (reason `make_room`), lowest tier first and newest first within a tier (as the
//! queue evicts), down to three quarters of `max_held`, and the intake reads on. This is the one
//! place where a Backpressure tier is deferred: sustained arrival beyond capacity with more
//! important work behind it (`RuntimeConfig::defer_held_to_make_room`; only with a healthy
//! defer sink, never a keyed message). A held message whose time left is less
//! than the mean handler run (busy time over calls, at most 1 s) is expired at its turn rather
//! than offered: oldest first, under sustained overload it would otherwise reach a worker right
//! at its deadline and finish after it. Memory stays bounded: at most
//! `capacity + in flight + max_held` messages per runtime and source, plus `max_parked` per
//! runtime behind busy ordering keys (`crate::ordering`): the intake pauses its source while
//! the key gate holds that many.
//!
//! A message refused because its downstream's circuit is open, under Backpressure, is held
//! apart from those: its refusal says nothing about the load, so other messages of its tier
//! are still offered, and it is offered again only when a circuit changes state (or a poll
//! interval passed, to expire it on time). They count against `max_held` too.

mod held;
mod receive;
mod shared;

use crate::sync::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::queue::TierMask;
use crate::runtime::engine::Inner;
use crate::runtime::pacing::PullForIntake;
use crate::runtime::Source;
use held::HeldBuffer;
pub(crate) use receive::Mode;
use receive::{pulled_ahead, receive, PULL_BATCH};
use shared::{Opened, Shared};

/// Whether deferred work may be pulled now: nothing is shed and the queue has no backlog for
/// the workers.
fn drain_allowed<T: Send + Sync + 'static>(inner: &Inner<T>) -> bool {
    inner.load_level() == 0
        && inner.queue.len() < inner.config().workers.get()
        && inner.limit.in_flight() < inner.limit.limit()
}

/// One message pulled: counted, expired at once if its deadline passed, through the key gate,
/// then offered (or held behind older ones of a refused tier).
fn take<T: Send + Sync + 'static>(
    inner: &Arc<Inner<T>>,
    held: &mut HeldBuffer<T>,
    mode: Mode,
    envelope: crate::runtime::Envelope<T>,
    patience: Option<Duration>,
    stamp: u16,
) {
    if let Some(item) = receive(inner, mode, envelope, patience, stamp) {
        held.offer_new(inner, item);
    }
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
    source: S,
    mode: Mode,
    lag: Arc<AtomicU64>,
    drained: CancellationToken,
    final_ack: Arc<parking_lot::Mutex<Option<tokio::time::Instant>>>,
) where
    S::Payload: Send + Sync + 'static,
{
    let shared = Arc::new(Shared {
        source: tokio::sync::Mutex::new(source),
        open: AtomicBool::new(false),
        returned: parking_lot::Mutex::new(Vec::new()),
        finished: AtomicBool::new(false),
        lag: Arc::clone(&lag),
    });
    // Deferred work is pulled only while the workers are idle: the intake alone decides that.
    if mode == Mode::Normal {
        let helper: Arc<dyn PullForIntake<Inner<S::Payload>>> = shared.clone();
        inner.pacing.helpers.rcu(|list| {
            let mut list = Vec::clone(list);
            list.push(Arc::clone(&helper));
            list
        });
    }
    let mut held: HeldBuffer<S::Payload> = HeldBuffer::new();
    let mut paused = false;
    let mut finished = false;
    let mut paused_tiers = TierMask::NONE;
    // When the source may next be asked to release what waited too long in its own buffer.
    let mut next_release = tokio::time::Instant::now();
    let mut recalls_seen = inner.recalls.stamp();
    loop {
        // A worker may be pulling (only while `open`, cleared when this intake woke): it holds
        // the source for one batch at most.
        let mut source = shared.source.lock().await;
        for (rank, offer) in shared.returned.lock().drain(..) {
            held.absorb(&inner, rank, offer);
        }
        // Read before this turn's pulls, to stamp what they take (see `recall.rs`); what the
        // source took back since the last turn leaves the held buffer, released.
        let stamp = inner.recalls.stamp();
        if stamp != recalls_seen {
            let recalls = &inner.recalls;
            for item in held.drain_where(&inner, |item| recalls.taken_back(item)) {
                inner.release_taken_back_item(item);
            }
            recalls_seen = stamp;
        }
        if shared.finished.load(Ordering::Acquire) {
            finished = true;
        }
        // Read each turn: a live reconfiguration may change it.
        let poll = inner.poll_interval();
        lag.store(source.lag().unwrap_or(u64::MAX), Ordering::Relaxed);
        let (shed_level, cohorts) = inner.signals.shed();
        let forced = inner.live.forced_level();
        let level = shed_level.max(forced);
        if mode == Mode::Normal {
            // A tier admitted in part (some of its cohorts) is read on: only whole tiers pause.
            let whole = shed_level.saturating_sub(u8::from(cohorts > 0));
            let shed = TierMask::below(whole.max(forced));
            if shed != paused_tiers {
                source.pause_tiers(shed);
                paused_tiers = shed;
            }
        }
        if held.sweep_due(&inner) {
            held.sweep(&inner);
        }
        if held.circuit_due(&inner) {
            held.sweep_circuit(&inner);
        }
        // Nothing waits in the runtime, nor in the source's buffer, until its broker's patience
        // runs out (see `patience.rs`).
        held.hand_back_due(&inner);
        inner.release_waiting(&mut *source, &mut next_release);
        // Parked messages (behind a busy ordering key) have a bound of their own. Both bounds
        // are read each turn: a live reconfiguration may change them.
        let config = inner.config();
        let (max_held, max_parked) = (config.expert.max_held.get(), config.expert.max_parked.get());
        drop(config);
        if mode == Mode::Normal {
            held.make_room(&inner, max_held);
        }
        let full = held.len() >= max_held || inner.keys.parked() >= max_parked;
        if full != paused {
            if full {
                source.pause();
            } else {
                source.resume();
            }
            paused = full;
        }
        // The memory budget is kept by not pulling: a pulled message is in memory already.
        let may_pull = !full
            && !finished
            && (mode == Mode::Normal || drain_allowed(&inner))
            && inner.accounts.memory.may_pull();
        // Not overloaded: pull only what the workers will serve soon; the broker keeps the rest.
        let prefetch = inner.prefetch();
        if may_pull && mode == Mode::Normal && level == 0 && pulled_ahead(&inner, prefetch) {
            drop(source);
            let room = inner.pacing.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            inner.pacing.room_waiters.fetch_add(1, Ordering::Relaxed);
            if pulled_ahead(&inner, prefetch) {
                // With nothing to hold and nothing refused, the workers may pull what this
                // intake would, while it waits (closed again when it wakes).
                let _open = held.clear().then(|| Opened::new(&shared, &inner));
                tokio::select! {
                    _ = inner.lifecycle.stop.cancelled() => {
                        inner.pacing.room_waiters.fetch_sub(1, Ordering::Relaxed);
                        break;
                    }
                    _ = &mut room => {}
                    _ = tokio::time::sleep(poll) => {}
                }
            }
            inner.pacing.room_waiters.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        if !may_pull {
            drop(source);
            if finished && held.len() == 0 {
                break;
            }
            tokio::select! {
                _ = inner.lifecycle.stop.cancelled() => break,
                _ = tokio::time::sleep(poll) => {}
            }
            continue;
        }
        // While holding, pull only until the next poll, then come back to the held ones; while
        // tiers are paused, likewise, so they are resumed even if nothing else arrives.
        let wait = if held.len() == 0 && paused_tiers.is_empty() {
            None
        } else {
            Some(poll)
        };
        let pulled = tokio::select! {
            biased;
            _ = inner.lifecycle.stop.cancelled() => break,
            p = pull(&mut *source, wait) => p,
        };
        let envelope = match pulled {
            Pulled::Message(e) => e,
            Pulled::Nothing => continue,
            Pulled::Finished => {
                finished = true;
                continue;
            }
        };
        let patience = source.patience();
        take(&inner, &mut held, mode, envelope, patience, stamp);
        // Messages the source already has are taken in the same turn, up to `PULL_BATCH`,
        // without the per-pull work above (the stop signal's registration, the lag, the
        // sweep, the pause state): each is still admitted on its own, and the limits that
        // stop pulling (the held buffer, the prefetch while not overloaded) still apply.
        if mode == Mode::Normal {
            for _ in 1..PULL_BATCH {
                if held.len() >= max_held
                    || inner.keys.parked() >= max_parked
                    || !inner.accounts.memory.may_pull()
                    || (level == 0 && pulled_ahead(&inner, prefetch))
                {
                    break;
                }
                match source.next().now_or_never() {
                    Some(Some(envelope)) => {
                        take(&inner, &mut held, mode, envelope, patience, stamp)
                    }
                    Some(None) => {
                        finished = true;
                        break;
                    }
                    None => break,
                }
            }
        }
    }
    if mode == Mode::Normal {
        let ours: Arc<dyn PullForIntake<Inner<S::Payload>>> = shared.clone();
        inner.pacing.helpers.rcu(|list| {
            list.iter()
                .filter(|h| !Arc::ptr_eq(h, &ours))
                .cloned()
                .collect::<Vec<_>>()
        });
    }
    // `open` is cleared (the guard is dropped with the loop's scope): once the lock is ours, no
    // worker pulls, and what the last one left to hold is ours to release.
    let mut source = shared.source.lock().await;
    for (rank, offer) in shared.returned.lock().drain(..) {
        held.absorb(&inner, rank, offer);
    }
    inner
        .signals
        .held
        .fetch_sub(held.len() as i64, Ordering::Relaxed);
    // Dropping them releases them unacknowledged.
    drop(held);
    if inner.lifecycle.pulling.fetch_sub(1, Ordering::AcqRel) == 1 {
        inner.accounts.sources_done.store(true, Ordering::Release);
    }
    inner.accounts.idle.notify_waiters();
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
