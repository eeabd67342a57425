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
//!   refuses by the rule above. An incoming item whose own deadline has already passed evicts
//!   nothing: if only an eviction would make room, it is refused as full and handed back.
//! - **Discard what has expired at dequeue.** An item whose deadline passed while it waited is
//!   handed back as [`Dequeued::Expired`]: free to drop, impossible to help. It is not charged
//!   to its tier's share.
//! - **Admit by queue age** before taking the lock (see [`crate::admission`]).
//!
//! # The ways in and out, and why these
//!
//! - [`WfqQueue::push`] is the one way in, and it never waits: a full queue evicts below the
//!   item or hands it back in the error, at once. [`WfqQueue::push_admitted`] is the same push
//!   without the queue-age check, for a caller that admits by a signal of its own (a
//!   pull-based consumer, see [`PullAdmission`](crate::admission::PullAdmission)).
//! - [`WfqQueue::try_pop`] returns at once: for a consumer with its own way to wait (the HTTP
//!   entry's waiters, a poll loop) and for tests. [`WfqQueue::try_pop_masked`] serves only some
//!   tiers, to give each tier a share of a concurrency limit.
//! - [`WfqQueue::pop_batch`] and [`WfqQueue::pop_batch_masked`] take up to `max` items under
//!   one lock and one clock read: the runtime's workers take their work this way.
//! - [`WfqQueue::pop`] waits (async) for an item: the consumer a user of the queue on its own
//!   writes first. It is cancel safe, so a timeout is `tokio::time::timeout` around it, and a
//!   thread outside any runtime waits on it with an executor's `block_on`.
//!
//! There is no push that waits for room: what to do with an item a full queue refuses (shed
//! it, defer it, or hold it and offer it again once a pop has made room, as the runtime does
//! for a tier under backpressure) is the caller's policy, and a push that waited would take
//! that decision for it, holding the item inside a future that loses it when dropped. There
//! are no forms that park a thread, and no batch push: nothing in the crate or its connectors
//! needs them, and each would add a waiting protocol (producers waiting for room, threads
//! parked for an item) whose wake-ups must be proved exact like the one above.
//!
//! # Time
//!
//! Items are stamped and deadlines compared with quanta's *recent* time (refreshed every
//! millisecond by an upkeep thread started on first use, which parks after 100 ms in which
//! nothing read it, so an idle process pays no wake-up per millisecond), so the hot path reads
//! the clock with one atomic load; queue ages are accurate to 1 ms. Deadlines stay exact: the
//! precise clock is read only for a deadline within a few milliseconds of recent time, and
//! for every read while the upkeep thread is parked (see `time.rs` for the window, the parking
//! protocol and what they assume of the upkeep thread).
//!
//! # Why one lock, and what it gives up
//!
//! Every operation touches scheduler state shared by the four tiers (the passes, the counts,
//! the byte budget), eviction takes the *newest* item of the lowest tier below the incoming
//! one, atomically across tiers, and a push into a full queue first discards what has
//! expired. So the state sits behind one lock, and the work done under it is kept small:
//!
//! - the backlog bitmask is kept as items come and go, not rebuilt from four `is_empty`;
//! - queue-age admission is re-evaluated only when it can change: at level 0 nothing a push or
//!   pop does can age the oldest item, so until that item reaches the lowest cut-off no
//!   operation recomputes the ages;
//! - a push with room builds no eviction set; a pop counts itself under the lock (a plain
//!   store published after it, not a locked add); the stride pick visits set bits only, and
//!   none when one tier is a candidate; an item of size 0 touches no byte counter;
//! - the precise clock is read only near a deadline (above);
//! - [`WfqQueue::pop_batch_masked`] pays the lock, the wake-up check and the clock read once
//!   per batch;
//! - an [`Entry`] is held flat, not with a [`Meta`] inside it: copying a nested `Meta` in
//!   16-byte pieces straddles the narrower stores that have just written it, and a pop's copy
//!   then waits for the push's stores to retire (`entry.rs`).
//!
//! Atomic read-modify-writes and cache lines cost more than instructions here. The lock is
//! `lock.rs`'s, taken by one compare-and-swap and released by a plain store (two
//! read-modify-writes per push+pop, as crossbeam's `ArrayQueue`, where a parking mutex needs
//! four: it must learn at release whether a thread is parked); it never parks, so a waiter
//! spins, then yields, while a descheduled holder finishes (see `lock.rs` for what that gives
//! up). And the fields every push and pop touches come first (`repr(C)`): the lock's flag, the
//! counts and the admission recheck instant in one cache line, the scheduler's passes and the
//! per-tier push and pop counters in the next ones, so a critical section moves few lines
//! between cores.
//!
//! What it still gives up: threads on few cores serialise on the one lock, where a lock-free
//! channel's producers and consumers touch different cache lines, and a holder descheduled
//! inside its critical section holds everyone up. A waiting pop yields to the executor once
//! before it registers to sleep. Four lock-free rings (one per tier) with an atomic total
//! would be faster alone but cannot take the newest item off a ring's tail, so they would give
//! up eviction of the newest item (and the expiry scan) or need a lock for them anyway; the
//! stride scheduler's passes would also need a lock or a compare-and-swap loop of their own,
//! shared by every consumer. A worker that spends microseconds per message is not limited by
//! a queue that spends tens of nanoseconds, and the refuse path (admission) never takes the
//! lock. BENCHMARKS.md has the measurements behind each of these choices (instructions per
//! push+pop, the entry layout, the lock against a mutex, the queue against channels).
//!
//! # Requeue stays within the bounds
//!
//! A batch worker whose handler waits hands the rest of its batch back to the heads of their
//! tiers (`WfqQueue::requeue`). The intake may have filled the room the batch left meanwhile,
//! so the queue takes back only what fits under the count bound and the byte budget, the
//! batch's last pops first (so the stride charges it refunds are the latest ones), and the
//! worker keeps the rest, in order, and serves them after its current call.

mod config;
mod core;
mod entry;
mod error;
mod lock;
mod mask;
mod scheduler;
mod stats;
pub(crate) mod time;
mod wfq;

pub use config::{Weight, WeightError, WfqConfig, MAX_CAPACITY, MAX_WEIGHT};
pub use entry::{Dequeued, Entry, Evictions, Meta, Removed};
pub use error::{Closed, PushError, RefuseReason, TryPopError};
pub use mask::TierMask;
pub use stats::{QueueStats, TierStats};
pub use wfq::WfqQueue;
