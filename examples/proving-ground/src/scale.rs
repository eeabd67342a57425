//! Scale-out on the brokers' own distribution (issue 15): several worker processes in one Kafka
//! consumer group over a topic of several partitions, or competing consumers on one RabbitMQ
//! queue, offered a multiple of their combined measured capacity, with one worker killed with
//! `kill -9` and restarted and one more added and removed while the load runs. A real
//! Prometheus ([`crate::prom`]) scrapes every worker each second with deploy/'s rules loaded,
//! and the report sets its per-tier goodput (read back through the query API) against the
//! reconciliation of every produced id, and says which alerts went pending and fired.
//!
//! ```text
//! tests/brokers/up.sh
//! flock -o -x /tmp/brokers.lock cargo run --release -p triage-proving-ground -- scale \
//!     --report examples/proving-ground/reports
//! ```
//!
//! Per broker: a capacity phase (the processes serve a backlog of Critical messages flat out;
//! completions per second over the middle 80 % of it), then the load phase at `--factor` x
//! that capacity. In the load phase worker `w1` is killed (`kill -9`) at 25 % of the phase and
//! started again (same static membership id on Kafka, a new port for its `/metrics`, so it is
//! a new Prometheus series), and a fourth worker (`extra`, a dynamic member) joins at 40 % and
//! leaves with SIGTERM at 70 %. Every process gets its own port, written into the job's
//! `file_sd` file while it runs, so the last scraped value of a counter is that process's
//! total: `sum(last_over_time(triage_goodput_total[..]))` is the job's goodput, with no
//! extrapolation. What a killed process counted after its last scrape (at most a second) is
//! lost to Prometheus and not to the ledger; that, the warm-up messages and duplicate
//! completions are the expected differences, and the report gives each.

// Shared by the binary (src/main.rs) and tests; each uses a part.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use plotters::prelude::*;

use crate::faults::{Launcher, WorkerProc, WorkerSpec};
use crate::load::{LoadSpec, Produced};
use crate::prom::{Prometheus, Series, Target};
use crate::reconcile::{self, Reconciliation, TierRow};
use crate::worker::{unix_ms, BrokerKind, Layout};

/// Named lines of `(seconds, value)` points, for the chart.
pub type Lines = Vec<(String, Vec<(f64, f64)>)>;

const TIERS: [&str; 4] = ["critical", "high", "medium", "sheddable"];

/// Arguments of the `scale` subcommand.
#[derive(Clone, Debug, clap::Args)]
pub struct ScaleArgs {
    /// Brokers, one after the other.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kafka,amqp")]
    pub brokers: Vec<BrokerKind>,
    /// Offered load, a multiple of the processes' combined measured capacity.
    #[arg(long, default_value_t = 3.0)]
    pub factor: f64,
    /// Length of the load phase, seconds. deploy/'s `TriageSheddableShed` needs a minute of
    /// refusals before it fires (`for: 1m`), so keep it above about 70.
    #[arg(long, default_value_t = 80)]
    pub seconds: u64,
    /// Worker processes (one consumer group on Kafka, competing consumers on RabbitMQ).
    #[arg(long, default_value_t = 3)]
    pub processes: usize,
    /// Kafka partitions of the topic (and of its defer and dead-letter topics).
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Handler service time, milliseconds. With 8 tasks, 40 ms gives about 200 msg/s per
    /// process: 3x of three processes is about 1,800 msg/s, plus the deferrals'
    /// re-publishes, what one broker carries next to six worker processes on two shared
    /// cores (at 20 ms, 3,000 msg/s, RabbitMQ fell behind on a machine at load average 20
    /// and every tier expired).
    #[arg(long, default_value_t = 40)]
    pub service_ms: u64,
    /// Worker tasks per process (fixed concurrency).
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Runtime queue capacity per process, messages (`expert.queue.capacity`). Default: the
    /// runtime's own (the zero-configuration default).
    #[arg(long)]
    pub capacity: Option<usize>,
    /// Deadline windows per tier in ms, Critical,High,Medium,Sheddable.
    #[arg(long, value_delimiter = ',', default_value = "3000,1500,800,400")]
    pub windows_ms: Vec<u64>,
    /// Poison messages per thousand (the handler fails them; dead-lettered).
    #[arg(long, default_value_t = 1)]
    pub poison_permille: u32,
    /// Output directory (worker logs, Prometheus' files).
    #[arg(long, default_value = "target/proving-ground-scale")]
    pub out: PathBuf,
    /// Directory for `scale-out.md` and `scale-out.svg` (default: --out).
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// One worker process of a phase, as the report shows it.
#[derive(Clone, Debug, Default)]
pub struct MemberRow {
    /// `w0`, `w1`, ..., `extra`.
    pub name: String,
    /// Process number in the phase (its log is `worker-<n>.log`).
    pub process: usize,
    /// Process id.
    pub pid: u32,
    /// Its `/metrics` address.
    pub addr: String,
    /// Seconds after the load started, when it started (negative: before).
    pub started_s: f64,
    /// When and how it ended (`stopped` at the end of the run, `kill -9`, `left`).
    pub ended: String,
    /// Completions it logged (every tier, duplicates and warm-up included).
    pub completed: u64,
    /// Completions inside the deadline it logged, offered ids only.
    pub goodput: u64,
    /// Prometheus: its last scraped `triage_goodput_total`, every tier.
    pub prom_goodput: f64,
    /// Prometheus: its last scraped `triage_consumed_total`, every tier.
    pub prom_consumed: f64,
    /// Largest VmRSS seen, KiB.
    pub max_rss_kb: u64,
}

/// An alert's course during the load phase, read back from Prometheus' `ALERTS` series.
#[derive(Clone, Debug, Default)]
pub struct AlertRow {
    /// Alert name.
    pub name: String,
    /// Seconds after the load started when it first went pending.
    pub pending_s: Option<f64>,
    /// Seconds after the load started when it first fired.
    pub firing_s: Option<f64>,
}

/// The outcome for one broker.
#[derive(Clone, Debug)]
pub struct ScaleResult {
    /// Which broker.
    pub broker: BrokerKind,
    /// Combined measured capacity of the processes, msg/s.
    pub capacity: f64,
    /// Offered rate, msg/s.
    pub rate: f64,
    /// Per tier, Critical first.
    pub rows: [TierRow; 4],
    /// The reconciliation.
    pub rec: Reconciliation,
    /// Messages whose publish the broker never confirmed.
    pub produce_failures: u64,
    /// Prometheus: goodput per tier, summed over every process's last scraped value.
    pub prom_goodput: [f64; 4],
    /// The ledger's completions inside the deadline per tier, duplicates and warm-up included
    /// (what the counters count).
    pub log_goodput_events: [u64; 4],
    /// Warm-up completions per tier (not offered load, counted by the metrics).
    pub warmup_completions: [u64; 4],
    /// The processes.
    pub members: Vec<MemberRow>,
    /// Alerts of deploy/'s rules that went pending or fired, and those that did not.
    pub alerts: Vec<AlertRow>,
    /// Largest value of `TriageCriticalShed`'s expression during the phase (Critical shed
    /// or expired per second, 5 minute rate).
    pub critical_shed_max: f64,
    /// What happened when, seconds after the load started.
    pub events: Vec<(f64, String)>,
    /// Whether every id was seen before the settle limit.
    pub settled: bool,
    /// Prometheus: goodput per tier over time, msg/s (5 s rate), seconds after the start.
    pub goodput_series: Lines,
    /// Prometheus: completions per process over time, msg/s (5 s rate).
    pub worker_series: Lines,
    /// 1-minute load average: at the start of the phase, its mean and max during it.
    pub load: (f64, f64, f64),
    /// Length of the load phase, seconds.
    pub seconds: f64,
    /// The checkout's commit when the run started (`git rev-parse --short HEAD`, `+` if it
    /// had changes).
    pub commit: String,
}

/// The checkout's commit, with `+` when the work tree has changes.
fn head_commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    format!(
        "{}{}",
        git(&["rev-parse", "--short", "HEAD"]),
        if dirty { "+" } else { "" }
    )
}

