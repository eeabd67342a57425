//! The main job on the embedded default: triage under 3x overload, next to a plain FIFO.
//!
//! ```text
//! cargo run --release --example overload
//! cargo run --release --example overload -- --factor 10 --duration-s 10 --workers 8
//! cargo run --release --features prometheus --example overload -- --metrics 127.0.0.1:9898
//! cargo run --release --features reload --example overload -- --config examples/overload/triage.toml --duration-s 60
//! cargo run --release --example overload -- --failing-downstream
//! ```
//!
//! With `--failing-downstream` it runs another scenario instead (see `failing.rs`): a share of
//! the messages is bound for a downstream whose every call fails after a timeout, and the same
//! load runs without and with circuit-breaker-aware admission; it prints the healthy
//! downstream's goodput for both.
//!
//! With `--config FILE` the run starts from that runtime configuration (TOML, the fields of
//! `RuntimeConfig`; its `workers` replaces `--workers`),
//! and, built with `--features reload`, re-reads it live on `kill -HUP <pid>`: set
//! `forced_shed_level = 2` and watch `refusing` rise on the live line without a restart.
//!
//! An in-memory broker is fed at `--factor` times the workers' measured capacity (a handler
//! with a fixed service time), with the tier mix `--mix` (percent) and a deadline per tier. It
//! prints, per tier, what triage did; then the same offered load through a plain bounded FIFO;
//! then load falls to 0.5x and every tier is admitted again without a manual step, while the
//! deferred work drains back. The flags are the ones the worker examples use for the same
//! things (`--duration-s`, `--service-ms`, `--workers`, `--capacity`, `--metrics`, `--mix`).

mod failing;
mod sim;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use triage::{Criticality, PerTier};

/// The flags, parsed with `lexopt` (a few kilobytes of code: the first command's build
/// compiles no argument-parser framework).
#[derive(Debug)]
struct Args {
    factor: f64,
    mix: [u32; 4],
    duration_s: f64,
    recovery_s: f64,
    workers: usize,
    service_ms: f64,
    capacity: usize,
    metrics: Option<SocketAddr>,
    quiet: bool,
    config: Option<std::path::PathBuf>,
    ordering: triage::ordering::OrderingMode,
    keys: u64,
    /// Run the failing-downstream scenario instead: `--failing-share` of the messages go to a
    /// downstream whose every call fails after `--failing-ms`; the same load without and with
    /// circuit breakers, printing the healthy downstream's goodput.
    failing_downstream: bool,
    /// With `--failing-downstream`: fraction of messages bound for the failing downstream.
    failing_share: f64,
    /// With `--failing-downstream`: how long a failing call takes before it fails, ms.
    failing_ms: f64,
    /// With `--failing-downstream`: offered load as a multiple of the workers' capacity at
    /// `--service-ms` (below 1: the only overload is what the failing calls cost).
    failing_factor: f64,
}

const USAGE: &str = "\
triage under overload, next to a plain FIFO

Usage: cargo run --release --example overload -- [OPTIONS]

