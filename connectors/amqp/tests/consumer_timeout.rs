//! RabbitMQ's consumer timeout (issue 34), on the real broker: a delivery that waits in the
//! runtime (a Sheddable one behind a sustained Critical backlog) is handed back before the
//! broker's timeout closes the channel, and nothing is lost or done twice.
//!
//! # How the broker is made impatient, and only for this test
//!
//! The suite's broker is RabbitMQ 3.10 (`rabbitmqctl status`). There a channel reads the global
//! `consumer_timeout` (30 minutes) when it opens, and checks the oldest unacknowledged delivery
//! against it on its tick, every `channel_tick_interval` (60 s); the per-queue
//! `x-consumer-timeout` argument and the `consumer-timeout` policy key came with 3.11.15 and
//! 3.12 (3.10 keeps the argument but ignores it). Lowering the global setting would cut the
//! timeout of every channel other tests open meanwhile, and a tick of 60 s would make a test
//! wait minutes. So [`impatient`] changes the timeout in the state of this test's own channels
//! only (the broker's `sys:replace_state` on those channel processes), and sends them `tick`
//! every 500 ms from a process inside the broker: the broker's own check
//! (`rabbit_channel:evaluate_consumer_timeout`), with this test's timeout, on this test's
//! channels. [`a_consumer_that_never_acks_is_closed_by_the_lowered_timeout`] checks that it
//! does close a channel, so the main test cannot pass for want of a timeout. On 3.12 and later
//! the source's `x-consumer-timeout` makes the broker apply the same timeout by itself.
//!
//! Each test uses a timeout of its own (5,903 and 5,917 ms), so the broker's log line about a
//! timeout ("Timeout used: N ms") tells which one it was.

mod common;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use triage::ledger::Disposition;
use triage::limit::TierShares;
use triage::queue::{TierMask, WfqConfig};
use triage::runtime::{HandlerError, Job, RefusalPolicy, Runtime, RuntimeConfig, Source};
use triage::{Criticality, PerTier};
use triage_amqp::{AmqpMessage, AmqpSource, AmqpSourceConfig, TierQueue};

/// Where the broker logs (`rabbitmqctl status`, "Log file(s)").
const BROKER_LOG: &str = "/var/log/rabbitmq/rabbit@localhost.log";

/// What the broker logs when it closes a channel for a delivery left unacknowledged too long.
const TIMED_OUT: &str = "has timed out waiting for delivery acknowledgement";

