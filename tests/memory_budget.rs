//! The memory budget under 10x overload: 1 MB payloads against a 64 MB budget, from an
//! in-memory source that makes each payload when it is pulled (so the process's memory is the
//! runtime's, not a broker's backlog). In a file of its own so that the process's peak RSS
//! (`VmHWM`) is this run's. On tokio's paused clock with the runtime's clock following it, so
//! the figures do not depend on the machine's load.

mod common;

use std::time::Duration;

use triage::runtime::{Ack, Envelope, Job, RefusalPolicy, Runtime, RuntimeConfig, Source};
use triage::{Criticality, PerTier};

const MB: usize = 1 << 20;
const BUDGET: u64 = 64 << 20;

/// Arrivals at `rate` per second for `count` messages, 10/20/30/40 % Critical to Sheddable;
/// a message arrived but not pulled yet waits "in the broker" as a count, not as memory.
struct Arrivals {
    start: Option<tokio::time::Instant>,
    rate: f64,
    produced: u64,
    count: u64,
}

impl Arrivals {
    fn arrived(&self) -> u64 {
        self.start.map_or(0, |s| {
            ((s.elapsed().as_secs_f64() * self.rate) as u64).min(self.count)
        })
    }
}

impl Source for Arrivals {
    type Payload = Vec<u8>;

    async fn next(&mut self) -> Option<Envelope<Vec<u8>>> {
        if self.produced == self.count {
            return None;
        }
        let start = *self.start.get_or_insert_with(tokio::time::Instant::now);
        let due = start + Duration::from_secs_f64(self.produced as f64 / self.rate);
        tokio::time::sleep_until(due).await;
        let tier = match self.produced % 10 {
            0 => Criticality::Critical,
            1 | 2 => Criticality::High,
            3..=5 => Criticality::Medium,
            _ => Criticality::Sheddable,
        };
        self.produced += 1;
        // Written, not zeroed: a zeroed allocation may not be resident, and the RSS is measured.
        let payload = vec![tier.rank() as u8 + 1; MB];
        Some(Envelope::new(payload, tier, Ack::noop()).with_size_bytes(MB))
    }

    fn lag(&self) -> Option<u64> {
        Some(self.arrived().saturating_sub(self.produced))
    }
}

fn vm_hwm_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Capacity: 2 workers of 25 ms, 80 msg/s; offered 800 msg/s (10x) of 1 MB payloads for 1.5 s.
/// Pull-based admission is off and the prefetch is large, so the memory budget is the only
/// bound on what the intake takes in (with pull-based admission on, the intake keeps only
/// `prefetch_per_slot ×` the limit queued and the budget is hardly touched).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn bytes_held_never_pass_the_budget_and_tiers_are_refused_in_order() {
    let mut config = RuntimeConfig {
        workers: 2.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    config.expert.admission.enabled = false;
    config.expert.admission.prefetch_per_slot = 1000;
    config.memory.budget_bytes = Some(BUDGET);
    // Critical and High wait (backpressure), Medium and Sheddable are dropped.
    config.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Drop,
        RefusalPolicy::Drop,
    );
    let mut rt = Runtime::builder(config)
        .clock(common::following_tokio())
        .start(|job: Job<Vec<u8>>| async move {
            std::hint::black_box(job.payload().len());
            tokio::time::sleep(Duration::from_millis(25)).await;
            Ok(())
        })
        .unwrap();
    let offered = 1200;
    rt.attach(Arrivals {
        start: None,
        rate: 800.0,
        produced: 0,
        count: offered,
    });
    rt.wait_idle().await;

    let memory = rt.memory();
    let peak = memory.peak();
    let order = memory.first_refusals();
    let hwm = vm_hwm_kb();
    println!(
        "peak payload bytes held {:.1} MB of a {} MB budget; first memory refusals {:?}; \
         process VmHWM {:?} kB",
        peak as f64 / MB as f64,
        BUDGET >> 20,
        order,
        hwm
    );
    // Filled to the byte (64 payloads of 1 MB), never past it.
    assert_eq!(peak, BUDGET, "peak {peak} of a budget of {BUDGET}");
    assert_eq!(memory.held(), 0, "every byte leaves with its message");
    assert_eq!(memory.waiting(), 0);
    use Criticality::*;
    let (s, m, h) = (order[Sheddable], order[Medium], order[High]);
    assert!(s.is_some() && m.is_some(), "{order:?}");
    assert!(s < m, "Sheddable refused first: {order:?}");
    assert!(h.is_some() && m < h, "Medium before High: {order:?}");
    assert_eq!(order[Critical], None, "Critical is refused only at 1.0");

    let d = rt.decisions();
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let ledger = report.stats.ledger;
    assert_eq!(ledger.total().consumed, offered);
    for tier in Criticality::ALL {
        assert_eq!(
            d[tier].total(),
            ledger.tier(tier).consumed,
            "{tier}: decisions {:?}",
            d[tier]
        );
    }
    assert_eq!(d[Critical].admitted, ledger.tier(Critical).consumed);
    assert!(d[Sheddable].shed_memory > 0 && d[Medium].shed_memory > 0);
    assert_eq!(
        ledger.tier(Critical).completed,
        ledger.tier(Critical).consumed
    );
}
