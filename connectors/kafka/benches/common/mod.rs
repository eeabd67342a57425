//! What the Kafka benches share: a topic created and filled before any clock starts.

use futures_util::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

/// Creates `topic` with `partitions` partitions on `brokers` and produces `records` (key,
/// payload) to it, without headers (every record of the default tier, Medium), in order per
/// partition (idempotent producer), returning once every record is acknowledged. At most
/// 10,000 deliveries are awaited at once.
pub async fn produce(
    brokers: &str,
    topic: &str,
    partitions: i32,
    records: impl IntoIterator<Item = (String, Vec<u8>)>,
) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let _ = admin
        .create_topics(
            [&NewTopic::new(
                topic,
                partitions,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .expect("create topic");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let mut pending = futures_util::stream::FuturesUnordered::new();
    for (key, payload) in records {
        // `send_result` returns an owned delivery future, so many can be in flight.
        let delivery = producer
            .send_result(FutureRecord::to(topic).key(&key).payload(&payload))
            .map_err(|(e, _)| e)
            .expect("enqueued");
        pending.push(delivery);
        if pending.len() >= 10_000 {
            while let Some(r) = pending.next().await {
                let _ = r.expect("delivery report").expect("delivered");
            }
        }
    }
    while let Some(r) = pending.next().await {
        let _ = r.expect("delivery report").expect("delivered");
    }
}