/// The Prometheus job of a broker's load phase.
fn job(broker: BrokerKind) -> String {
    format!("triage-scale-{}", broker.as_str())
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A worker process and what the report needs of it.
struct Member {
    proc: WorkerProc,
    row: MemberRow,
    addr: SocketAddr,
    instance: Option<String>,
    running: bool,
}

/// The processes of a phase, their `file_sd` targets and what happened to them.
struct Crew {
    launcher: Launcher,
    spec: WorkerSpec,
    prom: Option<(Arc<Prometheus>, String)>,
    members: Vec<Member>,
    started: Instant,
    events: Vec<(f64, String)>,
}

impl Crew {
    fn new(launcher: Launcher, spec: WorkerSpec, prom: Option<(Arc<Prometheus>, String)>) -> Self {
        Crew {
            launcher,
            spec,
            prom,
            members: Vec::new(),
            started: Instant::now(),
            events: Vec::new(),
        }
    }

    /// Seconds since the load started (negative before).
    fn now_s(&self) -> f64 {
        let now = Instant::now();
        if now >= self.started {
            (now - self.started).as_secs_f64()
        } else {
            -(self.started - now).as_secs_f64()
        }
    }

    fn event(&mut self, what: String) {
        let at = self.now_s();
        eprintln!("  [{at:6.1}s] {what}");
        self.events.push((at, what));
    }

    fn publish_targets(&self) {
        let Some((prom, job)) = &self.prom else {
            return;
        };
        let targets: Vec<Target> = self
            .members
            .iter()
            .filter(|m| m.running)
            .map(|m| Target {
                addr: m.addr,
                labels: BTreeMap::from([
                    ("worker".to_owned(), m.row.name.clone()),
                    ("process".to_owned(), m.row.process.to_string()),
                ]),
            })
            .collect();
        if let Err(e) = prom.set_targets(job, &targets) {
            eprintln!("  prometheus targets: {e}");
        }
    }

    /// Starts a process named `name` (a Kafka static member when `instance` is set).
    fn start(&mut self, name: &str, instance: Option<&str>) -> u32 {
        let n = self.members.len();
        let addr = crate::prom::free_addr();
        let proc = WorkerProc::spawn_serving(&self.launcher, &self.spec, n, instance, addr);
        let pid = proc.pid;
        let row = MemberRow {
            name: name.to_owned(),
            process: n,
            pid,
            addr: addr.to_string(),
            started_s: self.now_s(),
            ended: "stopped at the end".to_owned(),
            ..MemberRow::default()
        };
        self.members.push(Member {
            proc,
            row,
            addr,
            instance: instance.map(str::to_owned),
            running: true,
        });
        self.publish_targets();
        pid
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.members
            .iter()
            .rposition(|m| m.running && m.row.name == name)
    }

    /// `kill -9` of `name`, then the same worker started again after `pause`.
    fn kill_and_restart(&mut self, name: &str, pause: Duration) {
        let Some(i) = self.find(name) else { return };
        let at = self.now_s();
        let m = &mut self.members[i];
        m.proc.kill9();
        m.running = false;
        m.row.ended = format!("kill -9 at {at:.1} s");
        let (pid, instance) = (m.proc.pid, m.instance.clone());
        self.publish_targets();
        self.event(format!("kill -9 {name} (pid {pid})"));
        std::thread::sleep(pause);
        let pid = self.start(name, instance.as_deref());
        self.event(format!("{name} restarted as pid {pid}"));
    }

    /// SIGTERM to `name` (graceful: it leaves the group), waiting for it to exit.
    fn stop(&mut self, name: &str, why: &str) {
        let Some(i) = self.find(name) else { return };
        self.members[i].proc.terminate(Duration::from_secs(30));
        let at = self.now_s();
        let m = &mut self.members[i];
        m.running = false;
        m.row.ended = format!("{why} at {at:.1} s");
        let pid = m.proc.pid;
        self.publish_targets();
        self.event(format!("{name} (pid {pid}) {why}"));
    }

    /// Samples every running process; one that exited on its own is reported and started
    /// again.
    fn tick(&mut self) {
        let mut gone = Vec::new();
        for m in self.members.iter_mut().filter(|m| m.running) {
            if !m.proc.running() {
                m.running = false;
                m.row.ended = "exited on its own".to_owned();
                gone.push((m.row.name.clone(), m.instance.clone(), m.proc.pid));
            }
        }
        for (name, instance, pid) in gone {
            self.publish_targets();
            self.event(format!("{name} (pid {pid}) exited on its own; restarting"));
            self.start(&name, instance.as_deref());
        }
    }

    /// Stops every process gracefully.
    fn stop_all(&mut self) {
        for m in self.members.iter_mut().filter(|m| m.running) {
            m.proc.terminate(Duration::from_secs(30));
            m.running = false;
        }
        self.publish_targets();
    }
}

/// Produces a trickle of Critical messages (not offered load) until each of the first
/// `processes` workers of `dir` has logged one (every process holds partitions or
/// consumes from the queue), at most 90 s. Returns the warm-up's ids.
async fn warm_up(
    broker: BrokerKind,
    topic: &str,
    prefix: &str,
    dir: &Path,
    processes: usize,
) -> Vec<Produced> {
    let mut all = Vec::new();
    let until = Instant::now() + Duration::from_secs(90);
    for round in 0.. {
        // Paced, so that Kafka's sticky partitioner spreads them over the partitions.
        let spec = LoadSpec {
            prefix: format!("{prefix}-{round}"),
            rate: Some(50.0),
            duration: Duration::from_secs(1),
            count: 0,
            mix: [100, 0, 0, 0],
            windows_ms: [600_000; 4],
            poison_permille: 0,
            layout: Layout::Mixed,
        };
        let (got, _) = crate::load::produce(broker, topic, &spec).await;
        all.extend(got);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let busy = (0..processes)
            .filter(|n| {
                std::fs::metadata(dir.join(format!("worker-{n}.log"))).is_ok_and(|m| m.len() > 0)
            })
            .count();
        if busy == processes {
            break;
        }
        if Instant::now() > until {
            eprintln!("  warm-up: only {busy} of {processes} workers consumed within 90 s");
            break;
        }
    }
    all
}

fn spec(args: &ScaleArgs, broker: BrokerKind, topic: &str, group: &str, dir: &Path) -> WorkerSpec {
    WorkerSpec {
        broker,
        topic: topic.to_owned(),
        group: group.to_owned(),
        service_ms: args.service_ms,
        workers: args.workers,
        capacity: args.capacity,
        dir: dir.to_path_buf(),
        layout: Layout::Mixed,
        fifo: false,
    }
}

fn start_crew(crew: &mut Crew, broker: BrokerKind, processes: usize) {
    for i in 0..processes {
        let name = format!("w{i}");
        // Static membership on Kafka: a restarted worker takes its partitions back at once.
        let instance = (broker == BrokerKind::Kafka).then(|| name.clone());
        crew.start(&name, instance.as_deref());
    }
}

/// The combined capacity of `args.processes` workers: a backlog of Critical messages without
/// a useful deadline (offered at 4x the estimate for 2 s, faster than they are served),
/// served flat out, completions per second over its middle 80 %.
async fn measure_capacity(
    args: &ScaleArgs,
    broker: BrokerKind,
    run: &str,
    launcher: &Launcher,
) -> f64 {
    let topic = format!("pg-scale-{}-{run}-capacity", broker.as_str());
    let dir = args
        .out
        .join(format!("{}-{run}", broker.as_str()))
        .join("capacity");
    std::fs::create_dir_all(&dir).expect("phase directory");
    crate::brokers::prepare(broker, &topic, args.partitions, Layout::Mixed).await;
    let mut crew = Crew::new(
        launcher.clone(),
        spec(args, broker, &topic, &format!("{topic}-group"), &dir),
        None,
    );
    start_crew(&mut crew, broker, args.processes);
    let estimate = (args.processes * args.workers) as f64 * 1000.0 / args.service_ms.max(1) as f64;
    warm_up(
        broker,
        &topic,
        &format!("{run}-capwarm"),
        &dir,
        args.processes,
    )
    .await;
    // Paced at 4x the estimate for 2 s (8 s of work), not all at once: Kafka's sticky
    // partitioner puts a burst into one or two partitions, which one process alone would
    // serve; paced, the batches go round the partitions and every process has a share.
    let backlog = LoadSpec {
        prefix: format!("{run}-cap"),
        rate: Some(4.0 * estimate),
        duration: Duration::from_secs(2),
        count: 0,
        mix: [100, 0, 0, 0],
        windows_ms: [600_000; 4],
        poison_permille: 0,
        layout: Layout::Mixed,
    };
    eprintln!(
        "  capacity: {} processes serving a backlog produced at {:.0} msg/s for 2 s",
        args.processes,
        4.0 * estimate
    );
    let (produced, _) = crate::load::produce(broker, &topic, &backlog).await;
    crate::harness::settle(&produced, &dir, Duration::from_secs(120)).await;
    tokio::task::block_in_place(|| crew.stop_all());
    let logs = reconcile::read_logs(&reconcile::files(&dir, "log"));
    crate::harness::service_rate(&produced, &logs).unwrap_or(estimate)
}

/// Runs every broker of `args` with one Prometheus scraping them; returns the results.
///
/// # Errors
///
/// When Prometheus cannot be started.
pub async fn run(args: &ScaleArgs, launcher: Launcher) -> Result<Vec<ScaleResult>, String> {
    let rules = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/prometheus/triage.rules.yml"
    ))
    .canonicalize()
    .map_err(|e| format!("deploy/prometheus/triage.rules.yml: {e}"))?;
    let jobs: Vec<String> = args.brokers.iter().map(|b| job(*b)).collect();
    let job_refs: Vec<&str> = jobs.iter().map(String::as_str).collect();
    let prom = Arc::new(Prometheus::start(
        &args.out.join("prometheus"),
        &job_refs,
        std::slice::from_ref(&rules),
    )?);
    eprintln!(
        "prometheus on http://{} (rules: {})",
        prom.addr,
        rules.display()
    );
    let alert_names = alert_names(&rules);
    let commit = head_commit();
    let mut out = Vec::new();
    for &broker in &args.brokers {
        let mut r = run_broker(args, broker, &launcher, &prom, &alert_names).await?;
        r.commit.clone_from(&commit);
        out.push(r);
    }
    Ok(out)
}

