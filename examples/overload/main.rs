//! The main job on the embedded default: triage under 3x overload, next to a plain FIFO.
//!
//! ```text
//! cargo run --release --example overload
//! cargo run --release --example overload -- --factor 10 --mix 10,20,30,40 --duration 10 --workers 8
//! ```
//!
//! An in-memory broker is fed at `--factor` times the workers' measured capacity (a handler
//! with a fixed service time), with the tier mix `--mix` (percent, Critical first) and a
//! deadline per tier. It prints, per tier, what triage did; then the same offered load through
//! a plain bounded FIFO; then load falls to 0.5x and every tier is admitted again without a
//! manual step, while the deferred work drains back.

mod sim;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use triage::Criticality;

#[derive(Parser, Debug)]
#[command(about = "triage under overload, next to a plain FIFO")]
struct Args {
    /// Offered load as a multiple of the measured capacity.
    #[arg(long, default_value_t = 3.0)]
    factor: f64,
    /// Tier mix in percent, Critical,High,Medium,Sheddable.
    #[arg(long, default_value = "10,20,30,40", value_parser = parse_mix)]
    mix: [u32; 4],
    /// Overload phase, seconds.
    #[arg(long, default_value_t = 8.0)]
    duration: f64,
    /// Recovery phase at 0.5x, seconds.
    #[arg(long, default_value_t = 4.0)]
    recovery: f64,
    /// Worker tasks.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Handler service time, milliseconds.
    #[arg(long, default_value_t = 2.0)]
    service_ms: f64,
    /// Queue capacity, items.
    #[arg(long, default_value_t = 256)]
    capacity: usize,
}

fn parse_mix(s: &str) -> Result<[u32; 4], String> {
    let parts: Vec<u32> = s
        .split(',')
        .map(|p| p.trim().parse::<u32>().map_err(|e| format!("mix: {e}")))
        .collect::<Result<_, _>>()?;
    let mix: [u32; 4] = parts
        .try_into()
        .map_err(|_| "mix: four percentages, Critical,High,Medium,Sheddable".to_string())?;
    if mix.iter().sum::<u32>() != 100 {
        return Err("mix: percentages must add up to 100".into());
    }
    Ok(mix)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if !(args.factor > 0.0
        && args.duration > 0.0
        && args.service_ms > 0.0
        && args.workers > 0
        && args.capacity > 0)
    {
        eprintln!(
            "error: --factor, --duration, --service-ms, --workers and --capacity must be positive"
        );
        return ExitCode::from(2);
    }
    let params = sim::Params {
        factor: args.factor,
        mix: args.mix,
        duration: Duration::from_secs_f64(args.duration),
        recovery: Duration::from_secs_f64(args.recovery.max(0.5)),
        workers: args.workers,
        service: Duration::from_secs_f64(args.service_ms / 1000.0),
        capacity: args.capacity,
        ..sim::Params::default()
    };
    println!(
        "triage overload run: {} workers, {:.1} ms service time, queue capacity {}, mix {:?}, deadlines {:?}",
        params.workers,
        args.service_ms,
        params.capacity,
        params.mix,
        params.windows.map(|_, d| d.as_millis())
    );
    let out = sim::run(&params).await;
    println!(
        "measured capacity: {:.0} msg/s; offered {:.0} msg/s ({}x) for {:.1} s\n",
        out.capacity_per_s,
        out.capacity_per_s * params.factor,
        params.factor,
        args.duration
    );
    print!(
        "{}",
        sim::table(&format!("== triage at {}x ==", params.factor), &out.triage)
    );
    println!(
        "   admitted, refused, evicted: counted during the phase; goodput and late follow each message offered in it to its end;\n   goodput = completed inside the deadline; late = completed after it (deferred work drained back later);\n   refused = messages refused at admission (Critical and High are held and retried: backpressure, never dropped);\n   {} messages were still waiting in the broker at the end of the phase",
        out.broker_lag_after_overload
    );
    println!();
    print!(
        "{}",
        sim::table(
            &format!("== plain bounded FIFO at {}x, same load ==", params.factor),
            &out.fifo
        )
    );
    println!(
        "   ({} messages never served by the end of the phase)\n",
        out.fifo_unserved
    );
    print!(
        "{}",
        sim::table(
            &format!("== recovery at {}x ==", params.recovery_factor),
            &out.recovery
        )
    );
    println!(
        "   shed level every 100 ms (tiers refused, 0 = all admitted): {:?}",
        out.recovery_shed_levels
    );
    println!(
        "   deferred work drained back and completed: {}\n",
        out.drained_back
    );
    println!(
        "== ledger (whole run, by tier as classified) ==\n{}",
        out.stats
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
