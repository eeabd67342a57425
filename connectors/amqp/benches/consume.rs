//! Consumer throughput against one RabbitMQ queue, in one process:
//!
//! 1. `plain`: a plain lapin consumer acking each delivery (`delivery.ack` awaited);
//! 2. `plain_batched`: a plain lapin consumer acking every [`ACK_EVERY`] deliveries with one
//!    `multiple` ack (awaited), the usual hand-written optimisation and the fairer baseline
//!    for the source, which coalesces its acks the same way;
//! 3. `source`: [`AmqpSource`] with each envelope resolved `Completed` at once;
//! 4. `runtime`: [`AmqpSource`] under the triage [`Runtime`] with a no-op handler.
//!
//! Same prefetch (1,000), same message count and size, the queue refilled before each run.
//! A timed harness rather than criterion: one run is a whole queue drain against a broker,
//! not a microsecond loop. Needs the broker (`tests/brokers/rabbitmq.sh start`).
//!
//! Besides messages/s, each run reports the process's CPU time (user + system, every thread,
//! lapin's included) per 100,000 messages: the broker shares the machine's two cores, so
//! throughput alone hides the consumer's own cost.
//!
//! `cargo bench -p triage-amqp --bench consume` (`BENCH_MESSAGES` overrides the count,
//! `BENCH_ROUNDS` the rounds, default 2).

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use triage::ledger::Disposition;
use triage::queue::WfqConfig;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig, Source};
use triage_amqp::{AmqpMessage, AmqpSource, AmqpSourceConfig};

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

const URI: &str = "amqp://127.0.0.1:5672/%2f";
const PREFETCH: u16 = 1_000;
const BODY: usize = 128;
/// Deliveries per `multiple` ack in `plain_batched`.
const ACK_EVERY: usize = 100;

async fn connect() -> Connection {
    let props = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    Connection::connect(URI, props).await.expect("broker up")
}

async fn fill(ch: &Channel, queue: &str, n: usize) {
    let body = vec![1u8; BODY];
    for start in (0..n).step_by(5_000) {
        for _ in start..(start + 5_000).min(n) {
            ch.basic_publish(
                "",
                queue,
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default().with_priority(5),
            )
            .await
            .expect("publish");
        }
        ch.wait_for_confirms().await.expect("confirms");
    }
}

async fn plain(queue: &str, n: usize) -> Duration {
    plain_acking_every(queue, n, 1).await
}

async fn plain_batched(queue: &str, n: usize) -> Duration {
    plain_acking_every(queue, n, ACK_EVERY).await
}

