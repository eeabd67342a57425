//! The overload run, shared by `examples/overload` (the CLI) and `tests/overload_short.rs`.
//!
//! An in-memory broker is fed at `factor` times the workers' measured capacity with a mix of
//! tiers, each message carrying a deadline. The same schedule goes through triage and through a
//! plain bounded FIFO (a naive consumer: pull in order, serve everything), and the outcome is
//! tallied per message from the generator's side, so the two are judged by the same rules.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::ordering::OrderingMode;
use triage::quanta::{Clock, Instant};
use triage::runtime::{
    AckCounts, DeferSink, HandlerError, Job, MemoryBroker, Republish, Runtime, RuntimeConfig,
    RuntimeStats, SinkError,
};
use triage::{Criticality, PerTier};

/// What the run is asked to do.
#[derive(Clone, Debug)]
pub struct Params {
    /// Offered load as a multiple of measured capacity.
    pub factor: f64,
    /// Share of offered messages per tier, percent, Critical first.
    pub mix: [u32; 4],
    /// Length of the overload phase.
    pub duration: Duration,
    /// Length of the recovery phase at `recovery_factor`.
    pub recovery: Duration,
    /// Offered load during recovery, as a multiple of capacity.
    pub recovery_factor: f64,
    /// Worker tasks (and the fixed concurrency limit).
    pub workers: usize,
    /// Handler service time (zero: the handler returns at once, no timer).
    pub service: Duration,
    /// The plain FIFO baseline's channel capacity, items (triage runs on its defaults).
    pub capacity: usize,
    /// Usefulness window per tier: the deadline is publish time plus this.
    pub windows: PerTier<Duration>,
    /// Print a live line (see [`Live`]) this often during the phases; `None`: quiet.
    pub live: Option<Duration>,
    /// The runtime configuration to start from (a `--config` file), in place of the default
    /// with `workers`.
    pub base: Option<RuntimeConfig>,
    /// Re-read this configuration file on SIGHUP during the run (`--config`, with the
    /// `reload` feature).
    pub reload: Option<std::path::PathBuf>,
    /// Ordering of the generated messages: `Key` gives each one of `keys` random keys,
    /// `Partition` puts them all on one key (the in-memory broker is one partition).
    pub ordering: OrderingMode,
    /// Distinct keys in `Key` mode.
    pub keys: u64,
    /// The clock the runtimes and the generator read (deadlines, completions, queue ages);
    /// `None`: the system clock. A test on tokio's paused clock passes a mock that follows it,
    /// so that the run is the same however busy the machine is.
    pub clock: Option<Clock>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            factor: 3.0,
            mix: [10, 20, 30, 40],
            duration: Duration::from_secs(8),
            recovery: Duration::from_secs(4),
            recovery_factor: 0.5,
            workers: 8,
            service: Duration::from_millis(2),
            capacity: 256,
            windows: PerTier::new(
                Duration::from_millis(1000),
                Duration::from_millis(500),
                Duration::from_millis(250),
                Duration::from_millis(100),
            ),
            live: None,
            base: None,
            reload: None,
            ordering: OrderingMode::Unordered,
            keys: 1000,
            clock: None,
        }
    }
}

/// A generated message: its id indexes the generator's tally.
#[derive(Clone, Copy, Debug)]
pub struct Msg {
    pub id: u64,
    pub tier: Criticality,
    pub deadline: Instant,
}

/// Per-message outcome, kept by the generator.
#[derive(Default)]
struct Tally {
    /// Completion instant of the first completion, per id.
    done: Vec<Option<Instant>>,
    msgs: Vec<Msg>,
}

/// Outcome per tier of one phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct TierRow {
    pub offered: u64,
    pub admitted: u64,
    pub goodput: u64,
    pub completed_late: u64,
    pub expired: u64,
    pub evicted: u64,
    pub refused: u64,
    pub deferred: u64,
    pub shed: u64,
}

impl TierRow {
    pub fn goodput_share(&self) -> f64 {
        if self.offered == 0 {
            1.0
        } else {
            self.goodput as f64 / self.offered as f64
        }
    }
}

