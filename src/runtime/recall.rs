//! Taking messages back: a source whose broker takes back messages the runtime already holds
//! (a Kafka partition revoked and given to another member of the group) hands them back
//! through a [`Recall`], so that no message is served by two consumers at once and a key's
//! messages never run in two places together.
//!
//! # What a recall does
//!
//! 1. It moves the runtime's *recall generation* on. Every message carries the generation read
//!    before it was pulled from its source; wherever a message from before the latest recall
//!    moves on, the runtime asks its source whether it still has it
//!    ([`AckSink::is_current`]), and releases it if not: right before its handler call (the
//!    one place a popped message reaches a handler), when the intake sweeps what it holds
//!    under backpressure, and when a hold task offers its message again. So a message taken
//!    back is never served afterwards, wherever it was when the recall came: queued, held,
//!    parked, in a worker's batch, waiting to retry, or between the source and the queue.
//! 2. It releases at once what it can reach and its predicate selects: the messages waiting
//!    in the queue ([`WfqQueue::drain_where`](crate::queue::WfqQueue::drain_where)) and those
//!    parked behind a busy key ([`KeyGate::drain_where`](crate::ordering::KeyGate::drain_where)).
//!    The intake's held messages follow at its next turn (step 1).
//! 3. [`Recall::wait_running`] then waits, bounded, for the handlers still running such
//!    messages: the source lets its partitions go only once they are done (their completions
//!    are committed first), and the next owner does not start a key while its message runs
//!    here.
//!
//! A released message gets no disposition: it is counted `released` in the ledger, as at
//! shutdown, and its ack's [`AckSink::release`] tells the source not to acknowledge it (a
//! Kafka source commits nothing past it), so the broker delivers it again, to whoever owns it
//! now. A key whose message past the gate is released is freed for its next message.
//!
//! # Why the generation is read before the pull
//!
//! A message the source handed over just before it stopped owning it, but that the runtime
//! counted in just after the recall, would otherwise carry the new generation and never be
//! asked about. Read before the pull, the generation is older than the recall whenever the
//! pull was: the source's own check (a Kafka source drops the records of a partition being
//! revoked, from the moment it marks it) covers whatever was pulled after.
//!
//! # Why what a worker runs is published before the generation is read
//!
//! Each worker publishes the message it is about to run (its ack's sink and reference, in
//! `recalls.rs`), then reads the generation; a recall moves the generation on, then reads what
//! the workers published. All four are sequentially consistent, so either the worker sees the
//! new generation (and asks the source, which says the message was taken back) or the recall
//! sees what the worker published (and waits for that handler). Without it, a handler could start on a message taken back just
//! after the recall looked. That costs a worker one sequentially consistent store per message
//! (an `xchg` on x86).

use crate::sync::Ordering;
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::runtime::ack::SinkId;
use crate::runtime::engine::Inner;
use crate::runtime::item::{Item, Origin};
use crate::runtime::settle::Freed;
use crate::runtime::{AckRef, AckSink};

/// How often [`Recall::wait_running`] looks again at what the workers run.
const WAIT_STEP: Duration = Duration::from_millis(1);

/// A source's handle on the runtime it is attached to, for taking back messages its broker
/// took back (a Kafka partition revoked and given to another member of the group), so that no
/// message is served by two consumers at once and a key's messages never run in two places
/// together. The runtime gives one to each source it attaches
/// ([`Source::attached`](crate::runtime::Source::attached)); a source whose broker never takes
/// a message back ignores it. Cloning it is cheap; once the runtime is gone its calls do
/// nothing.
///
/// A recall goes in two calls. [`release_where`](Self::release_where) releases at once the
/// messages the runtime holds in its queue and parked behind their key, and from then on the
/// runtime asks the source ([`AckSink::is_current`]) about every message it took before, at
/// the places a message moves on (before its handler call, when the intake sweeps what it
/// holds, when a retry or a hold offers it again), and releases those taken back: none is
/// served afterwards, wherever it was. [`wait_running`](Self::wait_running) then waits,
/// bounded, for the handlers already running such messages, so the source can let them go
/// once they are done. A released message gets no disposition: it is counted `released` in
/// the ledger, as at shutdown, and its ack's [`AckSink::release`] tells the source not to
/// acknowledge it, so its broker delivers it again, to whoever owns it now.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use triage::runtime::{AckRef, AckSink, Recall};
///
/// /// A partition's records, handed back when the partition is revoked.
/// fn revoked(recall: &Recall, acks: &Arc<dyn AckSink>, partition: u64) {
///     let taken_back = |token: AckRef| token.stream == partition;
///     let released = recall.release_where(acks, taken_back);
///     let still_running = recall.wait_running(acks, taken_back, Duration::from_secs(10));
///     println!("{released} released, {still_running} handlers still running");
/// }
/// # let _ = revoked;
/// ```
#[derive(Clone)]
pub struct Recall {
    target: Arc<dyn Target>,
}

impl fmt::Debug for Recall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recall").finish_non_exhaustive()
    }
}

