//! triage over Kafka against a plain rdkafka consumer, same topic, same process.
//!
//! - `plain_rdkafka`: a `StreamConsumer` that reads each record and stores its offset
//!   (`enable.auto.offset.store=false`, auto commit), the at-least-once baseline;
//! - `triage_noop_handler`: `KafkaSource` through the full `Runtime` (classification,
//!   admission, the weighted-fair queue, a no-op handler, the ledger, watermark commits).
//!
//! Each iteration reads the same 50,000 records of 100 bytes from the start, with a fresh
//! consumer group. Needs the broker: `tests/brokers/kafka.sh start`, then
//! `cargo bench -p triage-kafka --bench consume`. Figures in BENCHMARKS.md.
//!
//! Before criterion's timing, each consumer reads the records `BENCH_CPU_RUNS` times (default
//! 2) while the process's CPU time (user + system, every thread, librdkafka's included) is
//! measured: printed per 100,000 records, triage against plain. The broker shares the two
//! cores, so throughput alone hides the consumer's own cost. `BENCH_CPU_ONLY=1` stops there.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use triage::admission::QueueAgeConfig;
use triage::runtime::{HandlerError, Job, RefusalPolicy, Runtime, RuntimeConfig};
use triage::PerTier;
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

/// CPU time (user + system) this process has used so far, every thread included (the client
/// library's own threads are part of a worker's cost), from `/proc/self/stat` (in clock ticks
/// of 10 ms: about 1% of a run here). `None` off Linux.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
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

async fn plain(topic: &str) -> Duration {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .set("group.id", group())
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let start = Instant::now();
    let mut n = 0;
    while n < RECORDS {
        // Transport errors are transient (librdkafka reconnects): skip them, as a worker would.
        let Ok(m) = consumer.recv().await else {
            continue;
        };
        std::hint::black_box(m.payload());
        consumer.store_offset_from_message(&m).expect("store");
        n += 1;
    }
    start.elapsed()
}

async fn triage(topic: &str) -> Duration {
    let mut config = RuntimeConfig {
        workers: 8.try_into().expect("non-zero"),
        ..RuntimeConfig::default()
    };
    config.queue.admission = QueueAgeConfig::disabled();
    config.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let mut runtime = Runtime::builder(config)
        .start(|job: Job<KafkaMessage>| async move {
            std::hint::black_box(job.payload());
            Ok::<(), HandlerError>(())
        })
        .expect("valid config");
    let mut source_config = KafkaSourceConfig::new(BROKERS, group(), [topic]);
    source_config
        .properties
        .insert("auto.offset.reset".into(), "earliest".into());
    let start = Instant::now();
    runtime.attach(KafkaSource::builder(source_config).build().expect("source"));
    while runtime.stats().ledger.total().completed < RECORDS {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed();
    let _report = runtime.shutdown(Duration::from_secs(10)).await;
    elapsed
}

/// Each consumer's CPU time per 100,000 records, the least over `BENCH_CPU_RUNS` runs (the
/// whole run: consumer creation, reading every record, and for triage the shutdown with its
/// final commit).
fn cpu_report(rt: &tokio::runtime::Runtime, topic: &str) {
    let runs: usize = std::env::var("BENCH_CPU_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let per_100k = |cpu: Duration| cpu.as_secs_f64() * 100_000.0 / RECORDS as f64;
    let mut least = [f64::INFINITY; 2];
    for run in 0..runs {
        for (i, name) in ["plain_rdkafka", "triage_noop_handler"]
            .into_iter()
            .enumerate()
        {
            let before = cpu_time();
            let took = if i == 0 {
                rt.block_on(plain(topic))
            } else {
                rt.block_on(triage(topic))
            };
            let Some(cpu) = cpu_time().zip(before).map(|(a, b)| per_100k(a - b)) else {
                println!("CPU time unavailable (no /proc/self/stat)");
                return;
            };
            least[i] = least[i].min(cpu);
            let rate = RECORDS as f64 / took.as_secs_f64();
            println!(
                "cpu run {run} {name:>20}: {rate:>8.0} records/s, CPU per 100,000: {:.0} ms",
                cpu * 1e3
            );
        }
    }
    println!(
        "least CPU per 100,000: plain {:.0} ms, triage {:.0} ms ({:.2}x)",
        least[0] * 1e3,
        least[1] * 1e3,
        least[1] / least[0]
    );
}

fn consume(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let topic = format!("bench-consume-{}", fastrand::u64(..));
    rt.block_on(prepare(&topic));
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
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(plain(&topic))).sum())
    });
    g.bench_function("triage_noop_handler", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(triage(&topic))).sum())
    });
    g.finish();
}

criterion_group!(benches, consume);
criterion_main!(benches);