/// The whole run's result.
#[derive(Debug)]
pub struct Outcome {
    pub capacity_per_s: f64,
    pub triage: PerTier<TierRow>,
    pub fifo: PerTier<TierRow>,
    pub recovery: PerTier<TierRow>,
    /// Shed level sampled during recovery (first, last).
    pub recovery_shed_levels: Vec<u8>,
    /// How the deferred copies ended, as the deferred store acknowledged them: drained back
    /// and completed (late: after the phase they were offered in), expired at intake (past
    /// their deadline, no handler call), deferred again (a copy of the copy), or still pending.
    pub drained: AckCounts,
    pub broker_lag_after_overload: usize,
    /// Messages still waiting in the deferred store when the run ended (not drained back).
    pub deferred_left: usize,
    /// Whether the run stopped waiting for them because the operator's forced level kept the
    /// drains closed.
    pub drains_closed: bool,
    pub fifo_unserved: u64,
    pub stats: RuntimeStats,
    pub balances: bool,
    /// Most messages inside the runtime at once during overload (sampled every 10 ms).
    pub max_alive: u64,
    /// What the runtime may hold at most: capacity + workers + held per source + deferring.
    pub alive_bound: u64,
}

/// Defers into a second in-memory broker, the "deferred topic", drained back when load falls.
/// A copy keeps what the Kafka and RabbitMQ defer sinks write into its headers: its tier, its
/// deferrals so far and its deadline, so a drained copy is served at its own tier, never
/// deferred past `max_deferrals`, and expired at intake once its deadline has passed. The
/// deadline is the message's own, on the run's clock: the header's wall-clock instant would
/// differ from it by the microseconds between two reads of the system time.
struct DeferToBroker {
    deferred: MemoryBroker<Msg>,
}

impl DeferSink<Msg> for DeferToBroker {
    fn publish<'a>(
        &'a self,
        payload: &'a Msg,
        info: &'a Republish,
    ) -> futures_util::future::BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let deadline = info.deadline.map(|_| payload.deadline);
            self.deferred
                .publish_copy(*payload, info.criticality, deadline, 0, info.deferrals);
            Ok(())
        })
    }
}

fn tier_of(mix: [u32; 4], x: u32) -> Criticality {
    let mut acc = 0;
    for (i, share) in mix.iter().enumerate() {
        acc += share;
        if x < acc {
            return Criticality::ALL[i];
        }
    }
    Criticality::Sheddable
}

/// Publishes at `rate` msgs/s for `duration` into `broker`.
async fn generate(
    clock: &Clock,
    broker: &MemoryBroker<Msg>,
    tally: &Mutex<Tally>,
    rate: f64,
    duration: Duration,
    p: &Params,
    rng: &mut fastrand::Rng,
) {
    let total: u32 = p.mix.iter().sum();
    let start = tokio::time::Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    loop {
        tick.tick().await;
        let elapsed = start.elapsed();
        if elapsed >= duration {
            break;
        }
        let due = (elapsed.as_secs_f64() * rate) as u64;
        while sent < due {
            let tier = tier_of(p.mix, rng.u32(0..total));
            let now = clock.now();
            let msg = {
                let mut t = tally.lock();
                let msg = Msg {
                    id: t.msgs.len() as u64,
                    tier,
                    deadline: now + p.windows[tier],
                };
                t.msgs.push(msg);
                t.done.push(None);
                msg
            };
            match p.ordering {
                OrderingMode::Unordered => broker.publish(msg, tier, Some(msg.deadline)),
                OrderingMode::Key => {
                    broker.publish_keyed(msg, tier, Some(msg.deadline), rng.u64(0..p.keys))
                }
                OrderingMode::Partition => broker.publish_keyed(msg, tier, Some(msg.deadline), 0),
            };
            sent += 1;
        }
    }
}

