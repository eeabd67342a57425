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
//! one atomic load; queue ages are accurate to 1 ms, deadlines exactly (see `time.rs`).
//!
//! # Why a mutex
//!
//! Every operation touches scheduler state shared by the four tiers (the passes, the counts, the
//! byte budget), and eviction must choose atomically across tiers; a lock-free design would need
//! a multi-word CAS for exactly the operations that matter. A short critical section (a few
//! dozen instructions, no allocation once the ring buffers have grown) behind a
//! `parking_lot::Mutex` measures within the targets in BENCHMARKS.md, and the refuse path never
//! takes it.

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
