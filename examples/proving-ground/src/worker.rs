//! The worker process: the triage runtime over a real Kafka topic or RabbitMQ queue, a handler
//! with a fixed service time, and an append-only disposition log.
//!
//! The harness starts it as a child process (`triage-proving-ground worker ...`, or the test binary
//! re-executing itself) so that it can `kill -9` it. Every disposition is written to the log
//! from the runtime's `observe` hook, which runs before the message is acknowledged, with one
//! unbuffered `write(2)` per line: once a message is acked its line is in the kernel's page
//! cache, and `kill -9` does not lose it. A line is `id,disposition,tier,unix_ms,sojourn_us`
//! (sojourn only for completions: enqueue to dequeue, from the job).
//!
//! Besides the log the worker keeps a small stats file (rewritten every 250 ms and at exit):
//! the runtime's refusal and eviction counters and the reject-cost histogram, captured by a
//! minimal `metrics` recorder installed in this process.

// Shared by the binary (src/main.rs) and tests/proving_ground.rs; each uses a part.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use triage::ledger::Disposition;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
use triage::Criticality;

/// Which broker a worker or a run talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BrokerKind {
    /// Kafka on 127.0.0.1:9092.
    Kafka,
    /// RabbitMQ on 127.0.0.1:5672.
    Amqp,
}

impl BrokerKind {
    /// Lowercase name, for file names and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerKind::Kafka => "kafka",
            BrokerKind::Amqp => "amqp",
        }
    }
}

/// How the load is laid out on the broker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// One topic (one priority queue on RabbitMQ) for every tier, labelled by the
    /// `triage-criticality` header.
    #[default]
    Mixed,
    /// A topic (a queue on RabbitMQ) per tier, `<topic>.<tier>`, mapped to its tier by the
    /// source (Kafka `criticality.topic_tiers`, AMQP `tier_queues`): a shed tier's partitions
    /// (queues) are paused, so its records wait in the broker, not in front of Critical.
    PerTier,
}

impl Layout {
    /// Lowercase name, for the command line and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Mixed => "mixed",
            Layout::PerTier => "per-tier",
        }
    }

    /// The topics (queues) the load goes to: one, or one per tier, Critical first.
    pub fn topics(self, topic: &str) -> Vec<String> {
        match self {
            Layout::Mixed => vec![topic.to_owned()],
            Layout::PerTier => Criticality::ALL
                .iter()
                .map(|t| tier_topic(topic, *t))
                .collect(),
        }
    }

    /// The topic (queue) a message of `tier` is produced to.
    pub fn topic_of(self, topic: &str, tier: Criticality) -> String {
        match self {
            Layout::Mixed => topic.to_owned(),
            Layout::PerTier => tier_topic(topic, tier),
        }
    }
}

/// `<topic>.<tier>`: the topic (queue) of one tier in the per-tier layout.
pub fn tier_topic(topic: &str, tier: Criticality) -> String {
    format!("{topic}.{}", tier.as_str())
}

/// Kafka bootstrap servers of the project's test broker.
pub const KAFKA: &str = "127.0.0.1:9092";
/// RabbitMQ URI of the project's test broker.
pub const AMQP: &str = "amqp://127.0.0.1:5672/%2f";

/// Environment variable with the worker's log filter (`tracing_subscriber::EnvFilter`).
pub const LOG_ENV: &str = "PROVING_GROUND_LOG";
/// Environment variable with librdkafka `debug` contexts for the worker's clients (e.g.
/// `cgrp,fetch`); their lines are logged at debug level.
pub const KAFKA_DEBUG_ENV: &str = "PROVING_GROUND_KAFKA_DEBUG";

/// Environment variable overriding the runtime's `share_reserve_ms` (how long lower tiers
/// leave a higher tier's share free after it last had work queued), for diagnosis.
pub const SHARE_RESERVE_ENV: &str = "PROVING_GROUND_SHARE_RESERVE_MS";

/// Environment variable overriding the runtime's `work_conserving` (`true` or `false`), to
/// measure what borrowing idle slots costs Critical's sojourn.
pub const WORK_CONSERVING_ENV: &str = "PROVING_GROUND_WORK_CONSERVING";

