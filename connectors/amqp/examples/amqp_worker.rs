//! A triage worker on a RabbitMQ queue: classify by priority, serve within a bounded queue,
//! defer what it cannot serve to a durable queue, dead-letter what fails.
//!
//! ```text
//! tests/brokers/rabbitmq.sh start
//! cargo run -p triage-amqp --example amqp_load -- --queue triage-orders --count 20000
//! cargo run -p triage-amqp --example amqp_worker -- --queue triage-orders --handler-ms 2 --seconds 20
//! ```
//!
//! Prints the ledger (per tier: consumed, completed, deferred, shed...) every second and at
//! the end. Deferred work is drained back from `<queue>.deferred` when load falls. Ctrl-C or
//! `--seconds` stops it gracefully: what finished is acked before the
//! channel closes, the rest is redelivered later.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use triage::queue::WfqConfig;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
use triage_amqp::{AmqpDeferSink, AmqpMessage, AmqpSinkConfig, AmqpSource, AmqpSourceConfig};

#[derive(Debug, Parser)]
struct Args {
    /// Broker URI.
    #[arg(long, default_value = "amqp://127.0.0.1:5672/%2f")]
    uri: String,
    /// Queue to consume.
    #[arg(long, default_value = "triage-orders")]
    queue: String,
    /// Runtime queue capacity (the prefetch is at most this).
    #[arg(long, default_value_t = 1_000)]
    capacity: usize,
    /// basic.qos prefetch.
    #[arg(long, default_value_t = 500)]
    prefetch: u16,
    /// Worker tasks.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Simulated handler time, milliseconds.
    #[arg(long, default_value_t = 5)]
    handler_ms: u64,
    /// Stop after this many seconds (0: until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
    /// Shutdown grace, seconds.
    #[arg(long, default_value_t = 10)]
    grace: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let capacity = NonZeroUsize::new(args.capacity).ok_or("--capacity must be at least 1")?;

    let mut source_config = AmqpSourceConfig::new(&args.uri, &args.queue);
    source_config.prefetch = args.prefetch;
    // Failures go to our own dead-letter queue, so the source only acks them.
    source_config.dead_letter_via_sink = true;
    let source = AmqpSource::connect(source_config, capacity).await?;
    let defer = AmqpDeferSink::connect(AmqpSinkConfig::new(
        &args.uri,
        format!("{}.deferred", args.queue),
    ))
    .await?;
    let dead = AmqpDeferSink::connect(AmqpSinkConfig::new(
        &args.uri,
        format!("{}.dead", args.queue),
    ))
    .await?;

    let config = RuntimeConfig {
        workers: NonZeroUsize::new(args.workers).ok_or("--workers must be at least 1")?,
        queue: WfqConfig::with_capacity(capacity.get()),
        ..RuntimeConfig::default()
    };
    let handler_time = Duration::from_millis(args.handler_ms);
    let mut runtime = Runtime::builder(config)
        .defer_sink(Arc::new(defer))
        .dead_letter_sink(Arc::new(dead))
        .start(move |job: Job<AmqpMessage>| async move {
            if job.load().is_overloaded() {
                // Brownout: a real handler would skip optional work here.
            }
            tokio::time::sleep(handler_time).await;
            if job.payload().body().is_empty() {
                return Err(HandlerError::permanent("empty body"));
            }
            Ok(())
        })?;
    runtime.attach(source);
    // Deferred work comes back as Sheddable, pulled only while the Sheddable tier is
    // admitted and workers are idle.
    let mut drain_config = AmqpSourceConfig::drain(&args.uri, format!("{}.deferred", args.queue));
    drain_config.prefetch = args.prefetch;
    drain_config.dead_letter_via_sink = true;
    runtime.attach_drain(AmqpSource::connect(drain_config, capacity).await?);

    let stop = async {
        if args.seconds > 0 {
            tokio::time::sleep(Duration::from_secs(args.seconds)).await;
        } else {
            let _ = tokio::signal::ctrl_c().await;
        }
    };
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                let stats = runtime.stats();
                println!("load {:?} queued {} running {}\n{}", runtime.load(), stats.queued, stats.running, stats.ledger);
            }
        }
    }
    let report = runtime.shutdown(Duration::from_secs(args.grace)).await;
    println!(
        "stopped in {:.2?} (grace exceeded: {})\n{}",
        report.elapsed, report.grace_exceeded, report.stats.ledger
    );
    Ok(())
}