/// The `- alert: Name` entries of a rules file.
fn alert_names(rules: &Path) -> Vec<String> {
    std::fs::read_to_string(rules)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_owned())
        .collect()
}

async fn run_broker(
    args: &ScaleArgs,
    broker: BrokerKind,
    launcher: &Launcher,
    prom: &Arc<Prometheus>,
    alert_names: &[String],
) -> Result<ScaleResult, String> {
    let run = format!("{:08x}", fastrand::u32(..));
    eprintln!("== scale-out on {} (run {run}) ==", broker.as_str());
    let capacity = measure_capacity(args, broker, &run, launcher).await;
    let rate = args.factor * capacity;
    eprintln!(
        "  combined capacity {capacity:.0} msg/s; offering {rate:.0} msg/s ({}x) for {} s",
        args.factor, args.seconds
    );
    let windows: [u64; 4] = args
        .windows_ms
        .clone()
        .try_into()
        .map_err(|_| "--windows-ms takes four values".to_owned())?;
    let topic = format!("pg-scale-{}-{run}-load", broker.as_str());
    let dir = args
        .out
        .join(format!("{}-{run}", broker.as_str()))
        .join("load");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    crate::brokers::prepare(broker, &topic, args.partitions, Layout::Mixed).await;
    let job = job(broker);
    let crew = Arc::new(Mutex::new(Crew::new(
        launcher.clone(),
        spec(args, broker, &topic, &format!("{topic}-group"), &dir),
        Some((Arc::clone(prom), job.clone())),
    )));
    start_crew(&mut crew.lock(), broker, args.processes);
    let warm = warm_up(broker, &topic, &format!("{run}-warm"), &dir, args.processes).await;
    let up = {
        let prom = Arc::clone(prom);
        let (job, n) = (job.clone(), args.processes);
        tokio::task::spawn_blocking(move || prom.wait_up(&job, n, Duration::from_secs(30)))
            .await
            .map_err(|e| e.to_string())?
    };
    if !up {
        eprintln!("  prometheus: not every worker is up after 30 s");
    }
    let load = LoadSpec {
        prefix: format!("{run}-load"),
        rate: Some(rate),
        duration: Duration::from_secs(args.seconds),
        count: 0,
        mix: [10, 20, 30, 40],
        windows_ms: windows,
        poison_permille: args.poison_permille,
        layout: Layout::Mixed,
    };
    let t0_unix = unix_ms() as f64 / 1000.0;
    {
        // The phase's clock starts with the load: what happened before is negative.
        let mut c = crew.lock();
        let shift = c.started.elapsed().as_secs_f64();
        c.started = Instant::now();
        for m in &mut c.members {
            m.row.started_s -= shift;
        }
        for e in &mut c.events {
            e.0 -= shift;
        }
    }
    let load0 = loadavg();
    let stop = Arc::new(AtomicBool::new(false));
    let timeline = {
        let crew = Arc::clone(&crew);
        let stop = Arc::clone(&stop);
        let d = args.seconds as f64;
        tokio::task::spawn_blocking(move || timeline(&crew, d, &stop))
    };
    let (produced, produce_failures) = crate::load::produce(broker, &topic, &load).await;
    eprintln!("  load done: {} confirmed", produced.len());
    let settled = crate::harness::settle(&produced, &dir, Duration::from_secs(180)).await;
    stop.store(true, Ordering::Relaxed);
    let loads = timeline.await.map_err(|e| e.to_string())?;
    // Two more scrapes, so that every running process's final counts are in Prometheus.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now_unix = unix_ms() as f64 / 1000.0;
    let read = {
        let prom = Arc::clone(prom);
        let job = job.clone();
        let names = alert_names.to_vec();
        tokio::task::spawn_blocking(move || read_prometheus(&prom, &job, t0_unix, now_unix, &names))
            .await
            .map_err(|e| e.to_string())??
    };
    let crew = Arc::into_inner(crew)
        .ok_or("crew still shared")?
        .into_inner();
    let mut crew = tokio::task::spawn_blocking(move || {
        let mut crew = crew;
        crew.stop_all();
        crew
    })
    .await
    .map_err(|e| e.to_string())?;
    let logs = reconcile::read_logs(&reconcile::files(&dir, "log"));
    let counters = reconcile::read_counters(&reconcile::files(&dir, "stats"));
    let defer_store = crate::brokers::store_ids(broker, &format!("{topic}.deferred")).await;
    let dead_store = crate::brokers::store_ids(broker, &format!("{topic}.dead")).await;
    let (rows, rec) = reconcile::tally(&produced, &logs, &defer_store, &dead_store, &counters);
    eprintln!(
        "  produced {}, unaccounted {}, duplicate completions {}, settled {settled}",
        rec.produced,
        rec.unaccounted.len(),
        rec.duplicate_completions
    );
    let deadlines: HashMap<&str, (usize, u64)> = produced
        .iter()
        .map(|p| (p.id.as_str(), (p.tier, p.deadline_ms)))
        .collect();
    let warm_ids: std::collections::HashSet<&str> = warm.iter().map(|p| p.id.as_str()).collect();
    let mut log_goodput_events = [0u64; 4];
    let mut warmup_completions = [0u64; 4];
    let mut members = Vec::new();
    for m in &mut crew.members {
        let path = dir.join(format!("worker-{}.log", m.row.process));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() < 4 || f[1] != "completed" {
                continue;
            }
            let Some(t) = TIERS.iter().position(|t| *t == f[2]) else {
                continue;
            };
            let at: u64 = f[3].parse().unwrap_or(u64::MAX);
            m.row.completed += 1;
            if warm_ids.contains(f[0]) {
                warmup_completions[t] += 1;
                log_goodput_events[t] += 1;
            } else if let Some(&(_, deadline)) = deadlines.get(f[0]) {
                if at <= deadline {
                    m.row.goodput += 1;
                    log_goodput_events[t] += 1;
                }
            }
        }
        m.row.max_rss_kb = m.proc.max_rss_kb;
        let p = m.row.process.to_string();
        m.row.prom_goodput = read
            .goodput
            .iter()
            .filter(|s| s.labels.get("process") == Some(&p))
            .map(|s| s.value)
            .sum();
        m.row.prom_consumed = read
            .consumed
            .iter()
            .filter(|s| s.labels.get("process") == Some(&p))
            .map(|s| s.value)
            .sum();
        members.push(m.row.clone());
    }
    let mut prom_goodput = [0.0; 4];
    for s in &read.goodput {
        if let Some(t) = s
            .labels
            .get("tier")
            .and_then(|t| TIERS.iter().position(|x| x == t))
        {
            prom_goodput[t] += s.value;
        }
    }
    let (mean, max) = if loads.is_empty() {
        (load0, load0)
    } else {
        (
            loads.iter().sum::<f64>() / loads.len() as f64,
            loads.iter().copied().fold(load0, f64::max),
        )
    };
    Ok(ScaleResult {
        broker,
        capacity,
        rate,
        rows,
        rec,
        produce_failures,
        prom_goodput,
        log_goodput_events,
        warmup_completions,
        members,
        alerts: read.alerts,
        critical_shed_max: read.critical_shed_max,
        events: std::mem::take(&mut crew.events),
        settled,
        goodput_series: read.goodput_series,
        worker_series: read.worker_series,
        load: (load0, mean, max),
        seconds: args.seconds as f64,
        commit: String::new(),
    })
}

