//! The runtime's configuration from outside: TOML with arbitrary values at every key, loaded,
//! started, and applied live ([`Runtime::reconfigure`]) to a runtime serving messages, on a mock
//! clock and paused tokio time.
//!
//! Input:
//! - byte 0, the mode: bit 0 set, the rest of the input is TOML text, loaded with
//!   [`RuntimeConfig::from_toml`] and, when valid, started (and loaded as the Kafka and RabbitMQ
//!   sources' configurations too); bit 0 clear, what follows is edits; bit 1 the runtime has a
//!   defer sink and a dead-letter sink (in memory, the defer sink failing in transport for every
//!   fourth payload); bit 2 half the messages are pulled from an in-memory broker, the others
//!   submitted;
//! - byte 1 (edits), the traffic: bits 0-3 messages submitted after each configuration is in
//!   force, bits 4-6 how far the clocks move after each step (0, 1 ms, 5 ms, 100 ms, 1 s, 30 s,
//!   10 min, an hour);
//! - then edits, each a path byte (an index into [`paths`], every key of the configuration
//!   including the optional sections; `0xff` ends a configuration and starts the next from it,
//!   at most [`MAX_CONFIGS`]), a kind byte and a value: an integer (8 bytes, or one of
//!   [`EDGE_INTEGERS`]), a float (8 bytes, or one of [`EDGE_FLOATS`]), a boolean, one of
//!   [`WORDS`], arbitrary text, or the key removed.
//!
//! The first configuration is loaded (`from_toml`) and started; each next one is applied live
//! to the running runtime, unvalidated (as an embedding application may build one). The
//! handler completes even payloads and fails odd ones as a failure of downstream `d`, so
//! retries, backoff, dead letters and the circuit breaker run on the configured times; pulled
//! messages go through the intake's pull admission and held buffer. Workers above 64 are held
//! to 64 when starting, so that an input runs in milliseconds.
//!
//! Invariants:
//! - a configuration `from_toml` accepts starts (or is refused only for a `defer` policy
//!   without a defer sink); one it refuses names a field that exists in the file (the sources'
//!   configurations too);
//! - a live reconfiguration applies whole or changes nothing: refused, the configuration read
//!   back, the generation, the limit and the shares are what they were before; applied, they
//!   are the new ones, and it was refused only if `validate` refuses it, a fixed setting
//!   changed, or a `defer` policy has no sink;
//! - the forced shed level in force is at least the configured one;
//! - after shutdown nothing is alive and the ledger balances: every message submitted ended in
//!   exactly one disposition.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use toml::{Table, Value};
use triage::limit::{AimdConfig, Gradient2Config, LimitConfig};
use triage::quanta::{Clock, Mock};
use triage::runtime::{
    DeferSink, Envelope, HandlerError, Job, LoadConfigError, MemoryBroker, MemorySink,
    RefusalPolicy, Republish, Runtime, RuntimeConfig, SinkError, FIXED, MOVED,
};
use triage::{Criticality, PerTier};

use crate::input::Input;

/// Configurations one input applies, the first started, the others live.
pub const MAX_CONFIGS: usize = 4;

/// Workers a started runtime gets at most.
const MAX_WORKERS: i64 = 64;

/// Integers at and around the configuration's bounds and the arithmetic's.
pub const EDGE_INTEGERS: [i64; 44] = [
    0,
    1,
    2,
    3,
    4,
    -1,
    5,
    7,
    8,
    10,
    16,
    64,
    100,
    255,
    256,
    1_000,
    1_001,
    1_024,
    4_096,
    10_000,
    60_000,
    60_001,
    100_000,
    100_001,
    600_000,
    600_001,
    1_000_000,
    1_000_001,
    3_600_000,
    3_600_001,
    86_400_000,
    31_536_000_000,
    31_536_000_001,
    u32::MAX as i64,
    u32::MAX as i64 + 1,
    1 << 53,
    i64::MAX,
    i64::MIN,
    (u64::MAX / 1_000) as i64,
    (u64::MAX / 1_000_000) as i64,
    i64::MAX / 1_000,
    i64::MAX / 1_000_000,
    18_446_744_073_709,
    (1 << 32) + 1,
];

/// Floats at and around the configuration's bounds, and the ones IEEE keeps for surprises.
pub const EDGE_FLOATS: [f64; 18] = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    0.9,
    0.999_999,
    1.000_000_1,
    2.0,
    1e-300,
    1e300,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::MIN_POSITIVE,
    1e9,
    1e12,
    f64::MAX,
];