/// Arguments of the `worker` subcommand.
#[derive(Clone, Debug, clap::Args)]
pub struct WorkerArgs {
    /// Broker to consume from.
    #[arg(long, value_enum)]
    pub broker: BrokerKind,
    /// Topic or queue; deferrals go to `<topic>.deferred`, dead letters to `<topic>.dead`.
    #[arg(long)]
    pub topic: String,
    /// Kafka consumer group.
    #[arg(long, default_value = "proving-ground")]
    pub group: String,
    /// Kafka static membership id (`group.instance.id`): a restarted worker with the same id
    /// takes its partitions back at once instead of waiting for the session timeout.
    #[arg(long)]
    pub instance: Option<String>,
    /// Handler service time, milliseconds.
    #[arg(long, default_value_t = 2)]
    pub service_ms: u64,
    /// Worker tasks (fixed concurrency).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Runtime queue capacity, messages (`expert.queue.capacity`). Default: the runtime's own,
    /// the zero-configuration default (its queue bounded from what it measures).
    #[arg(long)]
    pub capacity: Option<usize>,
    /// Messages the intake holds under backpressure before pausing the source (the
    /// runtime's `expert.max_held`). Default: the runtime's own.
    #[arg(long)]
    pub max_held: Option<usize>,
    /// Disposition log (appended).
    #[arg(long)]
    pub log: PathBuf,
    /// Stats file (rewritten).
    #[arg(long)]
    pub stats: PathBuf,
    /// Serve Prometheus `/metrics` and `/healthz` on this address as well (the stats file is
    /// written either way).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// One mixed topic (queue), or one per tier (`<topic>.<tier>`).
    #[arg(long, value_enum, default_value = "mixed")]
    pub layout: Layout,
    /// No triage: a plain FIFO consumer, the baseline of the restart phase: `--workers` tasks
    /// fed through a bounded async-channel in arrival order, the same handler. Kafka:
    /// rdkafka's `StreamConsumer`, offsets committed by librdkafka's auto-commit; RabbitMQ: a
    /// lapin consumer with a prefetch of twice the tasks, each delivery acknowledged after it
    /// is handled. Mixed layout only.
    #[arg(long)]
    pub fifo: bool,
}

/// The message id and poison flag from a payload `id,tier,produced_ms,poison`.
pub fn parse_payload(body: &[u8]) -> (&str, bool) {
    let text = std::str::from_utf8(body).unwrap_or("");
    let mut parts = text.split(',');
    let id = parts.next().unwrap_or("");
    let poison = parts.nth(2) == Some("1");
    (id, poison)
}

fn body_of_kafka(m: &triage_kafka::KafkaMessage) -> &[u8] {
    m.payload.as_deref().unwrap_or(&[])
}

fn body_of_amqp(m: &triage_amqp::AmqpMessage) -> &[u8] {
    m.body()
}

/// The handler both brokers' workers run: a fixed service time, poison messages refused for
/// good, and the sojourn kept for the disposition log.
async fn handle<T>(
    job: Job<T>,
    body: fn(&T) -> &[u8],
    service: Duration,
    log: Arc<DispositionLog>,
) -> Result<(), HandlerError> {
    tokio::time::sleep(service).await;
    let (id, poison) = parse_payload(body(job.payload()));
    if poison {
        return Err(HandlerError::permanent("poison message"));
    }
    log.sojourn
        .lock()
        .insert(id.to_owned(), job.sojourn().as_micros() as u64);
    Ok(())
}

/// The disposition log: one unbuffered append per line.
struct DispositionLog {
    file: Mutex<File>,
    /// Sojourn of completed jobs, from the handler to the observer, by id.
    sojourn: Mutex<HashMap<String, u64>>,
}

impl DispositionLog {
    fn open(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(DispositionLog {
            file: Mutex::new(file),
            sojourn: Mutex::new(HashMap::new()),
        })
    }

