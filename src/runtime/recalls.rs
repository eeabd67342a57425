//! The runtime's side of recalls: the recall generation every message is stamped with, and
//! what each worker runs, for [`Recall::wait_running`](crate::runtime::Recall::wait_running) to
//! wait for. Why the generation is read before the pull, and why a worker publishes what it
//! runs before it reads the generation: see `recall.rs`.

use crate::sync::{owned, AtomicU16, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::runtime::ack::SinkId;
use crate::runtime::item::Item;
use crate::runtime::AckRef;

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
    workers: Mutex<Vec<Arc<RunningCell>>>,
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

    /// Where a worker publishes what it runs; removed when dropped.
    pub(crate) fn for_worker(self: &Arc<Self>) -> Running {
        let cell = Arc::new(RunningCell::default());
        self.workers.lock().push(Arc::clone(&cell));
        Running {
            cell,
            recalls: Arc::clone(self),
        }
    }

    /// Handlers running a message of `sink` that `which` selects.
    pub(crate) fn count_running(&self, sink: SinkId, which: &dyn Fn(AckRef) -> bool) -> usize {
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
struct RunningCell {
    sink: owned::AtomicUsize,
    stream: owned::AtomicU64,
    position: owned::AtomicU64,
    epoch: owned::AtomicU64,
}

impl RunningCell {
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

/// What a worker runs, published for recalls to read (see [`Recalls::for_worker`]).
pub(crate) struct Running {
    cell: Arc<RunningCell>,
    recalls: Arc<Recalls>,
}

impl Running {
    /// The worker is about to check `item` and run it: published before the check reads the
    /// generation (see the module docs). An item with a no-op ack cannot be taken back.
    #[inline]
    pub(crate) fn enter<T>(&self, item: &Item<T>) {
        let Some((sink, token)) = item.ack_ident() else {
            return;
        };
        let r = &self.cell;
        r.stream.store(token.stream, Ordering::Relaxed);
        r.position.store(token.position, Ordering::Relaxed);
        r.epoch.store(token.epoch, Ordering::Relaxed);
        r.sink.swap(sink.get(), Ordering::SeqCst);
    }

    /// The worker is done with the item it entered (settled, released, or handed on).
    #[inline]
    pub(crate) fn leave(&self) {
        self.cell.sink.store(0, Ordering::Release);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.recalls
            .workers
            .lock()
            .retain(|w| !Arc::ptr_eq(w, &self.cell));
    }
}
