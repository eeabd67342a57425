//! The bounded weighted-fair queue at the heart of triage.
//!
//! One FIFO per criticality tier, bounded together by a count of items (and optionally bytes):
//!
//! - **Dequeue by weight.** Stride scheduling (Waldspurger & Weihl 1995), a deterministic form
//!   of weighted fair queuing: with every tier backlogged each tier gets `weight / sum(weights)`
//!   of the dequeues, interleaved, default 8/4/2/1. Lower tiers slow down but never starve: a
//!   backlogged tier of weight `w_i` is skipped at most `sum over j != i of (ceil(w_j/w_i) + 1)`
//!   consecutive dequeues (17 for Sheddable under 8/4/2/1). A tier left out of a pop by its
//!   [`TierMask`] builds no credit meanwhile: when it is eligible again it starts at the
//!   virtual time, like a tier that has just become backlogged. The weighted-fair-queue sketch in the
//!   load-shedding article this design started from drains
//!   strictly by priority and ignores its own weights; this one does not.
//! - **Evict the newest of the lowest tier when full.** A push into a full queue evicts the
//!   newest item (the tail) of the lowest non-empty tier strictly below the incoming one: the
//!   newest because the oldest has already waited and is closest to being served, and the
//!   lowest because that is the ladder's promise. With nothing below, the push is refused.
//!   Either way the item comes back to the caller; nothing is dropped inside the queue.
//!   Expired items never hold the room: a push into a full queue first discards every item
//!   whose deadline has passed (handed back as [`Removed::Expired`]), and only then evicts or
//!   refuses by the rule above.
//! - **Discard what has expired at dequeue.** An item whose deadline passed while it waited is
//!   handed back as [`Dequeued::Expired`]: free to drop, impossible to help. It is not charged
//!   to its tier's share.
//! - **Admit by queue age** before taking the lock (see [`crate::admission`]).
//!
//! # Time
//!
//! Items are stamped and deadlines compared with quanta's *recent* time (refreshed every
//! millisecond by an upkeep thread started on first use), so the hot path reads the clock with
//! one atomic load; queue ages are accurate to 1 ms. Deadlines stay exact: the precise clock
//! is read only for a deadline within a few milliseconds of recent time (see `time.rs` for
//! the window and what it assumes of the upkeep thread).
//!
//! # Why one lock, and what it gives up
//!
//! Every operation touches scheduler state shared by the four tiers (the passes, the counts,
//! the byte budget), eviction takes the *newest* item of the lowest tier below the incoming
//! one, atomically across tiers, and a push into a full queue first discards what has
//! expired. So the state sits behind one `parking_lot::Mutex`, and the work done under it was
//! slimmed until no single part stands out (callgrind, instructions per push+pop: 591 before,
//! 252 now, crossbeam's `ArrayQueue` 95):
//!
//! - the backlog bitmask is kept as items come and go, not rebuilt from four `is_empty`;
//! - queue-age admission is re-evaluated only when it can change: at level 0 nothing a push or
//!   pop does can age the oldest item, so until that item reaches the lowest cut-off no
//!   operation recomputes the ages (it was a third of the cost);
//! - a push with room builds no eviction set; a pop counts itself under the lock (a plain
//!   store published after it, not a locked add); the stride pick visits set bits only;
//! - the precise clock is read only near a deadline (above);
//! - [`WfqQueue::push_batch`] and [`WfqQueue::pop_batch_masked`] pay the lock, the wake-up
//!   check and the clock read once per batch.
//!
//! What it gives up, measured in BENCHMARKS.md: one push+pop costs two lock round-trips, so a
//! single thread is about 3x crossbeam's `ArrayQueue` (under 2x in batches of 32), and six
//! threads contending on two cores serialise on the lock where a lock-free channel does not
//! (a third of a bounded crossbeam-channel's throughput one item at a time). Blocking pushes
//! and pops spin, then yield, before they park, as crossbeam-channel does, and async ones
//! yield to the executor once before they register to sleep; with async tasks the queue keeps
//! up with async-channel.
//! The alternative measured in issue 11, four lock-free rings (one per tier) with an atomic
//! total, reached 1.8x `ArrayQueue` single-threaded but cannot take the newest item off a
//! ring's tail, so it would give up eviction of the newest item (and the expiry scan) or need
//! a lock for them anyway. A worker that spends microseconds per message is not limited by a
//! queue that spends tens of nanoseconds, and the refuse path (admission) never takes the
//! lock.

mod config;
mod core;
mod entry;
mod error;
mod scheduler;
mod stats;
mod time;
mod wfq;

pub use config::{Weight, WeightError, WfqConfig, MAX_CAPACITY, MAX_WEIGHT};
pub use entry::{Dequeued, Entry, Evictions, Meta, Removed};
pub use error::{Closed, PopTimeoutError, PushError, RefuseReason, TryPopError};
pub use stats::{QueueStats, TierStats};
pub use wfq::{TierMask, WfqQueue};
