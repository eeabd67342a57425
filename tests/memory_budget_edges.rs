//! The memory budget's edges, in virtual time: messages parked behind their ordering key never
//! keep that key's own message out of the budget, one large message does not serialise the
//! intake for ever (its size is forgotten after a window of messages, or at a reconfiguration),
//! and sizes claimed past `u64::MAX` in all are counted and leave exactly.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Semaphore;
use triage::admission::MemoryBudget;
use triage::runtime::{Ack, Envelope, Job, RefusalPolicy, Runtime, RuntimeConfig, Source};
use triage::{Criticality, PerTier};

/// A message of the test: its number, and whether the source waits for a permit before it.
struct Planned {
    envelope: Envelope<u32>,
    gated: bool,
}

/// A source that hands out a planned list, waiting for a permit of `gate` before each message
/// planned as gated; finished once the list is empty.
struct PlannedSource {
    planned: VecDeque<Planned>,
    gate: Arc<Semaphore>,
}

impl Source for PlannedSource {
    type Payload = u32;

    async fn next(&mut self) -> Option<Envelope<u32>> {
        let next = self.planned.pop_front()?;
        if next.gated {
            self.gate.acquire().await.ok()?.forget();
        }
        Some(next.envelope)
    }
}

fn message(n: u32, tier: Criticality, size: usize, key: Option<u64>) -> Planned {
    Planned {
        envelope: Envelope::new(n, tier, Ack::noop())
            .with_size_bytes(size)
            .with_ordering_key_opt(key),
        gated: false,
    }
}

