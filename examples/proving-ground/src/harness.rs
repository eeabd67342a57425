//! The run: per broker, measure capacity, offer each load factor, then a fault phase; settle,
//! stop the workers, reconcile. Shared by the binary's CLI and `tests/proving_ground.rs`.

// Shared by the binary (src/main.rs) and tests/proving_ground.rs; each uses a part.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::faults::{FaultPlan, Fleet, Launcher, WorkerSpec};
use crate::load::{LoadSpec, Produced};
use crate::reconcile::{self, Counters, Reconciliation, TierRow};
use crate::worker::BrokerKind;

/// Everything a run is asked to do.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Brokers, one after the other.
    pub brokers: Vec<BrokerKind>,
    /// Load factors (multiples of measured capacity).
    pub factors: Vec<f64>,
    /// Length of each load phase.
    pub phase: Duration,
    /// Length of the capacity measurement (backlog served flat out).
    pub capacity_phase: Duration,
    /// Handler service time, ms.
    pub service_ms: u64,
    /// Worker tasks per process.
    pub workers: usize,
    /// Runtime queue capacity; `None`: the runtime's default.
    pub queue_capacity: Option<usize>,
    /// Tier mix, percent, Critical first.
    pub mix: [u32; 4],
    /// Usefulness window per tier, ms (Critical first).
    pub windows_ms: [u64; 4],
    /// Poison messages per thousand (dead-lettered by the handler).
    pub poison_permille: u32,
    /// Fault phase: kills (0 and no restart and no churn: no fault phase).
    pub kills: usize,
    /// Fault phase: restart the broker once.
    pub broker_restart: bool,
    /// Fault phase (Kafka): a second worker joins and leaves.
    pub group_churn: bool,
    /// Fault phase: load factor and length.
    pub fault_factor: f64,
    /// Fault phase length.
    pub fault_phase: Duration,
    /// Longest wait for the phase to settle after the load stops.
    pub settle_limit: Duration,
    /// Output directory.
    pub out: PathBuf,
    /// How to start workers.
    pub launcher: Launcher,
    /// One topic (queue) for every tier, or one per tier.
    pub layout: crate::worker::Layout,
    /// Restart phase: seconds of 3x traffic accumulated while no worker runs, then served
    /// while arrivals continue at 1x for `phase`. Zero: no restart phase.
    pub restart_backlog: Duration,
    /// Restart phase: run it a second time with a plain FIFO consumer (`worker --fifo`) on a
    /// backlog of the same length and mix, for the baseline.
    pub restart_fifo: bool,
}

/// The outcome of one phase.
#[derive(Clone, Debug)]
pub struct PhaseResult {
    /// `capacity`, `1x`, `3x`, ..., `faults`.
    pub name: String,
    /// Offered load factor (0 for the capacity phase).
    pub factor: f64,
    /// Offered rate, msg/s.
    pub rate: f64,
    /// Per tier, Critical first.
    pub rows: [TierRow; 4],
    /// The reconciliation.
    pub rec: Reconciliation,
    /// Runtime counters summed over the phase's processes.
    pub counters: Counters,
    /// Largest VmRSS of any worker of the phase, KiB.
    pub max_rss_kb: u64,
    /// Messages whose publish the broker never confirmed (not offered).
    pub produce_failures: u64,
    /// Fault events.
    pub events: Vec<String>,
    /// Whether it settled (every id seen, logs quiet) before the limit.
    pub settled: bool,
    /// The restart phase's figures.
    pub restart: Option<Restart>,
}

/// The restart phase: a mixed backlog accumulated while no worker ran, then served with
/// arrivals continuing at 1x.
#[derive(Clone, Debug, Default)]
pub struct Restart {
    /// Records in the backlog, and of them Critical.
    pub backlog: u64,
    /// Critical records in the backlog.
    pub backlog_critical: u64,
    /// Backlog Critical records completed (in time or late).
    pub critical_served: u64,
    /// Backlog Critical records completed inside their deadline.
    pub critical_in_time: u64,
    /// Seconds from the worker's start until the last backlog Critical record completed.
    pub critical_all_served_s: Option<f64>,
    /// A plain FIFO consumer at the measured capacity: position of the last backlog
    /// Critical record / capacity, seconds (computed, not run).
    pub fifo_s: f64,
    /// The same restart served by a plain FIFO consumer (`--restart-fifo`, run): its figures.
    pub fifo_run: Option<Box<Restart>>,
    /// Re-publishes (deferrals) during the phase, every tier.
    pub republished: u64,
}