fn handler(
    clock: Clock,
    service: Duration,
    tally: Arc<Mutex<Tally>>,
) -> impl Fn(Job<Msg>) -> futures_util::future::BoxFuture<'static, Result<(), HandlerError>>
       + Send
       + Sync
       + 'static {
    move |job: Job<Msg>| {
        let clock = clock.clone();
        let tally = Arc::clone(&tally);
        let id = job.payload().id;
        Box::pin(async move {
            // Zero service time is a true no-op: no timer, no yield.
            if !service.is_zero() {
                tokio::time::sleep(service).await;
            }
            let now = clock.now();
            let mut t = tally.lock();
            if let Some(slot) = t.done.get_mut(id as usize) {
                slot.get_or_insert(now);
            }
            Ok(())
        })
    }
}

fn config(p: &Params) -> RuntimeConfig {
    if let Some(base) = &p.base {
        return base.clone();
    }
    // The zero-configuration default: the worker count is the one thing said; the queue's
    // bounds are derived from the measured capacity and the deadlines the messages carry.
    RuntimeConfig {
        workers: p.workers.try_into().expect("workers > 0"),
        ..RuntimeConfig::default()
    }
}

/// With `--config` and the `reload` feature: `kill -HUP <pid>` re-reads the file into the
/// running runtime (say `forced_shed_level = 2`, or new weights), logged on stderr.
#[cfg(all(unix, feature = "reload"))]
fn reload_on_sighup(rt: &Runtime<Msg>, p: &Params) -> Option<tokio::task::JoinHandle<()>> {
    let path = p.reload.as_ref()?;
    match rt.config_handle().reload_on_sighup(path) {
        Ok(task) => {
            eprintln!(
                "kill -HUP {} re-reads {} into the running runtime",
                std::process::id(),
                path.display()
            );
            Some(task)
        }
        Err(e) => {
            eprintln!("SIGHUP reload not available: {e}");
            None
        }
    }
}

#[cfg(not(all(unix, feature = "reload")))]
fn reload_on_sighup(_rt: &Runtime<Msg>, p: &Params) -> Option<()> {
    if p.reload.is_some() {
        eprintln!("--config is read once: build with --features reload to re-read it on SIGHUP");
    }
    None
}

/// Measures messages/s with every worker busy.
async fn measure_capacity(p: &Params) -> f64 {
    let clock = p.clock.clone().unwrap_or_default();
    let broker = MemoryBroker::new();
    // About one second of work; a no-op handler gets a fixed 100,000 messages.
    let n = if p.service.is_zero() {
        100_000
    } else {
        (p.workers as f64 / p.service.as_secs_f64()).max(100.0) as u64
    };
    let far = clock.now() + Duration::from_secs(3600);
    for id in 0..n {
        broker.publish(
            Msg {
                id,
                tier: Criticality::Critical,
                deadline: far,
            },
            Criticality::Critical,
            None,
        );
    }
    broker.close();
    let tally = Arc::new(Mutex::new(Tally {
        done: vec![None; n as usize],
        msgs: Vec::new(),
    }));
    let mut rt = Runtime::builder(config(p))
        .clock(clock.clone())
        .start(handler(clock, p.service, tally))
        .expect("valid config");
    let start = tokio::time::Instant::now();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let elapsed = start.elapsed();
    let _ = rt.shutdown(Duration::from_secs(5)).await;
    n as f64 / elapsed.as_secs_f64()
}

fn rows_from_tally(t: &Tally, range: std::ops::Range<usize>) -> PerTier<TierRow> {
    let mut rows = PerTier::<TierRow>::default();
    for m in &t.msgs[range] {
        let r = &mut rows[m.tier];
        r.offered += 1;
        match t.done[m.id as usize] {
            Some(at) if at <= m.deadline => r.goodput += 1,
            Some(_) => r.completed_late += 1,
            None => {}
        }
    }
    rows
}

fn diff_stats(rows: &mut PerTier<TierRow>, before: &RuntimeStats, after: &RuntimeStats) {
    for tier in Criticality::ALL {
        let (b, a) = (before.ledger.tier(tier), after.ledger.tier(tier));
        let (qb, qa) = (before.queue.tier(tier), after.queue.tier(tier));
        let r = &mut rows[tier];
        r.expired = a.expired - b.expired;
        r.deferred = a.deferred - b.deferred;
        r.shed = a.shed - b.shed;
        r.evicted = qa.evicted - qb.evicted;
        r.refused = after.refused[tier] - before.refused[tier];
        r.admitted = after.admitted[tier] - before.admitted[tier];
    }
}

