//! Broker administration for the harness: topics and queues, reading back what the defer and
//! dead-letter stores hold, and restarting a broker through the project's scripts.

// Shared by the binary (src/main.rs) and tests/proving_ground.rs; each uses a part.
#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use triage_amqp::lapin;

use crate::worker::{BrokerKind, KAFKA};

/// Creates a Kafka topic (an existing one is fine).
pub async fn create_topic(name: &str, partitions: i32) {
    use triage_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use triage_kafka::rdkafka::client::DefaultClientContext;
    use triage_kafka::rdkafka::config::ClientConfig;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", KAFKA)
        .create()
        .expect("kafka admin client");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    // "Already exists" is fine: names are unique per run anyway.
    let _ = admin.create_topics([&topic], &opts).await;
}

/// Creates the topic or queue of a phase with its `.deferred` and `.dead` companions.
pub async fn prepare(
    broker: BrokerKind,
    topic: &str,
    partitions: i32,
    layout: crate::worker::Layout,
) {
    let main = layout.topics(topic);
    let mains = main.len();
    let mut names = main;
    names.push(format!("{topic}.deferred"));
    names.push(format!("{topic}.dead"));
    match broker {
        BrokerKind::Kafka => {
            for n in &names {
                create_topic(n, partitions).await;
            }
        }
        BrokerKind::Amqp => {
            let (conn, ch) = crate::load::amqp_connect().await;
            for (i, n) in names.iter().enumerate() {
                // The main queue is a priority queue; the defer and dead-letter queues are
                // plain (the sinks declare them so).
                let priority = (i < mains).then_some(crate::load::MAX_PRIORITY);
                crate::load::declare_queue(&ch, n, priority).await;
            }
            let _ = conn.close(200, "declared").await;
        }
    }
}

/// The ids of every message in a Kafka topic, read from the beginning to the end.
pub fn kafka_ids(topic: &str) -> Vec<String> {
    use triage_kafka::rdkafka::config::ClientConfig;
    use triage_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
    use triage_kafka::rdkafka::error::KafkaError;
    use triage_kafka::rdkafka::{Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", KAFKA)
        .set("group.id", format!("pg-reconcile-{:x}", fastrand::u64(..)))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("kafka reconcile consumer");
    let meta = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("topic metadata");
    let partitions: Vec<i32> = meta
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .expect("assign offset");
    }
    consumer.assign(&tpl).expect("assign");
    let mut ids = Vec::new();
    let mut at_end = std::collections::HashSet::new();
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    while at_end.len() < partitions.len() && std::time::Instant::now() < give_up {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let (id, _) = crate::worker::parse_payload(m.payload().unwrap_or(&[]));
                ids.push(id.to_owned());
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(_)) | None => {}
        }
    }
    ids
}

/// The ids of every message left in a RabbitMQ queue; they are taken off the queue (the run
/// is over, the queue is the run's own).
pub async fn amqp_ids(queue: &str) -> Vec<String> {
    use lapin::options::{BasicAckOptions, BasicGetOptions};
    let (conn, ch) = crate::load::amqp_connect().await;
    let mut ids = Vec::new();
    while let Ok(Some(got)) = ch.basic_get(queue, BasicGetOptions::default()).await {
        let (id, _) = crate::worker::parse_payload(&got.delivery.data);
        ids.push(id.to_owned());
        let _ = got.delivery.ack(BasicAckOptions::default()).await;
    }
    let _ = conn.close(200, "reconciled").await;
    ids
}

/// The ids held by a defer or dead-letter store.
pub async fn store_ids(broker: BrokerKind, name: &str) -> Vec<String> {
    match broker {
        BrokerKind::Kafka => {
            let name = name.to_owned();
            tokio::task::spawn_blocking(move || kafka_ids(&name))
                .await
                .expect("kafka reader")
        }
        BrokerKind::Amqp => amqp_ids(name).await,
    }
}

/// Runs `tests/brokers/<broker>.sh <cmd>` of this checkout.
///
/// # Errors
///
/// The script's failure, with its exit status.
pub fn script(broker: BrokerKind, cmd: &str) -> Result<(), String> {
    let name = match broker {
        BrokerKind::Kafka => "kafka.sh",
        BrokerKind::Amqp => "rabbitmq.sh",
    };
    // This crate lives two levels below the workspace root, beside the broker scripts' tests/.
    let path = format!("{}/../../tests/brokers/{name}", env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("bash")
        .arg(&path)
        .arg(cmd)
        .status()
        .map_err(|e| format!("{path}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{path} {cmd}: {status}"))
    }
}

/// Starts the broker again when dropped, so that a failing run (or test) never leaves it
/// down for the next one.
#[derive(Debug)]
pub struct StartOnDrop(pub BrokerKind);

impl Drop for StartOnDrop {
    fn drop(&mut self) {
        if let Err(e) = script(self.0, "start") {
            eprintln!("proving ground: could not start the broker again: {e}");
        }
    }
}

/// Stops the broker, waits `down`, starts it again (also if this task is cancelled or
/// panics, through [`StartOnDrop`]).
///
/// # Errors
///
/// When the stop script fails (e.g. the broker was started from another checkout).
pub async fn restart(broker: BrokerKind, down: Duration) -> Result<(), String> {
    let guard = StartOnDrop(broker);
    tokio::task::spawn_blocking(move || script(broker, "stop"))
        .await
        .map_err(|e| e.to_string())??;
    tokio::time::sleep(down).await;
    tokio::task::spawn_blocking(move || drop(guard))
        .await
        .map_err(|e| e.to_string())?;
    script(broker, "status").map_err(|e| format!("not back after the restart: {e}"))
}
