//! triage over Kafka against a plain rdkafka consumer, same topic, same process.
//!
//! - `plain_rdkafka`: a `StreamConsumer` that reads each record and stores its offset
//!   (`enable.auto.offset.store=false`, auto commit at the source's `commit_interval_ms`), the
//!   at-least-once baseline, on the same librdkafka settings as the source
//!   (`KafkaSourceConfig::client_properties`: fetch sizes, prefetch bound, fetch backoff);
//! - `plain_pool`: the same client handing each record, detached (owned), through a bounded
//!   async-channel to 8 tasks that store its offset: a worker pool written without triage;
//! - `triage_noop_handler`: `KafkaSource` through the full `Runtime` (classification,
//!   admission, the weighted-fair queue, a no-op handler, the ledger, watermark commits).
//!
//! Each iteration reads the same 50,000 records of 100 bytes from the start, with a fresh
//! consumer group, timed from the first record to the last (the group join, 0 to 3 s on a
//! shared broker, left out); for triage the handler counts the records and wakes the bench at
//! the last one. Needs the broker: `tests/brokers/kafka.sh start`, then
//! `cargo bench -p triage-kafka --bench consume`. Figures in BENCHMARKS.md.
//!
//! Before criterion's timing, each consumer reads the records `BENCH_CPU_RUNS` times (default
//! 2) while the process's CPU time (user + system, every thread, librdkafka's included) is
//! measured: printed per 100,000 records, triage against plain. The broker shares the two
//! cores, so throughput alone hides the consumer's own cost. `BENCH_CPU_ONLY=1` stops there;
//! `BENCH_CPU_WHICH=plain_rdkafka` (or `plain_pool`, `triage`) runs only that consumer, for a profiler.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::OwnedMessage;
use rdkafka::Message;
use tokio::sync::Notify;
use triage::admission::QueueAgeConfig;
use triage::runtime::{HandlerError, Job, RefusalPolicy, Runtime, RuntimeConfig};
use triage::PerTier;
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

/// CPU time (user + system) this process has used so far, every thread included (the client
/// library's own threads, and threads that already exited, are part of a worker's cost), from
/// `getrusage(RUSAGE_SELF)`: microseconds, from the scheduler's precise runtime (the clock
/// ticks of `/proc/self/stat` were 10 ms, a third of the plain consumer's whole run here).
/// `None` if the call fails.
fn cpu_time() -> Option<Duration> {
    // SAFETY: `getrusage` only writes the struct it is given, which is plain data.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return None;
        }
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).ok()?)
            .checked_add(Duration::from_micros(u64::try_from(t.tv_usec).ok()?))
    };
    tv(usage.ru_utime)?.checked_add(tv(usage.ru_stime)?)
}

mod common;

const BROKERS: &str = "127.0.0.1:9092";
const RECORDS: u64 = 50_000;

fn group() -> String {
    format!("bench-{}", fastrand::u64(..))
}

async fn prepare(topic: &str) {
    let records = (0..RECORDS).map(|i| (i.to_string(), vec![b'x'; 100]));
    common::produce(BROKERS, topic, 1, records).await;
}

/// The source's configuration for `topic`, read from the start with a fresh group. No tier
/// has a usefulness window: a topic reused through `BENCH_TOPIC` is older than Medium's 15
/// minutes after a while, and its records would be expired at intake instead of served (the
/// triage run then waited for handler calls that never came).
fn source_config(topic: &str) -> KafkaSourceConfig {
    let mut config = KafkaSourceConfig::new(BROKERS, group(), [topic]);
    config
        .properties
        .insert("auto.offset.reset".into(), "earliest".into());
    config.deadline.window_ms = PerTier::splat(None);
    config
}

/// A moment of a run: when, and the process's CPU time then.
#[derive(Clone, Copy)]
struct Stamp {
    at: Instant,
    cpu: Option<Duration>,
}

impl Stamp {
    fn now() -> Self {
        Stamp {
            at: Instant::now(),
            cpu: cpu_time(),
        }
    }
}

/// The first and the last record of a run.
struct Timing {
    first: Stamp,
    last: Stamp,
}

impl Timing {
    /// From the first record to the last.
    fn took(&self) -> Duration {
        self.last.at - self.first.at
    }
}

/// The plain consumers' client: the same librdkafka settings as the source (fetch sizes,
/// prefetch bound, fetch backoff), and the same commit work: the stored offsets committed
/// every `commit_interval_ms`.
fn plain_consumer(topic: &str) -> StreamConsumer {
    let source = source_config(topic);
    let mut client = ClientConfig::new();
    for (k, v) in source.client_properties() {
        client.set(k, v);
    }
    let consumer: StreamConsumer = client
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .set(
            "auto.commit.interval.ms",
            source.commit_interval_ms.to_string(),
        )
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    consumer
}