/// Runs capacity measurement, the overload phase, recovery, and the FIFO comparison.
pub async fn run(p: &Params) -> Outcome {
    let capacity_per_s = measure_capacity(p).await;
    let clock = p.clock.clone().unwrap_or_default();
    let mut rng = fastrand::Rng::with_seed(7);

    // triage
    let broker = MemoryBroker::new();
    let deferred = MemoryBroker::new();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut rt = Runtime::builder(config(p))
        .clock(clock.clone())
        .defer_sink(Arc::new(DeferToBroker {
            deferred: deferred.clone(),
        }))
        .start(handler(clock.clone(), p.service, Arc::clone(&tally)))
        .expect("valid config");
    rt.attach(broker.source());
    rt.attach_drain(deferred.source());
    let _reload = reload_on_sighup(&rt, p);
    let s0 = rt.stats();
    let mut live = Live::new(p.live, &s0);
    let mut max_alive = 0u64;
    {
        let gen = generate(
            &clock,
            &broker,
            &tally,
            capacity_per_s * p.factor,
            p.duration,
            p,
            &mut rng,
        );
        tokio::pin!(gen);
        let mut every = tokio::time::interval(Duration::from_millis(10));
        loop {
            tokio::select! {
                biased;
                () = &mut gen => break,
                _ = every.tick() => {
                    let stats = rt.stats();
                    max_alive = max_alive.max(stats.alive);
                    live.tick("overload", &stats, rt.load().shed_tiers());
                }
            }
        }
    }
    let overload_end = tally.lock().msgs.len();
    let broker_lag_after_overload = broker.backlog();
    let s1 = rt.stats();

    // recovery: load falls, nothing is reconfigured
    let recovery_rate = capacity_per_s * p.recovery_factor;
    let mut levels = Vec::new();
    {
        let gen = generate(
            &clock,
            &broker,
            &tally,
            recovery_rate,
            p.recovery,
            p,
            &mut rng,
        );
        tokio::pin!(gen);
        let mut every = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                biased;
                () = &mut gen => break,
                _ = every.tick() => {
                    levels.push(rt.load().shed_tiers());
                    live.tick("recovery", &rt.stats(), rt.load().shed_tiers());
                }
            }
        }
    }
    let recovery_end = tally.lock().msgs.len();
    // Give the tail of recovery (and the drained deferred work) time to finish, showing the
    // live line meanwhile.
    broker.close();
    let settle = tokio::time::Instant::now();
    let mut drains_closed = false;
    loop {
        let stats = rt.stats();
        let inside = broker.backlog() > 0 || stats.alive > 0;
        if !inside && deferred.backlog() == 0 || settle.elapsed() >= Duration::from_secs(20) {
            break;
        }
        // The drains are pulled only while nothing is refused: under the operator's forced
        // level the deferred copies cannot come back, so there is nothing left to wait for.
        if !inside && rt.load().shed_tiers() > 0 && rt.config().forced_shed_level > 0 {
            drains_closed = true;
            break;
        }
        live.tick("settling", &stats, rt.load().shed_tiers());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s2 = rt.stats();
    let deferred_left = deferred.backlog();
    deferred.close();
    let report = rt.shutdown(Duration::from_secs(10)).await;

    let (mut triage_rows, mut recovery_rows) = {
        let t = tally.lock();
        (
            rows_from_tally(&t, 0..overload_end),
            rows_from_tally(&t, overload_end..recovery_end),
        )
    };
    diff_stats(&mut triage_rows, &s0, &s1);
    diff_stats(&mut recovery_rows, &s1, &s2);
    let drained = deferred.acks();

    // the plain FIFO: same load, same handler, a bounded channel and no priorities
    let fifo_broker = MemoryBroker::new();
    let fifo_tally = Arc::new(Mutex::new(Tally::default()));
    let (tx, rx) = async_channel::bounded::<Msg>(p.capacity);
    let mut workers = Vec::new();
    for _ in 0..p.workers {
        let rx = rx.clone();
        let h = handler(clock.clone(), p.service, Arc::clone(&fifo_tally));
        let clock = clock.clone();
        workers.push(tokio::spawn(async move {
            while let Ok(m) = rx.recv().await {
                let job_handler = &h;
                let _ = clock.now();
                let _ = job_handler(fake_job(m, &clock)).await;
            }
        }));
    }
    let puller = {
        let mut source = fifo_broker.source();
        tokio::spawn(async move {
            use triage::runtime::Source;
            while let Some(env) = source.next().await {
                let m = env.payload;
                env.ack.resolve(triage::ledger::Disposition::Completed);
                if tx.send(m).await.is_err() {
                    break;
                }
            }
        })
    };
    let mut rng = fastrand::Rng::with_seed(7);
    {
        let gen = generate(
            &clock,
            &fifo_broker,
            &fifo_tally,
            capacity_per_s * p.factor,
            p.duration,
            p,
            &mut rng,
        );
        tokio::pin!(gen);
        let mut fifo_live = FifoLive::new(p.live);
        let mut every = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                () = &mut gen => break,
                _ = every.tick() => fifo_live.tick(&fifo_tally, rx.len()),
            }
        }
    }
    puller.abort();
    rx.close();
    for w in workers {
        w.abort();
    }
    let (fifo_rows, fifo_unserved) = {
        let t = fifo_tally.lock();
        let n = t.msgs.len();
        let rows = rows_from_tally(&t, 0..n);
        let unserved = t.done.iter().filter(|d| d.is_none()).count() as u64;
        (rows, unserved)
    };

    Outcome {
        capacity_per_s,
        triage: triage_rows,
        fifo: fifo_rows,
        recovery: recovery_rows,
        recovery_shed_levels: levels,
        drained,
        broker_lag_after_overload,
        deferred_left,
        fifo_unserved,
        stats: report.stats,
        balances: report.stats.balances(),
        drains_closed,
        max_alive,
        alive_bound: {
            let c = config(p);
            // Two sources (the broker and the deferred drain) may each hold `max_held`.
            (c.expert.queue.capacity.get()
                + c.workers.get()
                + 2 * c.expert.max_held.get()
                + c.expert.max_deferring.get()) as u64
        },
    }
}