    fn record(&self, body: &[u8], tier: Criticality, disposition: Disposition) {
        let (id, _) = parse_payload(body);
        let sojourn = if disposition == Disposition::Completed {
            self.sojourn
                .lock()
                .remove(id)
                .map(|us| us.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        let line = format!(
            "{id},{},{},{},{sojourn}\n",
            disposition.as_str(),
            tier.as_str(),
            unix_ms()
        );
        // One write per line, before the ack: a failed write is reported, never hidden.
        if let Err(e) = self.file.lock().write_all(line.as_bytes()) {
            eprintln!("worker: cannot write the disposition log: {e}");
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A minimal `metrics` recorder: counters by name and labels, and the reject-cost histogram.
#[derive(Default)]
struct Recorder {
    counters: Mutex<Vec<(String, Arc<Cell>)>>,
    gauges: Mutex<Vec<(String, Arc<GaugeCell>)>>,
    reject: Arc<RejectCost>,
}

/// Counters the stats file carries (name prefixes).
const COUNTERS: [&str; 4] = [
    "triage_refused_total",
    "triage_shed_total",
    "triage_expired_at_intake_total",
    "triage_deferred_total",
];

/// Gauges of the pull admission, sampled into the gauges timeline (`<stats>.gauges`).
const GAUGES: [&str; 7] = [
    "triage_shed_level",
    "triage_arrival_rate",
    "triage_capacity",
    "triage_lag",
    "triage_in_flight",
    "triage_held",
    "triage_queue_depth",
];

/// A gauge's last value, as `f64` bits.
#[derive(Default)]
struct GaugeCell(AtomicU64);

impl metrics::GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some((f64::from_bits(b) + value).to_bits())
            });
    }
    fn decrement(&self, value: f64) {
        self.increment(-value);
    }
    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Cell(AtomicU64);

impl metrics::CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

/// Samples of `triage_reject_cost_seconds`, in nanoseconds.
#[derive(Default)]
struct RejectCost {
    samples: Mutex<Vec<u64>>,
}

impl metrics::HistogramFn for RejectCost {
    fn record(&self, value: f64) {
        let mut s = self.samples.lock();
        if s.len() < 100_000 {
            s.push((value * 1e9) as u64);
        }
    }
}

fn key_name(key: &metrics::Key) -> String {
    let mut name = key.name().to_owned();
    for label in key.labels() {
        name.push('.');
        name.push_str(label.value());
    }
    name
}

/// The recorder as installed (the trait is foreign, so is `Arc`).
struct Shared(Arc<Recorder>);

impl metrics::Recorder for Shared {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let name = key_name(key);
        if !COUNTERS.iter().any(|c| name.starts_with(c)) {
            return metrics::Counter::noop();
        }
        let cell = Arc::new(Cell::default());
        self.0.counters.lock().push((name, Arc::clone(&cell)));
        metrics::Counter::from_arc(cell)
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        if !GAUGES.contains(&key.name()) {
            return metrics::Gauge::noop();
        }
        let cell = Arc::new(GaugeCell::default());
        self.0
            .gauges
            .lock()
            .push((key_name(key), Arc::clone(&cell)));
        metrics::Gauge::from_arc(cell)
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        if key.name() == "triage_reject_cost_seconds" {
            metrics::Histogram::from_arc(Arc::clone(&self.0.reject))
        } else {
            metrics::Histogram::noop()
        }
    }
}

impl Recorder {
    /// `name value` lines: every captured counter, then the reject-cost samples.
    fn render(&self) -> String {
        let mut out = String::new();
        for (name, cell) in self.counters.lock().iter() {
            out.push_str(&format!("{name} {}\n", cell.0.load(Ordering::Relaxed)));
        }
        let samples = self.reject.samples.lock();
        out.push_str("reject_cost_ns");
        for s in samples.iter() {
            out.push_str(&format!(" {s}"));
        }
        out.push('\n');
        out
    }

    /// One timeline line: Unix ms, then `name=value` for every captured gauge.
    fn gauge_line(&self) -> String {
        let mut out = unix_ms().to_string();
        for (name, cell) in self.gauges.lock().iter() {
            let v = f64::from_bits(cell.0.load(Ordering::Relaxed));
            out.push_str(&format!(" {name}={v:.1}"));
        }
        out.push('\n');
        out
    }
}

fn write_stats(path: &Path, recorder: &Recorder, cpu: Option<(u64, u64)>) {
    let mut text = recorder.render();
    if let Some((user, system)) = cpu {
        text.push_str(&format!("cpu_ticks {}\n", user + system));
    }
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
    // The admission's gauges over time, for reading a phase back (not used by the report).
    if let Ok(mut f) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path.with_extension("gauges"))
    {
        let _ = f.write_all(recorder.gauge_line().as_bytes());
    }
}

/// This process's user and system CPU time, in clock ticks, from `/proc/self/stat`.
pub fn cpu_ticks(pid: Option<u32>) -> Option<(u64, u64)> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