/// The words the configuration's enums and tiers are written with, and a few near misses.
pub const WORDS: [&str; 14] = [
    "backpressure",
    "defer",
    "drop",
    "defer_or_drop",
    "fixed",
    "aimd",
    "gradient2",
    "critical",
    "high",
    "medium",
    "sheddable",
    "",
    "Drop",
    "unordered",
];

/// Every key path of the configuration (`queue.capacity`, `limit.kind`, ...), the optional
/// sections included: from the TOML form of the default configuration and of one with every
/// optional section set.
pub fn paths() -> &'static [String] {
    static PATHS: OnceLock<Vec<String>> = OnceLock::new();
    PATHS.get_or_init(|| {
        let mut out = Vec::new();
        let mut full = RuntimeConfig::default();
        full.expert.queue.max_bytes = std::num::NonZeroUsize::new(1 << 20);
        full.memory.budget_bytes = Some(1 << 20);
        full.buckets.capacity = Some(100.0);
        let bucket = Some(triage::admission::BucketConfig {
            rate: Some(10.0),
            burst: Some(5),
            ..triage::admission::BucketConfig::default()
        });
        full.buckets.critical = bucket.clone();
        full.buckets.high = bucket.clone();
        full.buckets.medium = bucket.clone();
        full.buckets.sheddable = bucket;
        let mut shared = full.clone();
        if let Ok(Value::Table(t)) = Value::try_from(&shared) {
            for (k, v) in &t {
                leaves(k, v, &mut out);
            }
        }
        for limit in [
            LimitConfig::Fixed { limit: 8 },
            LimitConfig::Aimd(AimdConfig::default()),
            LimitConfig::Gradient2(Gradient2Config {
                queue_size: Some(4),
                ..Gradient2Config::default()
            }),
        ] {
            shared.expert.limit = Some(limit);
            if let Ok(Value::Table(t)) = Value::try_from(&shared) {
                if let Some(v) = t.get("expert").and_then(|e| e.get("limit")) {
                    leaves("expert.limit", v, &mut out);
                }
            }
        }
        // The rate and the share of a bucket are alternatives; both are keys.
        for tier in Criticality::ALL {
            out.push(format!("buckets.{}.share", tier.as_str()));
        }
        out.sort();
        out.dedup();
        out
    })
}

fn leaves(path: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Table(t) => {
            for (k, v) in t {
                leaves(&format!("{path}.{k}"), v, out);
            }
        }
        _ => out.push(path.to_owned()),
    }
}

