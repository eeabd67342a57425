//! What a message's path writes that other threads see, and how it avoids it.
//!
//! A write to a cache line that another thread writes too moves the line between cores: on
//! the per-message path that costs more than the rest of the bookkeeping. So the state a
//! message touches is of two kinds:
//!
//! - **Shared** state that decides something (the queue's lock and length, the concurrency
//!   limit's in-flight count): its atomics are the ones this module exports, which count each
//!   write in tests (below). Every atomic of the crate comes from here (or from `crate::loom`,
//!   which takes them from here outside loom's models): a test fails on the standard library's
//!   atomics anywhere else (`runtime/shared_writes.rs`).
//! - **Counters** that only a reader sums (the ledger, the runtime's and the metrics' counts,
//!   the signals the sampler reads): [`PerThread`] keeps one copy per thread, each on cache
//!   lines of its own; a message writes its thread's copy, and a reader (the sampler's tick,
//!   a scrape, the ledger's report) sums the copies. As Java's `LongAdder` and the per-CPU
//!   counters of the Linux kernel do.
//!
//! # Counting
//!
//! In the crate's own tests (and with the `count-shared-writes` feature), each write to a
//! shared atomic (a store, a read-modify-write, a compare-and-swap attempt) adds one to a count
//! of the writing thread's, read with [`shared_writes`]: a test runs messages through the
//! runtime on one thread and divides (`runtime/shared_writes.rs`). Writes to a [`PerThread`]
//! copy are not counted: no other thread writes that line while threads are fewer than
//! copies.

use std::sync::atomic::AtomicUsize as StdUsize;

use crossbeam_utils::CachePadded;

pub(crate) use std::sync::atomic::{fence, Ordering};

#[cfg(not(any(test, feature = "count-shared-writes")))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU16, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
};

#[cfg(any(test, feature = "count-shared-writes"))]
pub(crate) use counted::{
    AtomicBool, AtomicI64, AtomicU16, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
};

/// Writes this thread made to shared atomics so far (see the module docs); always 0 without
/// counting.
#[allow(dead_code)]
pub(crate) fn shared_writes() -> u64 {
    #[cfg(any(test, feature = "count-shared-writes"))]
    return counted::WRITES.with(std::cell::Cell::get);
    #[cfg(not(any(test, feature = "count-shared-writes")))]
    0
}

/// Starts recording where this thread's shared writes are made (file and line, with
/// [`shared_write_sites`]); for the inventory a test prints.
#[cfg(test)]
pub(crate) fn record_shared_write_sites() {
    counted::SITES.with(|s| *s.borrow_mut() = Some(Default::default()));
}

/// The places this thread wrote shared atomics since [`record_shared_write_sites`], with how
/// many writes each, most first; recording stops.
#[cfg(test)]
pub(crate) fn shared_write_sites() -> Vec<(String, u64)> {
    let sites = counted::SITES
        .with(|s| s.borrow_mut().take())
        .unwrap_or_default();
    let mut sites: Vec<_> = sites
        .into_iter()
        .map(|(at, n)| (format!("{}:{}", at.file(), at.line()), n))
        .collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    sites
}

/// Counts `n` writes to shared state that does not go through this module's atomics (a lock
/// of another crate, a shared handle's reference count), where the code that makes them says
/// so; nothing without counting.
#[inline(always)]
#[track_caller]
#[allow(unused_variables)]
pub(crate) fn note_shared_writes(n: u64) {
    #[cfg(any(test, feature = "count-shared-writes"))]
    counted::note(n);
}

#[cfg(any(test, feature = "count-shared-writes"))]
mod counted {
    use std::cell::Cell;
    use std::fmt;
    use std::sync::atomic::Ordering;

    type Sites = std::collections::HashMap<&'static std::panic::Location<'static>, u64>;

    thread_local! {
        pub(super) static WRITES: Cell<u64> = const { Cell::new(0) };
        pub(super) static SITES: std::cell::RefCell<Option<Sites>> =
            const { std::cell::RefCell::new(None) };
    }

    #[inline(always)]
    #[track_caller]
    pub(super) fn note(n: u64) {
        let _ = WRITES.try_with(|w| w.set(w.get() + n));
        let caller = std::panic::Location::caller();
        let _ = SITES.try_with(|s| {
            if let Some(sites) = s.borrow_mut().as_mut() {
                *sites.entry(caller).or_default() += n;
            }
        });
    }

