//! The proving ground: triage over real Kafka and RabbitMQ, at 1x, 3x and 10x the worker's
//! measured capacity, then under faults (kill -9 of the worker, a broker restart, a second
//! Kafka consumer joining and leaving), with every produced id reconciled afterwards.
//!
//! ```text
//! tests/brokers/up.sh
//! cargo run --release -p triage-proving-ground -- --broker both --factors 0.8,1,3,10 \
//!     --seconds 20 --kills 5 --broker-restart --group-churn --out target/proving-ground
//! ```
//!
//! Roles, one file each: `load` (paced producers with unique ids), `worker` (the worker
//! process: the `worker` subcommand), `faults` (processes, kills, restarts), `brokers`
//! (topics, queues, reading the stores back, broker scripts), `reconcile` (logs against what
//! was produced), `report` (Markdown and SVG), `harness` (the phases).
//!
//! Each worker's warnings go to `worker-<n>.out` beside its disposition log; set
//! `PROVING_GROUND_LOG` (a `tracing` filter such as `warn,triage_kafka=debug`) for more, and
//! `PROVING_GROUND_KAFKA_DEBUG` (librdkafka `debug` contexts such as `cgrp,fetch`, logged under
//! `librdkafka=debug`) to see the consumer group at work. `PROVING_GROUND_SHARE_RESERVE_MS`
//! overrides the workers' `share_reserve_ms` and `PROVING_GROUND_WORK_CONSERVING` their
//! `work_conserving` (diagnosis and measurement only). Each worker also appends the
//! pull admission's gauges (`triage_shed_level`, `triage_arrival_rate`, `triage_capacity`,
//! `triage_lag`, `triage_in_flight`) every 250 ms to `worker-<n>.gauges`.

mod brokers;
mod faults;
mod harness;
mod load;
mod prom;
mod reconcile;
mod report;
mod scale;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "triage under overload and faults on real Kafka and RabbitMQ"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one worker process (started by the harness).
    Worker(worker::WorkerArgs),
    /// Scale-out: several worker processes in one Kafka consumer group (competing consumers
    /// on one RabbitMQ queue) at 3x their combined capacity, a kill -9 and a worker joining
    /// and leaving, scraped by a real Prometheus with deploy/'s rules (see src/scale.rs).
    Scale(scale::ScaleArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Which {
    Kafka,
    Amqp,
    Both,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Broker(s) to prove on.
    #[arg(long, value_enum, default_value = "both")]
    broker: Which,
    /// Load factors, multiples of the measured capacity.
    #[arg(long, value_delimiter = ',', default_value = "0.8,1,3,10")]
    factors: Vec<f64>,
    /// Length of each load phase, seconds.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Handler service time, milliseconds. With 8 tasks, 10 ms gives a capacity of about
    /// 700 msg/s, so 10x is about 7,000 msg/s: what one broker, the load generator and the
    /// worker sharing two cores carry. At 2 ms (about 2,500 msg/s, 10x = 25,000 msg/s) the
    /// broker, not the worker, is what gives way at 10x.
    #[arg(long, default_value_t = 10)]
    service_ms: u64,
    /// Worker tasks per worker process (fixed concurrency). Below about 8 the tier shares of
    /// the concurrency limit round down to the same slot count for several tiers.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Runtime queue capacity, messages (`expert.queue.capacity`). Default: the runtime's own
    /// (the zero-configuration default, its queue bounded from what it measures).
    #[arg(long)]
    capacity: Option<usize>,
    /// kill -9 of the worker during the fault phase (0 with no other fault: no fault phase).
    #[arg(long, default_value_t = 5)]
    kills: usize,
    /// Restart the broker once during the fault phase.
    #[arg(long)]
    broker_restart: bool,
    /// Kafka: a second worker joins the consumer group and leaves it during the fault phase.
    #[arg(long)]
    group_churn: bool,
    /// Load factor of the fault phase.
    #[arg(long, default_value_t = 3.0)]
    fault_factor: f64,
    /// Length of the fault phase, seconds.
    #[arg(long, default_value_t = 60)]
    fault_seconds: u64,
    /// Deadline windows per tier in ms, Critical,High,Medium,Sheddable.
    #[arg(long, value_delimiter = ',', default_value = "3000,1500,800,400")]
    windows_ms: Vec<u64>,
    /// Poison messages per thousand (the handler fails them; dead-lettered).
    #[arg(long, default_value_t = 1)]
    poison_permille: u32,
    /// Output directory (worker logs and stats per phase; the report too unless --report).
    #[arg(long, default_value = "target/proving-ground")]
    out: PathBuf,
    /// One topic (queue) for every tier, labelled by header, or a topic (queue) per tier
    /// (`<topic>.<tier>`) mapped to its tier by the source, whose shed tiers are paused.
    #[arg(long, value_enum, default_value = "mixed")]
    layout: worker::Layout,
    /// Restart phase: seconds of 3x traffic accumulated while no worker runs, then served
    /// while arrivals continue at 1x for --seconds (0: no restart phase).
    #[arg(long, default_value_t = 0)]
    restart_backlog: u64,
    /// With --restart-backlog: run the restart phase a second time with a plain FIFO consumer
    /// (rdkafka or lapin, --workers tasks, the same handler) for the baseline.
    #[arg(long)]
    restart_fifo: bool,
    /// Directory for `proving-ground.md` and `proving-ground.svg` (default: --out).
    #[arg(long)]
    report: Option<PathBuf>,
}

/// The flags; `--help` and `--version` print and exit, and a wrong flag is one line that
/// points at `--help` (not the whole help, which would scroll the error away).
fn parse_args<A: Parser>() -> A {
    A::try_parse().unwrap_or_else(|e| {
        use clap::error::ErrorKind;
        match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or_default();
                eprintln!("{}; see --help", first.trim_end_matches('.'));
                std::process::exit(2);
            }
        }
    })
}