/// The FIFO consumer has no runtime; it calls the same handler with a stand-in job.
fn fake_job(m: Msg, clock: &Clock) -> Job<Msg> {
    triage::runtime::Job::detached(m, m.tier, Some(m.deadline), clock.clone())
}

/// Renders one phase as a table.
pub fn table(title: &str, rows: &PerTier<TierRow>) -> String {
    let mut out = format!(
        "{title}\n{:<10} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
        "tier",
        "offered",
        "admitted",
        "goodput",
        "share",
        "late",
        "expired",
        "evicted",
        "refused",
        "deferred"
    );
    for (tier, r) in rows.iter() {
        out.push_str(&format!(
            "{:<10} {:>8} {:>8} {:>8} {:>6.1}% {:>8} {:>8} {:>8} {:>8} {:>8}\n",
            tier.as_str(),
            r.offered,
            r.admitted,
            r.goodput,
            100.0 * r.goodput_share(),
            r.completed_late,
            r.expired,
            r.evicted,
            r.refused,
            r.deferred,
        ));
    }
    out
}

/// What the live line's fields mean (the examples print it in `--help`).
pub const LIVE_HELP: &str = "\
Live line, once a second: [elapsed phase] consumed, goodput, queued, running, held, refusing, deferred
  consumed   messages the runtime took from its sources per second, over the last interval
             (drained-back deferred messages included)
  goodput    handler successes inside their deadline per second
  queued     messages waiting in triage's queue
  running    handlers running / the current concurrency limit
  held       messages held by backpressure (their tier is refused and its policy is to wait)
  refusing   tiers refused by admission (arrival beyond capacity, or the forced_shed_level of a --config
             file), lowest first (0 of 4 = all admitted)
  deferred   messages per second published to the defer store (drained back when load falls)";

