//! Clearing a backlog (issue 9, "a backlog is not an overload"): 20,000 Medium records already
//! in the topic, no new arrivals, the same handler (a 1 ms sleep) with the same concurrency
//! (8), read from the start with a fresh consumer group each iteration.
//!
//! - `plain_rdkafka`: a `StreamConsumer` whose stream runs the handler on up to 8 records at
//!   once (`for_each_concurrent`) and stores each offset after it (auto commit);
//! - `triage`: `KafkaSource` through the full `Runtime` with its defaults (pull-based
//!   admission on, 8 workers): the backlog must be served in order, none of it deferred,
//!   expired or shed (the iteration panics otherwise).
//!
//! The time is from the start of consuming until the last record's handler finished. Needs
//! the broker: `tests/brokers/kafka.sh start`, then
//! `cargo bench -p triage-kafka --bench backlog`. Figures in BENCHMARKS.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::StreamExt;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

mod common;

const BROKERS: &str = "127.0.0.1:9092";
const RECORDS: u64 = 20_000;
const WORKERS: usize = 8;
const SERVICE: Duration = Duration::from_millis(1);

fn group() -> String {
    format!("bench-backlog-{}", fastrand::u64(..))
}

/// The handler both consumers run.
async fn handle(payload: Option<&[u8]>) {
    std::hint::black_box(payload);
    tokio::time::sleep(SERVICE).await;
}

async fn prepare(topic: &str) {
    let records = (0..RECORDS).map(|i| (i.to_string(), vec![b'x'; 100]));
    common::produce(BROKERS, topic, 1, records).await;
}

async fn plain(topic: &str) -> Duration {
    let consumer: Arc<StreamConsumer> = Arc::new(
        ClientConfig::new()
            .set("bootstrap.servers", BROKERS)
            .set("group.id", group())
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.offset.store", "false")
            .set("enable.auto.commit", "true")
            .create()
            .expect("consumer"),
    );
    consumer.subscribe(&[topic]).expect("subscribe");
    let start = Instant::now();
    consumer
        .stream()
        .take(RECORDS as usize)
        .for_each_concurrent(WORKERS, |m| async {
            // Transport errors are transient (librdkafka reconnects): skip them.
            if let Ok(m) = m {
                handle(m.payload()).await;
                consumer.store_offset_from_message(&m).expect("store");
            }
        })
        .await;
    start.elapsed()
}

async fn triage(topic: &str) -> Duration {
    let config = RuntimeConfig {
        workers: WORKERS.try_into().expect("non-zero"),
        ..RuntimeConfig::default()
    };
    let mut runtime = Runtime::builder(config)
        .start(|job: Job<KafkaMessage>| async move {
            handle(job.payload().payload.as_deref()).await;
            Ok::<(), HandlerError>(())
        })
        .expect("valid config");
    let mut source_config = KafkaSourceConfig::new(BROKERS, group(), [topic]);
    source_config
        .properties
        .insert("auto.offset.reset".into(), "earliest".into());
    let start = Instant::now();
    runtime.attach(KafkaSource::builder(source_config).build().expect("source"));
    loop {
        let t = runtime.stats().ledger.total();
        let settled = t.completed + t.failed + t.deferred + t.expired + t.shed;
        if settled >= RECORDS {
            assert_eq!(
                t.completed, RECORDS,
                "a backlog is not an overload: every record completed ({t:?})"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed();
    let _report = runtime.shutdown(Duration::from_secs(10)).await;
    elapsed
}

fn backlog(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let topic = format!("bench-backlog-{}", fastrand::u64(..));
    rt.block_on(prepare(&topic));
    let mut g = c.benchmark_group("kafka_backlog_20k_medium_1ms_x8");
    g.throughput(Throughput::Elements(RECORDS));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(30));
    g.bench_function("plain_rdkafka", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(plain(&topic))).sum())
    });
    g.bench_function("triage", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(triage(&topic))).sum())
    });
    g.finish();
}

criterion_group!(benches, backlog);
criterion_main!(benches);
