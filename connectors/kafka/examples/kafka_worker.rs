//! Consumes a mixed-priority topic through the triage runtime, defers overflow to
//! `<topic>.deferred` (drained back while the load allows), and prints the ledger on exit.
//!
//! ```text
//! tests/brokers/kafka.sh start
//! cargo run --release -p triage-kafka --example kafka_load -- --topic orders --rate 6000 --duration-s 30 &
//! cargo run --release -p triage-kafka --example kafka_worker -- --topic orders --service-ms 5 --duration-s 40 \
//!     --metrics 127.0.0.1:9898
//! ```
//!
//! The flags are the ones `examples/overload` and the RabbitMQ worker use for the same things
//! (`--duration-s`, `--service-ms`, `--workers`, `--capacity`, `--metrics`); the live line's
//! fields are explained in `--help`.

use std::error::Error;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use triage::queue::WfqConfig;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig, RuntimeStats};
use triage_kafka::{
    drain, KafkaDeferSink, KafkaMessage, KafkaSinkConfig, KafkaSource, KafkaSourceConfig,
};

const LIVE_HELP: &str = "\
Live line, once a second: [elapsed] consumed, goodput, queued, running, held, refusing, deferred
  consumed   messages the runtime took from the topic and the deferred drain per second
  goodput    handler successes inside their deadline per second
  queued     messages waiting in triage's queue
  running    handlers running / the current concurrency limit
  held       messages held by backpressure (their tier is refused and its policy is to wait)
  refusing   tiers refused by admission (arrival beyond capacity), lowest first (0 of 4 = all admitted)
  deferred   messages per second published to <topic>.deferred (drained back when load falls)";

#[derive(Debug, Parser)]
#[command(version, about = "a triage worker on a Kafka topic", after_help = LIVE_HELP)]
struct Args {
    /// Bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// Topic to consume (its producers are trusted to label criticality).
    #[arg(long)]
    topic: String,
    /// Consumer group (the drain uses `<group>-drain`).
    #[arg(long, default_value = "triage-worker")]
    group: String,
    /// Handler service time per message, milliseconds. 0: a true no-op handler (no timer).
    #[arg(long, default_value_t = 5)]
    service_ms: u64,
    /// Worker tasks.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Runtime queue capacity, messages.
    #[arg(long, default_value_t = 256)]
    capacity: usize,
    /// How long to run, seconds (0: until Ctrl-C).
    #[arg(long, default_value_t = 30)]
    duration_s: u64,
    /// Shutdown grace, seconds.
    #[arg(long, default_value_t = 10)]
    grace_s: u64,
    /// Messages the intake holds under backpressure before it pauses the partition (the
    /// runtime's `max_held`; default: the runtime's).
    #[arg(long)]
    max_held: Option<usize>,
    /// Deferrals waiting for their broker confirm at once (the runtime's `max_deferring`;
    /// default: the runtime's).
    #[arg(long)]
    max_deferring: Option<usize>,
    /// Pause the partition when the held buffer is full, never deferring held High records
    /// to reach the Critical ones behind them (the runtime's `defer_held_to_make_room =
    /// false`; for comparison).
    #[arg(long)]
    no_make_room: bool,
    /// Serve Prometheus `/metrics` and `/healthz` on this address (e.g. 127.0.0.1:9898).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// No live line, only the ledger at exit.
    #[arg(long)]
    quiet: bool,
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

/// Records in `topic` (high minus low watermark, summed over partitions) and how many of them
/// are past `group`'s committed offsets: `(produced, waiting)`.
fn topic_counts(brokers: &str, group: &str, topic: &str) -> Result<(i64, i64), Box<dyn Error>> {
    const T: Duration = Duration::from_secs(5);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), T)?;
    let mut tpl = TopicPartitionList::new();
    let mut marks = Vec::new();
    for p in metadata.topics().iter().flat_map(|t| t.partitions()) {
        marks.push((p.id(), consumer.fetch_watermarks(topic, p.id(), T)?));
        tpl.add_partition(topic, p.id());
    }
    let committed = consumer.committed_offsets(tpl, T)?;
    let (mut produced, mut waiting) = (0, 0);
    for (partition, (low, high)) in marks {
        produced += high - low;
        let position = match committed
            .find_partition(topic, partition)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(o)) => o.max(low),
            _ => low,
        };
        waiting += high - position;
    }
    Ok((produced, waiting))
}

/// The live line: rates since the previous one.
struct Live {
    start: Instant,
    last_at: Instant,
    last: (u64, u64, u64),
}

impl Live {
    fn counts(stats: &RuntimeStats) -> (u64, u64, u64) {
        let t = stats.ledger.total();
        (t.consumed, t.goodput, t.deferred)
    }

