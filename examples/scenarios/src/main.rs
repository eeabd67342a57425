//! `triage-scenarios`: the scenario matrix of issue 33 in virtual time, and its report.
//!
//! ```text
//! cargo run --release -p triage-scenarios                         # FIFO and defaults
//! cargo run --release -p triage-scenarios -- --grid --out examples/scenarios/REPORT.md
//! cargo run --release -p triage-scenarios -- --scenario step-3x --real-time
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use triage::Criticality;
use triage_scenarios::grid::{points, search};
use triage_scenarios::report::{render, Row};
use triage_scenarios::run::real_capacity;
use triage_scenarios::scenario::by_name;
use triage_scenarios::{matrix, run_real_time, run_virtual, Consumer, Outcome, Scenario};

const USAGE: &str = "\
The scenario matrix of issue 33: a plain FIFO, triage's defaults before the zero-configuration
controller, (with --grid) the best hand-tuned settings, and the zero-configuration default
(RuntimeConfig::default()), per scenario and tier, in virtual time.

Usage: cargo run --release -p triage-scenarios -- [OPTIONS]

Options:
      --scenario <NAME>  Run this scenario (repeatable) [default: all twelve]
      --grid             Search the grid of hand-tuned settings (the best per scenario)
      --threads <N>      Threads for the grid search, 1..=64 [default: 2]
      --scale <X>        Multiply every scenario's length by X, 0.01..=10 [default: 1]
      --out <FILE>       Write the report there instead of standard output
      --real-time        Cross-check: run the scenarios in virtual and in real time (as long
                         as they last) and print both
  -h, --help             Print help
";

struct Args {
    scenarios: Vec<Scenario>,
    grid: bool,
    threads: usize,
    scale: f64,
    out: Option<std::path::PathBuf>,
    real_time: bool,
}

fn parse() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut args = Args {
        scenarios: Vec::new(),
        grid: false,
        threads: 2,
        scale: 1.0,
        out: None,
        real_time: false,
    };
    let mut p = lexopt::Parser::from_env();
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Long("scenario") => {
                let name = p
                    .value()
                    .map_err(|e| e.to_string())?
                    .string()
                    .map_err(|_| "--scenario: not UTF-8")?;
                let sc = by_name(&name).ok_or_else(|| {
                    let names: Vec<_> = matrix().iter().map(|s| s.name).collect();
                    format!("--scenario {name}: unknown; one of {}", names.join(", "))
                })?;
                args.scenarios.push(sc);
            }
            Long("grid") => args.grid = true,
            Long("real-time") => args.real_time = true,
            Long("threads") => {
                let n: usize = p
                    .value()
                    .map_err(|e| e.to_string())?
                    .parse()
                    .map_err(|e| format!("--threads: {e}"))?;
                if !(1..=64).contains(&n) {
                    return Err(format!("--threads {n}: allowed 1..=64"));
                }
                args.threads = n;
            }
            Long("scale") => {
                let x: f64 = p
                    .value()
                    .map_err(|e| e.to_string())?
                    .parse()
                    .map_err(|e| format!("--scale: {e}"))?;
                if !(0.01..=10.0).contains(&x) {
                    return Err(format!("--scale {x}: allowed 0.01..=10"));
                }
                args.scale = x;
            }
            Long("out") => args.out = Some(p.value().map_err(|e| e.to_string())?.into()),
            Short('h') | Long("help") => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("{}; see --help", other.unexpected())),
        }
    }
    if args.scenarios.is_empty() {
        args.scenarios = matrix();
    }
    if args.scale != 1.0 {
        args.scenarios = args
            .scenarios
            .iter()
            .map(|s| s.scaled(args.scale))
            .collect();
    }
    Ok(args)
}

fn same(a: &Outcome, b: &Outcome) -> bool {
    a.goodput == b.goodput
        && a.stats.map(|s| s.ledger) == b.stats.map(|s| s.ledger)
        && a.shed_series == b.shed_series
        && a.cohort_series == b.cohort_series
        && a.offers == b.offers
}

fn cross_check(scenarios: &[Scenario]) {
    println!("| scenario | consumer | tier | virtual | real time | difference (points) |");
    println!("|---|---|---|---:|---:|---:|");
    for sc in scenarios {
        // Real timers overshoot: "1x" is the capacity they leave, measured first.
        let measured = real_capacity(sc, Duration::from_secs(3));
        let real = Scenario {
            rate_scale: measured / sc.capacity_per_s(),
            ..sc.clone()
        };
        eprintln!(
            "{}: capacity on real timers {measured:.0} msg/s ({:.2} of nominal)",
            sc.name, real.rate_scale
        );
        for (label, consumer) in [
            ("FIFO", Consumer::fifo()),
            ("zero-config", Consumer::zero_config()),
        ] {
            let v = run_virtual(sc, &consumer);
            let r = run_real_time(&real, &consumer);
            for tier in Criticality::ALL {
                let (a, b) = (v.goodput.share(tier), r.goodput.share(tier));
                println!(
                    "| {} | {label} | {} | {:.1} | {:.1} | {:+.1} |",
                    sc.name,
                    tier.as_str(),
                    100.0 * a,
                    100.0 * b,
                    100.0 * (b - a)
                );
            }
            let (a, b) = (v.goodput.weighted(), r.goodput.weighted());
            println!(
                "| {} | {label} | weighted | {:.1} | {:.1} | {:+.1} |",
                sc.name,
                100.0 * a,
                100.0 * b,
                100.0 * (b - a)
            );
        }
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.real_time {
        cross_check(&args.scenarios);
        return ExitCode::SUCCESS;
    }
    let start = Instant::now();
    let mut runs = Vec::new();
    for sc in &args.scenarios {
        let fifo = run_virtual(sc, &Consumer::fifo());
        let defaults = run_virtual(sc, &Consumer::previous_defaults());
        let zero = run_virtual(sc, &Consumer::zero_config());
        let again = run_virtual(sc, &Consumer::zero_config());
        let deterministic = same(&zero, &again);
        eprintln!(
            "{}: FIFO {:.1}% defaults {:.1}% zero-config {:.1}% weighted ({:.1} s)",
            sc.name,
            100.0 * fifo.goodput.weighted(),
            100.0 * defaults.goodput.weighted(),
            100.0 * zero.goodput.weighted(),
            start.elapsed().as_secs_f64()
        );
        runs.push((fifo, defaults, zero, deterministic));
    }
    let found = args.grid.then(|| {
        eprintln!(
            "grid: {} points x {} scenarios on {} threads",
            points().len(),
            args.scenarios.len(),
            args.threads
        );
        search(&args.scenarios, &points(), args.threads)
    });
    let rows: Vec<Row<'_>> = args
        .scenarios
        .iter()
        .zip(&runs)
        .map(|(scenario, (fifo, defaults, zero, deterministic))| Row {
            scenario,
            fifo,
            defaults,
            zero,
            deterministic: *deterministic,
        })
        .collect();
    let mut command = "cargo run --release -p triage-scenarios --".to_string();
    if args.grid {
        command.push_str(" --grid");
    }
    if args.scale != 1.0 {
        command.push_str(&format!(" --scale {}", args.scale));
    }
    if let Some(out) = &args.out {
        command.push_str(&format!(" --out {}", out.display()));
    }
    let report = render(
        &rows,
        found.as_ref(),
        command.trim_end_matches(" --"),
        start.elapsed(),
    );
    match &args.out {
        Some(path) => {
            if let Err(e) = std::fs::write(path, report) {
                eprintln!("error: writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
        None => print!("{report}"),
    }
    ExitCode::SUCCESS
}