async fn plain(topic: &str) -> Timing {
    let consumer = plain_consumer(topic);
    let mut first = None;
    let mut n = 0;
    while n < RECORDS {
        // Transport errors are transient (librdkafka reconnects): skip them, as a worker would.
        let Ok(m) = consumer.recv().await else {
            continue;
        };
        first.get_or_insert_with(Stamp::now);
        std::hint::black_box(m.payload());
        consumer.store_offset_from_message(&m).expect("store");
        n += 1;
    }
    let last = Stamp::now();
    Timing {
        first: first.unwrap_or(last),
        last,
    }
}

/// A plain worker pool, what a worker without triage is written as: the same client, each
/// record detached (an owned copy, as any worker that queues records makes) and sent through
/// a bounded async-channel of 1,024 to 8 tasks, each storing its record's offset after the
/// no-op handler. Out of order: a pool that stores offsets this way may commit past a record
/// still in a handler (triage commits only the contiguous watermark); the baseline counts
/// what the hand-off costs, not what it promises.
async fn plain_pool(topic: &str) -> Timing {
    let consumer = Arc::new(plain_consumer(topic));
    let (tx, rx) = async_channel::bounded::<OwnedMessage>(1024);
    let handled = Arc::new(AtomicU64::new(0));
    let all_handled = Arc::new(Notify::new());
    let last = Arc::new(OnceLock::new());
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (rx, consumer) = (rx.clone(), Arc::clone(&consumer));
            let (count, done, last) = (
                Arc::clone(&handled),
                Arc::clone(&all_handled),
                Arc::clone(&last),
            );
            tokio::spawn(async move {
                while let Ok(m) = rx.recv().await {
                    std::hint::black_box(m.payload());
                    // librdkafka commits the stored offset + 1 (`rd_kafka_offset_store`):
                    // the record's own offset, not the next one (that committed one past the
                    // end, lag -1 in `ConsumerGroupCommand`).
                    consumer
                        .store_offset(m.topic(), m.partition(), m.offset())
                        .expect("store");
                    if count.fetch_add(1, Ordering::Relaxed) + 1 == RECORDS {
                        last.get_or_init(Stamp::now);
                        done.notify_one();
                    }
                }
            })
        })
        .collect();
    let mut first = None;
    let mut n = 0;
    while n < RECORDS {
        let Ok(m) = consumer.recv().await else {
            continue;
        };
        first.get_or_insert_with(Stamp::now);
        tx.send(m.detach()).await.expect("the pool's tasks run");
        n += 1;
    }
    all_handled.notified().await;
    drop(tx);
    for task in tasks {
        task.await.expect("pool task");
    }
    let last = *last.get().expect("stamped before the wake-up");
    Timing {
        first: first.unwrap_or(last),
        last,
    }
}

async fn triage(topic: &str) -> Timing {
    let mut config = RuntimeConfig {
        workers: 8.try_into().expect("non-zero"),
        ..RuntimeConfig::default()
    };
    config.expert.queue.admission = QueueAgeConfig::disabled();
    config.policy = PerTier::splat(RefusalPolicy::Backpressure);
    // The handler stamps the first and the last record and wakes the bench at the last: no
    // polling of the runtime's stats meanwhile (which cost a timer wake-up every millisecond).
    let handled = Arc::new(AtomicU64::new(0));
    let all_handled = Arc::new(Notify::new());
    let first = Arc::new(OnceLock::new());
    let last = Arc::new(OnceLock::new());
    let (count, done, first_seen, last_seen) = (
        Arc::clone(&handled),
        Arc::clone(&all_handled),
        Arc::clone(&first),
        Arc::clone(&last),
    );
    let mut runtime = Runtime::builder(config)
        .start(move |job: Job<KafkaMessage>| {
            first_seen.get_or_init(Stamp::now);
            std::hint::black_box(job.payload());
            if count.fetch_add(1, Ordering::Relaxed) + 1 == RECORDS {
                last_seen.get_or_init(Stamp::now);
                done.notify_one();
            }
            async { Ok::<(), HandlerError>(()) }
        })
        .expect("valid config");
    runtime.attach(
        KafkaSource::builder(source_config(topic))
            .build()
            .expect("source"),
    );
    // Bounded: a record that ends otherwise than completed (expired at intake, say) never
    // reaches the handler, and an unbounded wait hung the bench instead of failing it.
    let finished = tokio::time::timeout(Duration::from_secs(300), all_handled.notified()).await;
    let report = runtime.shutdown(Duration::from_secs(10)).await;
    assert!(
        finished.is_ok(),
        "not every record reached the handler within 300 s: {:?}",
        report.stats.ledger.total()
    );
    assert_eq!(report.stats.ledger.total().completed, RECORDS);
    let last = *last.get().expect("stamped before the wake-up");
    Timing {
        first: *first.get().expect("stamped before the last"),
        last,
    }
}