    fn line(&mut self, stats: &RuntimeStats, refusing: u8) -> String {
        let now = Instant::now();
        let dt = now.duration_since(self.last_at).as_secs_f64().max(1e-9);
        let c = Self::counts(stats);
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
        let line = format!(
            "[{:>4.0}s] consumed {:.0}/s  goodput {:.0}/s  queued {}  running {}/{}  held {}  refusing {} of 4 tiers  deferred {:.0}/s",
            now.duration_since(self.start).as_secs_f64(),
            rate(c.0, self.last.0),
            rate(c.1, self.last.1),
            stats.queued,
            stats.running,
            stats.limit,
            stats.held,
            refusing,
            rate(c.2, self.last.2),
        );
        self.last_at = now;
        self.last = c;
        line
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
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Args = parse_args();
    // The runtime and the connectors log through `tracing`: warnings and reloads on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .init();
    // Installed before the runtime and the sources register their metrics.
    let _metrics = match args.metrics {
        Some(addr) => {
            let server = triage::observe::serve(addr)?;
            println!(
                "metrics: http://{}/metrics (liveness: /healthz)",
                server.local_addr()
            );
            Some(server)
        }
        None => None,
    };
    let deferred = format!("{}.deferred", args.topic);
    let drain_group = format!("{}-drain", args.group);
    ensure_topic(&args.brokers, &deferred).await?;

    let mut config = RuntimeConfig {
        workers: NonZeroUsize::new(args.workers).ok_or("--workers must be at least 1")?,
        expert: triage::runtime::ExpertConfig {
            queue: WfqConfig {
                capacity: NonZeroUsize::new(args.capacity)
                    .ok_or("--capacity must be at least 1")?,
                ..WfqConfig::default()
            },
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    if let Some(held) = args.max_held {
        config.expert.max_held = NonZeroUsize::new(held).ok_or("--max-held must be at least 1")?;
    }
    config.defer_held_to_make_room = !args.no_make_room;
    if let Some(n) = args.max_deferring {
        config.expert.max_deferring =
            NonZeroUsize::new(n).ok_or("--max-deferring must be at least 1")?;
    }
    let defer_sink = Arc::new(KafkaDeferSink::new(KafkaSinkConfig::new(
        &args.brokers,
        &deferred,
    ))?);
    let service = Duration::from_millis(args.service_ms);
    let mut runtime = Runtime::builder(config)
        .defer_sink(Arc::clone(&defer_sink))
        .start(move |job: Job<KafkaMessage>| async move {
            // Zero service time is a true no-op: no timer, no yield.
            if !service.is_zero() {
                tokio::time::sleep(service).await;
            }
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
    let drain_config = KafkaSourceConfig::new(&args.brokers, &drain_group, [&deferred]);
    runtime.attach_drain(drain::builder(drain_config).build()?);

    let stop = async {
        if args.duration_s > 0 {
            tokio::time::sleep(Duration::from_secs(args.duration_s)).await;
        } else {
            let _ = tokio::signal::ctrl_c().await;
        }
    };
    tokio::pin!(stop);
    let now = Instant::now();
    let mut live = Live {
        start: now,
        last_at: now,
        last: Live::counts(&runtime.stats()),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => if !args.quiet {
                println!("{}", live.line(&runtime.stats(), runtime.load().shed_tiers()));
            },
        }
    }
    println!(
        "shutting down: serving what is queued, for {} s at most",
        args.grace_s
    );
    let report = runtime.shutdown(Duration::from_secs(args.grace_s)).await;
    let stats = &report.stats;
    let total = stats.ledger.total();
    println!(
        "\n== ledger at exit (messages, by tier as classified) ==\n{}",
        stats.ledger
    );
    println!("consumed counts a deferred record again when it is drained back from {deferred}");
    println!(
        "ledger balances: {} (consumed {} = settled {} + released {} + still inside {})",
        if stats.balances() { "yes" } else { "NO" },
        total.consumed,
        total.settled(),
        total.released,
        stats.alive
    );
    println!(
        "shutdown took {:.2?}{}",
        report.elapsed,
        if report.grace_exceeded {
            " (grace exceeded: the rest is released, redelivered later)"
        } else {
            ""
        }
    );
    match topic_counts(&args.brokers, &args.group, &args.topic) {
        Ok((produced, waiting)) => println!(
            "topic {}: {produced} records in the topic (all runs), {waiting} past group {}'s committed offsets (consumed at its next start)",
            args.topic, args.group
        ),
        Err(e) => println!("topic {}: counts unavailable: {e}", args.topic),
    }
    match topic_counts(&args.brokers, &drain_group, &deferred) {
        Ok((produced, waiting)) => println!(
            "deferred store {deferred}: {produced} records deferred in all, {waiting} still waiting to be drained back"
        ),
        Err(e) => println!("deferred store {deferred}: counts unavailable: {e}"),
    }
    if !stats.balances() {
        return Err("the ledger does not balance".into());
    }
    Ok(())
}