/// The faults of the load phase, at fixed shares of its length `d` (seconds): `kill -9` of
/// `w1` at 25 % (restarted after 200 to 700 ms), `extra` joining at 40 % and leaving at 70 %.
/// Samples the processes every 250 ms and the load average every second until `stop`;
/// returns the load averages.
fn timeline(crew: &Mutex<Crew>, d: f64, stop: &AtomicBool) -> Vec<f64> {
    let mut plan = vec![(0.25 * d, "kill"), (0.4 * d, "join"), (0.7 * d, "leave")];
    plan.reverse();
    let mut loads = Vec::new();
    let mut next_load = 0.0;
    while !stop.load(Ordering::Relaxed) {
        let now = crew.lock().now_s();
        if let Some(&(at, what)) = plan.last() {
            if now >= at {
                plan.pop();
                let mut c = crew.lock();
                match what {
                    "kill" => {
                        c.kill_and_restart("w1", Duration::from_millis(200 + fastrand::u64(..500)))
                    }
                    "join" => {
                        // A dynamic member on Kafka (no static id): it leaves the group cleanly.
                        let pid = c.start("extra", None);
                        c.event(format!("extra (pid {pid}) joins"));
                    }
                    _ => c.stop("extra", "left"),
                }
            }
        }
        if now >= next_load && now <= d {
            loads.push(loadavg());
            next_load = now + 1.0;
        }
        crew.lock().tick();
        std::thread::sleep(Duration::from_millis(250));
    }
    loads
}