/// Each consumer's CPU time per 100,000 records, the least over `BENCH_CPU_RUNS` runs, two
/// ways: over the whole run (consumer creation, the group join, every record, and the close:
/// for triage the runtime's shutdown with the final commit), and over the steady part, from
/// the first record to the last. Every plain run comes first: triage starts a clock thread
/// (the queue's recent-time upkeep) that lives as long as the process; it parks 100 ms after
/// its last use, but a plain run straight after a triage run would still pay its last ticks.
fn cpu_report(rt: &tokio::runtime::Runtime, topic: &str) {
    let runs: usize = std::env::var("BENCH_CPU_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let per_100k = |cpu: Duration| cpu.as_secs_f64() * 1e3 * 100_000.0 / RECORDS as f64;
    // `BENCH_CPU_WHICH=plain_rdkafka`, `plain_pool` or `triage` runs one consumer only (a prefix).
    let which = std::env::var("BENCH_CPU_WHICH").unwrap_or_default();
    // [consumer][whole, steady], ms per 100,000.
    let mut least = [[f64::INFINITY; 2]; 3];
    for (i, name) in ["plain_rdkafka", "plain_pool", "triage_noop_handler"]
        .into_iter()
        .enumerate()
    {
        if !which.is_empty() && !name.starts_with(which.as_str()) {
            continue;
        }
        for run in 0..runs {
            let before = cpu_time();
            let timing = match i {
                0 => rt.block_on(plain(topic)),
                1 => rt.block_on(plain_pool(topic)),
                _ => rt.block_on(triage(topic)),
            };
            let after = cpu_time();
            let (Some(before), Some(after), Some(first), Some(last)) =
                (before, after, timing.first.cpu, timing.last.cpu)
            else {
                println!("CPU time unavailable (getrusage failed)");
                return;
            };
            let (whole, steady) = (per_100k(after - before), per_100k(last - first));
            least[i][0] = least[i][0].min(whole);
            least[i][1] = least[i][1].min(steady);
            let rate = RECORDS as f64 / timing.took().as_secs_f64();
            println!(
                "cpu run {run} {name:>20}: {rate:>8.0} records/s (first to last record), \
                 CPU per 100,000: whole run {whole:.1} ms, first to last record {steady:.1} ms"
            );
        }
    }
    if least.iter().flatten().any(|l| l.is_infinite()) {
        return;
    }
    for (j, what) in ["whole run", "first to last record"]
        .into_iter()
        .enumerate()
    {
        println!(
            "least CPU per 100,000, {what}: plain {:.1} ms, plain pool {:.1} ms, triage {:.1} ms \
             ({:.2}x plain, {:.2}x the pool)",
            least[0][j],
            least[1][j],
            least[2][j],
            least[2][j] / least[0][j],
            least[2][j] / least[1][j]
        );
    }
}

fn consume(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // `BENCH_TOPIC` reuses a topic a previous run filled (its name is printed), so that a
    // profile of the consumers holds no producer.
    let topic = match std::env::var("BENCH_TOPIC") {
        Ok(topic) => topic,
        Err(_) => {
            let topic = format!("bench-consume-{}", fastrand::u64(..));
            rt.block_on(prepare(&topic));
            topic
        }
    };
    println!("topic {topic}");
    cpu_report(&rt, &topic);
    if std::env::var_os("BENCH_CPU_ONLY").is_some() {
        return;
    }
    let mut g = c.benchmark_group("kafka_consume_50k");
    g.throughput(Throughput::Elements(RECORDS));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(20));
    g.bench_function("plain_rdkafka", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(plain(&topic)).took()).sum())
    });
    g.bench_function("plain_pool", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| rt.block_on(plain_pool(&topic)).took())
                .sum()
        })
    });
    g.bench_function("triage_noop_handler", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(triage(&topic)).took()).sum())
    });
    g.finish();
}

criterion_group!(benches, consume);
criterion_main!(benches);
