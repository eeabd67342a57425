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

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use triage::admission::QueueAgeConfig;
use triage::runtime::{HandlerError, Job, RefusalPolicy, Runtime, RuntimeConfig};
use triage::PerTier;
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

const BROKERS: &str = "127.0.0.1:9092";
const RECORDS: u64 = 50_000;

fn group() -> String {
    format!("bench-{}", fastrand::u64(..))
}

async fn prepare(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .create()
        .expect("admin client");
    let _ = admin
        .create_topics(
            [&NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("create topic");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let payload = vec![b'x'; 100];
    let mut pending = futures_util::stream::FuturesUnordered::new();
    for i in 0..RECORDS {
        let key = i.to_string();
        pending.push(producer.send(
            FutureRecord::to(topic).key(&key).payload(&payload),
            Duration::from_secs(30),
        ));
        if pending.len() >= 10_000 {
            while let Some(r) = pending.next().await {
                r.expect("delivered");
            }
        }
    }
    while let Some(r) = pending.next().await {
        r.expect("delivered");
    }
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
        let m = consumer.recv().await.expect("record");
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

fn consume(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let topic = format!("bench-consume-{}", fastrand::u64(..));
    rt.block_on(prepare(&topic));
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
