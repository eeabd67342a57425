//! Publishes a load of prioritised messages to a RabbitMQ queue, for `amqp_worker`.
//!
//! ```text
//! tests/brokers/rabbitmq.sh start
//! cargo run -p triage-amqp --example amqp_load -- --queue orders --count 10000 --critical-every 10
//! ```
//!
//! Every message is persistent and confirmed; priorities follow the default mapping
//! (0-2 Sheddable, 3-4 Medium, 5-7 High, 8+ Critical). With `--deadline-ms` each message
//! carries `triage-deadline-ms` that far in the future.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

#[derive(Debug, Parser)]
struct Args {
    /// Broker URI.
    #[arg(long, default_value = "amqp://127.0.0.1:5672/%2f")]
    uri: String,
    /// Queue to fill (declared durable).
    #[arg(long, default_value = "triage-orders")]
    queue: String,
    /// Messages to publish.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    /// Body size, bytes.
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Every n-th message is Critical (priority 9); the rest cycle through 0..=7.
    #[arg(long, default_value_t = 10)]
    critical_every: u64,
    /// Deadline from now, milliseconds (0: none).
    #[arg(long, default_value_t = 0)]
    deadline_ms: u64,
    /// Messages per second (0: as fast as confirms allow).
    #[arg(long, default_value_t = 0)]
    rate: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
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
    let started = std::time::Instant::now();
    let pace = (args.rate > 0).then(|| Duration::from_secs_f64(1.0 / args.rate as f64));
    for i in 0..args.count {
        let priority = if args.critical_every > 0 && i % args.critical_every == 0 {
            9
        } else {
            (i % 8) as u8
        };
        let mut headers = FieldTable::default();
        if args.deadline_ms > 0 {
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
            headers.insert(
                "triage-deadline-ms".into(),
                AMQPValue::LongLongInt(now + args.deadline_ms as i64),
            );
        }
        ch.basic_publish(
            "",
            &args.queue,
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default()
                .with_priority(priority)
                .with_delivery_mode(2)
                .with_message_id(format!("m-{i}").into())
                .with_headers(headers),
        )
        .await?;
        if i % 1_000 == 999 {
            ch.wait_for_confirms().await?;
        }
        if let Some(pace) = pace {
            tokio::time::sleep(pace).await;
        }
    }
    ch.wait_for_confirms().await?;
    println!(
        "published {} messages to {} in {:.2?}",
        args.count,
        args.queue,
        started.elapsed()
    );
    conn.close(200, "done").await?;
    Ok(())
}