Options:
      --factor <X>         Offered load as a multiple of the measured capacity, 0.01..=100
                           [default: 3]
      --mix <MIX>          Tier mix, percent of offered messages, `tier=percent` comma-separated
                           (adding up to 100; a tier left out gets 0)
                           [default: critical=10,high=20,medium=30,sheddable=40]
      --duration-s <S>     Overload phase, seconds, 0.5..=3600 [default: 8]
      --recovery-s <S>     Recovery phase at 0.5x, seconds, 0.5..=3600 [default: 4]
      --workers <N>        Worker tasks (the fixed concurrency limit), 1..=1024 [default: 8]
      --service-ms <MS>    Handler service time, milliseconds, 0.1..=10000, or 0: a true
                           no-op handler (no timer) [default: 2]
      --capacity <N>       The plain FIFO's channel capacity, messages, 1..=1000000; triage
                           runs on its defaults, its queue bounded from what it measures
                           [default: 256]
      --metrics <ADDR>     Serve Prometheus `/metrics` and `/healthz` on this address (e.g.
                           127.0.0.1:9898); needs `--features prometheus`
      --quiet              No live line, only the tables
      --config <FILE>      Runtime configuration (TOML, `RuntimeConfig`) for the triage run; its
                           `workers` replaces `--workers` (a file that does not set it runs
                           with the default, 8).
                           With `--features reload`, `kill -HUP <pid>` re-reads it into the
                           running runtime
      --ordering <MODE>    Ordering of the generated messages: `unordered`, `key` (each message
                           gets one of `--keys` random keys; at most one message per key inside
                           the runtime, keyed messages are held rather than deferred) or
                           `partition` (the in-memory broker is one partition: one message at a
                           time) [default: unordered]
      --keys <N>           Distinct keys with `--ordering key` [default: 1000]
      --failing-downstream Run the failing-downstream scenario instead: `--failing-share` of the
                           messages go to a downstream whose every call fails after
                           `--failing-ms`; the same load without and with circuit breakers,
                           printing the healthy downstream's goodput
      --failing-share <F>  Fraction of messages bound for the failing downstream [default: 0.3]
      --failing-ms <MS>    How long a failing call takes before it fails [default: 20]
      --failing-factor <X> Offered load as a multiple of the workers' capacity at
                           `--service-ms` (below 1: the only overload is what the failing calls
                           cost) [default: 0.8]
  -h, --help               Print help
  -V, --version            Print version
";

impl Args {
    fn parse() -> Result<Self, String> {
        use lexopt::prelude::*;
        let mut a = Args {
            factor: 3.0,
            mix: [10, 20, 30, 40],
            duration_s: 8.0,
            recovery_s: 4.0,
            workers: 8,
            service_ms: 2.0,
            capacity: 256,
            metrics: None,
            quiet: false,
            config: None,
            ordering: triage::ordering::OrderingMode::Unordered,
            keys: 1000,
            failing_downstream: false,
            failing_share: 0.3,
            failing_ms: 20.0,
            failing_factor: 0.8,
        };
        let mut parser = lexopt::Parser::from_env();
        while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
            match arg {
                Long("factor") => a.factor = value(&mut parser, "factor")?,
                Long("mix") => {
                    let v: String = value(&mut parser, "mix")?;
                    a.mix = parse_mix(&v)?;
                }
                Long("duration-s") => a.duration_s = value(&mut parser, "duration-s")?,
                Long("recovery-s") => a.recovery_s = value(&mut parser, "recovery-s")?,
                Long("workers") => a.workers = value(&mut parser, "workers")?,
                Long("service-ms") => a.service_ms = value(&mut parser, "service-ms")?,
                Long("capacity") => a.capacity = value(&mut parser, "capacity")?,
                Long("metrics") => a.metrics = Some(value(&mut parser, "metrics")?),
                Long("quiet") => a.quiet = true,
                Long("config") => {
                    a.config = Some(parser.value().map_err(|e| e.to_string())?.into())
                }
                Long("ordering") => a.ordering = value(&mut parser, "ordering")?,
                Long("keys") => a.keys = value(&mut parser, "keys")?,
                Long("failing-downstream") => a.failing_downstream = true,
                Long("failing-share") => a.failing_share = value(&mut parser, "failing-share")?,
                Long("failing-ms") => a.failing_ms = value(&mut parser, "failing-ms")?,
                Long("failing-factor") => a.failing_factor = value(&mut parser, "failing-factor")?,
                Short('h') | Long("help") => {
                    println!("{USAGE}\n{}", sim::LIVE_HELP);
                    std::process::exit(0);
                }
                Short('V') | Long("version") => {
                    println!("overload (triage-overload {})", env!("CARGO_PKG_VERSION"));
                    std::process::exit(0);
                }
                _ => return Err(arg.unexpected().to_string()),
            }
        }
        a.check()?;
        Ok(a)
    }

    /// The bounds this run can keep, each error naming its flag and range: the plain FIFO
    /// baseline allocates its channel of `--capacity` up front, and the load generator keeps
    /// `--factor` x capacity messages a second in memory, so values the runtime accepts can
    /// still exhaust the machine here.
    fn check(&self) -> Result<(), String> {
        fn range<T: PartialOrd + std::fmt::Display>(
            flag: &str,
            v: T,
            lo: T,
            hi: T,
        ) -> Result<(), String> {
            if v >= lo && v <= hi {
                Ok(())
            } else {
                Err(format!("--{flag} {v}: allowed {lo}..={hi}"))
            }
        }
        // Below these the run measures nothing: a phase too short for a message, or a load
        // too light for one.
        range("factor", self.factor, MIN_FACTOR, MAX_FACTOR)?;
        range("duration-s", self.duration_s, MIN_SECONDS, MAX_SECONDS)?;
        range("recovery-s", self.recovery_s, MIN_SECONDS, MAX_SECONDS)?;
        range("workers", self.workers, 1, MAX_WORKERS)?;
        // Below 0.1 ms tokio's timer rounds a sleep up to about 1 ms, and the capacity probe
        // would offer `workers / service` messages a second: 0 is the no-op handler instead.
        if self.service_ms != 0.0 {
            range("service-ms", self.service_ms, 0.1, MAX_SERVICE_MS)
                .map_err(|e| format!("{e} (or 0, a no-op handler)"))?;
        }
        range("service-ms", self.service_ms, 0.0, MAX_SERVICE_MS)?;
        range("capacity", self.capacity, 1, MAX_CAPACITY)?;
        range("keys", self.keys, 1, 10_000_000)?;
        range("failing-share", self.failing_share, 0.0, 1.0)?;
        range("failing-ms", self.failing_ms, 0.0, MAX_SERVICE_MS)?;
        range(
            "failing-factor",
            self.failing_factor,
            MIN_FACTOR,
            MAX_FACTOR,
        )?;
        Ok(())
    }
}

