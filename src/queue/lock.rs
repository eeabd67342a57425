//! The queue's lock: test-and-test-and-set, released by a plain store.
//!
//! Every push and pop takes the queue's lock once. With `parking_lot::Mutex` that is two
//! atomic read-modify-writes per operation (a compare-and-swap to take it and another to
//! release it, since a release must learn whether a thread is parked), so four per push+pop
//! where crossbeam's `ArrayQueue` pays two: on x86 each costs about as much as 60 ordinary
//! instructions, which was a third of a push+pop. This lock is taken by one
//! compare-and-swap and released by a plain release store (an ordinary `mov` on x86): two
//! read-modify-writes per push+pop, as `ArrayQueue`.
//!
//! A plain store cannot tell a parked thread to wake, so no thread parks on this lock: a
//! thread that finds it taken spins (exponentially, as crossbeam's `Backoff`, but longer: see
//! [`SPINS`]), then yields
//! its core, up to [`YIELDS`] times, and only then sleeps [`NAP`] at a time until it is free.
//! The critical sections are tens of nanoseconds and never block, so a holder that keeps the
//! lock for longer than the spinning is a holder the scheduler preempted; yielding hands it a
//! core back, which on a machine with more threads than cores (the four-producer,
//! two-consumer bench on two cores) is what a parked waiter would wait for anyway, without
//! the futex calls of parking and unparking (a sixth of that bench's time with
//! `parking_lot`). The naps come late on purpose: with 16 yields before them, waiters napped
//! while the lock was already free, and on the loaded machine one run in three of that bench
//! took 250-310 ms instead of 10-60 ms; 1,024 yields is about a millisecond of a descheduled holder.
//!
//! What it gives up: fairness (`parking_lot` hands the lock over fairly now and then; here the
//! next to find it free takes it, so a waiter may lose a few rounds in a row); a waiter burns
//! its time slices yielding rather than sleeping while a holder is descheduled; and one that
//! reaches the naps wakes up to [`NAP`] after the lock was released instead of at once. None
//! shows with critical sections this short; the queue's waiters for items park on
//! their own events, not on this lock.
//!
//! The release/acquire pair orders every critical section after the previous one, as a
//! mutex does, which is all the queue's waiter protocol asks of its lock (see
//! `wfq/waiting.rs`). Under `cfg(loom)` the flag is loom's atomic, the value sits in loom's
//! `UnsafeCell` (so a critical section that another could overlap is reported as a data
//! race), and a waiter sleeps on a condition variable instead of spinning (loom cannot
//! bound a spin loop's interleavings): `tests/loom_queue.rs` runs the queue's models over
//! this lock.

use std::time::Duration;

use crate::loom::{AtomicBool, Ordering};

#[cfg(not(loom))]
use std::cell::UnsafeCell;

#[cfg(loom)]
use loom::cell::UnsafeCell;

/// Rounds of exponential spinning (`2^step` spin hints each) before a waiter yields: 1,023
/// hints in all, tens of µs where a spin hint (`pause`) is slow, a few µs where it is short.
/// The lock is held for a push or a pop, far less than that: a waiter that yields sooner (as
/// crossbeam's `Backoff` does, after 63 hints) yields while the holder is running on another
/// core and only moving cache lines, and hands its core to another contender, which costs a
/// context switch per contended acquisition (BENCHMARKS.md has the bench). A descheduled
/// holder costs a waiter at most this spinning before it yields, against a time slice of
/// milliseconds.
#[cfg_attr(loom, allow(dead_code))]
const SPINS: u32 = 10;

/// Yields of the thread before a waiter naps.
#[cfg_attr(loom, allow(dead_code))]
const YIELDS: u32 = 1024;

/// A waiter's sleep once spinning and yielding did not see the lock free: the holder has been
/// descheduled for a while.
#[cfg_attr(loom, allow(dead_code))]
const NAP: Duration = Duration::from_micros(50);

/// A lock around a `T` that never parks (see the module docs). The flag comes first
/// (`repr(C)`), so it shares a cache line with the start of `T`.
#[repr(C)]
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
    /// Under loom a waiter sleeps here instead of spinning (see `lock_contended`).
    #[cfg(loom)]
    sleep: (loom::sync::Mutex<()>, loom::sync::Condvar),
}