fn ctl_eval(expr: &str) -> String {
    let out = Command::new("rabbitmqctl")
        .args(["-q", "eval", expr])
        .output()
        .expect("rabbitmqctl eval");
    assert!(out.status.success(), "rabbitmqctl eval {expr}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Gives the channels of the connection named `name` a consumer timeout of `ms` and has them
/// check it every 500 ms for `for_s` seconds (see the module docs). Returns how many channels
/// it changed. The state layout is RabbitMQ 3.10's: `#ch{cfg = #conf{}}` with
/// `consumer_timeout` the 17th field of `#conf` (19 fields); a channel of another layout is
/// left alone and not counted.
fn impatient(name: &str, ms: u64, for_s: u64) -> usize {
    let rounds = for_s * 2;
    let expr = format!(
        r#"Name = <<"{name}">>, Ms = {ms}, Rounds = {rounds},
        Mine = fun(Ch) ->
            case rabbit_channel:info(Ch, [connection]) of
                [{{connection, C}}] ->
                    case catch rabbit_reader:info(C, [client_properties]) of
                        [{{client_properties, Props}}] ->
                            lists:keyfind(<<"connection_name">>, 1, Props) =:= {{<<"connection_name">>, longstr, Name}};
                        _ -> false
                    end;
                _ -> false
            end
        end,
        Set = fun(GS) ->
            list_to_tuple([case E of
                _ when is_tuple(E), tuple_size(E) > 1, element(1, E) =:= ch,
                       is_tuple(element(2, E)), tuple_size(element(2, E)) =:= 20,
                       element(1, element(2, E)) =:= conf ->
                    setelement(2, E, setelement(18, element(2, E), Ms));
                _ -> E
            end || E <- tuple_to_list(GS)])
        end,
        Changed = fun(Ch) ->
            S = sys:get_state(Ch),
            lists:any(fun(E) -> is_tuple(E) andalso tuple_size(E) > 1 andalso element(1, E) =:= ch
                andalso element(18, element(2, E)) =:= Ms end, tuple_to_list(S))
        end,
        Tick = fun(Ch) ->
            spawn(fun() ->
                Loop = fun L(0) -> ok;
                           L(N) -> case is_process_alive(Ch) of
                                       true -> Ch ! tick, timer:sleep(500), L(N - 1);
                                       false -> ok
                                   end
                       end,
                Loop(Rounds)
            end)
        end,
        Chs = [Ch || Ch <- rabbit_channel:list_local(), Mine(Ch)],
        [sys:replace_state(Ch, Set) || Ch <- Chs],
        Done = [Ch || Ch <- Chs, Changed(Ch)],
        [Tick(Ch) || Ch <- Done],
        length(Done)."#
    );
    ctl_eval(&expr).parse().expect("a count of channels")
}

/// The broker log's length now, to read only what is written after.
fn log_len() -> u64 {
    std::fs::metadata(BROKER_LOG).map_or(0, |m| m.len())
}

/// The broker log's lines about consumer timeouts of `ms`, written since `from`.
fn timeouts_logged(from: u64, ms: u64) -> Vec<String> {
    let text = std::fs::read(BROKER_LOG).unwrap_or_default();
    let start = usize::try_from(from).unwrap_or(usize::MAX).min(text.len());
    String::from_utf8_lossy(&text[start..])
        .lines()
        .filter(|l| l.contains(TIMED_OUT) && l.contains(&format!("Timeout used: {ms} ms")))
        .map(str::to_owned)
        .collect()
}

async fn connect_named(name: &str) -> Connection {
    let props = ConnectionProperties::default()
        .with_connection_name(name.into())
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    Connection::connect(&uri(), props).await.expect("connect")
}

/// The control: with the timeout lowered on its channel, a plain consumer that never acks is
/// closed by the broker, and the broker logs it. Without this, the main test could pass only
/// because the broker never checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_never_acks_is_closed_by_the_lowered_timeout() {
    const MS: u64 = 5_903;
    let (_admin, ch) = admin().await;
    let q = rand_queue("ctimeout-control");
    declare(&ch, &q, FieldTable::default()).await;
    let from = log_len();
    let name = format!("triage-test/{q}");
    let conn = connect_named(&name).await;
    let consumer_ch = conn.create_channel().await.expect("channel");
    consumer_ch
        .basic_qos(1, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = consumer_ch
        .basic_consume(
            &q,
            "",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    assert_eq!(impatient(&name, MS, 40), 1, "the consumer's channel");
    publish_n(&ch, &q, 1, b"never acked", |_| BasicProperties::default()).await;
    let delivery = consumer.next().await.expect("a delivery").expect("ok");
    // Never acked: the broker closes the channel, which ends the consumer's stream.
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(_)) = consumer.next().await {}
    })
    .await;
    assert!(closed.is_ok(), "the broker never closed the channel");
    assert!(!consumer_ch.status().connected());
    assert!(
        eventually(|| !timeouts_logged(from, MS).is_empty()).await,
        "the broker logged no consumer timeout of {MS} ms"
    );
    drop(delivery);
    let _ = conn.close(200, "done").await;
    // The delivery went back to the queue with the channel.
    assert!(eventually(|| ctl_counts(&q) == (1, 0)).await);
    delete(&ch, &q).await;
}

