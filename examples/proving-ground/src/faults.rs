//! Worker processes and fault injection: start, `kill -9`, restart, a second worker joining and
//! leaving the consumer group, and a broker restart, on a timeline.
//!
//! How the worker is started is a [`Launcher`]: the binary runs itself with the `worker`
//! subcommand; the integration test runs its own test binary with one ignored test selected
//! and the worker's arguments in an environment variable (re-executing the current binary
//! runs exactly the code under test and needs nothing else built).

// Shared by the binary (src/main.rs) and tests/proving_ground.rs; each uses a part.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::worker::BrokerKind;

/// Environment variable carrying the worker's arguments when the test binary is the worker.
pub const WORKER_ENV: &str = "PROVING_GROUND_WORKER";

/// How to start a worker process.
#[derive(Clone, Debug)]
pub enum Launcher {
    /// `<this executable> worker <args>` (the `triage-proving-ground` binary).
    Subcommand,
    /// `<this test binary> <test> --exact --ignored --nocapture`, arguments in [`WORKER_ENV`]
    /// separated by newlines.
    TestBinary {
        /// Name of the ignored test that runs the worker.
        test: String,
    },
}

/// Parameters every worker of a phase shares.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// Broker.
    pub broker: BrokerKind,
    /// Topic or queue.
    pub topic: String,
    /// Consumer group (Kafka).
    pub group: String,
    /// Handler service time, ms.
    pub service_ms: u64,
    /// Worker tasks.
    pub workers: usize,
    /// Runtime queue capacity; `None`: the runtime's default.
    pub capacity: Option<usize>,
    /// Directory for logs and stats.
    pub dir: PathBuf,
    /// One topic (queue) for every tier, or one per tier.
    pub layout: crate::worker::Layout,
    /// A plain FIFO consumer instead of the runtime (`worker --fifo`).
    pub fifo: bool,
}

/// A worker process of a phase, running or finished.
#[derive(Debug)]
pub struct WorkerProc {
    child: Option<Child>,
    /// Process id.
    pub pid: u32,
    /// Its disposition log.
    pub log: PathBuf,
    /// Its stats file.
    pub stats: PathBuf,
    /// Largest VmRSS seen, KiB.
    pub max_rss_kb: u64,
    /// CPU ticks (user + system) last seen.
    pub cpu_ticks: u64,
}

impl WorkerProc {
    /// Starts worker number `n` of the phase; `instance` is its Kafka static membership id.
    pub fn spawn(launcher: &Launcher, spec: &WorkerSpec, n: usize, instance: Option<&str>) -> Self {
        // The Prometheus endpoint on a port of the kernel's choosing: the workers run as a
        // deployment would (the stats file is what the report reads).
        let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        Self::spawn_serving(launcher, spec, n, instance, any)
    }

    /// [`WorkerProc::spawn`], serving Prometheus' `/metrics` on `metrics` (a port known in
    /// advance, for a Prometheus that scrapes it).
    pub fn spawn_serving(
        launcher: &Launcher,
        spec: &WorkerSpec,
        n: usize,
        instance: Option<&str>,
        metrics: std::net::SocketAddr,
    ) -> Self {
        let log = spec.dir.join(format!("worker-{n}.log"));
        let stats = spec.dir.join(format!("worker-{n}.stats"));
        let mut args = vec![
            "--broker".to_owned(),
            spec.broker.as_str().to_owned(),
            "--topic".to_owned(),
            spec.topic.clone(),
            "--group".to_owned(),
            spec.group.clone(),
            "--service-ms".to_owned(),
            spec.service_ms.to_string(),
            "--workers".to_owned(),
            spec.workers.to_string(),
            "--log".to_owned(),
            path_str(&log),
            "--stats".to_owned(),
            path_str(&stats),
            "--layout".to_owned(),
            spec.layout.as_str().to_owned(),
            "--metrics".to_owned(),
            metrics.to_string(),
        ];
        if let Some(capacity) = spec.capacity {
            args.push("--capacity".to_owned());
            args.push(capacity.to_string());
        }
        if spec.fifo {
            args.push("--fifo".to_owned());
        }
        if let Some(i) = instance {
            args.push("--instance".to_owned());
            args.push(i.to_owned());
        }
        let exe = std::env::current_exe().expect("current executable");
        let mut cmd = Command::new(exe);
        match launcher {
            Launcher::Subcommand => {
                cmd.arg("worker").args(&args);
            }
            Launcher::TestBinary { test } => {
                cmd.args([
                    test.as_str(),
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--quiet",
                ])
                .env(WORKER_ENV, args.join("\n"));
            }
        }
        let out = std::fs::File::create(spec.dir.join(format!("worker-{n}.out")))
            .expect("worker output file");
        let err = out.try_clone().expect("worker output file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start the worker process");
        WorkerProc {
            pid: child.id(),
            child: Some(child),
            log,
            stats,
            max_rss_kb: 0,
            cpu_ticks: 0,
        }
    }