// SAFETY: the lock hands out access to `value` to one thread at a time (the acquire
// compare-and-swap in `lock` against the release store in the guard's drop), so sharing the
// lock sends `T` between threads, never shares it.
unsafe impl<T: Send> Send for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
            #[cfg(loom)]
            sleep: Default::default(),
        }
    }

    /// Takes the lock, waiting (spin, yield, nap) while another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        self.guard()
    }

    #[cfg(not(loom))]
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut step = 0u32;
        loop {
            // Wait reading, not writing: a compare-and-swap that fails still takes the cache
            // line from the holder.
            while self.locked.load(Ordering::Relaxed) {
                wait(&mut step);
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Under loom, a waiter that finds the lock taken sleeps on a condition variable that
    /// every release notifies, instead of spinning: loom explores every interleaving of a
    /// spin loop's loads, and three threads spinning on one another exceed any useful bound.
    /// The flag and its orderings are the same code as above, and a thread that comes after a
    /// release takes the lock by the compare-and-swap alone, so the models still check that
    /// the release store and the acquiring compare-and-swap order the critical sections.
    #[cfg(loom)]
    fn lock_contended(&self) {
        let (mutex, condvar) = &self.sleep;
        loop {
            let mut g = mutex
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while self.locked.load(Ordering::Relaxed) {
                g = condvar
                    .wait(g)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            drop(g);
            if self
                .locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    #[cfg(not(loom))]
    #[inline]
    fn guard(&self) -> SpinGuard<'_, T> {
        SpinGuard {
            lock: self,
            value: self.value.get(),
        }
    }

    #[cfg(loom)]
    fn guard(&self) -> SpinGuard<'_, T> {
        SpinGuard {
            lock: self,
            value: std::mem::ManuallyDrop::new(self.value.get_mut()),
        }
    }
}

/// One step of a waiter's patience (see the module docs).
#[inline]
#[cfg(not(loom))]
fn wait(step: &mut u32) {
    if *step < SPINS {
        for _ in 0..1u32 << *step {
            std::hint::spin_loop();
        }
    } else if *step < SPINS + YIELDS {
        std::thread::yield_now();
    } else {
        std::thread::sleep(NAP);
        return;
    }
    *step += 1;
}

/// Access to the locked value; releases the lock on drop.
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    #[cfg(not(loom))]
    value: *mut T,
    #[cfg(loom)]
    value: std::mem::ManuallyDrop<loom::cell::MutPtr<T>>,
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no other reference to the value exists.
        #[cfg(not(loom))]
        return unsafe { &*self.value };
        // SAFETY: as above; loom checks it.
        #[cfg(loom)]
        return unsafe { loom::cell::MutPtr::deref(&self.value) };
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the only reference
        // through it.
        #[cfg(not(loom))]
        return unsafe { &mut *self.value };
        // SAFETY: as above; loom checks it.
        #[cfg(loom)]
        return unsafe { loom::cell::MutPtr::deref(&self.value) };
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Under loom the tracked access ends before the lock is released (field drop order
        // would end it after).
        // SAFETY: dropped once, here, and not used after.
        #[cfg(loom)]
        unsafe {
            std::mem::ManuallyDrop::drop(&mut self.value)
        };
        self.lock.locked.store(false, Ordering::Release);
        // Under loom, wake the sleepers (taking their mutex: one that saw the flag set is
        // either waiting already or will see it clear).
        #[cfg(loom)]
        {
            let (mutex, condvar) = &self.lock.sleep;
            drop(mutex.lock());
            condvar.notify_all();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn four_threads_count_to_forty_thousand() {
        let lock = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        // Read, then write in a second step: a lost update if two overlap.
                        let mut g = lock.lock();
                        let v = *g;
                        std::hint::black_box(());
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no panic");
        }
        assert_eq!(*lock.lock(), 40_000);
    }

    #[test]
    fn a_waiter_gets_the_lock_after_a_long_hold() {
        let lock = Arc::new(SpinLock::new(Vec::new()));
        let g = lock.lock();
        let waiter = {
            let lock = Arc::clone(&lock);
            std::thread::spawn(move || lock.lock().push(2))
        };
        // Long enough for the waiter to reach its naps.
        std::thread::sleep(Duration::from_millis(20));
        drop(g);
        waiter.join().expect("no panic");
        lock.lock().push(3);
        assert_eq!(*lock.lock(), [2, 3]);
    }
}