/// Prints the live line at most every `every`, with rates since the previous line.
pub struct Live {
    every: Option<Duration>,
    start: std::time::Instant,
    last_at: std::time::Instant,
    last: (u64, u64, u64),
}

fn live_counts(stats: &RuntimeStats) -> (u64, u64, u64) {
    let t = stats.ledger.total();
    (t.consumed, t.goodput, t.deferred)
}

impl Live {
    pub fn new(every: Option<Duration>, stats: &RuntimeStats) -> Self {
        let now = std::time::Instant::now();
        Live {
            every,
            start: now,
            last_at: now,
            last: live_counts(stats),
        }
    }

    pub fn tick(&mut self, phase: &str, stats: &RuntimeStats, refusing: u8) {
        let Some(every) = self.every else { return };
        let now = std::time::Instant::now();
        let dt = now.duration_since(self.last_at);
        if dt < every {
            return;
        }
        let counts = live_counts(stats);
        let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / dt.as_secs_f64();
        println!(
            "[{:>5.1}s {phase}] consumed {:.0}/s  goodput {:.0}/s  queued {}  running {}/{}  held {}  refusing {} of 4 tiers  deferred {:.0}/s",
            now.duration_since(self.start).as_secs_f64(),
            rate(counts.0, self.last.0),
            rate(counts.1, self.last.1),
            stats.queued,
            stats.running,
            stats.limit,
            stats.held,
            refusing,
            rate(counts.2, self.last.2),
        );
        self.last_at = now;
        self.last = counts;
    }
}

/// The FIFO phase's live line, at most once a second: what it served, and in time.
struct FifoLive {
    every: Option<Duration>,
    start: std::time::Instant,
    last_at: std::time::Instant,
    last: (usize, usize, usize),
}

impl FifoLive {
    fn new(every: Option<Duration>) -> Self {
        let now = std::time::Instant::now();
        FifoLive {
            every,
            start: now,
            last_at: now,
            last: (0, 0, 0),
        }
    }

    fn tick(&mut self, tally: &Mutex<Tally>, waiting: usize) {
        let Some(every) = self.every else { return };
        let now = std::time::Instant::now();
        let dt = now.duration_since(self.last_at);
        if dt < every {
            return;
        }
        // Offered, served, served in time so far: a scan of the tally, once a second.
        let counts = {
            let t = tally.lock();
            let mut served = 0;
            let mut in_time = 0;
            for (m, done) in t.msgs.iter().zip(&t.done) {
                if let Some(at) = done {
                    served += 1;
                    in_time += usize::from(*at <= m.deadline);
                }
            }
            (t.msgs.len(), served, in_time)
        };
        let rate = |now: usize, before: usize| now.saturating_sub(before) as f64 / dt.as_secs_f64();
        println!(
            "[{:>5.1}s fifo] offered {:.0}/s  served {:.0}/s  in time {:.0}/s  waiting in the channel {waiting}",
            now.duration_since(self.start).as_secs_f64(),
            rate(counts.0, self.last.0),
            rate(counts.1, self.last.1),
            rate(counts.2, self.last.2),
        );
        self.last_at = now;
        self.last = counts;
    }
}

/// Renders the plain FIFO's phase: it has no admission, no deferral and no expiry, so only
/// what was offered and what became of it.
pub fn fifo_table(title: &str, rows: &PerTier<TierRow>) -> String {
    let mut out = format!(
        "{title}\n{:<10} {:>8} {:>8} {:>7} {:>8} {:>12}\n",
        "tier", "offered", "goodput", "share", "late", "never served"
    );
    for (tier, r) in rows.iter() {
        out.push_str(&format!(
            "{:<10} {:>8} {:>8} {:>6.1}% {:>8} {:>12}\n",
            tier.as_str(),
            r.offered,
            r.goodput,
            100.0 * r.goodput_share(),
            r.completed_late,
            r.offered - r.goodput - r.completed_late,
        ));
    }
    out
}
