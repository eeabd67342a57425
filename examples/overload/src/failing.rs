//! `--failing-downstream`: one downstream failing every call, with and without
//! circuit-breaker-aware admission.
//!
//! Messages go to one of two downstreams: `payments` (a share `--failing-share` of them), whose
//! every call waits `--failing-ms` (a timeout) and then fails with
//! `HandlerError::downstream("payments", ..)`, and `inventory`, served in `--service-ms`. The
//! same load runs twice on the default runtime configuration: once with the breakers off
//! (`breaker.enabled = false`), where every payments message costs its timeout and its retries,
//! and once with them on, where after `breaker.min_calls` failures the payments circuit opens
//! and its messages are refused before a worker is spent on them (Critical and High held
//! until their deadline, Medium and Sheddable dropped: the default policies without a defer
//! sink), half-open probes every `breaker.recovery_ms`. The figure that matters is inventory's
//! goodput: completions inside the deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use triage::quanta::{Clock, Instant};
use triage::runtime::{HandlerError, Job, MemoryBroker, Runtime, RuntimeConfig, RuntimeStats};
use triage::{Criticality, PerTier};

/// What the scenario is asked to do.
#[derive(Clone, Debug)]
pub struct Params {
    /// Offered load as a multiple of the workers' capacity at the healthy service time.
    pub factor: f64,
    /// Share of offered messages per tier, percent, Critical first.
    pub mix: [u32; 4],
    pub duration: Duration,
    pub workers: usize,
    /// Healthy (inventory) service time.
    pub service: Duration,
    /// Time a payments call takes before it fails.
    pub failing: Duration,
    /// Fraction of messages bound for payments.
    pub failing_share: f64,
    /// Usefulness window per tier: the deadline is publish time plus this.
    pub windows: PerTier<Duration>,
}

#[derive(Clone, Copy)]
struct Msg {
    payments: bool,
    deadline: Instant,
}

#[derive(Default)]
struct Counts {
    inventory_offered: AtomicU64,
    inventory_goodput: AtomicU64,
    payments_offered: AtomicU64,
    payments_calls: AtomicU64,
}

/// One run's figures.
pub struct Outcome {
    pub inventory_offered: u64,
    pub inventory_goodput: u64,
    pub payments_offered: u64,
    pub payments_calls: u64,
    pub refused_or_withdrawn: u64,
    pub circuit_opened: u64,
    pub stats: RuntimeStats,
    pub balances: bool,
}

