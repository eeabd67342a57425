//! Load generation: paced, mixed-tier messages with a unique id each, to a Kafka topic or a
//! RabbitMQ queue, and the list of what the broker confirmed.
//!
//! A message is `id,tier,produced_ms,poison` with the headers `triage-criticality` and
//! `triage-deadline-ms` (on RabbitMQ also the matching `priority`). Only messages the broker
//! confirmed (Kafka delivery report, RabbitMQ publisher confirm) count as produced; a RabbitMQ
//! publish lost to a broker restart is published again under the same id after reconnecting
//! (a duplicate is possible, a gap is not). Kafka's producer retries by itself.

// Shared by the binary (src/main.rs) and tests/proving_ground.rs; each uses a part.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use triage::Criticality;
use triage_amqp::lapin;

use crate::worker::{unix_ms, BrokerKind, Layout, AMQP, KAFKA};

/// One confirmed message, as the generator knows it.
#[derive(Clone, Debug)]
pub struct Produced {
    /// Unique id, `<prefix>-<seq>`.
    pub id: String,
    /// Tier index, 0 = Critical .. 3 = Sheddable.
    pub tier: usize,
    /// Deadline, Unix milliseconds.
    pub deadline_ms: u64,
    /// Whether the handler fails it for good (dead-lettered).
    pub poison: bool,
    /// When the broker confirmed it (Unix milliseconds, as the generator's confirm collector
    /// saw it): a message confirmed after its deadline reached the broker too late for any
    /// consumer, which the report counts apart from the worker's misses.
    pub acked_ms: u64,
}

/// What to offer.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// Id prefix, unique per phase.
    pub prefix: String,
    /// Messages per second; `None`: as fast as the broker confirms.
    pub rate: Option<f64>,
    /// How long to offer, or, without a rate, the number of messages is `count`.
    pub duration: Duration,
    /// Messages without a rate.
    pub count: u64,
    /// Percent per tier, Critical first.
    pub mix: [u32; 4],
    /// Usefulness window per tier, milliseconds (deadline = produce time + window).
    pub windows_ms: [u64; 4],
    /// Poison messages per thousand (handler fails them permanently).
    pub poison_permille: u32,
    /// One topic (queue) for every tier, or one per tier.
    pub layout: Layout,
}

/// Tier index from a uniform draw over the mix.
fn pick_tier(mix: [u32; 4], x: u32) -> usize {
    let mut acc = 0;
    for (i, share) in mix.iter().enumerate() {
        acc += share;
        if x < acc {
            return i;
        }
    }
    3
}

/// `x-max-priority` of the main queue: RabbitMQ delivers the highest priority first among the
/// ready messages, so a Critical message never waits in the broker behind a backlog of lower
/// ones (its `priority` 9 is the top level).
pub const MAX_PRIORITY: u8 = 9;

/// AMQP priority of a tier index under the default mapping.
fn priority(tier: usize) -> u8 {
    [9, 6, 4, 1][tier]
}

struct Draft {
    seq: usize,
    produced: Produced,
    payload: String,
}

fn draft(spec: &LoadSpec, seq: usize, rng: &mut fastrand::Rng) -> Draft {
    let total: u32 = spec.mix.iter().sum();
    let tier = pick_tier(spec.mix, rng.u32(0..total.max(1)));
    let now = unix_ms();
    let poison = rng.u32(0..1000) < spec.poison_permille;
    let id = format!("{}-{seq}", spec.prefix);
    let payload = format!(
        "{id},{},{now},{}",
        Criticality::ALL[tier].as_str(),
        u8::from(poison)
    );
    Draft {
        seq,
        produced: Produced {
            id,
            tier,
            deadline_ms: now + spec.windows_ms[tier],
            poison,
            acked_ms: 0,
        },
        payload,
    }
}

/// Offers `spec` to `topic` and returns what the broker confirmed, plus the number of
/// messages that could not be confirmed at all.
pub async fn produce(broker: BrokerKind, topic: &str, spec: &LoadSpec) -> (Vec<Produced>, u64) {
    match broker {
        BrokerKind::Kafka => produce_kafka(topic, spec).await,
        BrokerKind::Amqp => produce_amqp(topic, spec).await,
    }
}

/// Paces `send` at the spec's rate (or sends `count` at once), numbering the drafts.
async fn pace(spec: &LoadSpec, send: &mut impl AsyncSend) {
    let mut rng = fastrand::Rng::new();
    let start = Instant::now();
    let mut seq = 0usize;
    match spec.rate {
        None => {
            for _ in 0..spec.count {
                send.send(draft(spec, seq, &mut rng)).await;
                seq += 1;
            }
        }
        Some(rate) => {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            loop {
                tick.tick().await;
                let elapsed = start.elapsed();
                if elapsed >= spec.duration {
                    break;
                }
                let due = (elapsed.as_secs_f64() * rate) as usize;
                while seq < due {
                    send.send(draft(spec, seq, &mut rng)).await;
                    seq += 1;
                }
            }
        }
    }
}