/// Runs the worker until SIGTERM or SIGINT, then shuts down gracefully.
///
/// # Errors
///
/// When the log cannot be opened, a broker cannot be reached at start, or the configuration
/// is out of range.
pub async fn run(args: WorkerArgs) -> Result<(), Box<dyn std::error::Error>> {
    // Warnings of the runtime and the connectors go to the worker's output file; more with
    // `PROVING_GROUND_LOG` (an `EnvFilter`, e.g. `triage_kafka=debug,librdkafka=debug`).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_ansi(false)
        .try_init();
    let recorder = Arc::new(Recorder::default());
    // Kept for the whole run: dropping it stops the endpoint.
    let _endpoint = match args.metrics {
        Some(addr) => Some(triage::observe::serve_alongside(
            addr,
            Shared(Arc::clone(&recorder)),
        )?),
        None => {
            metrics::set_global_recorder(Shared(Arc::clone(&recorder)))
                .map_err(|_| "a metrics recorder is already installed")?;
            None
        }
    };
    let log = Arc::new(DispositionLog::open(&args.log)?);
    let workers = NonZeroUsize::new(args.workers).ok_or("--workers must be at least 1")?;
    // The zero-configuration default unless a flag says otherwise: the worker count is the
    // one thing the harness states.
    let mut config = RuntimeConfig {
        workers,
        ..RuntimeConfig::default()
    };
    if let Some(capacity) = args.capacity {
        config.expert.queue.capacity =
            NonZeroUsize::new(capacity).ok_or("--capacity must be at least 1")?;
    }
    if let Some(max_held) = args.max_held {
        config.expert.max_held =
            NonZeroUsize::new(max_held).ok_or("--max-held must be at least 1")?;
    }
    let capacity = config.expert.queue.capacity;
    if let Ok(ms) = std::env::var(SHARE_RESERVE_ENV) {
        config.expert.share_reserve_ms = ms
            .parse()
            .map_err(|_| format!("{SHARE_RESERVE_ENV} must be a number of milliseconds"))?;
    }
    if let Ok(on) = std::env::var(WORK_CONSERVING_ENV) {
        config.expert.work_conserving = on
            .parse()
            .map_err(|_| format!("{WORK_CONSERVING_ENV} must be true or false"))?;
    }
    let service = Duration::from_millis(args.service_ms);
    if args.fifo {
        return run_fifo(&args, log, service, &recorder).await;
    }
    let deferred = format!("{}.deferred", args.topic);
    let dead = format!("{}.dead", args.topic);

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stats_path = args.stats.clone();
    let report = match args.broker {
        BrokerKind::Kafka => {
            use triage_kafka::{drain, KafkaDeferSink, KafkaMessage, KafkaSinkConfig};
            use triage_kafka::{KafkaSource, KafkaSourceConfig};
            let sink = |topic: &str| {
                let mut c = KafkaSinkConfig::new(KAFKA, topic);
                c.message_timeout_ms = 30_000;
                c.properties.insert("linger.ms".into(), "2".into());
                KafkaDeferSink::new(c)
            };
            let observer = Arc::clone(&log);
            let sojourn = Arc::clone(&log);
            let (defer_sink, dead_sink) = (Arc::new(sink(&deferred)?), Arc::new(sink(&dead)?));
            let mut runtime = Runtime::builder(config)
                .defer_sink(Arc::clone(&defer_sink))
                .dead_letter_sink(Arc::clone(&dead_sink))
                .observe(move |m: &KafkaMessage, tier, d| {
                    observer.record(body_of_kafka(m), tier, d)
                })
                .start(move |job: Job<KafkaMessage>| {
                    let sojourn = Arc::clone(&sojourn);
                    handle(job, body_of_kafka, service, sojourn)
                })?;
            let source_config = |group: String, topics: Vec<String>, suffix: &str| {
                let mut c = KafkaSourceConfig::new(KAFKA, group, topics.clone());
                c.commit_interval_ms = 200;
                // librdkafka (2.x) postpones the next fetch by `fetch.queue.backoff.ms`
                // (default 1000) whenever its queue holds `queued.min.messages` (here the
                // source's `max_prefetch_messages`): with the defaults a source slower than the
                // broker for a moment is throttled to about that many messages per second.
                c.max_prefetch_messages = 4000;
                c.properties
                    .insert("fetch.queue.backoff.ms".into(), "5".into());
                // Trusted for the deadline header (and the label, which agrees with the
                // topic's tier in the per-tier layout).
                c.criticality.trusted_topics = topics.clone();
                if args.layout == Layout::PerTier && suffix.is_empty() {
                    for t in Criticality::ALL {
                        c.criticality
                            .topic_tiers
                            .insert(tier_topic(&args.topic, t), t);
                    }
                }
                // The broker's minimum: a killed dynamic member is noticed within 6 s.
                c.properties
                    .insert("session.timeout.ms".into(), "6000".into());
                c.properties
                    .insert("heartbeat.interval.ms".into(), "1000".into());
                if let Ok(debug) = std::env::var(KAFKA_DEBUG_ENV) {
                    c.properties.insert("debug".into(), debug);
                }
                if let Some(instance) = &args.instance {
                    c.properties
                        .insert("group.instance.id".into(), format!("{instance}{suffix}"));
                }
                c
            };
            runtime.attach(
                KafkaSource::builder(source_config(
                    args.group.clone(),
                    args.layout.topics(&args.topic),
                    "",
                ))
                .republish_to(&defer_sink)
                .republish_to(&dead_sink)
                .build()?,
            );
            runtime.attach_drain(
                drain::builder(source_config(
                    format!("{}-drain", args.group),
                    vec![deferred.clone()],
                    "-drain",
                ))
                .republish_to(&dead_sink)
                .build()?,
            );
            serve(runtime, &mut terminate, &recorder, &stats_path).await
        }
        BrokerKind::Amqp => {
            use triage_amqp::AmqpSourceConfig;
            use triage_amqp::{AmqpDeferSink, AmqpMessage, AmqpSinkConfig, AmqpSource};
            let observer = Arc::clone(&log);
            let sojourn = Arc::clone(&log);
            let mut runtime = Runtime::builder(config)
                .defer_sink(Arc::new(
                    AmqpDeferSink::connect(AmqpSinkConfig::new(AMQP, &deferred)).await?,
                ))
                .dead_letter_sink(Arc::new(
                    AmqpDeferSink::connect(AmqpSinkConfig::new(AMQP, &dead)).await?,
                ))
                .observe(move |m: &AmqpMessage, tier, d| observer.record(body_of_amqp(m), tier, d))
                .start(move |job: Job<AmqpMessage>| {
                    let sojourn = Arc::clone(&sojourn);
                    handle(job, body_of_amqp, service, sojourn)
                })?;
            let prefetch = u16::try_from(capacity.get().min(256)).unwrap_or(256);
            let mut main = match args.layout {
                Layout::Mixed => AmqpSourceConfig::new(AMQP, &args.topic),
                Layout::PerTier => {
                    let mut c = AmqpSourceConfig::new(AMQP, "");
                    c.tier_queues = Criticality::ALL
                        .iter()
                        .map(|t| triage_amqp::TierQueue::new(tier_topic(&args.topic, *t), *t))
                        .collect();
                    c
                }
            };
            main.prefetch = prefetch;
            main.dead_letter_via_sink = true;
            main.classify.trusted_queues = args.layout.topics(&args.topic);
            main.declare.max_priority = Some(crate::load::MAX_PRIORITY);
            runtime.attach(AmqpSource::connect(main, capacity).await?);
            // The drain: each deferred copy keeps the tier it was deferred with.
            let mut drain = AmqpSourceConfig::drain(AMQP, &deferred);
            drain.prefetch = prefetch;
            drain.dead_letter_via_sink = true;
            runtime.attach_drain(AmqpSource::connect(drain, capacity).await?);
            serve(runtime, &mut terminate, &recorder, &stats_path).await
        }
    };
    println!("{report}");
    Ok(())
}

