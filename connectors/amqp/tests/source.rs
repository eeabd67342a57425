//! `AmqpSource` against a real RabbitMQ: prefetch bound, settling exactly once, dead-lettering,
//! release, stale epochs, classification. A fresh queue per test.

mod common;

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use triage::ledger::Disposition;
use triage::runtime::{Ack, Source};
use triage::Criticality;
use triage_amqp::{AmqpSource, AmqpSourceConfig};

fn capacity(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

fn config(queue: &str, prefetch: u16) -> AmqpSourceConfig {
    let mut c = AmqpSourceConfig::new(uri(), queue);
    c.prefetch = prefetch;
    c.reconnect.initial_backoff_ms = 50;
    c.reconnect.max_backoff_ms = 1_000;
    c
}

/// `next()` yields nothing within `wait`: used only to show that nothing *more* arrives.
async fn nothing_within(source: &mut AmqpSource, wait: Duration) -> bool {
    tokio::time::timeout(wait, source.next()).await.is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_never_exceeds_the_configured_value() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("prefetch");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, 5_000, b"x", |_| BasicProperties::default()).await;

    let prefetch = 50;
    let mut source = AmqpSource::connect(config(&q, prefetch), capacity(100))
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..prefetch {
        held.push(source.next().await.unwrap());
    }
    // Holding the whole prefetch unsettled: the broker sends nothing more.
    assert!(nothing_within(&mut source, Duration::from_millis(500)).await);
    source.pause();
    assert!(nothing_within(&mut source, Duration::from_millis(200)).await);
    let (ready_now, unacked) = ctl_counts(&q);
    assert_eq!(unacked, u64::from(prefetch));
    assert_eq!(ready_now, 5_000 - u64::from(prefetch));

    // Settling 10 lets exactly 10 more in.
    for env in held.drain(..10) {
        env.ack.resolve(Disposition::Completed);
    }
    source.resume();
    for _ in 0..10 {
        held.push(source.next().await.unwrap());
    }
    assert!(nothing_within(&mut source, Duration::from_millis(500)).await);
    assert!(eventually(|| ctl_counts(&q) == (5_000 - 60, 50)).await);
    assert_eq!(source.outstanding(), usize::from(prefetch));

    for env in held {
        env.ack.release();
    }
    source.shutdown().await;
    let stats = source.stats();
    assert_eq!(stats.acked, 10);
    assert_eq!(stats.requeued, 50);
    assert_eq!(ready(&ch, &q).await, 5_000 - 10);
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_above_capacity_is_refused_by_name() {
    let err = AmqpSource::connect(config("q", 200), capacity(100))
        .await
        .unwrap_err();
    let triage_amqp::AmqpError::Config(e) = err else {
        panic!("{err:?}")
    };
    assert_eq!(e.field(), "prefetch");
    assert!(e.to_string().contains("1..=100"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_is_acked_exactly_once_and_replays_are_ignored() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("once");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, 300, b"x", |_| BasicProperties::default()).await;

    let mut source = AmqpSource::connect(config(&q, 100), capacity(100))
        .await
        .unwrap();
    let mut ids = HashSet::new();
    let mut replay = Vec::new();
    for i in 0..300 {
        let env = source.next().await.unwrap();
        assert!(!env.payload.redelivered());
        assert!(ids.insert(env.payload.message_id().unwrap().to_owned()));
        if i % 30 == 0 {
            replay.push(env.ack.token());
        }
        env.ack.resolve(Disposition::Completed);
    }
    // Settling the same deliveries again (a bug in a caller) changes nothing at the broker.
    for token in &replay {
        Ack::new(source.ack_sink(), *token).resolve(Disposition::Completed);
        Ack::new(source.ack_sink(), *token).resolve(Disposition::Failed);
    }
    source.shutdown().await;
    let stats = source.stats();
    assert_eq!(stats.deliveries, 300);
    assert_eq!(stats.acked, 300);
    // Settled in delivery order: the settle task coalesces runs of acks into `multiple`
    // frames (never waiting for one), so fewer frames than deliveries, and none lost: the
    // queue ends empty with nothing requeued.
    assert!(
        (1..300).contains(&stats.ack_frames),
        "{} ack frames for 300 acks",
        stats.ack_frames
    );
    assert_eq!(stats.duplicate_settles, 20);
    assert_eq!(stats.rejected, 0);
    // A second ack of a tag would have closed the channel (PRECONDITION_FAILED).
    assert_eq!(stats.reconnects, 0);
    assert_eq!(stats.settle_errors, 0);
    assert_eq!(stats.redelivered, 0);
    assert_eq!(ready(&ch, &q).await, 0);
    assert_eq!(ctl_counts(&q), (0, 0));
    delete(&ch, &q).await;
}

async fn failed_run(via_sink: bool) -> (u32, u32, triage_amqp::AmqpSourceStats) {
    let (_conn, ch) = admin().await;
    let q = rand_queue("failed");
    let (dlx, dlq) = dead_letter_pair(&ch, "failed").await;
    let mut cfg = config(&q, 10);
    cfg.declare.dead_letter_exchange = Some(dlx.clone());
    cfg.dead_letter_via_sink = via_sink;
    let mut source = AmqpSource::connect(cfg, capacity(10)).await.unwrap();
    publish_n(&ch, &q, 3, b"x", |_| BasicProperties::default()).await;
    for _ in 0..3 {
        let env = source.next().await.unwrap();
        let d = if env.payload.message_id() == Some("id-1") {
            Disposition::Failed
        } else {
            Disposition::Completed
        };
        env.ack.resolve(d);
    }
    source.shutdown().await;
    let stats = source.stats();
    let in_dlq = drain(&ch, &dlq).await;
    if let Some(m) = in_dlq.first() {
        assert_eq!(
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .as_str(),
            "id-1"
        );
    }
    let remaining = ready(&ch, &q).await;
    delete(&ch, &q).await;
    delete(&ch, &dlq).await;
    let _ = ch.exchange_delete(dlx.as_str(), Default::default()).await;
    (in_dlq.len() as u32, remaining, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_without_a_sink_is_rejected_to_the_dead_letter_exchange() {
    let (dead_lettered, remaining, stats) = failed_run(false).await;
    assert_eq!(dead_lettered, 1);
    assert_eq!(remaining, 0);
    assert_eq!((stats.rejected, stats.acked), (1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_through_a_sink_is_acked_not_rejected() {
    let (dead_lettered, remaining, stats) = failed_run(true).await;
    assert_eq!(dead_lettered, 0);
    assert_eq!(remaining, 0);
    assert_eq!((stats.rejected, stats.acked), (0, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_is_redelivered_with_the_flag() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("release");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, 1, b"x", |_| BasicProperties::default()).await;
    let mut source = AmqpSource::connect(config(&q, 10), capacity(10))
        .await
        .unwrap();
    let first = source.next().await.unwrap();
    assert!(!first.payload.redelivered());
    drop(first); // an Ack dropped unresolved releases the delivery
    let again = source.next().await.unwrap();
    assert!(again.payload.redelivered());
    assert_eq!(again.payload.message_id(), Some("id-0"));
    again.ack.resolve(Disposition::Completed);
    source.shutdown().await;
    let stats = source.stats();
    assert_eq!((stats.requeued, stats.redelivered, stats.acked), (1, 1, 1));
    assert_eq!(ready(&ch, &q).await, 0);
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_from_a_closed_channel_are_ignored_after_reconnect() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("stale");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, 2, b"x", |_| BasicProperties::default()).await;
    let mut cfg = config(&q, 10);
    let name = format!("stale-test/{q}");
    cfg.connection_name = Some(name.clone());
    let mut source = AmqpSource::connect(cfg, capacity(10)).await.unwrap();
    let old_a = source.next().await.unwrap();
    let old_b = source.next().await.unwrap();
    assert_eq!(source.epoch(), 1);

    assert!(eventually(|| close_connections_named(&name) == 1).await);
    // The source notices, reconnects, and gets both deliveries again.
    let mut again = vec![source.next().await.unwrap(), source.next().await.unwrap()];
    assert_eq!(source.epoch(), 2);
    assert!(again.iter().all(|e| e.payload.redelivered()));
    // Settling the old handles must not touch the new channel's tags 1 and 2.
    old_a.ack.resolve(Disposition::Completed);
    drop(old_b);
    assert_eq!(source.stats().stale_settles, 2);
    assert_eq!(source.outstanding(), 2);
    for env in again.drain(..) {
        env.ack.resolve(Disposition::Completed);
    }
    source.shutdown().await;
    let stats = source.stats();
    assert_eq!(stats.reconnects, 1);
    assert_eq!(stats.acked, 2);
    assert_eq!(stats.redelivered, 2);
    assert_eq!(ready(&ch, &q).await, 0);
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classifies_from_priority_and_trusted_header_and_counts_the_rest() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("classify");
    declare(&ch, &q, FieldTable::default()).await;
    let header = |v: &str| {
        let mut h = FieldTable::default();
        h.insert(
            "triage-criticality".into(),
            AMQPValue::LongString(LongString::from(v)),
        );
        h.insert("triage-attempt".into(), AMQPValue::LongInt(1));
        h
    };
    let cases: Vec<BasicProperties> = vec![
        BasicProperties::default().with_priority(1),
        BasicProperties::default().with_priority(9),
        BasicProperties::default().with_headers(header("critical")),
        BasicProperties::default()
            .with_headers(header("bogus"))
            .with_priority(9),
        BasicProperties::default(),
    ];
    publish_n(&ch, &q, cases.len(), b"x", |i| cases[i].clone()).await;
    let mut cfg = config(&q, 10);
    cfg.classify.trusted_queues = vec![q.clone()];
    let mut source = AmqpSource::connect(cfg, capacity(10)).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..cases.len() {
        let env = source.next().await.unwrap();
        got.push((env.criticality, env.attempt, env.size_bytes));
        env.ack.resolve(Disposition::Completed);
    }
    use Criticality::*;
    assert_eq!(
        got,
        [
            (Sheddable, 0, 1),
            (Critical, 0, 1),
            (Critical, 1, 1),
            (Medium, 1, 1),
            (Medium, 0, 1)
        ]
    );
    source.shutdown().await;
    assert_eq!(source.stats().unclassified, 2);
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_too_far_for_the_clock_is_held_to_a_year_instead_of_crashing_the_source() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("far-deadline");
    declare(&ch, &q, FieldTable::default()).await;
    let deadline = |v: AMQPValue| {
        let mut h = FieldTable::default();
        h.insert("triage-deadline-ms".into(), v);
        BasicProperties::default().with_headers(h)
    };
    let soon = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 60_000;
    // Any publisher may write these: millions of years ahead, as an integer and as text.
    let cases = [
        deadline(AMQPValue::LongLongInt(i64::MAX)),
        deadline(AMQPValue::LongString(LongString::from("99999999999999"))),
        deadline(AMQPValue::Timestamp(u64::MAX)),
        deadline(AMQPValue::LongLongInt(soon)),
    ];
    publish_n(&ch, &q, cases.len(), b"x", |i| cases[i].clone()).await;
    // A clock that stands still: each deadline is read against the same now.
    let (clock, _mock) = triage::quanta::Clock::mock();
    let now = clock.now();
    let mut source = AmqpSource::connect(config(&q, 10), capacity(10))
        .await
        .unwrap()
        .with_clock(clock);
    let mut ahead = Vec::new();
    for _ in 0..cases.len() {
        let env = source.next().await.unwrap();
        ahead.push(env.deadline.map(|d| d.duration_since(now)));
        env.ack.resolve(Disposition::Completed);
    }
    // Too far for the clock: held to the furthest a deadline from outside goes
    // (wire::deadline_after); the near one keeps its own (less the time since it was written).
    let year = Some(triage::wire::MAX_DEADLINE_AHEAD);
    assert_eq!(ahead[..3], [year, year, year]);
    assert!(
        ahead[3].is_some_and(|a| a <= Duration::from_secs(60)),
        "{ahead:?}"
    );
    source.shutdown().await;
    assert_eq!(source.stats().acked, 4);
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_bodies_are_rejected_unseen() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("oversize");
    let (dlx, dlq) = dead_letter_pair(&ch, "oversize").await;
    let mut cfg = config(&q, 10);
    cfg.max_payload_bytes = 16;
    cfg.declare.dead_letter_exchange = Some(dlx.clone());
    let mut source = AmqpSource::connect(cfg, capacity(10)).await.unwrap();
    publish_n(&ch, &q, 1, &[7u8; 17], |_| BasicProperties::default()).await;
    publish_n(&ch, &q, 1, &[7u8; 16], |_| BasicProperties::default()).await;
    let env = source.next().await.unwrap();
    assert_eq!(env.payload.body().len(), 16);
    env.ack.resolve(Disposition::Completed);
    source.shutdown().await;
    assert_eq!(source.stats().oversize, 1);
    assert_eq!(drain(&ch, &dlq).await.len(), 1);
    assert_eq!(ready(&ch, &q).await, 0);
    delete(&ch, &q).await;
    delete(&ch, &dlq).await;
    let _ = ch.exchange_delete(dlx.as_str(), Default::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_with_the_default_config_lands_in_the_queues_own_dead_letter_queue() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("default-dlq");
    // Not declared beforehand: the source declares it, with its dead-letter queue.
    let mut source = AmqpSource::connect(config(&q, 10), capacity(10))
        .await
        .unwrap();
    publish_n(&ch, &q, 2, b"x", |_| BasicProperties::default()).await;
    let failed = source.next().await.unwrap();
    failed.ack.resolve(Disposition::Failed);
    let done = source.next().await.unwrap();
    done.ack.resolve(Disposition::Completed);
    source.shutdown().await;
    assert_eq!((source.stats().rejected, source.stats().acked), (1, 1));
    let dead = drain(&ch, &format!("{q}.dead")).await;
    assert_eq!(
        dead.len(),
        1,
        "the rejected delivery is kept, not discarded"
    );
    assert_eq!(
        dead[0]
            .delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .as_str(),
        "id-0"
    );
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_a_dead_letter_exchange_is_refused_at_start_up() {
    // Managed elsewhere, no dead-letter exchange named, failed ones would be rejected.
    let mut cfg = config("managed", 10);
    cfg.declare.enabled = false;
    let err = AmqpSource::connect(cfg.clone(), capacity(10))
        .await
        .unwrap_err();
    let triage_amqp::AmqpError::Config(e) = err else {
        panic!("{err:?}")
    };
    assert_eq!(e.field(), "declare.dead_letter_exchange");
    assert!(e.to_string().contains("dead_letter_via_sink"), "{e}");

    // Acked through a sink, on a runtime without one: refused by the runtime, by name.
    let (_conn, ch) = admin().await;
    let q = rand_queue("via-sink");
    declare_plain(&ch, &q).await;
    let mut cfg = config(&q, 10);
    cfg.declare.enabled = false;
    cfg.dead_letter_via_sink = true;
    let source = AmqpSource::connect(cfg, capacity(10)).await.unwrap();
    let mut rt = triage::runtime::Runtime::builder(triage::runtime::RuntimeConfig::default())
        .start(
            |_job: triage::runtime::Job<triage_amqp::AmqpMessage>| async {
                Ok::<(), triage::runtime::HandlerError>(())
            },
        )
        .unwrap();
    let err = rt.try_attach(source).unwrap_err();
    assert_eq!(err.field(), "dead_letter_via_sink");
    rt.shutdown(Duration::from_secs(5)).await;
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_without_a_dead_letter_exchange_is_handed_on_not_discarded() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("oversize-no-dlx");
    declare_plain(&ch, &q).await;
    let mut cfg = config(&q, 10);
    cfg.declare.enabled = false;
    cfg.dead_letter_via_sink = true;
    cfg.max_payload_bytes = 16;
    let mut source = AmqpSource::connect(cfg, capacity(10)).await.unwrap();
    publish_n(&ch, &q, 1, &[7u8; 17], |_| BasicProperties::default()).await;
    let env = source.next().await.unwrap();
    assert_eq!(env.size_bytes, 17);
    env.ack.resolve(Disposition::Completed);
    source.shutdown().await;
    let stats = source.stats();
    assert_eq!((stats.oversize, stats.rejected, stats.acked), (1, 0, 1));
    delete(&ch, &q).await;
}
