//! Consumes a mixed-priority topic through the triage runtime, defers overflow to
//! `<topic>.deferred` (drained back while the load allows), and prints the ledger on exit.
//!
//! ```text
//! tests/brokers/kafka.sh start
//! cargo run -p triage-kafka --example kafka_load -- --topic orders --rate 6000 --duration 30 &
//! cargo run -p triage-kafka --example kafka_worker -- --topic orders --work-ms 5 --duration 40
//! ```

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
use triage_kafka::{
    drain, KafkaDeferSink, KafkaMessage, KafkaSinkConfig, KafkaSource, KafkaSourceConfig,
};

#[derive(Debug, Parser)]
struct Args {
    /// Bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// Topic to consume (its producers are trusted to label criticality).
    #[arg(long)]
    topic: String,
    /// Consumer group.
    #[arg(long, default_value = "triage-worker")]
    group: String,
    /// Simulated work per message, in milliseconds.
    #[arg(long, default_value_t = 5)]
    work_ms: u64,
    /// Worker tasks.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Messages the intake holds under backpressure before it pauses the partition (the
    /// runtime's `max_held`; default: the runtime's).
    #[arg(long)]
    max_held: Option<usize>,
}

async fn ensure_topic(brokers: &str, topic: &str) -> Result<(), Box<dyn Error>> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    // An "already exists" result is fine: the topic is reused across runs.
    let _ = admin
        .create_topics(
            [&NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    let deferred = format!("{}.deferred", args.topic);
    ensure_topic(&args.brokers, &deferred).await?;

    let mut config = RuntimeConfig {
        workers: std::num::NonZeroUsize::new(args.workers).ok_or("workers must be > 0")?,
        ..RuntimeConfig::default()
    };
    if let Some(held) = args.max_held {
        config.max_held = std::num::NonZeroUsize::new(held).ok_or("max-held must be > 0")?;
    }
    let defer_sink = Arc::new(KafkaDeferSink::new(KafkaSinkConfig::new(
        &args.brokers,
        &deferred,
    ))?);
    let work = Duration::from_millis(args.work_ms);
    let mut runtime = Runtime::builder(config)
        .defer_sink(Arc::clone(&defer_sink))
        .start(move |job: Job<KafkaMessage>| async move {
            tokio::time::sleep(work).await;
            let _ = job.payload();
            Ok::<(), HandlerError>(())
        })?;

    let mut source_config = KafkaSourceConfig::new(&args.brokers, &args.group, [&args.topic]);
    source_config.criticality.trusted_topics = vec![args.topic.clone()];
    // `republish_to`: refuse to start if a record could be too large to defer.
    runtime.attach(
        KafkaSource::builder(source_config)
            .republish_to(&defer_sink)
            .build()?,
    );
    let drain_config =
        KafkaSourceConfig::new(&args.brokers, format!("{}-drain", args.group), [&deferred]);
    runtime.attach_drain(drain::builder(drain_config).build()?);

    for _ in 0..args.duration {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stats = runtime.stats();
        println!(
            "load={:?} queued={} running={} limit={}",
            runtime.load(),
            stats.queued,
            stats.running,
            stats.limit
        );
    }
    let report = runtime.shutdown(Duration::from_secs(10)).await;
    println!("{report}");
    Ok(())
}
