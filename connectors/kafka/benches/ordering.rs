//! Ordered consumption on Kafka (issue 14): `key` mode against `partition` mode, 16 workers,
//! a 1 ms handler, one topic of 100 keys × 50 records over 4 partitions (the shape of
//! `tests/ordering.rs`, shorter).
//!
//! `partition` mode runs at most one record per partition, so 4 at a time; `key` mode runs one
//! per key, so up to the 16 workers while at least 16 keys have work. Each iteration reads the
//! whole topic with a fresh consumer group and is timed from its first completion to its last
//! (the group join is left out). Needs the broker:
//! `tests/brokers/kafka.sh start`, then `cargo bench -p triage-kafka --bench ordering`.
//! Figures in BENCHMARKS.md.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use triage::ordering::OrderingMode;
use triage::runtime::{HandlerError, Job, RefusalPolicy, Runtime, RuntimeConfig};
use triage::PerTier;
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

mod common;

const BROKERS: &str = "127.0.0.1:9092";
const KEYS: u64 = 100;
const PER_KEY: u64 = 50;
const RECORDS: u64 = KEYS * PER_KEY;
const PARTITIONS: i32 = 4;

async fn prepare(topic: &str) {
    let records = (0..PER_KEY).flat_map(|seq| {
        (0..KEYS).map(move |key| (format!("k{key}"), format!("{key}:{seq}").into_bytes()))
    });
    common::produce(BROKERS, topic, PARTITIONS, records).await;
}

async fn run(topic: &str, mode: OrderingMode) -> Duration {
    let mut config = RuntimeConfig {
        workers: 16.try_into().expect("non-zero"),
        ..RuntimeConfig::default()
    };
    config.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let mut runtime = Runtime::builder(config)
        .start(|job: Job<KafkaMessage>| async move {
            std::hint::black_box(job.payload());
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok::<(), HandlerError>(())
        })
        .expect("valid config");
    let group = format!("bench-order-{}", fastrand::u64(..));
    let source_config = KafkaSourceConfig::new(BROKERS, group, [topic]);
    runtime.attach(
        KafkaSource::builder(source_config)
            .ordering(mode)
            .build()
            .expect("source"),
    );
    // Timed from the first completion: joining the group (hundreds of ms, the same for both
    // modes) is not the throughput being compared.
    let mut first: Option<Instant> = None;
    loop {
        let completed = runtime.stats().ledger.total().completed;
        if completed >= RECORDS {
            break;
        }
        if completed > 0 && first.is_none() {
            first = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = first.map_or(Duration::ZERO, |f| f.elapsed());
    let _report = runtime.shutdown(Duration::from_secs(10)).await;
    elapsed
}

fn ordering(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let topic = format!("bench-ordering-{}", fastrand::u64(..));
    rt.block_on(prepare(&topic));
    let mut g = c.benchmark_group("kafka_ordering_5k_1ms");
    g.throughput(Throughput::Elements(RECORDS));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(10));
    for mode in [OrderingMode::Key, OrderingMode::Partition] {
        g.bench_function(format!("{mode}_16_workers"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(run(&topic, mode))).sum())
        });
    }
    g.finish();
}

criterion_group!(benches, ordering);
criterion_main!(benches);