/// What the report reads back from Prometheus.
struct Read {
    goodput: Vec<crate::prom::Sample>,
    consumed: Vec<crate::prom::Sample>,
    alerts: Vec<AlertRow>,
    critical_shed_max: f64,
    goodput_series: Lines,
    worker_series: Lines,
}

fn relative(series: Vec<Series>, key: impl Fn(&Series) -> String, t0: f64) -> Lines {
    let mut v: Lines = series
        .into_iter()
        .map(|s| {
            let k = key(&s);
            (k, s.points.iter().map(|&(t, x)| (t - t0, x)).collect())
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn read_prometheus(
    prom: &Prometheus,
    job: &str,
    t0: f64,
    now: f64,
    alert_names: &[String],
) -> Result<Read, String> {
    let sel = format!("job=\"{job}\"");
    // The whole run is inside the window; each process is its own series, so the last value
    // is its total.
    let window = format!("{}s", (now - t0 + 120.0).ceil() as u64);
    let goodput = prom.query(
        &format!("last_over_time(triage_goodput_total{{{sel}}}[{window}])"),
        None,
    )?;
    let consumed = prom.query(
        &format!("last_over_time(triage_consumed_total{{{sel}}}[{window}])"),
        None,
    )?;
    let start = t0 - 60.0;
    let alerts_raw = prom.query_range(&format!("ALERTS{{{sel}}}"), start, now, 1.0)?;
    let mut alerts: Vec<AlertRow> = alert_names
        .iter()
        .map(|n| AlertRow {
            name: n.clone(),
            ..AlertRow::default()
        })
        .collect();
    for s in &alerts_raw {
        let name = s.labels.get("alertname").cloned().unwrap_or_default();
        let state = s.labels.get("alertstate").cloned().unwrap_or_default();
        let first = s.points.first().map(|p| p.0 - t0);
        let row = match alerts.iter().position(|a| a.name == name) {
            Some(i) => &mut alerts[i],
            None => {
                alerts.push(AlertRow {
                    name: name.clone(),
                    ..AlertRow::default()
                });
                alerts.last_mut().expect("just pushed")
            }
        };
        let slot = if state == "firing" {
            &mut row.firing_s
        } else {
            &mut row.pending_s
        };
        if let Some(f) = first {
            *slot = Some(slot.map_or(f, |x: f64| x.min(f)));
        }
    }
    let crit = prom.query_range(
        &format!(
            "sum(rate(triage_shed_total{{{sel},tier=\"critical\"}}[5m])) + sum(rate(triage_expired_total{{{sel},tier=\"critical\"}}[5m]))"
        ),
        t0,
        now,
        1.0,
    )?;
    let critical_shed_max = crit
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    let goodput_series = relative(
        prom.query_range(
            &format!("sum by (tier) (rate(triage_goodput_total{{{sel}}}[5s]))"),
            t0 - 5.0,
            now,
            1.0,
        )?,
        |s| s.labels.get("tier").cloned().unwrap_or_default(),
        t0,
    );
    let worker_series = relative(
        prom.query_range(
            &format!("sum by (worker, process) (rate(triage_completed_total{{{sel}}}[5s]))"),
            t0 - 5.0,
            now,
            1.0,
        )?,
        |s| {
            format!(
                "{} (process {})",
                s.labels.get("worker").cloned().unwrap_or_default(),
                s.labels.get("process").cloned().unwrap_or_default()
            )
        },
        t0,
    );
    Ok(Read {
        goodput,
        consumed,
        alerts,
        critical_shed_max,
        goodput_series,
        worker_series,
    })
}

/// Goodput per tier as a share of offered, for the report's checks.
pub fn critical_share(r: &ScaleResult) -> f64 {
    r.rows[0].goodput_share()
}

/// Relative difference of `prom` against `reference` (0 when both are 0).
fn rel(prom: f64, reference: f64) -> f64 {
    if reference == 0.0 {
        if prom == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (prom - reference) / reference
    }
}

/// Prometheus' goodput of tier `t`, less the harness's warm-up messages, against the
/// reconciliation's completions inside the deadline of offered ids, duplicates included (a
/// counter counts every completion): the check of the metrics against the ledger.
pub fn prom_vs_ledger(r: &ScaleResult, t: usize) -> f64 {
    let warm = r.warmup_completions[t];
    rel(
        r.prom_goodput[t] - warm as f64,
        r.log_goodput_events[t].saturating_sub(warm) as f64,
    )
}

/// Prometheus' goodput of tier `t` (less the warm-up) against the reconciliation's distinct
/// ids completed in time (duplicate completions make Prometheus' larger).
pub fn prom_vs_rec(r: &ScaleResult, t: usize) -> f64 {
    rel(
        r.prom_goodput[t] - r.warmup_completions[t] as f64,
        r.rows[t].goodput as f64,
    )
}

/// Writes `scale-out.md` and `scale-out.svg` into `dir`; returns the Markdown.
///
/// # Errors
///
/// When a file cannot be written or the chart cannot be drawn.
pub fn write_report(
    dir: &Path,
    args: &ScaleArgs,
    results: &[ScaleResult],
    command: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let md = markdown(args, results, command);
    std::fs::write(dir.join("scale-out.md"), &md)?;
    chart(&dir.join("scale-out.svg"), results)?;
    Ok(md)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn markdown(args: &ScaleArgs, results: &[ScaleResult], command: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Scale-out on the brokers' own distribution, watched by Prometheus\n"
    );
    let _ = writeln!(s, "Command: `{command}`\n");
    let commit = results.first().map_or("", |r| r.commit.as_str());
    let _ = writeln!(
        s,
        "Commit {commit}, {} processes of {} tasks each, {} ms fixed service time (a sleep), \
         queue capacity {} per process. Kafka: one consumer group (static members `w0`..`w{}`, \
         `extra` a dynamic member) over one topic of {} partitions (the defer and dead-letter \
         topics too). RabbitMQ: competing consumers on one priority queue, prefetch 256 each. \
         Mix 10/20/30/40 % (Critical/High/Medium/Sheddable), deadlines produce time + \
         {:?} ms, {} per mille poison. The load phase offers {}x the processes' combined \
         capacity, measured just before on a backlog of Critical messages, for {} s: `w1` is \
         killed with `kill -9` at 25 % of it and started again (a new process: a new \
         Prometheus series), `extra` joins at 40 % and leaves (SIGTERM) at 70 %.\n",
        args.processes,
        args.workers,
        args.service_ms,
        args.capacity
            .map_or_else(|| "derived".to_owned(), |c| c.to_string()),
        args.processes.saturating_sub(1),
        args.partitions,
        args.windows_ms,
        args.poison_permille,
        args.factor,
        args.seconds,
    );
    let _ = writeln!(
        s,
        "Prometheus 2.42 (Debian's `prometheus`, started by the harness on a free port with a \
         storage directory of its own) scrapes every process's `/metrics` each second through \
         `file_sd` (a process's target is written when it starts and removed when it ends) \
         and evaluates `deploy/prometheus/triage.rules.yml` each second. Its goodput is \
         `sum by (tier) (last_over_time(triage_goodput_total{{job=..}}[..]))` over every \
         process of the phase (each process has a port of its own, so its last scraped value \
         is its total), read through `/api/v1/query`; the reconciliation's is every produced \
         id completed inside its deadline at least once, from the workers' disposition logs.\n"
    );
    let _ = writeln!(
        s,
        "![goodput per tier and completions per worker over time](scale-out.svg)\n"
    );
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(
        s,
        "| broker | capacity msg/s | offered msg/s | critical | high | medium | sheddable | unaccounted | duplicate completions | Prometheus vs the ledger's completions in time, worst tier | load average (start / mean / max) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in results {
        let worst = |f: fn(&ScaleResult, usize) -> f64| {
            (0..4)
                .map(|t| f(r, t))
                .fold(0.0f64, |a, x| if x.abs() > a.abs() { x } else { a })
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} ({} ids) | {:+.2}% ({:+.2}% against distinct ids) | {:.1} / {:.1} / {:.1} |",
            r.broker.as_str(),
            r.capacity,
            r.rate,
            pct(r.rows[0].goodput_share()),
            pct(r.rows[1].goodput_share()),
            pct(r.rows[2].goodput_share()),
            pct(r.rows[3].goodput_share()),
            r.rec.unaccounted.len(),
            r.rec.duplicate_completions,
            r.rec.duplicated_ids,
            100.0 * worst(prom_vs_ledger),
            100.0 * worst(prom_vs_rec),
            r.load.0,
            r.load.1,
            r.load.2,
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "Targets: Critical goodput >= 99% at 3x across the processes; zero unaccounted; Prometheus' goodput per tier (less the warm-up) within 1% of the reconciliation's completions in time (duplicates included, as a counter counts them); `TriageSheddableShed` fires and `TriageCriticalShed` does not.\n");
    for r in results {
        broker_md(&mut s, r);
    }
    s
}

fn broker_md(s: &mut String, r: &ScaleResult) {
    let _ = writeln!(s, "## {}\n", r.broker.as_str());
    let _ = writeln!(
        s,
        "Combined capacity {:.0} msg/s; offered {:.0} msg/s for {:.0} s; {} produced, {} \
         publishes never confirmed; settled: {}. Load average (1 min) {:.1} at the start, \
         {:.1} mean and {:.1} max during the phase.\n",
        r.capacity,
        r.rate,
        r.seconds,
        r.rec.produced,
        r.produce_failures,
        if r.settled { "yes" } else { "no" },
        r.load.0,
        r.load.1,
        r.load.2
    );
    let _ = writeln!(
        s,
        "| tier | offered | goodput: ids in time | share | late | deferred | expired | shed | dead | completions in time, duplicates included | Prometheus goodput (less warm-up) | vs completions in time | vs ids in time |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (t, row) in r.rows.iter().enumerate() {
        let warm = r.warmup_completions[t];
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} ({} warm-up less) | {:+.2}% | {:+.2}% |",
            TIERS[t],
            row.offered,
            row.goodput,
            pct(row.goodput_share()),
            row.late,
            row.deferred,
            row.expired,
            row.shed,
            row.dead,
            r.log_goodput_events[t].saturating_sub(warm),
            r.prom_goodput[t] - warm as f64,
            warm,
            100.0 * prom_vs_ledger(r, t),
            100.0 * prom_vs_rec(r, t),
        );
    }
    let _ = writeln!(
        s,
        "\nReconciliation: {} produced, {} unaccounted, {} duplicate completions over {} ids \
         (at-least-once redelivery after the kill and the rebalances: counted, allowed), {} \
         ids accounted for only by their copy in the defer store, {} copies in the defer \
         store and {} in the dead-letter store after the run.\n",
        r.rec.produced,
        r.rec.unaccounted.len(),
        r.rec.duplicate_completions,
        r.rec.duplicated_ids,
        r.rec.only_in_defer_store,
        r.rec.defer_store,
        r.rec.dead_store
    );
    let _ = writeln!(s, "Per process (a restarted worker is a new process):\n");
    let _ = writeln!(
        s,
        "| worker | process | pid | /metrics | started (s) | ended | completions logged | goodput logged | Prometheus goodput | Prometheus consumed | max RSS MiB |"
    );
    let _ = writeln!(s, "|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|");
    for m in &r.members {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} | {} | {} | {} | {:.0} | {:.0} | {:.0} |",
            m.name,
            m.process,
            m.pid,
            m.addr,
            m.started_s,
            m.ended,
            m.completed,
            m.goodput,
            m.prom_goodput,
            m.prom_consumed,
            m.max_rss_kb as f64 / 1024.0
        );
    }
    let _ = writeln!(s, "\nAlerts of `deploy/prometheus/triage.rules.yml` during the phase (read back from Prometheus' `ALERTS` series; seconds after the load started):\n");
    let _ = writeln!(s, "| alert | pending at | firing at |");
    let _ = writeln!(s, "|---|---:|---:|");
    let fmt = |x: Option<f64>| x.map_or("never".to_owned(), |v| format!("{v:.0} s"));
    for a in &r.alerts {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            a.name,
            fmt(a.pending_s),
            fmt(a.firing_s)
        );
    }
    let _ = writeln!(
        s,
        "\n`TriageCriticalShed`'s expression (Critical shed or expired per second, 5 minute \
         rate) peaked at {:.3}/s during the phase.\n",
        r.critical_shed_max
    );
    let _ = writeln!(s, "Events:\n");
    for (at, e) in &r.events {
        let _ = writeln!(s, "- {at:.1} s: {e}");
    }
    let _ = writeln!(s);
}