/// Sets (or with `None` removes) the value at `path`, making the tables on the way.
fn set(table: &mut Table, path: &str, value: Option<Value>) {
    let mut parts = path.split('.').peekable();
    let mut at = table;
    while let Some(key) = parts.next() {
        if parts.peek().is_none() {
            match value {
                Some(v) => {
                    at.insert(key.to_owned(), v);
                }
                None => {
                    at.remove(key);
                }
            }
            return;
        }
        let entry = at
            .entry(key.to_owned())
            .or_insert_with(|| Value::Table(Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(Table::new());
        }
        let Value::Table(next) = entry else {
            return;
        };
        at = next;
    }
}

/// The configurations described by the edits, each one the previous plus its own edits.
fn configurations(input: &mut Input<'_>) -> Vec<Table> {
    let Ok(Value::Table(mut table)) = Value::try_from(RuntimeConfig::default()) else {
        return Vec::new();
    };
    let paths = paths();
    let mut out = Vec::new();
    loop {
        let at = input.byte();
        if at == 0xff || input.is_empty() {
            out.push(table.clone());
            if out.len() == MAX_CONFIGS || input.is_empty() {
                return out;
            }
            continue;
        }
        let path = &paths[usize::from(at) % paths.len()];
        let value = match input.byte() % 8 {
            0 => Some(Value::Integer(input.u64() as i64)),
            1 => Some(Value::Integer(
                EDGE_INTEGERS[usize::from(input.byte()) % EDGE_INTEGERS.len()],
            )),
            2 => Some(Value::Float(f64::from_bits(input.u64()))),
            3 => Some(Value::Float(
                EDGE_FLOATS[usize::from(input.byte()) % EDGE_FLOATS.len()],
            )),
            4 => Some(Value::Boolean(input.byte() & 1 == 1)),
            5 => Some(Value::String(
                WORDS[usize::from(input.byte()) % WORDS.len()].to_owned(),
            )),
            6 => None,
            _ => {
                let len = usize::from(input.byte() % 32);
                let bytes: Vec<u8> = (0..len).map(|_| input.byte()).collect();
                Some(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
            }
        };
        set(&mut table, path, value);
    }
}

/// Whether `field`, as a [`ConfigError`](triage::ConfigError) names it, is a key of `text`, or
/// a key missing from a table of `text` (a bucket's `rate` when it has none): the path up to
/// its last part leads through the file's tables.
fn names_a_key(field: &str, text: &str) -> bool {
    // A setting of the layout before the expert group is named at its new place.
    let old = MOVED.iter().find_map(|(old, new)| {
        let rest = field.strip_prefix(new)?;
        (rest.is_empty() || rest.starts_with('.')).then(|| format!("{old}{rest}"))
    });
    is_a_key(field, text) || old.is_some_and(|old| is_a_key(&old, text))
}

fn is_a_key(field: &str, text: &str) -> bool {
    let Ok(Value::Table(t)) = text.parse::<Value>() else {
        return true;
    };
    let mut at = &t;
    let mut parts = field.split('.').peekable();
    while let Some(key) = parts.next() {
        let last = parts.peek().is_none();
        match at.get(key) {
            Some(Value::Table(next)) if !last => at = next,
            Some(_) => return true,
            None => return last,
        }
    }
    true
}

/// Runs the target on one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let mode = input.byte();
    let (texts, traffic) = if mode & 1 == 1 {
        match std::str::from_utf8(input.rest()) {
            Ok(text) => {
                sources(text);
                (vec![text.to_owned()], 0)
            }
            Err(_) => return,
        }
    } else {
        let traffic = input.byte();
        let texts = configurations(&mut input)
            .iter()
            .filter_map(|t| toml::to_string(t).ok())
            .collect();
        (texts, traffic)
    };
    let Some((first, next)) = texts.split_first() else {
        return;
    };
    let mut config = match RuntimeConfig::from_toml(first) {
        Ok(config) => config,
        Err(LoadConfigError::Invalid(e)) => {
            assert!(
                names_a_key(e.field(), first),
                "the error names {:?}, not a key of\n{first}\n({e})",
                e.field()
            );
            return;
        }
        Err(_) => return,
    };
    if config.workers.get() > MAX_WORKERS as usize {
        config.workers =
            std::num::NonZeroUsize::new(MAX_WORKERS as usize).unwrap_or(config.workers);
    }
    let next: Vec<Result<RuntimeConfig, String>> = next
        .iter()
        .map(|t| toml::from_str(t).map_err(|_| t.clone()))
        .collect();
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime")
        .block_on(drive(config, next, traffic, mode));
}

/// `text` as the Kafka and RabbitMQ sources' configurations: when it is one, a refusal names
/// a key of it.
fn sources(text: &str) {
    if let Ok(kafka) = toml::from_str::<triage_kafka::KafkaSourceConfig>(text) {
        if let Err(e) = kafka.validate() {
            assert!(names_a_key(e.field(), text), "kafka: {e}\n{text}");
        }
    }
    if let Ok(amqp) = toml::from_str::<triage_amqp::AmqpSourceConfig>(text) {
        if let Err(e) = amqp.validate(1024) {
            assert!(names_a_key(e.field(), text), "amqp: {e}\n{text}");
        }
    }
}

async fn drive(
    config: RuntimeConfig,
    next: Vec<Result<RuntimeConfig, String>>,
    traffic: u8,
    mode: u8,
) {
    let (clock, mock) = Clock::mock();
    mock.increment(Duration::from_secs(86_400));
    let sinks = mode & 0b10 != 0;
    let mut builder = Runtime::builder(config.clone())
        .clock(clock.clone())
        .downstream(|p: &u8| (p % 2 == 1).then_some("d"));
    if sinks {
        builder = builder
            .defer_sink(Arc::new(FlakySink(MemorySink::new())))
            .dead_letter_sink(Arc::new(MemorySink::<u8>::new()));
    }
    let started = builder.start(|job: Job<u8>| async move {
        if job.payload() % 2 == 1 {
            return Err(HandlerError::downstream("d", "odd"));
        }
        Ok::<(), HandlerError>(())
    });
    let mut runtime = match started {
        Ok(runtime) => runtime,
        Err(e) => {
            assert!(
                !sinks
                    && e.field().starts_with("policy.")
                    && config
                        .policy
                        .iter()
                        .any(|(_, p)| *p == RefusalPolicy::Defer),
                "a configuration from_toml accepted did not start: {e}"
            );
            return;
        }
    };
    let broker = (mode & 0b100 != 0).then(MemoryBroker::<u8>::new);
    if let Some(broker) = &broker {
        runtime.attach(broker.source());
    }
    let step = [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_millis(5),
        Duration::from_millis(100),
        Duration::from_secs(1),
        Duration::from_secs(30),
        Duration::from_secs(600),
        Duration::from_secs(3_600),
    ][usize::from((traffic >> 4) & 0b111)];
    let messages = traffic & 0b1111;
    let mut sent = 0u8;

    let serve = |runtime: &Runtime<u8>, sent: &mut u8| {
        for _ in 0..messages {
            let tier =
                Criticality::from_rank(usize::from(*sent % 4)).unwrap_or(Criticality::Medium);
            let deadline = clock
                .now()
                .checked_add(Duration::from_millis(u64::from(*sent) * 50))
                .filter(|_| *sent % 3 == 0);
            match &broker {
                Some(broker) if *sent % 2 == 0 => {
                    broker.publish_with(*sent, tier, deadline, usize::from(*sent) * 100);
                }
                _ => {
                    let envelope = Envelope::new(*sent, tier, triage::runtime::Ack::noop())
                        .with_size_bytes(usize::from(*sent) * 100)
                        .with_deadline_opt(deadline);
                    let _ = runtime.try_submit(envelope);
                }
            }
            *sent = sent.wrapping_add(1);
        }
    };
    let tick = |mock: &Mock| {
        mock.increment(step);
        tokio::time::advance(step)
    };

    serve(&runtime, &mut sent);
    tick(&mock).await;
    check_live(&runtime);
    for b in next {
        let Ok(b) = b else {
            continue;
        };
        let before = runtime.config();
        let generation = runtime.config_generation();
        let refused = runtime.config_refused();
        let limit = runtime.concurrency_limit().limit();
        let shares = runtime.concurrency_limit().shares();
        let done = runtime.reconfigure(b.clone());
        let expected = resolved(&b, sinks);
        match done {
            Ok(r) => {
                assert_eq!(*runtime.config(), expected, "applied, read back");
                assert!(b.validate().is_ok(), "applied although validate refuses it");
                assert_eq!(
                    runtime.config_generation(),
                    generation + u64::from(!r.changes.is_empty())
                );
                assert_eq!(runtime.concurrency_limit().shares(), b.expert.shares);
                if b.expert.limit != before.expert.limit {
                    // The limit moves below `workers`: capped at it.
                    let initial = match &b.expert.limit {
                        Some(l) => l.build().expect("validated").limit().min(b.workers.get()),
                        None => b.workers.get(),
                    };
                    assert_eq!(
                        runtime.concurrency_limit().limit(),
                        initial,
                        "the new limit"
                    );
                }
            }
            Err(e) => {
                assert_eq!(runtime.config(), before, "refused ({e}), yet changed");
                assert_eq!(runtime.config_generation(), generation);
                assert_eq!(runtime.config_refused(), refused + 1);
                assert_eq!(runtime.concurrency_limit().limit(), limit, "refused ({e})");
                assert_eq!(
                    runtime.concurrency_limit().shares(),
                    shares,
                    "refused ({e})"
                );
                let fixed = FIXED.iter().any(|(f, _)| Some(*f) == e.field());
                let defer = !sinks && b.policy.iter().any(|(_, p)| *p == RefusalPolicy::Defer);
                assert!(
                    b.validate().is_err() || fixed || defer,
                    "a valid configuration refused: {e}"
                );
            }
        }
        check_live(&runtime);
        serve(&runtime, &mut sent);
        tick(&mock).await;
        check_live(&runtime);
    }
    if let Some(broker) = &broker {
        broker.close();
    }
    let report = runtime.shutdown(Duration::from_secs(1)).await;
    assert_eq!(report.stats.alive, 0, "alive after shutdown: {report}");
    assert!(
        report.stats.balances(),
        "the ledger does not balance: {report}"
    );
}

/// `config` as the runtime holds it: `defer_or_drop` is `defer` with a defer sink, `drop`
/// without.
fn resolved(config: &RuntimeConfig, sinks: bool) -> RuntimeConfig {
    let mut out = config.clone();
    out.policy = PerTier::from_fn(|t| match config.policy[t] {
        RefusalPolicy::DeferOrDrop if sinks => RefusalPolicy::Defer,
        RefusalPolicy::DeferOrDrop => RefusalPolicy::Drop,
        p => p,
    });
    out
}

/// A defer sink that fails in transport for every fourth payload, as a broker that drops a
/// connection now and then.
struct FlakySink(MemorySink<u8>);

impl DeferSink<u8> for FlakySink {
    fn publish<'a>(
        &'a self,
        payload: &'a u8,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        if payload % 4 == 3 {
            return Box::pin(async { Err(SinkError::Unavailable("flaky".into())) });
        }
        self.0.publish(payload, info)
    }
}

fn check_live(runtime: &Runtime<u8>) {
    let forced = runtime.config().forced_shed_level;
    assert!(
        runtime.load().shed_tiers() >= forced,
        "load {:?} below the forced level {forced}",
        runtime.load()
    );
}