/// The issue's scenario on the real broker. A consumer timeout of 5.917 s (the queue declared
/// with `x-consumer-timeout`, and the broker's check on this test's channels, see the module
/// docs); one Sheddable delivery within a Critical backlog of about 15 s (1,200 deliveries of
/// 50 ms on 4 workers), which keeps the Sheddable one queued: its tier's share (0.01 of the
/// limit, floored at one slot) lets it start only with no handler running, and the shares stay
/// strict for a second after Critical work was queued. It is handed back after 80% of the
/// timeout (released: no defer sink) and delivered again, each time it waits that long, and
/// served when the workers are idle at last. The broker never
/// closes the channel (the source never reconnects, the broker logs no timeout of 5,917 ms),
/// every handler runs once, the ledger balances and the queue ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sheddable_delivery_behind_a_critical_backlog_is_handed_back_before_the_timeout() {
    const MS: u64 = 5_917;
    const CRITICAL: usize = 1_200;
    const SHEDDABLE: usize = 50;
    let (_admin, ch) = admin().await;
    let q = rand_queue("ctimeout");
    let from = log_len();

    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.declare.consumer_timeout_ms = Some(MS);
    let name = format!("triage-amqp/{q}");
    cfg.connection_name = Some(name.clone());
    assert_eq!(cfg.consumer_timeout(), Some(Duration::from_millis(MS)));
    let source = AmqpSource::connect(cfg, NonZeroUsize::new(1_024).unwrap())
        .await
        .expect("connect");
    let source_stats = source.stats_handle();
    // The consumer's channel and the lag probe's.
    assert_eq!(impatient(&name, MS, 60), 2);

    // Handler calls per message id, and the order they finished in.
    let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let finished: Arc<Mutex<Vec<String>>> = Arc::default();
    let (c, f) = (Arc::clone(&calls), Arc::clone(&finished));
    let config = RuntimeConfig {
        workers: NonZeroUsize::new(4).unwrap(),
        // Nothing shed: were pull admission to refuse the Sheddable delivery for a while, it
        // would be held rather than dropped, and wait all the same.
        policy: PerTier::splat(RefusalPolicy::Backpressure),
        expert: triage::runtime::ExpertConfig {
            queue: WfqConfig {
                capacity: 1_024.try_into().unwrap(),
                ..WfqConfig::default()
            },
            shares: TierShares::new(1.0, 0.9, 0.75, 0.01).unwrap(),
            // Shares strict for a second after Critical work was queued: the Sheddable delivery
            // never borrows a slot while the backlog lasts, however the pulls interleave.
            share_reserve_ms: 1_000,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::builder(config)
        .start(move |job: Job<AmqpMessage>| {
            let id = job.payload().message_id().unwrap_or("?").to_owned();
            *c.lock().unwrap().entry(id.clone()).or_default() += 1;
            let f = Arc::clone(&f);
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                f.lock().unwrap().push(id);
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    // Published before the runtime pulls (the source buffers its prefetch meanwhile), the
    // Sheddable one behind the first Critical ones: when it reaches the queue, the workers
    // are busy, and stay busy until the backlog is done.
    publish_n(&ch, &q, CRITICAL + 1, b"x", |i| {
        BasicProperties::default().with_priority(if i == SHEDDABLE { 0 } else { 9 })
    })
    .await;
    rt.attach(source);

    let all = CRITICAL + 1;
    let done = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let distinct: std::collections::HashSet<String> =
                finished.lock().unwrap().iter().cloned().collect();
            if distinct.len() == all {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let stats = rt.stats();
    assert!(done.is_ok(), "not every delivery was served: {stats}");
    let report = rt.shutdown(Duration::from_secs(10)).await;
    let stats = report.stats;

    let source_stats = source_stats.stats();
    let handed_back = stats.handed_back[Criticality::Sheddable];
    eprintln!(
        "handed back {handed_back}; source: {source_stats:?}; ledger:\n{}",
        stats.ledger
    );
    // The channel was never closed by the broker.
    assert_eq!(source_stats.reconnects, 0, "{source_stats:?}");
    assert_eq!(source_stats.stale_settles, 0, "{source_stats:?}");
    assert!(
        timeouts_logged(from, MS).is_empty(),
        "the broker timed the channel out: {:?}",
        timeouts_logged(from, MS)
    );
    // No finished work was done twice, and every delivery was served.
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), all);
    assert!(
        calls.values().all(|&n| n == 1),
        "handlers run more than once: {:?}",
        calls.iter().filter(|(_, &n)| n > 1).collect::<Vec<_>>()
    );
    assert!(
        handed_back >= 1,
        "the Sheddable delivery was never handed back"
    );
    assert_eq!(stats.handed_back[Criticality::Critical], 0);
    // Nothing lost: the ledger balances; each hand-back was released and consumed again.
    assert!(stats.balances(), "{stats}");
    let total = stats.ledger.total();
    assert_eq!(total.completed, all as u64);
    assert_eq!(total.released, handed_back);
    assert_eq!(total.consumed, all as u64 + handed_back);
    assert_eq!(source_stats.requeued, handed_back);
    assert!(
        eventually(|| ctl_counts(&q) == (0, 0)).await,
        "queue not empty"
    );
    delete(&ch, &q).await;
}

/// The source's own buffer: a tier queue not read while its tier is shed keeps its prefetch
/// there, unacknowledged. `release_waiting` (which the runtime calls on its tick with 80% of
/// the timeout) releases what waited that long, `basic.nack` with `requeue`; the broker puts
/// the deliveries back at their place and delivers them again, and the source hands them out
/// with the time they waited in its buffer. Nothing younger is released.
///
/// (The Critical queue is consumed beside it, empty: the layout whose shed tier keeps its
/// prefetch in the buffer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_waiting_in_the_sources_buffer_are_released() {
    let (_admin, ch) = admin().await;
    let critical = rand_queue("ctimeout-buffer-critical");
    let sheddable = rand_queue("ctimeout-buffer-sheddable");
    declare(&ch, &critical, FieldTable::default()).await;
    declare(&ch, &sheddable, FieldTable::default()).await;
    publish_n(&ch, &sheddable, 20, b"s", |_| BasicProperties::default()).await;
    let mut cfg = AmqpSourceConfig::new(uri(), "");
    cfg.tier_queues = vec![
        TierQueue::new(&sheddable, Criticality::Sheddable),
        TierQueue::new(&critical, Criticality::Critical),
    ];
    cfg.prefetch = 5;
    let mut source = AmqpSource::connect(cfg, NonZeroUsize::new(5).unwrap())
        .await
        .unwrap();
    source.pause_tiers(TierMask::NONE.with(Criticality::Sheddable));
    // The prefetch of Sheddable waits in the source's buffer.
    assert!(eventually(|| ctl_counts(&sheddable) == (15, 5)).await);
    // Nothing has waited an hour.
    assert_eq!(source.release_waiting(Duration::from_secs(3_600)), 0);
    let waited = Duration::from_millis(300);
    tokio::time::sleep(waited).await;
    assert_eq!(source.release_waiting(waited), 5);
    let stats = source.stats();
    assert_eq!(
        (stats.handed_back, stats.requeued, stats.deliveries),
        (5, 5, 0)
    );
    // Delivered again (to this consumer: its prefetch has room), at their place.
    assert!(eventually(|| ctl_counts(&sheddable) == (15, 5)).await);
    tokio::time::sleep(waited).await;
    source.pause_tiers(TierMask::NONE);
    for i in 0..20 {
        let env = source.next().await.unwrap();
        assert_eq!(env.criticality, Criticality::Sheddable);
        assert_eq!(env.payload.redelivered(), i < 5, "delivery {i}");
        if i < 5 {
            // It waited in the buffer since the broker delivered it again.
            assert!(env.waited >= waited, "{:?}", env.waited);
        }
        env.ack.resolve(Disposition::Completed);
    }
    source.shutdown().await;
    let stats = source.stats();
    assert_eq!(
        (stats.deliveries, stats.acked, stats.redelivered),
        (20, 20, 5)
    );
    assert_eq!(stats.reconnects, 0);
    assert_eq!(ctl_counts(&sheddable), (0, 0));
    delete(&ch, &critical).await;
    delete(&ch, &sheddable).await;
}
