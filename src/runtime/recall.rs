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
//! # Why a worker's slot is written before the generation is read
//!
//! Each worker publishes the message it is about to run (its ack's sink and reference) in a
//! slot, then reads the generation; a recall moves the generation on, then reads the slots.
//! All four are sequentially consistent, so either the worker sees the new generation (and
//! asks the source, which says the message was taken back) or the recall sees the slot (and
//! waits for that handler). Without it, a handler could start on a message taken back just
//! after the recall looked. That costs a worker one sequentially consistent store per message
//! (an `xchg` on x86).

use std::fmt;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::runtime::ack::SinkId;
use crate::runtime::engine::Inner;
use crate::runtime::item::{Item, Origin};
use crate::runtime::settle::Freed;
use crate::runtime::{AckRef, AckSink};

/// How often [`Recall::wait_running`] looks at the workers' slots again.
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
            let running = inner.recalls.running(sink, which);
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
            self.signals.pulled[item.original.rank()].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The runtime's side of recalls: the generation, and what each worker runs.
#[derive(Default)]
pub(crate) struct Recalls {
    /// Sixteen bits, as the stamps (see `Item::recall_stamp`): it wraps, so a message that
    /// went 65,536 recalls without moving on and without its source's answer would be taken
    /// for a current one. Messages waiting in the queue or parked are taken back by the
    /// recall's predicate, whatever their stamp; the others are asked wherever they move (held
    /// ones at every turn of their intake after a recall, hold tasks every poll interval), so
    /// only a retry waiting out its backoff could be that late, with recalls coming faster
    /// than 65,536 per backoff (an hour at most): far more than rebalances ever come (two
    /// generations each).
    generation: AtomicU16,
    workers: Mutex<Vec<Arc<Running>>>,
}

impl Recalls {
    /// The generation to stamp a message with: read before pulling it.
    #[inline]
    pub(crate) fn stamp(&self) -> u16 {
        self.generation.load(Ordering::SeqCst)
    }

    pub(crate) fn next_generation(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether `item`'s source took it back since it was stamped. Asks the source only for an
    /// item stamped before the latest recall, and stamps it again when the source still has
    /// it, so each item is asked at most once per recall.
    #[inline]
    pub(crate) fn taken_back<T>(&self, item: &mut Item<T>) -> bool {
        let now = self.generation.load(Ordering::SeqCst);
        if item.recall_stamp == now {
            return false;
        }
        if item.is_current() {
            item.recall_stamp = now;
            return false;
        }
        true
    }

    /// A slot for a worker to publish what it runs; removed when dropped.
    pub(crate) fn slot(self: &Arc<Self>) -> Slot {
        let running = Arc::new(Running::default());
        self.workers.lock().push(Arc::clone(&running));
        Slot {
            running,
            recalls: Arc::clone(self),
        }
    }

    /// Handlers running a message of `sink` that `which` selects.
    fn running(&self, sink: SinkId, which: &dyn Fn(AckRef) -> bool) -> usize {
        let workers = self.workers.lock();
        workers
            .iter()
            .filter_map(|w| w.get(sink))
            .filter(|t| which(*t))
            .count()
    }
}

/// What one worker runs: its ack's sink and reference, `sink` 0 while it runs nothing
/// trackable. Read without the worker's cooperation: a reader may see the sink of one message
/// with the reference of the next only when the first has ended, so it never misses a
/// message that runs (see the module docs for the order of the writes). Written by its worker
/// for every message, so it has cache lines of its own (two: adjacent-line prefetching pairs
/// them), and workers on different cores never write to one line.
#[derive(Default)]
#[repr(align(128))]
struct Running {
    sink: AtomicUsize,
    stream: AtomicU64,
    position: AtomicU64,
    epoch: AtomicU64,
}

impl Running {
    fn get(&self, sink: SinkId) -> Option<AckRef> {
        if self.sink.load(Ordering::SeqCst) != sink.get() {
            return None;
        }
        Some(AckRef {
            stream: self.stream.load(Ordering::Relaxed),
            position: self.position.load(Ordering::Relaxed),
            epoch: self.epoch.load(Ordering::Relaxed),
        })
    }
}

/// A worker's slot (see [`Recalls::slot`]).
pub(crate) struct Slot {
    running: Arc<Running>,
    recalls: Arc<Recalls>,
}

impl Slot {
    /// The worker is about to check `item` and run it: published before the check reads the
    /// generation (see the module docs). An item with a no-op ack cannot be taken back.
    #[inline]
    pub(crate) fn enter<T>(&self, item: &Item<T>) {
        let Some((sink, token)) = item.ack_ident() else {
            return;
        };
        let r = &self.running;
        r.stream.store(token.stream, Ordering::Relaxed);
        r.position.store(token.position, Ordering::Relaxed);
        r.epoch.store(token.epoch, Ordering::Relaxed);
        r.sink.swap(sink.get(), Ordering::SeqCst);
    }

    /// The worker is done with the item it entered (settled, released, or handed on).
    #[inline]
    pub(crate) fn leave(&self) {
        self.running.sink.store(0, Ordering::Release);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.recalls
            .workers
            .lock()
            .retain(|w| !Arc::ptr_eq(w, &self.running));
    }
}