/// Bounds of this run's flags (see `Args::check`).
const MIN_FACTOR: f64 = 0.01;
const MAX_FACTOR: f64 = 100.0;
const MIN_SECONDS: f64 = 0.5;
const MAX_SECONDS: f64 = 3600.0;
const MAX_WORKERS: usize = 1024;
const MAX_SERVICE_MS: f64 = 10_000.0;
const MAX_CAPACITY: usize = 1_000_000;

/// The next value of `--flag`, parsed; the error names the flag and the value.
fn value<T>(parser: &mut lexopt::Parser, flag: &str) -> Result<T, String>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let raw = parser
        .value()
        .map_err(|e| format!("--{flag}: {e}"))?
        .into_string()
        .map_err(|raw| format!("--{flag} {}: not UTF-8", raw.to_string_lossy()))?;
    raw.parse().map_err(|e| format!("--{flag} {raw}: {e}"))
}

fn parse_mix(s: &str) -> Result<[u32; 4], String> {
    let mut mix = [0u32; 4];
    for part in s.split(',') {
        let (tier, pct) = part
            .split_once('=')
            .ok_or_else(|| format!("mix: `{part}` is not tier=percent"))?;
        let name = tier.trim();
        let tier: Criticality = name.parse().map_err(|_| {
            format!("--mix: `{name}` is not a tier (critical, high, medium, sheddable)")
        })?;
        let pct: u32 = pct
            .trim()
            .parse()
            .map_err(|e| format!("--mix: `{}` for {tier}: {e}", pct.trim()))?;
        if pct > 100 {
            return Err(format!("--mix: {tier}={pct}: allowed 0..=100"));
        }
        mix[mix_index(tier)] = pct;
    }
    let sum = mix.iter().sum::<u32>();
    if sum != 100 {
        return Err(format!(
            "--mix: percentages add up to {sum}, must add up to 100"
        ));
    }
    Ok(mix)
}

/// Position of `tier` in `--mix` and `sim::Params::mix`: Critical first.
fn mix_index(tier: Criticality) -> usize {
    Criticality::ALL
        .iter()
        .position(|&t| t == tier)
        .unwrap_or_default()
}