/// The outcome for one broker.
#[derive(Clone, Debug)]
pub struct BrokerResult {
    /// Which broker.
    pub broker: BrokerKind,
    /// Measured capacity, msg/s.
    pub capacity: f64,
    /// Phases, in order.
    pub phases: Vec<PhaseResult>,
}

/// Runs every broker of `config`.
pub async fn run(config: &RunConfig) -> Vec<BrokerResult> {
    let mut out = Vec::new();
    for &broker in &config.brokers {
        out.push(run_broker(config, broker).await);
    }
    out
}

fn names(broker: BrokerKind, run: &str, phase: &str) -> (String, String) {
    let topic = format!("pg-{}-{run}-{phase}", broker.as_str());
    (topic.clone(), format!("{topic}-group"))
}

async fn run_broker(config: &RunConfig, broker: BrokerKind) -> BrokerResult {
    let run = format!("{:08x}", fastrand::u32(..));
    eprintln!("== {} (run {run}) ==", broker.as_str());
    // Capacity: a backlog of Critical messages without a useful deadline, served flat out.
    let estimate = config.workers as f64 * 1000.0 / config.service_ms.max(1) as f64;
    let count = (estimate * config.capacity_phase.as_secs_f64() * 1.2) as u64;
    let spec = LoadSpec {
        prefix: format!("{run}-cap"),
        rate: None,
        duration: Duration::ZERO,
        count,
        mix: [100, 0, 0, 0],
        windows_ms: [600_000; 4],
        poison_permille: 0,
        layout: config.layout,
    };
    let cap = phase(config, broker, &run, "capacity", 0.0, &spec, None).await;
    let capacity = cap.1.unwrap_or(estimate);
    eprintln!("  capacity {capacity:.0} msg/s");
    let mut phases = vec![PhaseResult {
        rate: capacity,
        ..cap.0
    }];
    for &factor in &config.factors {
        let spec = LoadSpec {
            prefix: format!("{run}-{factor}x"),
            rate: Some(factor * capacity),
            duration: config.phase,
            count: 0,
            mix: config.mix,
            windows_ms: config.windows_ms,
            poison_permille: config.poison_permille,
            layout: config.layout,
        };
        let name = format!("{factor}x");
        let (p, _) = phase(config, broker, &run, &name, factor, &spec, None).await;
        phases.push(p);
    }
    if !config.restart_backlog.is_zero() {
        // Deadlines of the backlog: its age at the restart plus 10x each tier's window, so
        // that what the backlog is measured on is whether Critical is reached in time.
        let accum = config.restart_backlog.as_millis() as u64;
        let backlog = LoadSpec {
            prefix: format!("{run}-restart-backlog"),
            rate: Some(3.0 * capacity),
            duration: config.restart_backlog,
            count: 0,
            mix: config.mix,
            windows_ms: config.windows_ms.map(|w| accum + 10 * w),
            poison_permille: 0,
            layout: config.layout,
        };
        let arrivals = LoadSpec {
            prefix: format!("{run}-restart"),
            rate: Some(capacity),
            duration: config.phase,
            count: 0,
            mix: config.mix,
            windows_ms: config.windows_ms,
            poison_permille: config.poison_permille,
            layout: config.layout,
        };
        let (mut p, _) = phase_with(
            config,
            broker,
            &run,
            "restart",
            1.0,
            &arrivals,
            None,
            Some(&backlog),
            false,
        )
        .await;
        if let Some(r) = p.restart.as_mut() {
            r.fifo_s /= capacity;
        }
        if config.restart_fifo {
            // A FIFO serves the whole backlog before the last arrivals: three times the
            // backlog's length at 1x, plus the arrivals, plus the usual limit.
            let fifo_config = RunConfig {
                settle_limit: config.settle_limit + config.restart_backlog * 4 + config.phase,
                ..config.clone()
            };
            let backlog = LoadSpec {
                prefix: format!("{run}-fifo-backlog"),
                ..backlog.clone()
            };
            let arrivals = LoadSpec {
                prefix: format!("{run}-fifo"),
                ..arrivals.clone()
            };
            let (f, _) = phase_with(
                &fifo_config,
                broker,
                &run,
                "restart-fifo",
                1.0,
                &arrivals,
                None,
                Some(&backlog),
                true,
            )
            .await;
            if let (Some(r), Some(mut fr)) = (p.restart.as_mut(), f.restart) {
                fr.fifo_s /= capacity;
                r.fifo_run = Some(Box::new(fr));
            }
        }
        phases.push(p);
    }
    let faults = config.kills > 0 || config.broker_restart || config.group_churn;
    if faults {
        let spec = LoadSpec {
            prefix: format!("{run}-faults"),
            rate: Some(config.fault_factor * capacity),
            duration: config.fault_phase,
            count: 0,
            mix: config.mix,
            windows_ms: config.windows_ms,
            poison_permille: config.poison_permille,
            layout: config.layout,
        };
        let plan = FaultPlan {
            kills: config.kills,
            broker_restart: config.broker_restart,
            group_churn: config.group_churn,
            duration: config.fault_phase,
            broker_down: Duration::from_secs(2),
        };
        let (p, _) = phase(
            config,
            broker,
            &run,
            "faults",
            config.fault_factor,
            &spec,
            Some(plan),
        )
        .await;
        phases.push(p);
    }
    BrokerResult {
        broker,
        capacity,
        phases,
    }
}