async fn run_once(p: &Params, breaker: bool) -> Outcome {
    let clock = Clock::new();
    let counts = Arc::new(Counts::default());
    let mut config = RuntimeConfig {
        workers: p.workers.try_into().unwrap_or(std::num::NonZeroUsize::MIN),
        ..RuntimeConfig::default()
    };
    config.expert.breaker.enabled = breaker;
    let c = Arc::clone(&counts);
    let (service, failing, handler_clock) = (p.service, p.failing, clock.clone());
    let mut runtime = Runtime::builder(config)
        .clock(clock.clone())
        .downstream(|m: &Msg| Some(if m.payments { "payments" } else { "inventory" }))
        .start(move |job: Job<Msg>| {
            let (c, clock) = (Arc::clone(&c), handler_clock.clone());
            async move {
                let msg = *job.payload();
                if msg.payments {
                    c.payments_calls.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(failing).await;
                    return Err(HandlerError::downstream("payments", "timed out"));
                }
                tokio::time::sleep(service).await;
                if clock.now() <= msg.deadline {
                    c.inventory_goodput.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
        })
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let broker = MemoryBroker::new();
    runtime.attach(broker.source());

    let capacity = p.workers as f64 / p.service.as_secs_f64().max(1e-4);
    let rate = p.factor * capacity;
    let total_mix: u32 = p.mix.iter().sum();
    let started = tokio::time::Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    while started.elapsed() < p.duration {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        while sent < due {
            sent += 1;
            let pick = fastrand::u32(0..total_mix.max(1));
            let mut acc = 0;
            let mut tier = Criticality::Sheddable;
            for (i, share) in p.mix.iter().enumerate() {
                acc += share;
                if pick < acc {
                    tier = Criticality::ALL[i];
                    break;
                }
            }
            let payments = fastrand::f64() < p.failing_share;
            if payments {
                counts.payments_offered.fetch_add(1, Ordering::Relaxed);
            } else {
                counts.inventory_offered.fetch_add(1, Ordering::Relaxed);
            }
            let deadline = clock.now() + p.windows[tier];
            broker.publish(Msg { payments, deadline }, tier, Some(deadline));
        }
    }
    broker.close();
    // Everything left has a deadline of at most the longest window: bounded.
    let _ = tokio::time::timeout(Duration::from_secs(30), runtime.wait_idle()).await;
    let breakers = runtime.breakers();
    let report = runtime.shutdown(Duration::from_secs(5)).await;
    let stats = report.stats;
    let refused: u64 = Criticality::ALL
        .iter()
        .map(|t| stats.refused[*t] + stats.withdrawn[*t])
        .sum();
    Outcome {
        inventory_offered: counts.inventory_offered.load(Ordering::Relaxed),
        inventory_goodput: counts.inventory_goodput.load(Ordering::Relaxed),
        payments_offered: counts.payments_offered.load(Ordering::Relaxed),
        payments_calls: counts.payments_calls.load(Ordering::Relaxed),
        refused_or_withdrawn: refused,
        circuit_opened: breakers.opened_total(),
        balances: stats.balances(),
        stats,
    }
}

/// Runs the scenario without and with breakers and prints the comparison; `false` when a
/// ledger does not balance.
pub async fn main(p: &Params) -> bool {
    let capacity = p.workers as f64 / p.service.as_secs_f64().max(1e-4);
    println!(
        "one failing downstream: {} workers; inventory calls take {:.1} ms, every payments call fails after {:.1} ms;\n\
         offered {:.0} msg/s ({}x the healthy capacity of {:.0} msg/s) for {:.1} s, {:.0}% bound for payments; default runtime\n\
         configuration (3 retries, no defer sink: Critical/High held, Medium/Sheddable dropped when refused)\n",
        p.workers,
        p.service.as_secs_f64() * 1e3,
        p.failing.as_secs_f64() * 1e3,
        p.factor * capacity,
        p.factor,
        capacity,
        p.duration.as_secs_f64(),
        p.failing_share * 100.0
    );
    let without = run_once(p, false).await;
    let with = run_once(p, true).await;
    println!(
        "{:<16} {:>18} {:>16} {:>16} {:>14} {:>12} {:>9}",
        "",
        "inventory goodput",
        "inventory msg/s",
        "payments calls",
        "refused",
        "circuit",
        "ledger"
    );
    for (name, o) in [("without breaker", &without), ("with breaker", &with)] {
        let share = 100.0 * o.inventory_goodput as f64 / o.inventory_offered.max(1) as f64;
        println!(
            "{:<16} {:>11} {:>5.1}% {:>16.0} {:>16} {:>14} {:>9} x{:<2} {:>9}",
            name,
            o.inventory_goodput,
            share,
            o.inventory_goodput as f64 / p.duration.as_secs_f64(),
            o.payments_calls,
            o.refused_or_withdrawn,
            "opened",
            o.circuit_opened,
            if o.balances { "balances" } else { "NO" }
        );
    }
    println!(
        "\n   inventory goodput: inventory messages completed inside their deadline (share: % of {} and {} offered);\n   payments calls: handler calls bound to fail (first attempts and retries, of {} and {} payments messages offered);\n   refused: messages refused at admission or withdrawn from the queue, any reason (with the breaker: mostly `circuit`)",
        without.inventory_offered,
        with.inventory_offered,
        without.payments_offered,
        with.payments_offered
    );
    for (name, o) in [("without breaker", &without), ("with breaker", &with)] {
        let t = o.stats.ledger.total();
        println!(
            "ledger {name}: consumed {} = completed {} + failed {} + expired {} + shed {} + deferred {} + released {} + inside {}",
            t.consumed, t.completed, t.failed, t.expired, t.shed, t.deferred, t.released, o.stats.alive
        );
    }
    without.balances && with.balances
}
