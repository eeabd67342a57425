//! The memory budget's counters under real threads: messages entering, waiting, offered again
//! and leaving on several threads at once, with sizes that add up past `u64::MAX` (the count's
//! carry word), and a reader beside them. Once every message has left, every count is 0: the
//! adds and removes cancel exactly whatever the interleaving. The loom models of the same
//! counters are in `tests/loom_memory.rs`.

use std::sync::{Arc, Barrier};
use std::thread;

use triage::admission::{MemoryBudget, MemoryConfig};
use triage::Criticality;

#[test]
fn counts_return_to_zero_under_concurrent_messages_of_any_size() {
    let budget = Arc::new(MemoryBudget::new(&MemoryConfig {
        budget_bytes: Some(1 << 20),
        ..MemoryConfig::default()
    }));
    let threads = 4;
    let start = Arc::new(Barrier::new(threads + 2));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (budget, start) = (Arc::clone(&budget), Arc::clone(&start));
            thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t as u64);
                let mut alive: Vec<(u64, bool)> = Vec::new();
                start.wait();
                for _ in 0..200_000 {
                    match rng.u8(..10) {
                        0..=3 => {
                            let size = if rng.u8(..20) == 0 {
                                rng.u64(u64::MAX / 2..)
                            } else {
                                rng.u64(..4096)
                            };
                            budget.add(size);
                            alive.push((size, false));
                        }
                        4 | 5 if !alive.is_empty() => {
                            let i = rng.usize(..alive.len());
                            let m = &mut alive[i];
                            if m.1 {
                                budget.unmark_waiting(m.0);
                            } else {
                                budget.mark_waiting(m.0);
                            }
                            m.1 = !m.1;
                        }
                        _ if !alive.is_empty() => {
                            let (size, waiting) = alive.swap_remove(rng.usize(..alive.len()));
                            budget.remove(size, waiting);
                        }
                        _ => {}
                    }
                }
                for (size, waiting) in alive {
                    budget.remove(size, waiting);
                }
            })
        })
        .collect();
    let reader = {
        let (budget, start) = (Arc::clone(&budget), Arc::clone(&start));
        thread::spawn(move || {
            start.wait();
            let mut reads = 0u64;
            while Arc::strong_count(&budget) > 2 {
                // Readings racing a carry may be off for that instant; they never panic.
                let _ = (
                    budget.held(),
                    budget.working(),
                    budget.waiting(),
                    budget.largest(),
                );
                let _ = (budget.may_pull(), budget.admits(Criticality::Sheddable, 1));
                reads += 1;
            }
            reads
        })
    };
    start.wait();
    for w in workers {
        w.join().unwrap();
    }
    assert!(reader.join().unwrap() > 0);
    assert_eq!(
        (budget.held(), budget.waiting(), budget.working()),
        (0, 0, 0)
    );
    assert_eq!(
        budget.peak(),
        u64::MAX,
        "sizes past u64::MAX were held at once"
    );
    assert!(budget.may_pull());
}