    /// Samples resident memory and CPU time; returns whether the process is still running.
    pub fn sample(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            self.child = None;
            return false;
        }
        if let Some(rss) = rss_kb(self.pid) {
            self.max_rss_kb = self.max_rss_kb.max(rss);
        }
        if let Some((u, s)) = crate::worker::cpu_ticks(Some(self.pid)) {
            self.cpu_ticks = u + s;
        }
        true
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        self.sample();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `grace` for a clean exit, then `kill -9`.
    pub fn terminate(&mut self, grace: Duration) {
        self.sample();
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Whether the process is running.
    pub fn running(&mut self) -> bool {
        self.sample()
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        // Never leave a worker behind (a failing test, a panic in the harness).
        self.kill9();
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// VmRSS of `pid`, KiB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What to inject during a fault phase.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// `kill -9` of the main worker, each followed by a restart.
    pub kills: usize,
    /// One broker restart.
    pub broker_restart: bool,
    /// Kafka: a second worker joins the consumer group and leaves it.
    pub group_churn: bool,
    /// Length of the phase (the load's duration).
    pub duration: Duration,
    /// How long the broker stays down.
    pub broker_down: Duration,
}

/// The workers of one phase and the faults done to them.
#[derive(Debug)]
pub struct Fleet {
    launcher: Launcher,
    spec: WorkerSpec,
    started: Instant,
    next: usize,
    /// The main worker (static member `main` on Kafka).
    pub main: WorkerProc,
    /// The churn worker, while in the group.
    pub extra: Option<WorkerProc>,
    /// Finished workers.
    pub done: Vec<WorkerProc>,
    /// What happened, with seconds since the phase started.
    pub events: Vec<String>,
}

impl Fleet {
    /// Starts the main worker.
    pub fn start(launcher: Launcher, spec: WorkerSpec) -> Self {
        let main = WorkerProc::spawn(&launcher, &spec, 0, Some("main"));
        Fleet {
            launcher,
            spec,
            started: Instant::now(),
            next: 1,
            main,
            extra: None,
            done: Vec::new(),
            events: Vec::new(),
        }
    }

    fn event(&mut self, what: impl Into<String>) {
        let what = what.into();
        let at = self.started.elapsed().as_secs_f64();
        eprintln!("  [{at:6.1}s] {what}");
        self.events.push(format!("{at:.1}s {what}"));
    }

    fn respawn_main(&mut self) {
        let fresh = WorkerProc::spawn(&self.launcher, &self.spec, self.next, Some("main"));
        self.next += 1;
        let old = std::mem::replace(&mut self.main, fresh);
        self.done.push(old);
    }

    /// Samples every running worker; restarts the main worker if it exited on its own (it
    /// cannot connect while a broker restarts).
    pub fn tick(&mut self) {
        if !self.main.running() {
            self.event(format!("worker pid {} exited; restarting", self.main.pid));
            std::thread::sleep(Duration::from_millis(500));
            self.respawn_main();
        }
        if let Some(extra) = self.extra.as_mut() {
            extra.sample();
        }
    }

    /// `kill -9` of the main worker, then a restart after `pause`.
    pub fn kill_and_restart(&mut self, pause: Duration) {
        let pid = self.main.pid;
        self.main.kill9();
        self.event(format!("kill -9 worker pid {pid}"));
        std::thread::sleep(pause);
        self.respawn_main();
        self.event(format!("restarted worker as pid {}", self.main.pid));
    }

    /// A second worker joins the group (a dynamic member: it leaves cleanly).
    pub fn join_extra(&mut self) {
        let w = WorkerProc::spawn(&self.launcher, &self.spec, self.next, None);
        self.next += 1;
        self.event(format!("second worker pid {} joins the group", w.pid));
        self.extra = Some(w);
    }

    /// The second worker leaves (SIGTERM: graceful shutdown, leaves the group).
    pub fn leave_extra(&mut self) {
        if let Some(mut w) = self.extra.take() {
            w.terminate(Duration::from_secs(30));
            self.event(format!("second worker pid {} left the group", w.pid));
            self.done.push(w);
        }
    }

    /// Stops every worker gracefully and returns them all.
    pub fn stop(mut self) -> (Vec<WorkerProc>, Vec<String>) {
        self.leave_extra();
        self.main.terminate(Duration::from_secs(30));
        let mut all = std::mem::take(&mut self.done);
        let main = std::mem::replace(
            &mut self.main,
            WorkerProc {
                child: None,
                pid: 0,
                log: PathBuf::new(),
                stats: PathBuf::new(),
                max_rss_kb: 0,
                cpu_ticks: 0,
            },
        );
        all.push(main);
        (all, std::mem::take(&mut self.events))
    }
}

/// Runs `plan` against `fleet` (shared with the settle loop) while the load runs: kills at
/// random moments, one broker restart, a second worker joining and leaving. Blocking: run it
/// on a blocking thread.
pub fn inject(fleet: &parking_lot::Mutex<Fleet>, plan: &FaultPlan, broker: BrokerKind) {
    let d = plan.duration.as_secs_f64();
    let mut schedule: Vec<(f64, &str)> = Vec::new();
    for i in 0..plan.kills {
        // Spread over the phase, jittered inside each slot: random moments, never bunched.
        let slot = 0.8 * d / plan.kills as f64;
        schedule.push((0.1 * d + slot * (i as f64 + fastrand::f64() * 0.8), "kill"));
    }
    if plan.broker_restart {
        schedule.push((0.45 * d, "broker"));
    }
    if plan.group_churn && broker == BrokerKind::Kafka {
        schedule.push((0.2 * d, "join"));
        schedule.push((0.7 * d, "leave"));
    }
    schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    let started = Instant::now();
    let mut broker_thread: Option<std::thread::JoinHandle<()>> = None;
    for (at, what) in schedule {
        while started.elapsed().as_secs_f64() < at {
            fleet.lock().tick();
            std::thread::sleep(Duration::from_millis(100));
        }
        match what {
            "kill" => fleet
                .lock()
                .kill_and_restart(Duration::from_millis(200 + fastrand::u64(..500))),
            "join" => fleet.lock().join_extra(),
            "leave" => fleet.lock().leave_extra(),
            _ => {
                fleet
                    .lock()
                    .event(format!("{} broker stopping", broker.as_str()));
                let down = plan.broker_down;
                broker_thread = Some(std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime for the broker restart");
                    if let Err(e) = rt.block_on(crate::brokers::restart(broker, down)) {
                        panic!("broker restart failed: {e}");
                    }
                }));
            }
        }
    }
    if let Some(t) = broker_thread {
        let ok = t.join().is_ok();
        fleet.lock().event(if ok {
            format!("{} broker back", broker.as_str())
        } else {
            format!("{} broker restart FAILED", broker.as_str())
        });
        assert!(ok, "the broker restart failed");
    }
}