fn chart(path: &Path, results: &[ScaleResult]) -> Result<(), Box<dyn std::error::Error>> {
    let rows = results.len().max(1);
    let root = SVGBackend::new(path, (1100, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((rows, 2));
    let tier_colors = [RED, BLUE, GREEN, BLACK];
    let worker_colors = [
        RGBColor(230, 97, 1),
        RGBColor(94, 60, 153),
        RGBColor(0, 128, 128),
        RGBColor(178, 24, 43),
        RGBColor(77, 146, 33),
        RGBColor(120, 120, 120),
    ];
    for (i, r) in results.iter().enumerate() {
        let x_max = r
            .goodput_series
            .iter()
            .chain(&r.worker_series)
            .flat_map(|(_, p)| p.iter().map(|p| p.0))
            .fold(r.seconds, f64::max);
        let panels: [(&str, &Lines); 2] = [
            ("goodput per tier (Prometheus), msg/s", &r.goodput_series),
            (
                "completions per process (Prometheus), msg/s",
                &r.worker_series,
            ),
        ];
        for (j, (title, series)) in panels.iter().enumerate() {
            let y_max = series
                .iter()
                .flat_map(|(_, p)| p.iter().map(|p| p.1))
                .filter(|y| y.is_finite())
                .fold(1.0f64, f64::max)
                * 1.15;
            let area = &areas[i * 2 + j];
            let mut ch = ChartBuilder::on(area)
                .caption(
                    format!("{}: {title}", r.broker.as_str()),
                    ("sans-serif", 16),
                )
                .margin(10)
                .x_label_area_size(34)
                .y_label_area_size(50)
                .build_cartesian_2d(-5f64..x_max, 0f64..y_max)?;
            ch.configure_mesh()
                .x_desc("seconds after the load started")
                .x_labels(8)
                .y_labels(6)
                .draw()?;
            for (at, _) in &r.events {
                ch.draw_series(LineSeries::new(
                    vec![(*at, 0.0), (*at, y_max)],
                    RGBColor(170, 170, 170).stroke_width(1),
                ))?;
            }
            for (k, (name, pts)) in series.iter().enumerate() {
                let color = if j == 0 {
                    TIERS
                        .iter()
                        .position(|t| t == name)
                        .map_or(BLACK, |t| tier_colors[t])
                } else {
                    worker_colors[k % worker_colors.len()]
                };
                let pts: Vec<(f64, f64)> =
                    pts.iter().copied().filter(|p| p.1.is_finite()).collect();
                ch.draw_series(LineSeries::new(pts, color.stroke_width(2)))?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
            }
            ch.configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
    }
    root.present()?;
    Ok(())
}