impl Recall {
    pub(crate) fn new<T: Send + Sync + 'static>(inner: &Arc<Inner<T>>) -> Self {
        Recall {
            target: Arc::new(Runtime {
                inner: Arc::downgrade(inner),
                tokio: tokio::runtime::Handle::try_current().ok(),
            }),
        }
    }

    /// Takes back the messages acknowledged through `sink` whose reference `which` selects:
    /// releases at once those waiting in the queue and those parked behind a busy key, and
    /// from now on releases instead of serving any message of `sink` taken before this call
    /// for which `sink` answers [`AckSink::is_current`] `false` (held by the intake, in a
    /// worker's batch, waiting to retry...). Returns how many it released at once.
    ///
    /// Answer `false` from `is_current` for the messages taken back *before* calling this.
    /// `which` is called under the queue's and the gate's locks, once per message of `sink`
    /// there: keep it cheap, and never call into the runtime from it. Never blocks otherwise.
    pub fn release_where(&self, sink: &Arc<dyn AckSink>, which: impl Fn(AckRef) -> bool) -> usize {
        self.target.release_where(SinkId::of(sink), &which)
    }

    /// Waits until no handler runs a message of `sink` that `which` selects, at most `bound`,
    /// blocking the calling thread (a rebalance callback's, say: never call it from a task of
    /// the runtime's, whose handlers it waits for). Returns how many such handlers still run:
    /// 0 unless `bound` ran out. Call it after [`release_where`](Self::release_where), so that
    /// no new handler starts on those messages meanwhile. `which` is called once per running
    /// handler of `sink` every millisecond.
    pub fn wait_running(
        &self,
        sink: &Arc<dyn AckSink>,
        which: impl Fn(AckRef) -> bool,
        bound: Duration,
    ) -> usize {
        self.target.wait_running(SinkId::of(sink), &which, bound)
    }
}

/// A recall as the handle sees the runtime, whatever its payload type.
trait Target: Send + Sync {
    fn release_where(&self, sink: SinkId, which: &dyn Fn(AckRef) -> bool) -> usize;
    fn wait_running(&self, sink: SinkId, which: &dyn Fn(AckRef) -> bool, bound: Duration) -> usize;
}

/// The runtime a [`Recall`] belongs to, weakly: a source may outlive it.
struct Runtime<T> {
    inner: Weak<Inner<T>>,
    /// The tokio runtime it was attached on: a recall comes from a thread of the source's
    /// (a rebalance callback), and freeing a key may offer its next message, whose policy may
    /// spawn a task (a hold, a deferral).
    tokio: Option<tokio::runtime::Handle>,
}

impl<T: Send + Sync + 'static> Target for Runtime<T> {
    fn release_where(&self, sink: SinkId, which: &dyn Fn(AckRef) -> bool) -> usize {
        let Some(inner) = self.inner.upgrade() else {
            return 0;
        };
        let _tokio = self.tokio.as_ref().map(tokio::runtime::Handle::enter);
        inner.release_taken_back(sink, which)
    }

    fn wait_running(&self, sink: SinkId, which: &dyn Fn(AckRef) -> bool, bound: Duration) -> usize {
        let Some(inner) = self.inner.upgrade() else {
            return 0;
        };
        // Any handler about to start sees the new generation, or is seen below.
        inner.recalls.next_generation();
        let until = Instant::now().checked_add(bound);
        loop {
            let running = inner.recalls.count_running(sink, which);
            let left = until.map_or(Duration::MAX, |u| {
                u.saturating_duration_since(Instant::now())
            });
            if running == 0 || left.is_zero() {
                return running;
            }
            std::thread::sleep(WAIT_STEP.min(left));
        }
    }
}

impl<T: Send + Sync + 'static> Inner<T> {
    /// A recall: the messages of `sink` that `which` selects leave the key gate and the
    /// queue, released; from now on every message stamped before is asked about where it
    /// moves on. Returns how many were released here.
    pub(crate) fn release_taken_back(
        self: &Arc<Self>,
        sink: SinkId,
        which: &dyn Fn(AckRef) -> bool,
    ) -> usize {
        self.recalls.next_generation();
        let pick = |item: &Item<T>| item.ack_ident().is_some_and(|(s, t)| s == sink && which(t));
        // The parked first, so that a key freed below lets none of them through.
        let parked = self.keys.drain_where(pick);
        let queued = self.queue.drain_where(pick);
        let released = parked.len() + queued.len();
        // A parked message holds no key: dropped, it is released.
        for item in parked {
            self.unpull(&item);
        }
        let mut freed = Freed::default();
        for e in queued {
            self.drop_taken_back(e.into_inner(), &mut freed);
        }
        self.release(freed);
        released
    }

    /// A message past the key gate that its source took back: released (dropped: counted
    /// `released` in the ledger, as at shutdown, and its ack released), and its key freed for
    /// the next message.
    pub(crate) fn release_taken_back_item(self: &Arc<Self>, item: Item<T>) {
        let mut freed = Freed::default();
        self.drop_taken_back(item, &mut freed);
        self.release(freed);
    }

    /// [`release_taken_back_item`](Self::release_taken_back_item) inside a step: its key goes
    /// to `freed`.
    fn drop_taken_back(&self, item: Item<T>, freed: &mut Freed) {
        self.unpull(&item);
        if let Some(key) = item.key {
            freed.push(key);
        }
        drop(item);
    }

    /// A message handed back to its broker is pulled again later (here or by another
    /// consumer): counted out of the arrival pull-based admission sees, or a rebalance that
    /// hands back a backlog and pulls it again would read as arrival beyond capacity.
    fn unpull(&self, item: &Item<T>) {
        if item.origin == Origin::Pulled {
            let measured = self.signals.measured.local();
            measured.pulled[item.original.rank()].sub(1, Ordering::Relaxed);
            measured
                .cohort_pulled
                .add(item.original.rank(), item.cohort, u64::MAX);
        }
    }
}
