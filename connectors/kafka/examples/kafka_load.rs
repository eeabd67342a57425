//! Produces a mixed-priority load to a topic at a given rate.
//!
//! ```text
//! cargo run -p triage-kafka --example kafka_load -- --topic orders --rate 2000 \
//!     --mix critical=10,high=20,medium=30,sheddable=40 --duration 30
//! ```
//!
//! Each record carries `triage-criticality` (drawn from the mix) and `triage-deadline-ms`
//! (now + `--deadline-ms`); mark the topic as trusted in the worker for them to count.

use std::error::Error;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use triage::Criticality;

#[derive(Debug, Parser)]
struct Args {
    /// Bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// Topic to produce to.
    #[arg(long)]
    topic: String,
    /// Records per second.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Share of each tier, `tier=weight` comma-separated.
    #[arg(long, default_value = "critical=10,high=20,medium=30,sheddable=40")]
    mix: String,
    /// How long to produce, in seconds.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Deadline written on each record, in milliseconds from now.
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    let mix = parse_mix(&args.mix)?;
    let total: u32 = mix.iter().map(|(_, w)| w).sum();
    if total == 0 {
        return Err("mix weights sum to zero".into());
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "5")
        .create()?;
    let period = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    let start = Instant::now();
    let end = start + Duration::from_secs(args.duration);
    let mut sent = 0u64;
    let mut pending = Vec::new();
    while Instant::now() < end {
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
            Ok(delivery) => pending.push(delivery),
            Err((err, _)) => eprintln!("enqueue failed: {err}"),
        }
        sent += 1;
        if pending.len() >= 1000 {
            for d in pending.drain(..) {
                let _ = d.await;
            }
        }
        let due = start + period.mul_f64(sent as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
    for d in pending {
        let _ = d.await;
    }
    println!(
        "produced {sent} records to {} in {:?}",
        args.topic,
        start.elapsed()
    );
    Ok(())
}
