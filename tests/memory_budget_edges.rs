//! The memory budget's edges, in virtual time: messages parked behind their ordering key never
//! keep that key's own message out of the budget.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Semaphore;
use triage::admission::MemoryConfig;
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
        poll_interval_ms: 1,
        ..RuntimeConfig::default()
    };
    c.admission.enabled = false;
    c.memory = MemoryConfig::with_budget(budget);
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
