//! What every pulled message goes through before its offer, whoever pulled it (the intake, or a
//! worker pulling for it), and how far ahead an intake that is not overloaded pulls.

use crate::sync::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::engine::Inner;
use crate::runtime::item::{Item, Origin};

/// How a source is pulled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Pull whenever the held buffer has room.
    Normal,
    /// Deferred work coming back: pull only while nothing is shed and workers are idle. Its
    /// copies keep the tier they were deferred with; one deferred `max_deferrals` times is not
    /// deferred again.
    Drain,
}

/// How far past the prefetch the intake may pull while not overloaded, counting the messages
/// parked behind a busy ordering key, as a multiple of the prefetch. Parked messages wait for
/// their key, not for a worker, so the intake looks past them for keys that are ready (as a
/// parallel consumer does); but not without bound: everything pulled counts as arrival to
/// pull-based admission, and a look-ahead of thousands of parked messages, pulled faster than
/// the lag probe sees them leave the broker, reads as arrival beyond capacity and sheds a keyed
/// backlog. A backlog stays in the broker.
const ORDERING_LOOKAHEAD: usize = 8;

/// Whether the intake, not overloaded, has pulled as far ahead as it should: the queue holds
/// the prefetch, or, when the sampler derived it and no message is parked behind a busy key,
/// as many as the workers clear within the shortest deadline slack of the admitted work (at
/// most half the queue: see `admission::derived_lookahead`), so that the queue can serve by
/// deadline what the broker would hand over in offset order; or the queue and the messages
/// parked behind busy keys hold [`ORDERING_LOOKAHEAD`] times the prefetch, or that derived
/// look-ahead.
pub(crate) fn pulled_ahead<T: Send + Sync + 'static>(inner: &Inner<T>, prefetch: usize) -> bool {
    let queued = inner.queue.len();
    let parked = inner.keys.parked();
    // A keyed message waiting in a deep queue holds its key, and every message parked behind
    // it waits as long (a hot key's Critical messages expired): with any parked, the queue
    // holds the prefetch, and only the look-ahead past busy keys goes further.
    let pull_ahead = if parked > 0 {
        0
    } else {
        inner.signals.pull_ahead.load(Ordering::Relaxed)
    };
    if queued >= prefetch.max(usize::try_from(pull_ahead).unwrap_or(usize::MAX)) {
        return true;
    }
    let derived = inner.signals.lookahead.load(Ordering::Relaxed);
    let ahead = (prefetch * ORDERING_LOOKAHEAD).max(usize::try_from(derived).unwrap_or(usize::MAX));
    queued + parked >= ahead
}

/// Most messages taken from a source in one turn of the intake loop (see `intake::run`).
pub(crate) const PULL_BATCH: usize = 32;

/// What every pulled message goes through before its offer, whoever pulled it (the intake, or
/// a worker pulling for it): counted, given its hand-back instant if its source has a
/// `patience`, stamped with the recall generation `stamp` read before the pull (see
/// `recall.rs`), expired at once if its deadline passed, through the key gate. `None` when it
/// was settled or parked here.
pub(crate) fn receive<T: Send + Sync + 'static>(
    inner: &Arc<Inner<T>>,
    mode: Mode,
    envelope: crate::runtime::Envelope<T>,
    patience: Option<Duration>,
    stamp: u16,
) -> Option<Item<T>> {
    let tier = envelope.criticality;
    let waited = envelope.waited;
    let mut item = Item::consumed(envelope, &inner.accounts);
    item.set_hand_back_at(inner.hand_back_at(patience, waited));
    item.recall_stamp = stamp;
    inner.map_downstream(&mut item);
    let now = crate::queue::time::recent(&inner.clock);
    if mode == Mode::Drain {
        item.origin = Origin::Drained;
    } else {
        let measured = inner.signals.measured.local();
        measured.pulled[tier.rank()].add(1, Ordering::Relaxed);
        measured.cohort_pulled.add(tier.rank(), item.cohort, 1);
        // The deadline slack it arrives with: what admission predicts deadline misses from.
        // In µs, at most `u32::MAX` (71 minutes) each, so the sum lasts 4 billion messages.
        if let Some(deadline) = item.deadline() {
            let slack = deadline.saturating_duration_since(now).as_micros();
            measured.pulled_with_deadline[tier.rank()].add(1, Ordering::Relaxed);
            measured.slack_us[tier.rank()].add(
                u64::try_from(slack).map_or(u64::from(u32::MAX), |s| s.min(u64::from(u32::MAX))),
                Ordering::Relaxed,
            );
        }
    }
    // Past its deadline already: expired from its headers alone, before any queueing.
    if item.deadline().is_some_and(|d| d <= now) {
        inner.expire_at_intake(item);
        return None;
    }
    // Behind a busy key: parked, offered when the key's earlier message is settled.
    inner.pass_gate(item)
}
