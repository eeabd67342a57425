//! Loom models of the memory budget's byte counts (`src/admission/memory.rs`): a count kept
//! past `u64::MAX` as a wrapping low word and a carry word, updated by messages entering and
//! leaving on several threads. Loom runs every interleaving of the atomics; once the threads
//! are done, each count is exact.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test --test loom_memory --release
//! ```
//!
//! Built only under `cfg(loom)` (see `src/loom.rs`); the normal suite skips this file (its
//! threaded stress twin is `tests/memory_concurrency.rs`).
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use triage::admission::{MemoryBudget, MemoryConfig};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// Two messages whose sizes add up past `u64::MAX` enter on two threads; one leaves while the
/// other enters: the count carries and borrows in any order, and ends exact.
#[test]
fn a_carry_and_a_borrow_racing_end_exact() {
    model(|| {
        let b = Arc::new(MemoryBudget::new(&MemoryConfig {
            budget_bytes: Some(100),
            ..MemoryConfig::default()
        }));
        b.add(u64::MAX);
        let other = {
            let b = Arc::clone(&b);
            thread::spawn(move || {
                b.add(u64::MAX);
                b.mark_waiting(u64::MAX);
            })
        };
        b.remove(u64::MAX, false);
        b.add(3);
        other.join().unwrap();
        assert_eq!(
            (b.held(), b.waiting(), b.working()),
            (u64::MAX, u64::MAX, 3)
        );
        b.remove(u64::MAX, true);
        assert_eq!((b.held(), b.waiting(), b.working()), (3, 0, 3));
    });
}

/// Messages entering and leaving on two threads, one of them waiting then offered again: the
/// counts end at 0.
#[test]
fn concurrent_messages_leave_no_bytes_behind() {
    model(|| {
        let b = Arc::new(MemoryBudget::new(&MemoryConfig {
            budget_bytes: Some(100),
            ..MemoryConfig::default()
        }));
        let other = {
            let b = Arc::clone(&b);
            thread::spawn(move || {
                b.add(u64::MAX - 1);
                b.mark_waiting(u64::MAX - 1);
                b.unmark_waiting(u64::MAX - 1);
                b.remove(u64::MAX - 1, false);
            })
        };
        b.add(5);
        b.mark_waiting(5);
        b.remove(5, true);
        other.join().unwrap();
        assert_eq!((b.held(), b.waiting(), b.working()), (0, 0, 0));
        assert!(b.may_pull());
    });
}