/// The plain FIFO consumer of `--fifo`: every record handled in offset order by `workers`
/// tasks, nothing refused, deferred or expired, each completion (or poison failure) logged as
/// the runtime's workers log theirs. What a worker without triage does with a backlog.
async fn run_fifo(
    args: &WorkerArgs,
    log: Arc<DispositionLog>,
    service: Duration,
    recorder: &Recorder,
) -> Result<(), Box<dyn std::error::Error>> {
    use triage_kafka::rdkafka::consumer::{Consumer, StreamConsumer};
    use triage_kafka::rdkafka::{ClientConfig, Message};
    if args.layout != Layout::Mixed {
        return Err("--fifo: the mixed layout only".into());
    }
    if args.broker == BrokerKind::Amqp {
        return run_fifo_amqp(args, log, service, recorder).await;
    }
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", KAFKA)
        .set("group.id", &args.group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "200");
    if let Some(instance) = &args.instance {
        client.set("group.instance.id", instance);
    }
    let consumer: StreamConsumer = client.create()?;
    consumer.subscribe(&[args.topic.as_str()])?;
    let (tx, rx) = async_channel::bounded::<Vec<u8>>(args.workers * 2);
    let mut tasks = Vec::new();
    for _ in 0..args.workers.max(1) {
        let (rx, log) = (rx.clone(), Arc::clone(&log));
        tasks.push(tokio::spawn(async move {
            while let Ok(body) = rx.recv().await {
                fifo_handle(&body, service, &log).await;
            }
        }));
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => write_stats(&args.stats, recorder, cpu_ticks(None)),
            m = consumer.recv() => {
                let m = match m {
                    Ok(m) => m,
                    Err(e) => {
                        eprintln!("fifo: {e}");
                        continue;
                    }
                };
                let body = m.payload().unwrap_or(&[]).to_vec();
                if tx.send(body).await.is_err() {
                    break;
                }
            }
        }
    }
    tx.close();
    for t in tasks {
        let _ = t.await;
    }
    write_stats(&args.stats, recorder, cpu_ticks(None));
    Ok(())
}