/// A plain lapin consumer that acks every `ack_every`-th delivery and the last, each ack
/// awaited: one ack per delivery when `ack_every` is 1, else one `multiple` ack for the run.
async fn plain_acking_every(queue: &str, n: usize, ack_every: usize) -> Duration {
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    ch.basic_qos(PREFETCH, BasicQosOptions { global: false })
        .await
        .expect("qos");
    let start = Instant::now();
    let mut consumer = ch
        .basic_consume(
            queue,
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    for i in 1..=n {
        let d = consumer.next().await.expect("delivery").expect("ok");
        if i % ack_every == 0 || i == n {
            d.ack(BasicAckOptions {
                multiple: ack_every > 1,
            })
            .await
            .expect("ack");
        }
    }
    let took = start.elapsed();
    let _ = conn.close(200, "done").await;
    took
}

fn source_config(queue: &str) -> AmqpSourceConfig {
    let mut c = AmqpSourceConfig::new(URI, queue);
    c.prefetch = PREFETCH;
    c.declare.enabled = false;
    // The bench declares it with a dead-letter queue through the default exchange.
    c.declare.dead_letter_exchange = Some(String::new());
    c
}

async fn source(queue: &str, n: usize) -> Duration {
    let start = Instant::now();
    let mut source = AmqpSource::connect(source_config(queue), NonZeroUsize::new(1_024).unwrap())
        .await
        .expect("source");
    for _ in 0..n {
        source
            .next()
            .await
            .expect("delivery")
            .ack
            .resolve(Disposition::Completed);
    }
    source.shutdown().await;
    start.elapsed()
}

async fn runtime(queue: &str, n: usize) -> Duration {
    let start = Instant::now();
    let source = AmqpSource::connect(source_config(queue), NonZeroUsize::new(1_024).unwrap())
        .await
        .expect("source");
    let config = RuntimeConfig {
        expert: triage::runtime::ExpertConfig {
            queue: WfqConfig {
                capacity: 1_024.try_into().unwrap(),
                ..WfqConfig::default()
            },
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::builder(config)
        .start(|_job: Job<AmqpMessage>| async { Ok::<(), HandlerError>(()) })
        .expect("runtime");
    rt.attach(source);
    while rt.stats().ledger.total().completed < n as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    rt.shutdown(Duration::from_secs(10)).await;
    took
}

fn main() {
    let n: usize = std::env::var("BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async {
        let conn = connect().await;
        let ch = conn.create_channel().await.expect("channel");
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm");
        let queue = format!("triage-bench-{:016x}", fastrand::u64(..));
        let dead = format!("{queue}.dead");
        ch.queue_declare(&dead, QueueDeclareOptions::default(), FieldTable::default())
            .await
            .expect("declare");
        let mut args = FieldTable::default();
        args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dead.as_str().into()),
        );
        ch.queue_declare(&queue, QueueDeclareOptions::default(), args)
            .await
            .expect("declare");
        println!("consume {n} messages of {BODY} B, prefetch {PREFETCH}");
        let rounds: usize = std::env::var("BENCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2);
        let mut rates = Vec::new();
        let mut cpus = Vec::new();
        for round in 0..rounds {
            for (name, kind) in [
                ("plain", 0),
                ("plain_batched", 3),
                ("source", 1),
                ("runtime", 2),
            ] {
                fill(&ch, &queue, n).await;
                let cpu_before = cpu_time();
                let took = match kind {
                    0 => plain(&queue, n).await,
                    3 => plain_batched(&queue, n).await,
                    1 => source(&queue, n).await,
                    _ => runtime(&queue, n).await,
                };
                let cpu = cpu_time()
                    .zip(cpu_before)
                    .map(|(after, before)| (after - before).as_secs_f64() * 100_000.0 / n as f64);
                let rate = n as f64 / took.as_secs_f64();
                let cpu_text = cpu.map_or("n/a".to_owned(), |c| format!("{:.0} ms", c * 1e3));
                println!(
                    "round {round} {name:>13}: {took:>10.3?}  {rate:>9.0} msg/s  CPU per 100,000: {cpu_text}"
                );
                rates.push((name, rate));
                if let Some(c) = cpu {
                    cpus.push((name, c));
                }
            }
        }
        let least_cpu = |name: &str| {
            cpus.iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, c)| *c)
                .fold(f64::INFINITY, f64::min)
        };
        println!(
            "least CPU per 100,000: plain {:.0} ms, source {:.0} ms ({:.2}x), runtime {:.0} ms ({:.2}x)",
            least_cpu("plain") * 1e3,
            least_cpu("source") * 1e3,
            least_cpu("source") / least_cpu("plain"),
            least_cpu("runtime") * 1e3,
            least_cpu("runtime") / least_cpu("plain")
        );
        let batched = least_cpu("plain_batched");
        println!(
            "against plain_batched ({:.0} ms): source {:.2}x, runtime {:.2}x",
            batched * 1e3,
            least_cpu("source") / batched,
            least_cpu("runtime") / batched
        );
        let best = |name: &str| {
            rates
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, r)| *r)
                .fold(0.0, f64::max)
        };
        let plain = best("plain");
        println!(
            "best: plain {plain:.0} msg/s, plain_batched {:.0} msg/s, source {:.0} msg/s ({:.0}%), runtime {:.0} msg/s ({:.0}%)",
            best("plain_batched"),
            best("source"),
            100.0 * best("source") / plain,
            best("runtime"),
            100.0 * best("runtime") / plain
        );
        let _ = ch.queue_delete(&queue, QueueDeleteOptions::default()).await;
        let _ = conn.close(200, "done").await;
    });
}