trait AsyncSend {
    async fn send(&mut self, draft: Draft);
}

async fn produce_kafka(topic: &str, spec: &LoadSpec) -> (Vec<Produced>, u64) {
    use triage_kafka::rdkafka::config::ClientConfig;
    use triage_kafka::rdkafka::message::{Header, OwnedHeaders};
    use triage_kafka::rdkafka::producer::{FutureProducer, FutureRecord};

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", KAFKA)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "180000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("kafka producer");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let collector = tokio::spawn(async move {
        let mut confirmed = Vec::new();
        let mut failed = 0u64;
        while let Some((produced, delivery)) = rx.recv().await {
            let delivery: triage_kafka::rdkafka::producer::DeliveryFuture = delivery;
            match delivery.await {
                Ok(Ok(_)) => confirmed.push(Produced {
                    acked_ms: unix_ms(),
                    ..produced
                }),
                _ => failed += 1,
            }
        }
        (confirmed, failed)
    });

    struct Send<'a> {
        producer: &'a FutureProducer,
        topic: &'a str,
        layout: Layout,
        tx: mpsc::UnboundedSender<(Produced, triage_kafka::rdkafka::producer::DeliveryFuture)>,
    }
    impl AsyncSend for Send<'_> {
        async fn send(&mut self, d: Draft) {
            let tier = Criticality::ALL[d.produced.tier].as_str();
            let deadline = d.produced.deadline_ms.to_string();
            let payload = d.payload;
            let topic = self
                .layout
                .topic_of(self.topic, Criticality::ALL[d.produced.tier]);
            loop {
                let headers = OwnedHeaders::new()
                    .insert(Header {
                        key: "triage-criticality",
                        value: Some(tier),
                    })
                    .insert(Header {
                        key: "triage-deadline-ms",
                        value: Some(&deadline),
                    });
                let record = FutureRecord::<(), _>::to(&topic)
                    .payload(&payload)
                    .headers(headers);
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        let _ = self.tx.send((d.produced, delivery));
                        return;
                    }
                    Err(_) => {
                        // Local queue full: wait for deliveries and try again.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        }
    }
    // One record before the clock starts: the idempotent producer's id, the connection and
    // the topic's metadata are set up by the first send, which otherwise held the phase's
    // first few hundred milliseconds of records (stamped, so late before reaching the
    // broker). Its id is not offered load.
    let primer_topic = spec.layout.topic_of(topic, Criticality::Critical);
    let primer_body = format!("{}-primer,critical,{},0", spec.prefix, unix_ms());
    let primer = FutureRecord::<(), _>::to(&primer_topic)
        .payload(&primer_body)
        .headers(OwnedHeaders::new().insert(Header {
            key: "triage-criticality",
            value: Some("critical"),
        }));
    let _ = producer.send(primer, Duration::from_secs(30)).await;
    let mut send = Send {
        producer: &producer,
        topic,
        layout: spec.layout,
        tx,
    };
    pace(spec, &mut send).await;
    drop(send);
    collector.await.expect("kafka delivery collector")
}

async fn amqp_channel() -> Option<(lapin::Connection, lapin::Channel)> {
    use lapin::options::ConfirmSelectOptions;
    use lapin::{Connection, ConnectionProperties};
    let props = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    let conn = Connection::connect(AMQP, props).await.ok()?;
    let ch = conn.create_channel().await.ok()?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .ok()?;
    Some((conn, ch))
}