/// Every tier on Backpressure (so nothing is dropped or deferred), pull-based admission off (so
/// only the memory budget and the operator's level refuse), a budget of `budget` bytes.
fn config(workers: usize, budget: u64) -> RuntimeConfig {
    let mut c = RuntimeConfig {
        workers: workers.try_into().unwrap(),
        expert: triage::runtime::ExpertConfig {
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    c.expert.admission.enabled = false;
    c.memory.budget_bytes = Some(budget);
    c.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
    );
    c
}

/// Waits, in virtual time, until `done` holds (at most 60 virtual seconds).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Budget 1,000 bytes, messages of 100: key 7's Sheddable head, then 8 Critical messages of
/// key 7, then 2 unkeyed Critical. The operator's `forced_shed_level = 1` refuses the head, which
/// is held (Backpressure), and the 8 park behind it; the 2 unkeyed are served. The operator then
/// sets level 0. Parked messages counted in the working set (900 bytes against Sheddable's 500),
/// so the head was refused for `memory` at every offer and the key never drained: 2 of 11
/// completed, 1 held, 8 parked, for ever. Parked, like held, they are in memory either way and
/// out of the working set: the head is admitted and the key drains in order.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn messages_parked_behind_a_key_never_keep_its_head_out_of_the_budget() {
    use Criticality::{Critical, Sheddable};
    let mut config = config(4, 1000);
    config.forced_shed_level = 1;
    let mut planned = VecDeque::new();
    planned.push_back(message(0, Sheddable, 100, Some(7)));
    for n in 1..=8 {
        planned.push_back(message(n, Critical, 100, Some(7)));
    }
    for n in 9..=10 {
        planned.push_back(message(n, Critical, 100, None));
    }
    let order: Arc<Mutex<Vec<u32>>> = Arc::default();
    let o = Arc::clone(&order);
    let mut rt = Runtime::builder(config.clone())
        .start(move |job: Job<u32>| {
            let o = Arc::clone(&o);
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                o.lock().push(*job.payload());
                Ok(())
            }
        })
        .unwrap();
    rt.attach(PlannedSource {
        planned,
        gate: Arc::new(Semaphore::new(0)),
    });
    until("2 served, the head held, 8 parked", || {
        let s = rt.stats();
        s.ledger.total().completed == 2 && s.held == 1 && s.parked == 8
    })
    .await;
    assert_eq!(*order.lock(), vec![9, 10]);
    assert_eq!(rt.memory().held(), 900);

    config.forced_shed_level = 0;
    rt.reconfigure(config).unwrap();
    let drained = tokio::time::timeout(Duration::from_secs(5), rt.wait_idle()).await;
    let s = rt.stats();
    assert!(
        drained.is_ok(),
        "key 7 never drained: {} of 11 completed, {} held, {} parked, {} bytes held",
        s.ledger.total().completed,
        s.held,
        s.parked,
        rt.memory().held()
    );
    assert_eq!(s.ledger.total().completed, 11);
    assert_eq!(*order.lock(), vec![9, 10, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!((rt.memory().held(), rt.memory().waiting()), (0, 0));
    let report = rt.shutdown(Duration::from_secs(1)).await;
    assert!(report.stats.balances(), "{report}");
}

/// Handlers of 10 virtual ms that count how many run at once: per call (in start order), the
/// number running when it started, itself included.
#[derive(Clone, Default)]
struct Concurrency {
    running: Arc<AtomicUsize>,
    at_start: Arc<Mutex<Vec<usize>>>,
}

impl Concurrency {
    fn start(&self, budget: u64, workers: usize) -> Runtime<u32> {
        let c = self.clone();
        Runtime::builder(config(workers, budget))
            .start(move |_job: Job<u32>| {
                let c = c.clone();
                async move {
                    let now = c.running.fetch_add(1, Ordering::SeqCst) + 1;
                    c.at_start.lock().push(now);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    c.running.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap()
    }
}

/// Budget 1,000 bytes, 4 workers: one message of 1,000 bytes, then 300 of 10. The intake pulls
/// while the bytes held plus the largest message seen fit the budget; seen for ever, the large
/// one let 1 handler run at a time for the rest of the run (1 + 300 calls, each alone). Its
/// size is remembered for a window of messages: every call until it has left the window runs
/// alone, and then the 4 workers run 4 at a time.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_large_message_serialises_the_intake_only_for_a_window() {
    let window = MemoryBudget::LARGEST_WINDOW as usize;
    let concurrency = Concurrency::default();
    let mut rt = concurrency.start(1000, 4);
    let mut planned = VecDeque::new();
    planned.push_back(message(0, Criticality::High, 1000, None));
    for n in 1..=300 {
        planned.push_back(message(n, Criticality::High, 10, None));
    }
    rt.attach(PlannedSource {
        planned,
        gate: Arc::new(Semaphore::new(0)),
    });
    rt.wait_idle().await;
    let at_start = concurrency.at_start.lock().clone();
    // Until the large message has left the window (the first `2 × window + 1` messages), each
    // was pulled with nothing else held, so each handler ran alone; then the intake pulls
    // ahead and the 4 workers stay busy, each call starting beside the 3 others.
    let mut expected = vec![1; 2 * window + 1];
    expected.extend([2, 3]);
    expected.resize(301, 4);
    assert_eq!(at_start, expected);
    let report = rt.shutdown(Duration::from_secs(1)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.ledger.total().completed, 301);
}

/// The same large message, then a live reconfiguration (a new budget of the same size and
/// thresholds: the operator's lever): the size it measured is forgotten at once, and the 40
/// small messages that follow run 4 at a time.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_reconfiguration_forgets_the_largest_message() {
    let concurrency = Concurrency::default();
    let mut rt = concurrency.start(1000, 4);
    let mut planned = VecDeque::new();
    planned.push_back(message(0, Criticality::High, 1000, None));
    for n in 1..=40 {
        let mut m = message(n, Criticality::High, 10, None);
        m.gated = n == 1;
        planned.push_back(m);
    }
    let gate = Arc::new(Semaphore::new(0));
    rt.attach(PlannedSource {
        planned,
        gate: Arc::clone(&gate),
    });
    until("the large message served", || {
        rt.stats().ledger.total().completed == 1
    })
    .await;
    let mut config = (*rt.config()).clone();
    config.expert.memory.thresholds[Criticality::Sheddable] = 0.4;
    assert_eq!(rt.reconfigure(config).unwrap().changes.len(), 1);
    gate.add_permits(1);
    rt.wait_idle().await;
    // The large message alone, then the 40 small ones 4 at a time, as at the start of a run.
    let mut expected = vec![1, 1, 2, 3];
    expected.resize(41, 4);
    assert_eq!(*concurrency.at_start.lock(), expected);
    let report = rt.shutdown(Duration::from_secs(1)).await;
    assert!(report.stats.balances(), "{report}");
}

/// Sizes come from outside (a producer may claim any): four messages of `usize::MAX / 2 + 1`
/// bytes, more than `u64::MAX` in all, pulled at once and served by one worker that settles
/// them as one batch. The bytes held overflowed as they were added (a debug build panicked in
/// the intake; a release build wrapped), and so did the batch's sum (2^64 bytes too few taken
/// out of the budget, so the bytes held never fell back to 0, and a budget would have stopped
/// the intake for good). They are counted past `u64::MAX`, read saturated, and every byte
/// leaves with its message.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn sizes_claimed_past_u64_leave_with_their_messages() {
    let mut config = config(1, 1000);
    config.memory = triage::runtime::MemoryBudgetConfig::default();
    // All four queued before the worker runs: one batch.
    config.expert.admission.prefetch_per_slot = 64;
    let mut rt = Runtime::builder(config.clone())
        .start(|_job: Job<u32>| async { Ok(()) })
        .unwrap();
    // Sixteen without a size first: a worker whose handler calls finish at once takes
    // batches from then on.
    let planned = (0..20)
        .map(|n| {
            let size = if n < 16 { 0 } else { usize::MAX / 2 + 1 };
            message(n, Criticality::High, size, None)
        })
        .collect();
    rt.attach(PlannedSource {
        planned,
        gate: Arc::new(Semaphore::new(0)),
    });
    let idle = tokio::time::timeout(Duration::from_secs(5), rt.wait_idle()).await;
    let memory = rt.memory();
    assert!(idle.is_ok(), "never idle: {} bytes held", memory.held());
    assert_eq!(rt.stats().ledger.total().completed, 20);
    assert_eq!((memory.held(), memory.peak()), (0, u64::MAX));
    // A budget set now finds nothing held: the intake pulls.
    config.memory.budget_bytes = Some(1000);
    rt.reconfigure(config).unwrap();
    assert!(rt.memory().may_pull());
    let report = rt.shutdown(Duration::from_secs(1)).await;
    assert!(report.stats.balances(), "{report}");
}
