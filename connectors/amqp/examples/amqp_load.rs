//! Publishes a mixed-priority load to a RabbitMQ queue, for `amqp_worker`.
//!
//! ```text
//! tests/brokers/rabbitmq.sh start
//! cargo run --release -p triage-amqp --example amqp_load -- --queue orders --rate 2000 --duration-s 10
//! ```
//!
//! Every message is persistent and confirmed; its AMQP `priority` comes from its tier, drawn
//! from `--mix` (Critical 9, High 6, Medium 4, Sheddable 1: the default mapping reads 8+ as
//! Critical, 5-7 High, 3-4 Medium, 0-2 Sheddable). With `--deadline-ms` each message carries
//! `triage-deadline-ms` that far in the future. Prints what it published per tier, confirmed
//! by the broker. The flags are the ones `kafka_load` uses for the same things (`--rate`,
//! `--duration-s`, `--count`, `--mix`, `--deadline-ms`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use triage::Criticality;

#[derive(Debug, Parser)]
#[command(version, about = "publish a mixed-priority load to a RabbitMQ queue")]
struct Args {
    /// Broker URI.
    #[arg(long, default_value = "amqp://127.0.0.1:5672/%2f")]
    uri: String,
    /// Queue to fill (declared durable).
    #[arg(long, default_value = "triage-orders")]
    queue: String,
    /// Messages per second (0: as fast as confirms allow).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// How long to publish, seconds.
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    /// Stop after this many messages, if sooner.
    #[arg(long)]
    count: Option<u64>,
    /// Share of each tier, `tier=weight` comma-separated.
    #[arg(long, default_value = "critical=10,high=20,medium=30,sheddable=40")]
    mix: String,
    /// Deadline written on each message, milliseconds from when it is published (0: none).
    #[arg(long, default_value_t = 0)]
    deadline_ms: u64,
    /// Body size, bytes.
    #[arg(long, default_value_t = 256)]
    size: usize,
}

fn parse_mix(mix: &str) -> Result<Vec<(Criticality, u32)>, Box<dyn std::error::Error>> {
    mix.split(',')
        .map(|part| {
            let (tier, weight) = part.split_once('=').ok_or("mix entries are tier=weight")?;
            Ok((tier.parse::<Criticality>()?, weight.trim().parse::<u32>()?))
        })
        .collect()
}

fn priority(tier: Criticality) -> u8 {
    match tier {
        Criticality::Critical => 9,
        Criticality::High => 6,
        Criticality::Medium => 4,
        Criticality::Sheddable => 1,
    }
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
async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
    let props = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    let conn = Connection::connect(&args.uri, props).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    ch.queue_declare(
        &args.queue,
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await?;
    let body = vec![b'x'; args.size];
    let start = Instant::now();
    let end = start + Duration::from_secs(args.duration_s);
    // A progress line a second while producing.
    let mut shown = start;
    let limit = args.count.unwrap_or(u64::MAX);
    let period = (args.rate > 0).then(|| Duration::from_secs_f64(1.0 / args.rate as f64));
    let mut confirmed = [0u64; 4];
    let mut nacked = 0u64;
    let mut pending = Vec::new();
    let mut sent = 0u64;
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
        let mut headers = FieldTable::default();
        if args.deadline_ms > 0 {
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
            headers.insert(
                "triage-deadline-ms".into(),
                AMQPValue::LongLongInt(now + args.deadline_ms as i64),
            );
        }
        let confirm = ch
            .basic_publish(
                "",
                &args.queue,
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default()
                    .with_priority(priority(tier))
                    .with_delivery_mode(2)
                    .with_message_id(format!("m-{sent}").into())
                    .with_headers(headers),
            )
            .await?;
        pending.push((tier, confirm));
        sent += 1;
        if shown.elapsed() >= Duration::from_secs(1) {
            shown = Instant::now();
            println!(
                "[{:>4.0}s] sent {sent}, confirmed {}",
                start.elapsed().as_secs_f64(),
                confirmed.iter().sum::<u64>()
            );
        }
        if pending.len() >= 1_000 {
            settle(&mut pending, &mut confirmed, &mut nacked).await;
        }
        if let Some(period) = period {
            let due = start + period.mul_f64(sent as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                tokio::time::sleep(wait).await;
            }
        }
    }
    settle(&mut pending, &mut confirmed, &mut nacked).await;
    let elapsed = start.elapsed();
    println!(
        "published {} messages to {} in {:.1} s ({:.0} msg/s), confirmed by the broker: {}; not confirmed {nacked}",
        confirmed.iter().sum::<u64>(),
        args.queue,
        elapsed.as_secs_f64(),
        confirmed.iter().sum::<u64>() as f64 / elapsed.as_secs_f64(),
        Criticality::ALL
            .iter()
            .map(|t| format!("{} {}", t.as_str(), confirmed[*t as usize]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    conn.close(200, "done").await?;
    Ok(())
}

/// Awaits the broker's confirm of each pending publish, counting acks per tier and the rest
/// (negative confirms, or the channel lost before confirming) as not confirmed.
async fn settle(
    pending: &mut Vec<(Criticality, lapin::publisher_confirm::PublisherConfirm)>,
    confirmed: &mut [u64; 4],
    nacked: &mut u64,
) {
    for (tier, confirm) in pending.drain(..) {
        match confirm.await {
            Ok(c) if c.is_ack() => confirmed[tier as usize] += 1,
            _ => *nacked += 1,
        }
    }
}
