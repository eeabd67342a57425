//! A triage worker on a RabbitMQ queue: classify by priority, serve within a bounded queue,
//! defer what it cannot serve to a durable queue, dead-letter what fails.
//!
//! ```text
//! tests/brokers/rabbitmq.sh start
//! cargo run --release -p triage-amqp --example amqp_load -- --queue orders --rate 2000 --duration-s 10
//! cargo run --release -p triage-amqp --example amqp_worker -- --queue orders --service-ms 2 --duration-s 20 \
//!     --metrics 127.0.0.1:9899
//! ```
//!
//! Prints a live line every second (its fields are explained in `--help`) and the ledger at
//! the end, with what is still waiting in the queue and in the deferred store. Deferred work
//! is drained back from `<queue>.deferred` when load falls. Ctrl-C or `--duration-s` stops it
//! gracefully: what finished is acked before the channel closes, the rest is redelivered
//! later. The flags are the ones `examples/overload` and the Kafka worker use for the same
//! things (`--duration-s`, `--service-ms`, `--workers`, `--capacity`, `--metrics`).

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use triage::queue::WfqConfig;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig, RuntimeStats};
use triage_amqp::{AmqpDeferSink, AmqpMessage, AmqpSinkConfig, AmqpSource, AmqpSourceConfig};

const LIVE_HELP: &str = "\
Live line, once a second: [elapsed] consumed, goodput, queued, running, held, refusing, deferred
  consumed   deliveries the runtime took from the queue and the deferred drain per second
  goodput    handler successes inside their deadline per second
  queued     messages waiting in triage's queue
  running    handlers running / the current concurrency limit
  held       messages held by backpressure (their tier is refused and its policy is to wait)
  refusing   tiers refused by admission (arrival beyond capacity), lowest first (0 of 4 = all admitted)
  deferred   messages per second published to <queue>.deferred (drained back when load falls)";

#[derive(Debug, Parser)]
#[command(version, about = "a triage worker on a RabbitMQ queue", after_help = LIVE_HELP)]
struct Args {
    /// Broker URI.
    #[arg(long, default_value = "amqp://127.0.0.1:5672/%2f")]
    uri: String,
    /// Queue to consume.
    #[arg(long, default_value = "triage-orders")]
    queue: String,
    /// Handler service time per message, milliseconds. 0: a true no-op handler (no timer).
    #[arg(long, default_value_t = 5)]
    service_ms: u64,
    /// Worker tasks.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Runtime queue capacity, messages (the prefetch is at most this).
    #[arg(long, default_value_t = 1_000)]
    capacity: usize,
    /// basic.qos prefetch, deliveries.
    #[arg(long, default_value_t = 500)]
    prefetch: u16,
    /// How long to run, seconds (0: until Ctrl-C).
    #[arg(long, default_value_t = 30)]
    duration_s: u64,
    /// Shutdown grace, seconds.
    #[arg(long, default_value_t = 10)]
    grace_s: u64,
    /// Serve Prometheus `/metrics` and `/healthz` on this address (e.g. 127.0.0.1:9899).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// No live line, only the ledger at exit.
    #[arg(long)]
    quiet: bool,
}

/// Messages ready in each queue (a passive declare: nothing is created).
async fn ready_counts(uri: &str, queues: &[&str]) -> Result<Vec<u32>, lapin::Error> {
    let props = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    let conn = Connection::connect(uri, props).await?;
    let ch = conn.create_channel().await?;
    let mut counts = Vec::new();
    for q in queues {
        let declared = ch
            .queue_declare(
                q,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        counts.push(declared.message_count());
    }
    let _ = conn.close(200, "done").await;
    Ok(counts)
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
async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
    let capacity = NonZeroUsize::new(args.capacity).ok_or("--capacity must be at least 1")?;
    let deferred = format!("{}.deferred", args.queue);

    let mut source_config = AmqpSourceConfig::new(&args.uri, &args.queue);
    source_config.prefetch = args.prefetch;
    // Failures go to our own dead-letter queue, so the source only acks them.
    source_config.dead_letter_via_sink = true;
    let defer = Arc::new(AmqpDeferSink::connect(AmqpSinkConfig::new(&args.uri, &deferred)).await?);
    let dead = Arc::new(
        AmqpDeferSink::connect(AmqpSinkConfig::new(
            &args.uri,
            format!("{}.dead", args.queue),
        ))
        .await?,
    );
    // Refused at start-up unless every message the source accepts fits both sinks.
    let source =
        AmqpSource::connect_republishing(source_config, capacity, &[&*defer, &*dead]).await?;

    let config = RuntimeConfig {
        workers: NonZeroUsize::new(args.workers).ok_or("--workers must be at least 1")?,
        expert: triage::runtime::ExpertConfig {
            queue: WfqConfig {
                capacity,
                ..WfqConfig::default()
            },
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    let service = Duration::from_millis(args.service_ms);
    let mut runtime = Runtime::builder(config)
        .defer_sink(Arc::clone(&defer))
        .dead_letter_sink(Arc::clone(&dead))
        .start(move |job: Job<AmqpMessage>| async move {
            if job.load().is_overloaded() {
                // Brownout: a real handler would skip optional work here.
            }
            // Zero service time is a true no-op: no timer, no yield.
            if !service.is_zero() {
                tokio::time::sleep(service).await;
            }
            if job.payload().body().is_empty() {
                return Err(HandlerError::permanent("empty body"));
            }
            Ok(())
        })?;
    runtime.attach(source);
    // Deferred work comes back with the tier it was deferred with, pulled only while load
    // allows.
    let mut drain_config = AmqpSourceConfig::drain(&args.uri, &deferred);
    drain_config.prefetch = args.prefetch;
    drain_config.dead_letter_via_sink = true;
    runtime.attach_drain(
        AmqpSource::connect_republishing(drain_config, capacity, &[&*defer, &*dead]).await?,
    );

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
    println!(
        "consumed counts a deferred message again when it is drained back from {deferred} (with the tier it was deferred with)"
    );
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
    match ready_counts(&args.uri, &[&args.queue, &deferred]).await {
        Ok(counts) => {
            println!(
                "queue {}: {} messages still waiting (not consumed, or released unacknowledged)",
                args.queue, counts[0]
            );
            println!(
                "deferred store {deferred}: {} messages still waiting to be drained back",
                counts[1]
            );
        }
        Err(e) => println!("queue counts unavailable: {e}"),
    }
    if !stats.balances() {
        return Err("the ledger does not balance".into());
    }
    Ok(())
}