fn main() -> ExitCode {
    let cli: Cli = parse_args();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    if let Some(Command::Worker(args)) = cli.command {
        return match runtime.block_on(worker::run(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Scale(args)) = cli.command {
        return run_scale(&runtime, &args);
    }
    let a = cli.run;
    let windows: [u64; 4] = a
        .windows_ms
        .clone()
        .try_into()
        .expect("--windows-ms takes four values");
    let config = harness::RunConfig {
        brokers: match a.broker {
            Which::Kafka => vec![worker::BrokerKind::Kafka],
            Which::Amqp => vec![worker::BrokerKind::Amqp],
            Which::Both => vec![worker::BrokerKind::Kafka, worker::BrokerKind::Amqp],
        },
        factors: a.factors.clone(),
        phase: Duration::from_secs(a.seconds),
        capacity_phase: Duration::from_secs(5),
        service_ms: a.service_ms,
        workers: a.workers,
        queue_capacity: a.capacity,
        mix: [10, 20, 30, 40],
        windows_ms: windows,
        poison_permille: a.poison_permille,
        kills: a.kills,
        broker_restart: a.broker_restart,
        group_churn: a.group_churn,
        fault_factor: a.fault_factor,
        fault_phase: Duration::from_secs(a.fault_seconds),
        settle_limit: Duration::from_secs(120),
        out: a.out.clone(),
        launcher: faults::Launcher::Subcommand,
        layout: a.layout,
        restart_backlog: Duration::from_secs(a.restart_backlog),
        restart_fifo: a.restart_fifo,
    };
    let command = format!(
        "cargo run --release -p triage-proving-ground -- {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let results = runtime.block_on(harness::run(&config));
    let report_dir = a.report.clone().unwrap_or_else(|| a.out.clone());
    let md = report::write(&report_dir, &config, &results, &command).expect("write the report");
    println!("{md}");
    println!(
        "report: {}",
        report_dir.join("proving-ground.md").to_string_lossy()
    );
    let unaccounted: usize = results
        .iter()
        .flat_map(|b| b.phases.iter())
        .map(|p| p.rec.unaccounted.len())
        .sum();
    if unaccounted > 0 {
        eprintln!("error: {unaccounted} ids unaccounted for");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn run_scale(runtime: &tokio::runtime::Runtime, args: &scale::ScaleArgs) -> ExitCode {
    let command = format!(
        "cargo run --release -p triage-proving-ground -- {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let results = match runtime.block_on(scale::run(args, faults::Launcher::Subcommand)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = args.report.clone().unwrap_or_else(|| args.out.clone());
    let md = scale::write_report(&dir, args, &results, &command).expect("write the report");
    println!("{md}");
    println!("report: {}", dir.join("scale-out.md").to_string_lossy());
    let unaccounted: usize = results.iter().map(|r| r.rec.unaccounted.len()).sum();
    if unaccounted > 0 {
        eprintln!("error: {unaccounted} ids unaccounted for");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
