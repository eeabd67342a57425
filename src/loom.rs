//! The synchronisation primitives of the hand-written waiter protocols (the queue's
//! `waiters` count beside its lock, the concurrency limit's per-tier waiter
//! counts beside its in-flight count), of the token buckets' timestamp and of the memory
//! budget's byte counts, swapped for loom's models under `cfg(loom)` so that
//! `tests/loom_queue.rs`, `tests/loom_bucket.rs` and `tests/loom_memory.rs` explore every
//! interleaving of them. The pattern is tokio's
//! `tokio/src/loom/mod.rs`; `event-listener` has its own loom support, enabled by the
//! `cfg(loom)` dependency in Cargo.toml.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test --test loom_queue --release
//! ```

#[cfg(not(loom))]
pub(crate) use crate::sync::{
    fence, AtomicBool, AtomicU16, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU16, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

/// Waiting in a spin loop for another thread's short critical section (a token bucket being
/// reconfigured): crossbeam's exponential backoff, which spins and then yields; under loom, a
/// yield, so that the model lets the other thread run.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    #[cfg(not(loom))]
    inner: crossbeam_utils::Backoff,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff::default()
    }

    #[inline]
    pub(crate) fn snooze(&self) {
        #[cfg(not(loom))]
        self.inner.snooze();
        #[cfg(loom)]
        loom::thread::yield_now();
    }
}

/// A mutex with parking_lot's interface: `lock` returns the guard (no poisoning).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(not(loom))]
    inner: parking_lot::Mutex<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

#[cfg(not(loom))]
pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex {
            #[cfg(not(loom))]
            inner: parking_lot::Mutex::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(not(loom))]
        return self.inner.lock();
        // A panic while the lock is held is a bug under test; loom reports it either way.
        #[cfg(loom)]
        return self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}
