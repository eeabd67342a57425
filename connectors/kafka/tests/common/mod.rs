//! Helpers for the integration tests against the real broker on 127.0.0.1:9092
//! (started by `tests/brokers/kafka.sh start`). After rdkafka's `tests/utils.rs`.
#![allow(dead_code)]

use std::future::Future;
use std::process::Command;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use triage::runtime::{Envelope, Source};
use triage_kafka::KafkaMessage;

pub const BROKERS: &str = "127.0.0.1:9092";

/// Hang guard for waits on the broker: a test stuck longer than this fails instead of hanging.
/// Never a performance threshold.
pub const HANG_GUARD: Duration = Duration::from_secs(90);

/// Tests that stop the broker take it exclusively; every other test shares it.
static BROKER: RwLock<()> = RwLock::const_new(());

pub async fn broker_shared() -> RwLockReadGuard<'static, ()> {
    let guard = BROKER.read().await;
    broker("start");
    guard
}

pub async fn broker_exclusive() -> RwLockWriteGuard<'static, ()> {
    let guard = BROKER.write().await;
    broker("start");
    guard
}

/// Runs `tests/brokers/kafka.sh <cmd>` of this checkout.
pub fn broker(cmd: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/brokers/kafka.sh");
    let status = Command::new("bash")
        .arg(script)
        .arg(cmd)
        .status()
        .expect("run kafka.sh");
    assert!(status.success(), "kafka.sh {cmd} failed");
}

/// Restarts the broker when dropped, even if the test panicked.
pub struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        broker("start");
    }
}

pub fn rand_name(prefix: &str) -> String {
    format!("{prefix}-{:016x}", fastrand::u64(..))
}

pub async fn create_topic(name: &str, partitions: i32, config: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .create()
        .expect("admin client");
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in config {
        topic = topic.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics([&topic], &opts)
        .await
        .expect("create topics");
    for r in results {
        r.expect("topic created");
    }
}

pub fn producer(max_message_bytes: usize) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .set("acks", "all")
        .set("message.max.bytes", max_message_bytes.to_string())
        .create()
        .expect("producer")
}

/// One record to produce: key, payload, headers.
pub type Rec = (Option<Vec<u8>>, Vec<u8>, Vec<(String, Option<Vec<u8>>)>);

pub async fn produce(topic: &str, records: Vec<Rec>) {
    let producer = producer(30_000_000);
    for (key, payload, headers) in records {
        let hs = headers.iter().fold(OwnedHeaders::new(), |acc, (k, v)| {
            acc.insert(Header {
                key: k.as_str(),
                value: v.as_deref(),
            })
        });
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
            .payload(payload.as_slice())
            .partition(0)
            .headers(hs);
        if let Some(k) = key.as_deref() {
            rec = rec.key(k);
        }
        producer
            .send(rec, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }
}

pub async fn produce_n(topic: &str, n: usize) {
    produce(
        topic,
        (0..n)
            .map(|i| (None, format!("m{i}").into_bytes(), vec![]))
            .collect(),
    )
    .await;
}

/// The group's committed position of `topic`/0, read by a separate client.
pub fn committed(group: &str, topic: &str) -> Option<i64> {
    committed_offsets(&group_reader(group), group, topic, 1)[0]
}

/// A client of `group` that only reads its committed positions and the watermarks.
fn group_reader(group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .set("group.id", group)
        .create()
        .expect("consumer")
}

/// Per partition `0..partitions` of `topic`: `group`'s committed position, `None` if none.
fn committed_offsets(
    consumer: &BaseConsumer,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Vec<Option<i64>> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    // The group coordinator can answer NotCoordinator or CoordinatorLoadInProgress while it
    // moves or loads (a broker busy with other tests' groups): retriable, as librdkafka's own
    // clients treat it; the question is asked again, up to the hang guard's patience.
    let mut attempts = 0;
    let got = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(30)) {
            Ok(got) => break got,
            Err(e) if attempts < 20 => {
                attempts += 1;
                eprintln!("committed offsets of {group}: {e}; asking again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("committed offsets: {e}"),
        }
    };
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// Polls `check` until it returns true; panics after the hang guard.
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let waited = tokio::time::timeout(HANG_GUARD, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "hang guard: gave up waiting for {what}");
}

/// Waits until the committed position is at least `min`, and returns it. Positions only
/// grow, so the first one seen at or above `min` tells whether the commit stopped where it
/// had to.
pub async fn committed_at_least(group: &str, topic: &str, min: i64) -> i64 {
    let read = || {
        let (g, t) = (group.to_owned(), topic.to_owned());
        tokio::task::spawn_blocking(move || committed(&g, &t))
    };
    let found = tokio::time::timeout(HANG_GUARD, async {
        loop {
            if let Some(now) = read().await.unwrap().filter(|&p| p >= min) {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    found.expect("hang guard: no commit")
}

pub async fn next<S: Source<Payload = KafkaMessage>>(source: &mut S) -> Envelope<KafkaMessage> {
    tokio::time::timeout(HANG_GUARD, source.next())
        .await
        .expect("hang guard: no record")
        .expect("source ended")
}

pub async fn take<S: Source<Payload = KafkaMessage>>(
    source: &mut S,
    n: usize,
) -> Vec<Envelope<KafkaMessage>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next(source).await);
    }
    out
}

/// `per_key` rounds over `keys` keys (`k<key>` -> payload `<key>:<seq>`), spread over the
/// partitions by the default partitioner, idempotent so each key's records keep their order.
pub async fn produce_keyed(topic: &str, keys: u32, per_key: u32) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let mut deliveries = Vec::with_capacity((keys * per_key) as usize);
    for seq in 0..per_key {
        for key in 0..keys {
            let (k, payload) = (format!("k{key}"), format!("{key}:{seq}"));
            deliveries.push(
                producer
                    .send_result(FutureRecord::to(topic).key(&k).payload(&payload))
                    .map_err(|(e, _)| e)
                    .expect("enqueue"),
            );
        }
    }
    for d in deliveries {
        d.await
            .expect("delivery")
            .map_err(|(e, _)| e)
            .expect("produced");
    }
}

/// Per partition `0..partitions`: (committed position of `group`, high watermark).
pub fn positions(group: &str, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
    let consumer = group_reader(group);
    let committed = committed_offsets(&consumer, group, topic, partitions);
    (0..partitions)
        .map(|p| {
            let at = committed[p as usize].unwrap_or(-1);
            let (_, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(30))
                .expect("watermarks");
            (at, high)
        })
        .collect()
}
