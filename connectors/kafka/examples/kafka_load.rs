//! Produces a mixed-priority load to a topic at a given rate, for `kafka_worker`.
//!
//! ```text
//! cargo run --release -p triage-kafka --example kafka_load -- --topic orders --rate 2000 \
//!     --mix critical=10,high=20,medium=30,sheddable=40 --duration-s 30
//! ```
//!
//! Each record carries `triage-criticality` (drawn from the mix) and `triage-deadline-ms`
//! (now + `--deadline-ms`); mark the topic as trusted in the worker for them to count. Prints
//! what it produced per tier, acknowledged by the broker. The flags are the ones
//! `amqp_load` uses for the same things (`--rate`, `--duration-s`, `--count`, `--mix`,
//! `--deadline-ms`).

use std::error::Error;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use triage::Criticality;

#[derive(Debug, Parser)]
#[command(version, about = "produce a mixed-priority load to a Kafka topic")]
struct Args {
    /// Bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// Topic to produce to.
    #[arg(long)]
    topic: String,
    /// Records per second (0: as fast as the producer takes them).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// How long to produce, seconds.
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    /// Stop after this many records, if sooner.
    #[arg(long)]
    count: Option<u64>,
    /// Share of each tier, `tier=weight` comma-separated.
    #[arg(long, default_value = "critical=10,high=20,medium=30,sheddable=40")]
    mix: String,
    /// Deadline written on each record, milliseconds from when it is produced.
    #[arg(long, default_value_t = 5000)]
    deadline_ms: u64,
}

fn parse_mix(mix: &str) -> Result<Vec<(Criticality, u32)>, Box<dyn Error>> {
    mix.split(',')
        .map(|part| {
            let (tier, weight) = part.split_once('=').ok_or("mix entries are tier=weight")?;
            Ok((tier.parse::<Criticality>()?, weight.trim().parse::<u32>()?))
        })
        .collect()
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Args = parse_args();
    // The runtime and the connectors log through `tracing`: warnings and reloads on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .init();
    let mix = parse_mix(&args.mix)?;
    let total: u32 = mix.iter().map(|(_, w)| w).sum();
    if total == 0 {
        return Err("mix weights sum to zero".into());
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "5")
        .create()?;
    let period = (args.rate > 0).then(|| Duration::from_secs_f64(1.0 / args.rate as f64));
    let start = Instant::now();
    let end = start + Duration::from_secs(args.duration_s);
    // A progress line a second while producing.
    let mut shown = start;
    let limit = args.count.unwrap_or(u64::MAX);
    let mut sent = 0u64;
    let mut acked = [0u64; 4];
    let mut failed = 0u64;
    let mut pending = Vec::new();
    while Instant::now() < end && sent < limit {
        let mut pick = fastrand::u32(0..total);
        let tier = mix
            .iter()
            .find(|(_, w)| {
                let hit = pick < *w;
                pick = pick.saturating_sub(*w);
                hit
            })
            .map_or(Criticality::Medium, |(t, _)| *t);
        let deadline =
            SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64 + args.deadline_ms;
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "triage-criticality",
                value: Some(tier.as_str()),
            })
            .insert(Header {
                key: "triage-deadline-ms",
                value: Some(&deadline.to_string()),
            });
        let payload = format!("{tier} #{sent}");
        let record = FutureRecord::<(), _>::to(&args.topic)
            .payload(&payload)
            .headers(headers);
        match producer.send_result(record) {
            Ok(delivery) => pending.push((tier, delivery)),
            Err((err, _)) => {
                eprintln!("enqueue failed: {err}");
                failed += 1;
            }
        }
        sent += 1;
        if shown.elapsed() >= Duration::from_secs(1) {
            shown = Instant::now();
            println!(
                "[{:>4.0}s] sent {sent}, acknowledged {}",
                start.elapsed().as_secs_f64(),
                acked.iter().sum::<u64>()
            );
        }
        if pending.len() >= 1000 {
            for (tier, d) in pending.drain(..) {
                match d.await {
                    Ok(Ok(_)) => acked[tier as usize] += 1,
                    _ => failed += 1,
                }
            }
        }
        if let Some(period) = period {
            let due = start + period.mul_f64(sent as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                tokio::time::sleep(wait).await;
            }
        }
    }
    for (tier, d) in pending {
        match d.await {
            Ok(Ok(_)) => acked[tier as usize] += 1,
            _ => failed += 1,
        }
    }
    let elapsed = start.elapsed();
    println!(
        "produced {} records to {} in {:.1} s ({:.0} msg/s), acknowledged by the broker: {}; failed {failed}",
        acked.iter().sum::<u64>(),
        args.topic,
        elapsed.as_secs_f64(),
        acked.iter().sum::<u64>() as f64 / elapsed.as_secs_f64(),
        Criticality::ALL
            .iter()
            .map(|t| format!("{} {}", t.as_str(), acked[*t as usize]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