/// One phase; returns its result and, for a backlog phase, the measured service rate.
async fn phase(
    config: &RunConfig,
    broker: BrokerKind,
    run: &str,
    name: &str,
    factor: f64,
    spec: &LoadSpec,
    faults: Option<FaultPlan>,
) -> (PhaseResult, Option<f64>) {
    phase_with(config, broker, run, name, factor, spec, faults, None, false).await
}

/// One phase, with `early` (a restart's backlog) produced before any worker starts, served by
/// the runtime's workers or (`fifo`) plain consumers without triage.
#[allow(clippy::too_many_arguments)]
async fn phase_with(
    config: &RunConfig,
    broker: BrokerKind,
    run: &str,
    name: &str,
    factor: f64,
    spec: &LoadSpec,
    faults: Option<FaultPlan>,
    early: Option<&LoadSpec>,
    fifo: bool,
) -> (PhaseResult, Option<f64>) {
    let (topic, group) = names(broker, run, &name.replace('.', "_"));
    let dir = config
        .out
        .join(format!("{}-{run}", broker.as_str()))
        .join(name);
    std::fs::create_dir_all(&dir).expect("phase directory");
    let partitions = if faults.is_some() { 2 } else { 1 };
    crate::brokers::prepare(broker, &topic, partitions, config.layout).await;
    let wspec = WorkerSpec {
        broker,
        topic: topic.clone(),
        group,
        service_ms: config.service_ms,
        workers: config.workers,
        capacity: config.queue_capacity,
        dir: dir.clone(),
        layout: config.layout,
        fifo,
    };
    eprintln!(
        "  phase {name}: {}",
        spec.rate
            .map_or(format!("backlog of {}", spec.count), |r| format!(
                "{r:.0} msg/s for {:?}",
                spec.duration
            ))
    );
    let backlog = spec.rate.is_none();
    // A backlog is produced before the worker starts, so the worker measures service only.
    let mut produced_early = None;
    if backlog {
        produced_early = Some(crate::load::produce(broker, &topic, spec).await);
    }
    let restart_backlog = match early {
        Some(e) => {
            eprintln!("  phase {name}: accumulating {:?} of backlog", e.duration);
            Some(crate::load::produce(broker, &topic, e).await.0)
        }
        None => None,
    };
    let started_ms = crate::worker::unix_ms();
    let fleet = Arc::new(parking_lot::Mutex::new(Fleet::start(
        config.launcher.clone(),
        wspec,
    )));
    if !backlog && early.is_none() {
        warm_up(
            broker,
            &topic,
            &format!("{}-warm", spec.prefix),
            &dir,
            config.layout,
        )
        .await;
    }
    let injector = faults.map(|plan| {
        let fleet = Arc::clone(&fleet);
        tokio::task::spawn_blocking(move || crate::faults::inject(&fleet, &plan, broker))
    });
    let sampler_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let fleet = Arc::clone(&fleet);
        let stop = Arc::clone(&sampler_stop);
        tokio::task::spawn_blocking(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(mut f) = fleet.try_lock() {
                    f.tick();
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    let (produced, produce_failures) = match produced_early {
        Some(p) => p,
        None => crate::load::produce(broker, &topic, spec).await,
    };
    if let Some(injector) = injector {
        if let Err(e) = injector.await {
            sampler_stop.store(true, std::sync::atomic::Ordering::Relaxed);
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let mut produced = produced;
    if let Some(b) = &restart_backlog {
        produced.extend(b.iter().cloned());
    }
    let settled = settle(&produced, &dir, config.settle_limit).await;
    sampler_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.await;
    let fleet = Arc::into_inner(fleet).expect("fleet shared").into_inner();
    let (workers, events) = tokio::task::spawn_blocking(move || fleet.stop())
        .await
        .expect("stop workers");
    let max_rss_kb = workers.iter().map(|w| w.max_rss_kb).max().unwrap_or(0);
    let logs = reconcile::read_logs(&reconcile::files(&dir, "log"));
    let counters = reconcile::read_counters(&reconcile::files(&dir, "stats"));
    let defer_store = crate::brokers::store_ids(broker, &format!("{topic}.deferred")).await;
    let dead_store = crate::brokers::store_ids(broker, &format!("{topic}.dead")).await;
    let (rows, rec) = reconcile::tally(&produced, &logs, &defer_store, &dead_store, &counters);
    eprintln!(
        "  phase {name}: produced {}, unaccounted {}, duplicate completions {}, settled {settled}",
        rec.produced,
        rec.unaccounted.len(),
        rec.duplicate_completions
    );
    let service_rate = backlog.then(|| service_rate(&produced, &logs)).flatten();
    let restart = restart_backlog.map(|b| restart_figures(&b, &logs, started_ms, &rows));
    (
        PhaseResult {
            name: name.to_owned(),
            factor,
            rate: spec.rate.unwrap_or(0.0),
            rows,
            rec,
            counters,
            max_rss_kb,
            produce_failures,
            events,
            settled,
            restart,
        },
        service_rate,
    )
}

/// The restart figures; `fifo_s` is the last Critical's position, divided by the capacity by
/// the caller.
fn restart_figures(
    backlog: &[Produced],
    logs: &reconcile::Logs,
    started_ms: u64,
    rows: &[TierRow; 4],
) -> Restart {
    let mut r = Restart {
        backlog: backlog.len() as u64,
        republished: rows.iter().map(|t| t.republished).sum(),
        ..Restart::default()
    };
    let mut last: Option<u64> = None;
    let mut all = true;
    for (i, p) in backlog.iter().enumerate().filter(|(_, p)| p.tier == 0) {
        r.backlog_critical += 1;
        r.fifo_s = (i + 1) as f64;
        let done = logs.get(&p.id).and_then(|ls| {
            ls.iter()
                .filter(|l| l.what == reconcile::Logged::Completed)
                .map(|l| l.at_ms)
                .min()
        });
        match done {
            Some(at) => {
                r.critical_served += 1;
                if at <= p.deadline_ms {
                    r.critical_in_time += 1;
                }
                last = Some(last.map_or(at, |l| l.max(at)));
            }
            None => all = false,
        }
    }
    if all {
        r.critical_all_served_s = last.map(|l| l.saturating_sub(started_ms) as f64 / 1000.0);
    }
    r
}

/// Completions per second over the middle 80 % of a backlog's completions.
pub fn service_rate(produced: &[Produced], logs: &reconcile::Logs) -> Option<f64> {
    let mut at: Vec<u64> = produced
        .iter()
        .filter_map(|p| logs.get(&p.id))
        .filter_map(|ls| {
            ls.iter()
                .find(|l| l.what == reconcile::Logged::Completed)
                .map(|l| l.at_ms)
        })
        .collect();
    at.sort_unstable();
    if at.len() < 100 {
        return None;
    }
    let lo = at.len() / 10;
    let hi = at.len() - 1 - at.len() / 10;
    let span = (at[hi] - at[lo]) as f64 / 1000.0;
    (span > 0.0).then(|| (hi - lo) as f64 / span)
}

/// Waits until every id has a line and the logs stopped growing for two seconds (deferred
/// work drained back), or `limit`.
pub async fn settle(produced: &[Produced], dir: &std::path::Path, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    let mut last_size = 0u64;
    let mut quiet_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let files = reconcile::files(dir, "log");
        let size: u64 = files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        if size != last_size {
            last_size = size;
            quiet_since = Instant::now();
        }
        let quiet = quiet_since.elapsed() >= Duration::from_secs(2);
        if quiet {
            let logs = reconcile::read_logs(&files);
            if reconcile::seen(produced, &logs) == produced.len() {
                return true;
            }
        }
        if Instant::now() > until {
            return false;
        }
    }
}

/// Produces a few Critical messages and waits until the worker logged them all: the consumer
/// has joined its group and the phase's clock can start. Their ids are not offered load.
async fn warm_up(
    broker: BrokerKind,
    topic: &str,
    prefix: &str,
    dir: &std::path::Path,
    layout: crate::worker::Layout,
) {
    let spec = LoadSpec {
        prefix: prefix.to_owned(),
        rate: None,
        duration: Duration::ZERO,
        count: 20,
        mix: [100, 0, 0, 0],
        windows_ms: [600_000; 4],
        poison_permille: 0,
        layout,
    };
    let (warm, _) = crate::load::produce(broker, topic, &spec).await;
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        let logs = reconcile::read_logs(&reconcile::files(dir, "log"));
        if reconcile::seen(&warm, &logs) == warm.len() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("  warm-up: the worker did not serve the warm-up messages within 120 s");
}
