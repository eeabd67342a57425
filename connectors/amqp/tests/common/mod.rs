//! Helpers shared by the integration tests: a real RabbitMQ started by the project's script,
//! a fresh queue per test, publishing and inspection.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

pub fn uri() -> String {
    std::env::var("AMQP_URI").unwrap_or_else(|_| "amqp://127.0.0.1:5672/%2f".to_owned())
}

pub fn broker_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/brokers/rabbitmq.sh")
}

/// Runs `rabbitmq.sh <cmd>`; panics if it fails.
pub fn broker(cmd: &str) {
    let status = Command::new("bash")
        .arg(broker_script())
        .arg(cmd)
        .status()
        .expect("run rabbitmq.sh");
    assert!(status.success(), "rabbitmq.sh {cmd} failed: {status}");
}

static STARTED: Once = Once::new();

/// Starts the broker once per test binary (idempotent if it is already up).
pub fn ensure_broker() {
    STARTED.call_once(|| broker("start"));
}

/// A queue name no other test uses.
pub fn rand_queue(prefix: &str) -> String {
    format!("triage-test-{prefix}-{:016x}", fastrand::u64(..))
}

pub async fn admin() -> (Connection, Channel) {
    ensure_broker();
    let props = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    let conn = Connection::connect(&uri(), props).await.expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm");
    (conn, ch)
}

/// Declares `queue` durable with `args`, plus the dead-letter queue `AmqpSource` gives a queue
/// by default (`<queue>.dead` through the default exchange) unless `args` name another.
pub async fn declare(ch: &Channel, queue: &str, mut args: FieldTable) {
    if !args.contains_key("x-dead-letter-exchange") {
        let dead = format!("{queue}.dead");
        declare_plain(ch, &dead).await;
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dead.as_str().into()),
        );
    }
    declare_with(ch, queue, args).await;
}

/// Declares `queue` durable, without arguments.
pub async fn declare_plain(ch: &Channel, queue: &str) {
    declare_with(ch, queue, FieldTable::default()).await;
}

async fn declare_with(ch: &Channel, queue: &str, args: FieldTable) {
    ch.queue_declare(
        queue,
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .expect("declare");
}

/// A fanout dead-letter exchange with one bound queue; returns (exchange, queue).
pub async fn dead_letter_pair(ch: &Channel, prefix: &str) -> (String, String) {
    let dlx = rand_queue(&format!("{prefix}-dlx"));
    let dlq = rand_queue(&format!("{prefix}-dlq"));
    ch.exchange_declare(
        dlx.as_str(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            auto_delete: false,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("dlx");
    declare_plain(ch, &dlq).await;
    ch.queue_bind(
        dlq.as_str(),
        dlx.as_str(),
        "",
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("bind");
    (dlx, dlq)
}

/// Publishes `n` messages (`id-0`..) with confirms; `props(i)` adds properties.
pub async fn publish_n(
    ch: &Channel,
    queue: &str,
    n: usize,
    body: &[u8],
    props: impl Fn(usize) -> BasicProperties,
) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1_000) {
        for &i in chunk {
            let p = props(i).with_message_id(format!("id-{i}").into());
            ch.basic_publish("", queue, BasicPublishOptions::default(), body, p)
                .await
                .expect("publish");
        }
        let returned = ch.wait_for_confirms().await.expect("confirms");
        assert!(returned.is_empty());
    }
}

/// Ready messages in `queue` (a passive declare: unacked ones are not counted).
pub async fn ready(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        queue,
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("passive declare")
    .message_count()
}

/// `(messages_ready, messages_unacknowledged)` from `rabbitmqctl list_queues`.
pub fn ctl_counts(queue: &str) -> (u64, u64) {
    let out = Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_queues",
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .output()
        .expect("rabbitmqctl");
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() == 3 && cols[0] == queue {
            return (cols[1].parse().unwrap(), cols[2].parse().unwrap());
        }
    }
    panic!("queue {queue} not listed: {text}");
}

/// Closes, from the broker's side, every connection whose client-provided name is `name`.
pub fn close_connections_named(name: &str) -> usize {
    let out = Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_connections",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .expect("rabbitmqctl");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut closed = 0;
    for line in text.lines() {
        if line.contains(&format!("\"{name}\"")) {
            let pid = line.split_whitespace().next().unwrap();
            let st = Command::new("rabbitmqctl")
                .args(["-q", "close_connection", pid, "test closes it"])
                .status()
                .expect("close_connection");
            assert!(st.success());
            closed += 1;
        }
    }
    closed
}

/// Takes every message of `queue` with basic.get (no ack): `(message_id, delivery)`.
pub async fn drain(ch: &Channel, queue: &str) -> Vec<lapin::message::BasicGetMessage> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue, BasicGetOptions { no_ack: true })
        .await
        .expect("get")
    {
        out.push(m);
    }
    out
}

/// Deletes `queue` and its default dead-letter queue, if any.
pub async fn delete(ch: &Channel, queue: &str) {
    let _ = ch.queue_delete(queue, QueueDeleteOptions::default()).await;
    let _ = ch
        .queue_delete(&format!("{queue}.dead"), QueueDeleteOptions::default())
        .await;
}

/// Consumes `queue` with a plain lapin consumer (used by the bench and checks).
pub async fn plain_consume_ack(ch: &Channel, queue: &str, n: usize) {
    let mut consumer = ch
        .basic_consume(
            queue,
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    for _ in 0..n {
        let d = consumer.next().await.expect("delivery").expect("ok");
        d.ack(Default::default()).await.expect("ack");
    }
}

/// Bounded wait for a condition that depends on the broker catching up (not a timing
/// assertion: the test fails only if it never happens within a generous bound).
pub async fn eventually<F: FnMut() -> bool>(mut f: F) -> bool {
    for _ in 0..300 {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Resident set size of this process, in KiB, from /proc/self/status.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Pids of the broker's connections whose client-provided name is `name`.
pub fn connections_named(name: &str) -> Vec<String> {
    let out = Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_connections",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .expect("rabbitmqctl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.contains(&format!("\"{name}\"")))
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Consumers on `queue`, from `rabbitmqctl list_queues`; 0 when the broker does not answer
/// (an overloaded broker's `rabbitmqctl` can time out with nothing printed).
pub fn consumers(queue: &str) -> u64 {
    let out = Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_queues",
            "--no-table-headers",
            "name",
            "consumers",
        ])
        .output()
        .expect("rabbitmqctl");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            (cols.len() == 2 && cols[0] == queue).then(|| cols[1].parse().unwrap())
        })
        .next()
        .unwrap_or(0)
}

/// What the broker showed of one client's connections while it was sampled.
#[derive(Debug, Default)]
pub struct ConnectionSamples {
    /// Distinct connection pids seen.
    pub distinct: std::collections::HashSet<String>,
    /// Most connections open at once in one sample.
    pub max_at_once: usize,
    /// Samples taken.
    pub samples: usize,
}

impl ConnectionSamples {
    pub fn sample(&mut self, name: &str) -> usize {
        let now = connections_named(name);
        eprintln!(
            "sample {}: {} connections named {name}",
            self.samples,
            now.len()
        );
        self.max_at_once = self.max_at_once.max(now.len());
        self.samples += 1;
        let n = now.len();
        self.distinct.extend(now);
        n
    }
}