fn per_tier<T: std::fmt::Display>(values: &PerTier<T>) -> String {
    values
        .iter()
        .map(|(tier, v)| format!("{} {v}", tier.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}; see --help");
            return ExitCode::from(2);
        }
    };
    // The runtime logs through `tracing`: a configuration reloaded (applied, with what
    // changed, or refused, with why) is one line on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_target(false)
        .init();
    // The runtime's own range for workers, checked before the capacity probe starts that
    // many workers, so a bad value is an error naming the field, not a panic.
    if let Some(workers) = std::num::NonZeroUsize::new(args.workers) {
        let probe = triage::runtime::RuntimeConfig {
            workers,
            ..triage::runtime::RuntimeConfig::default()
        };
        if let Err(e) = probe.validate() {
            eprintln!("error: --workers: {e}");
            return ExitCode::from(2);
        }
    }
    if args.failing_downstream {
        if args.service_ms <= 0.0 {
            eprintln!("error: --failing-downstream needs --service-ms above 0");
            return ExitCode::from(2);
        }
        let params = failing::Params {
            factor: args.failing_factor,
            mix: args.mix,
            duration: Duration::from_secs_f64(args.duration_s),
            workers: args.workers,
            service: Duration::from_secs_f64(args.service_ms / 1000.0),
            failing: Duration::from_secs_f64(args.failing_ms / 1000.0),
            failing_share: args.failing_share,
            windows: sim::Params::default().windows,
        };
        return if failing::main(&params).await {
            ExitCode::SUCCESS
        } else {
            eprintln!("error: a ledger does not balance");
            ExitCode::FAILURE
        };
    }
    // Kept alive for the whole run: dropping it stops the endpoint.
    let _metrics = match args.metrics {
        None => None,
        Some(addr) => match serve_metrics(addr) {
            Ok(server) => Some(server),
            Err(e) => {
                eprintln!("error: --metrics {addr}: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let base = match &args.config {
        None => None,
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                triage::runtime::RuntimeConfig::from_toml(&text).map_err(|e| e.to_string())
            }) {
            Ok(config) => Some(config),
            Err(e) => {
                eprintln!("error: --config {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
    };
    let params = sim::Params {
        factor: args.factor,
        mix: args.mix,
        duration: Duration::from_secs_f64(args.duration_s),
        recovery: Duration::from_secs_f64(args.recovery_s),
        workers: args.workers,
        service: Duration::from_secs_f64(args.service_ms / 1000.0),
        capacity: args.capacity,
        live: (!args.quiet).then_some(Duration::from_secs(1)),
        reload: args.config.clone(),
        ordering: args.ordering,
        keys: args.keys,
        ..sim::Params::default()
    };
    let params = match base {
        Some(base) => sim::Params {
            workers: base.workers.get(),
            base: Some(base),
            ..params
        },
        None => params,
    };
    if params.workers > MAX_WORKERS {
        eprintln!(
            "error: --config: workers {}: this run allows workers 1..={MAX_WORKERS}",
            params.workers
        );
        return ExitCode::from(2);
    }
    println!(
        "triage overload run: {} workers, {} service time, the FIFO's channel {} messages",
        params.workers,
        if args.service_ms == 0.0 {
            "no-op (0 ms)".to_owned()
        } else {
            format!("{:.1} ms", args.service_ms)
        },
        params.capacity,
    );
    match params.ordering {
        triage::ordering::OrderingMode::Key => {
            println!("ordering: key ({} keys)", params.keys)
        }
        mode => println!("ordering: {mode}"),
    }
    println!(
        "mix, percent of offered: {}",
        per_tier(&PerTier::from_fn(|t: Criticality| params.mix[mix_index(t)]))
    );
    println!(
        "deadlines, ms after publish: {}",
        per_tier(&params.windows.map(|_, d| d.as_millis()))
    );
    if !args.quiet {
        println!("measuring the workers' capacity (about a second)...");
    }
    let out = sim::run(&params).await;
    let offered: u64 = out.triage.iter().map(|(_, r)| r.offered).sum();
    if offered == 0 {
        eprintln!(
            "error: the overload phase offered no message ({:.1} msg/s x {} x {} s): raise --factor or --duration-s; see --help",
            out.capacity_per_s, params.factor, args.duration_s
        );
        return ExitCode::from(2);
    }
    println!(
        "\nmeasured capacity: {:.0} msg/s; offered {:.0} msg/s ({}x) for {:.1} s\n",
        out.capacity_per_s,
        out.capacity_per_s * params.factor,
        params.factor,
        args.duration_s
    );
    print!(
        "{}",
        sim::table(
            &format!("== triage at {}x (messages) ==", params.factor),
            &out.triage
        )
    );
    println!(
        "   admitted, refused, evicted: counted during the phase; goodput and late follow each message offered in it to its end;\n   goodput = completed inside the deadline (share: % of offered); late = completed after it;\n   refused = messages refused at admission (Critical and High are held and retried: backpressure, never dropped);\n   {} messages were still waiting in the broker at the end of the phase",
        out.broker_lag_after_overload
    );
    println!();
    print!(
        "{}",
        sim::fifo_table(
            &format!(
                "== plain bounded FIFO at {}x, same load (messages) ==",
                params.factor
            ),
            &out.fifo
        )
    );
    println!(
        "   a FIFO admits everything in arrival order and knows no tiers or deadlines: nothing is refused, deferred or expired,\n   so its only columns are what was served in time, late, or never ({} messages in all)\n",
        out.fifo_unserved
    );
    print!(
        "{}",
        sim::table(
            &format!("== recovery at {}x (messages) ==", params.recovery_factor),
            &out.recovery
        )
    );
    println!(
        "   shed level every 100 ms (tiers refused, 0 = all admitted): {:?}",
        out.recovery_shed_levels
    );
    println!(
        "   deferred copies drained back: {} completed, {} expired at intake (past their deadline: no handler call), {} deferred again;\n   each copy is consumed at the tier it was deferred with, and admitted counts it there\n",
        out.drained.completed, out.drained.expired, out.drained.deferred
    );
    let total = out.stats.ledger.total();
    let offered: u64 = out
        .triage
        .iter()
        .chain(out.recovery.iter())
        .map(|(_, r)| r.offered)
        .sum();
    println!(
        "== ledger (whole run, messages, by tier as classified) ==\n{}",
        out.stats.ledger
    );
    println!(
        "   offered {offered}, consumed {}: a deferred message drained back is consumed again, at its own tier,\n   so a tier's consumed exceeds what was offered of it by its drained copies",
        total.consumed
    );
    println!(
        "   still waiting in the deferred store at exit: {} messages{}",
        out.deferred_left,
        if out.drains_closed {
            " (the forced_shed_level keeps the drains closed: they come back once it is 0)"
        } else {
            ""
        }
    );
    println!(
        "ledger balances: {} (consumed {} = settled {} + released {} + still inside {})",
        if out.balances { "yes" } else { "NO" },
        total.consumed,
        total.settled(),
        total.released,
        out.stats.alive
    );
    let c = out.triage[Criticality::Critical];
    let f = out.fifo[Criticality::Critical];
    println!(
        "critical goodput: triage {:.1}% vs FIFO {:.1}% of offered",
        100.0 * c.goodput_share(),
        100.0 * f.goodput_share()
    );
    if !out.balances {
        eprintln!("error: the ledger does not balance");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(feature = "prometheus")]
fn serve_metrics(addr: SocketAddr) -> Result<triage::observe::MetricsServer, String> {
    let server = triage::observe::serve(addr).map_err(|e| e.to_string())?;
    println!(
        "metrics: http://{}/metrics (liveness: /healthz)",
        server.local_addr()
    );
    Ok(server)
}

#[cfg(not(feature = "prometheus"))]
fn serve_metrics(_addr: SocketAddr) -> Result<(), String> {
    Err("this build has no metrics endpoint: run with `--features prometheus`".into())
}