    macro_rules! common {
        ($name:ident, $std:ty, $int:ty) => {
            /// A shared atomic whose writes are counted (see `crate::sync`).
            #[derive(Default)]
            #[repr(transparent)]
            pub(crate) struct $name($std);

            impl fmt::Debug for $name {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    fmt::Debug::fmt(&self.0, f)
                }
            }

            impl From<$int> for $name {
                fn from(v: $int) -> Self {
                    Self::new(v)
                }
            }

            #[allow(dead_code)]
            impl $name {
                pub(crate) const fn new(v: $int) -> Self {
                    Self(<$std>::new(v))
                }
                #[inline]
                #[track_caller]
                pub(crate) fn load(&self, o: Ordering) -> $int {
                    self.0.load(o)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn store(&self, v: $int, o: Ordering) {
                    note(1);
                    self.0.store(v, o)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn swap(&self, v: $int, o: Ordering) -> $int {
                    note(1);
                    self.0.swap(v, o)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn compare_exchange(
                    &self,
                    current: $int,
                    new: $int,
                    success: Ordering,
                    failure: Ordering,
                ) -> Result<$int, $int> {
                    note(1);
                    self.0.compare_exchange(current, new, success, failure)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn compare_exchange_weak(
                    &self,
                    current: $int,
                    new: $int,
                    success: Ordering,
                    failure: Ordering,
                ) -> Result<$int, $int> {
                    note(1);
                    self.0.compare_exchange_weak(current, new, success, failure)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn fetch_update<F: FnMut($int) -> Option<$int>>(
                    &self,
                    set: Ordering,
                    fetch: Ordering,
                    f: F,
                ) -> Result<$int, $int> {
                    note(1);
                    self.0.fetch_update(set, fetch, f)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn fetch_or(&self, v: $int, o: Ordering) -> $int {
                    note(1);
                    self.0.fetch_or(v, o)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn fetch_and(&self, v: $int, o: Ordering) -> $int {
                    note(1);
                    self.0.fetch_and(v, o)
                }
                pub(crate) fn into_inner(self) -> $int {
                    self.0.into_inner()
                }
                pub(crate) fn get_mut(&mut self) -> &mut $int {
                    self.0.get_mut()
                }
            }
        };
    }

    macro_rules! int {
        ($name:ident, $std:ty, $int:ty) => {
            common!($name, $std, $int);

            #[allow(dead_code)]
            impl $name {
                #[inline]
                #[track_caller]
                pub(crate) fn fetch_add(&self, v: $int, o: Ordering) -> $int {
                    note(1);
                    self.0.fetch_add(v, o)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn fetch_sub(&self, v: $int, o: Ordering) -> $int {
                    note(1);
                    self.0.fetch_sub(v, o)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn fetch_max(&self, v: $int, o: Ordering) -> $int {
                    note(1);
                    self.0.fetch_max(v, o)
                }
                #[inline]
                #[track_caller]
                pub(crate) fn fetch_min(&self, v: $int, o: Ordering) -> $int {
                    note(1);
                    self.0.fetch_min(v, o)
                }
            }
        };
    }

    common!(AtomicBool, std::sync::atomic::AtomicBool, bool);
    int!(AtomicU8, std::sync::atomic::AtomicU8, u8);
    int!(AtomicU16, std::sync::atomic::AtomicU16, u16);
    int!(AtomicU32, std::sync::atomic::AtomicU32, u32);
    int!(AtomicU64, std::sync::atomic::AtomicU64, u64);
    int!(AtomicI64, std::sync::atomic::AtomicI64, i64);
    int!(AtomicUsize, std::sync::atomic::AtomicUsize, usize);
}

/// Atomics of a cache line that one thread alone writes (a worker's own slot, aligned to lines
/// of its own) and others only read: not shared writes, so not counted.
pub(crate) mod owned {
    pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize};
}

/// How many copies a [`PerThread`] keeps: a power of two, more than the threads that usually
/// run the runtime (tokio's workers, an intake's, a broker client's).
const COPIES: usize = 16;

/// In [`COPY`]: this thread alone writes its copy (see [`Count::add`]).
const OWNED: usize = 1 << (usize::BITS - 1);

thread_local! {
    /// This thread's copy of every [`PerThread`]: 0 until its first write, then one more than
    /// the copy's index, with [`OWNED`] when no other thread ever writes that copy.
    static COPY: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Which copy of a [`PerThread`] this thread writes, with [`OWNED`] if it alone does. The
/// first [`COPIES`] threads that write one each own a copy for their life (and the copy stays
/// theirs after they end); the threads after them share the copies round robin.
#[inline]
fn copy() -> usize {
    static NEXT: StdUsize = StdUsize::new(0);
    COPY.try_with(|c| {
        let v = c.get();
        if v != 0 {
            return v;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let v = (n % COPIES + 1) | if n < COPIES { OWNED } else { 0 };
        c.set(v);
        v
    })
    // A thread whose locals are gone writes copy 0 as a sharer: never a plain store.
    .unwrap_or(1)
}

/// Counters kept once per thread, each copy on cache lines of its own, summed by whoever
/// reads them (see the module docs). `C` holds [`Count`]s.
pub(crate) struct PerThread<C> {
    copies: Box<[CachePadded<C>]>,
}

impl<C: Default> Default for PerThread<C> {
    fn default() -> Self {
        PerThread {
            copies: (0..COPIES)
                .map(|_| CachePadded::new(C::default()))
                .collect(),
        }
    }
}

impl<C> PerThread<C> {
    /// This thread's copy, to write.
    #[inline]
    pub(crate) fn local(&self) -> &C {
        &self.copies[(copy() & !OWNED) - 1]
    }

    /// Every copy, to sum.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &C> {
        self.copies.iter().map(|c| &**c)
    }

    /// Sums one counter over every copy (wrapping, so a counter that goes down on one thread
    /// and up on another sums right).
    pub(crate) fn sum(&self, field: impl Fn(&C) -> &Count) -> u64 {
        self.iter()
            .map(|c| field(c).load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add)
    }

    /// The largest value of one counter over every copy.
    pub(crate) fn max(&self, field: impl Fn(&C) -> &Count) -> u64 {
        self.iter()
            .map(|c| field(c).load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }
}

impl<C> std::fmt::Debug for PerThread<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerThread").finish_non_exhaustive()
    }
}

/// A counter of a [`PerThread`] copy. Written only through the copy [`PerThread::local`]
/// gives this thread: where the thread owns that copy, an add is a load and a store (no other
/// thread writes it, so nothing is lost, and no locked instruction is needed), else an atomic
/// read-modify-write. Read with [`load`](Self::load), or summed with [`PerThread::sum`].
#[derive(Debug, Default)]
pub(crate) struct Count(std::sync::atomic::AtomicU64);

impl Count {
    /// Adds `n` (wrapping), with `order` (`Relaxed` or `Release`; `SeqCst` for a sum that
    /// must see every add before it).
    #[inline]
    pub(crate) fn add(&self, n: u64, order: Ordering) {
        if copy() & OWNED != 0 && order != Ordering::SeqCst {
            let v = self.0.load(Ordering::Relaxed).wrapping_add(n);
            self.0.store(v, order);
        } else {
            self.0.fetch_add(n, order);
        }
    }

    /// Takes `n` away (wrapping), as [`add`](Self::add).
    #[inline]
    pub(crate) fn sub(&self, n: u64, order: Ordering) {
        self.add(n.wrapping_neg(), order);
    }

    /// Sets the copy's value (for a latest-value counter, read as the largest copy with
    /// [`PerThread::max`]: racing sets leave one of them, never a torn value).
    #[inline]
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// The copy's value.
    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Two {
        a: Count,
        b: Count,
    }

    #[test]
    fn counts_from_many_threads_sum_exactly() {
        // More threads than copies: the later ones share copies with the earlier ones.
        let per: std::sync::Arc<PerThread<Two>> = Default::default();
        let threads: Vec<_> = (0..3 * COPIES)
            .map(|_| {
                let per = std::sync::Arc::clone(&per);
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        per.local().a.add(1, Ordering::Relaxed);
                        per.local().b.sub(2, Ordering::Release);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no panic");
        }
        assert_eq!(per.sum(|c| &c.a), 3 * COPIES as u64 * 1_000);
        assert_eq!(per.sum(|c| &c.b) as i64, -(6 * COPIES as i64 * 1_000));
    }
}