/// Connects, retrying for up to two minutes (the broker may be restarting).
pub async fn amqp_connect() -> (lapin::Connection, lapin::Channel) {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(c) = amqp_channel().await {
            return c;
        }
        assert!(
            Instant::now() < until,
            "RabbitMQ unreachable for two minutes"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Declares a durable queue.
pub async fn declare_queue(ch: &lapin::Channel, queue: &str, max_priority: Option<u8>) {
    use lapin::options::QueueDeclareOptions;
    use lapin::types::{AMQPValue, FieldTable};
    let mut args = FieldTable::default();
    if let Some(p) = max_priority {
        args.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(p));
    }
    ch.queue_declare(
        queue,
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        args,
    )
    .await
    .expect("declare queue");
}

async fn produce_amqp(queue: &str, spec: &LoadSpec) -> (Vec<Produced>, u64) {
    use lapin::options::BasicPublishOptions;
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::BasicProperties;

    let (conn, ch) = amqp_connect().await;
    for q in spec.layout.topics(queue) {
        declare_queue(&ch, &q, Some(MAX_PRIORITY)).await;
    }
    let layout = spec.layout;
    let link = Arc::new(Mutex::new(Some((conn, ch))));
    // Publishes whose confirm did not come back come here to be published again.
    let retry: Arc<Mutex<Vec<Draft>>> = Arc::default();
    let (tx, mut rx) =
        mpsc::unbounded_channel::<(Draft, lapin::publisher_confirm::PublisherConfirm)>();
    let retry_c = Arc::clone(&retry);
    let collector = tokio::spawn(async move {
        let mut confirmed = Vec::new();
        while let Some((draft, confirm)) = rx.recv().await {
            match confirm.await {
                Ok(c) if c.is_ack() => confirmed.push((
                    draft.seq,
                    Produced {
                        acked_ms: unix_ms(),
                        ..draft.produced
                    },
                )),
                _ => retry_c.lock().push(draft),
            }
        }
        confirmed
    });

    async fn publish(
        link: &Mutex<Option<(lapin::Connection, lapin::Channel)>>,
        queue: &str,
        layout: Layout,
        d: &Draft,
    ) -> Option<lapin::publisher_confirm::PublisherConfirm> {
        let ch = link.lock().as_ref().map(|(_, ch)| ch.clone())?;
        let queue = layout.topic_of(queue, Criticality::ALL[d.produced.tier]);
        let mut headers = FieldTable::default();
        headers.insert(
            "triage-criticality".into(),
            AMQPValue::LongString(Criticality::ALL[d.produced.tier].as_str().into()),
        );
        headers.insert(
            "triage-deadline-ms".into(),
            AMQPValue::LongLongInt(d.produced.deadline_ms as i64),
        );
        ch.basic_publish(
            "",
            &queue,
            BasicPublishOptions::default(),
            d.payload.as_bytes(),
            BasicProperties::default()
                .with_priority(priority(d.produced.tier))
                .with_delivery_mode(2)
                .with_message_id(d.produced.id.clone().into())
                .with_headers(headers),
        )
        .await
        .ok()
    }

    struct Send<'a> {
        link: Arc<Mutex<Option<(lapin::Connection, lapin::Channel)>>>,
        queue: &'a str,
        layout: Layout,
        retry: Arc<Mutex<Vec<Draft>>>,
        tx: mpsc::UnboundedSender<(Draft, lapin::publisher_confirm::PublisherConfirm)>,
    }
    impl Send<'_> {
        async fn relink(&self) {
            let dead = self
                .link
                .lock()
                .as_ref()
                .is_none_or(|(c, _)| !c.status().connected());
            if dead {
                *self.link.lock() = None;
                let fresh = amqp_connect().await;
                *self.link.lock() = Some(fresh);
            }
        }
        async fn send_one(&self, d: Draft) {
            loop {
                match publish(&self.link, self.queue, self.layout, &d).await {
                    Some(confirm) => {
                        let _ = self.tx.send((d, confirm));
                        return;
                    }
                    None => {
                        self.relink().await;
                    }
                }
            }
        }
    }
    impl AsyncSend for Send<'_> {
        async fn send(&mut self, d: Draft) {
            let again: Vec<Draft> = std::mem::take(&mut *self.retry.lock());
            for r in again {
                self.send_one(r).await;
            }
            self.send_one(d).await;
        }
    }
    let mut send = Send {
        link: Arc::clone(&link),
        queue,
        layout,
        retry: Arc::clone(&retry),
        tx,
    };
    pace(spec, &mut send).await;
    // Publish again whatever was not confirmed, until everything is (or three minutes).
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let again: Vec<Draft> = std::mem::take(&mut *retry.lock());
        if again.is_empty() || Instant::now() > until {
            retry.lock().extend(again);
            break;
        }
        for r in again {
            send.send_one(r).await;
        }
    }
    drop(send);
    let mut got = collector.await.expect("amqp confirm collector");
    // Failures the collector saw after the loop above get one last try each.
    let late: Vec<Draft> = std::mem::take(&mut *retry.lock());
    let mut failed = 0u64;
    for d in late {
        let acked = match publish(&link, queue, layout, &d).await {
            Some(c) => c.await.is_ok_and(|c| c.is_ack()),
            None => false,
        };
        if acked {
            let acked_ms = unix_ms();
            got.push((
                d.seq,
                Produced {
                    acked_ms,
                    ..d.produced
                },
            ));
        } else {
            failed += 1;
        }
    }
    got.sort_by_key(|(seq, _)| *seq);
    got.dedup_by_key(|(seq, _)| *seq);
    let conn = link.lock().take();
    if let Some((conn, _)) = conn {
        let _ = conn.close(200, "done").await;
    }
    (got.into_iter().map(|(_, p)| p).collect(), failed)
}