/// One record through `--fifo`'s handler: the service time, then its line in the log,
/// completed or (a poison payload) failed, at the tier its payload names.
async fn fifo_handle(body: &[u8], service: Duration, log: &DispositionLog) {
    tokio::time::sleep(service).await;
    let (_, poison) = parse_payload(body);
    let tier = std::str::from_utf8(body)
        .ok()
        .and_then(|t| t.split(',').nth(1))
        .and_then(|t| t.parse().ok())
        .unwrap_or(Criticality::Medium);
    let d = if poison {
        Disposition::Failed
    } else {
        Disposition::Completed
    };
    log.record(body, tier, d);
}

/// `--fifo` on RabbitMQ: a plain lapin consumer on the queue (prefetch `2 x workers`, the
/// broker's priority order is all it knows), `workers` tasks, the same handler, each delivery
/// acknowledged after its line is logged.
async fn run_fifo_amqp(
    args: &WorkerArgs,
    log: Arc<DispositionLog>,
    service: Duration,
    recorder: &Recorder,
) -> Result<(), Box<dyn std::error::Error>> {
    use futures_util::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
    use triage_amqp::lapin;
    let (conn, ch) = crate::load::amqp_connect().await;
    let prefetch = u16::try_from(args.workers * 2).unwrap_or(u16::MAX);
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            &args.topic,
            "proving-ground-fifo",
            BasicConsumeOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await?;
    let (tx, rx) = async_channel::bounded::<lapin::message::Delivery>(args.workers * 2);
    let mut tasks = Vec::new();
    for _ in 0..args.workers.max(1) {
        let (rx, log) = (rx.clone(), Arc::clone(&log));
        tasks.push(tokio::spawn(async move {
            while let Ok(delivery) = rx.recv().await {
                fifo_handle(&delivery.data, service, &log).await;
                let _ = delivery.ack(BasicAckOptions::default()).await;
            }
        }));
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => write_stats(&args.stats, recorder, cpu_ticks(None)),
            d = consumer.next() => match d {
                Some(Ok(delivery)) => {
                    if tx.send(delivery).await.is_err() {
                        break;
                    }
                }
                Some(Err(e)) => eprintln!("fifo: {e}"),
                None => break,
            },
        }
    }
    tx.close();
    for t in tasks {
        let _ = t.await;
    }
    write_stats(&args.stats, recorder, cpu_ticks(None));
    let _ = conn.close(200, "fifo done").await;
    Ok(())
}

async fn serve<T: Send + Sync + 'static>(
    runtime: Runtime<T>,
    terminate: &mut tokio::signal::unix::Signal,
    recorder: &Recorder,
    stats: &Path,
) -> triage::runtime::Report {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => write_stats(stats, recorder, cpu_ticks(None)),
        }
    }
    let report = runtime.shutdown(Duration::from_secs(15)).await;
    write_stats(stats, recorder, cpu_ticks(None));
    report
}
