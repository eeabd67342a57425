//! `AmqpDeferSink` against a real RabbitMQ: `Ok` only after the confirm, headers copied
//! once, unroutable publishes returned as errors with the source delivery left unacked.

mod common;

use std::num::NonZeroUsize;
use std::time::{Duration, UNIX_EPOCH};

use common::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use triage::ledger::Disposition;
use triage::runtime::{DeadLetterSink, DeferSink, Republish, SinkError, Source};
use triage::Criticality;
use triage_amqp::{AmqpDeferSink, AmqpSinkConfig, AmqpSource, AmqpSourceConfig};

fn republish(error: Option<&str>) -> Republish {
    Republish {
        criticality: Criticality::High,
        attempt: 1,
        deferrals: 2,
        deadline: Some(UNIX_EPOCH + Duration::from_millis(4_102_444_800_000)),
        reason: if error.is_some() {
            "failed"
        } else {
            "overloaded"
        },
        error: error.map(str::to_owned),
    }
}

async fn source_with_one(ch: &lapin::Channel, q: &str) -> AmqpSource {
    declare(ch, q, FieldTable::default()).await;
    let mut h = FieldTable::default();
    h.insert(
        "tenant".into(),
        AMQPValue::LongString(LongString::from("acme")),
    );
    h.insert("trace".into(), AMQPValue::LongLongInt(42));
    publish_n(ch, q, 1, b"payload-0", |_| {
        BasicProperties::default()
            .with_headers(h.clone())
            .with_priority(6)
            .with_content_type("text/plain".into())
            .with_correlation_id("corr-0".into())
    })
    .await;
    AmqpSource::connect(
        AmqpSourceConfig::new(uri(), q),
        NonZeroUsize::new(100).unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defer_is_ok_after_the_confirm_with_headers_copied_once() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("defer-src");
    let dq = rand_queue("defer");
    let mut source = source_with_one(&ch, &q).await;
    let sink = AmqpDeferSink::connect(AmqpSinkConfig::new(uri(), &dq))
        .await
        .unwrap();

    let env = source.next().await.unwrap();
    DeferSink::publish(&sink, &env.payload, &republish(None))
        .await
        .unwrap();
    env.ack.resolve(Disposition::Deferred);
    source.shutdown().await;
    assert_eq!(ready(&ch, &q).await, 0);

    let copies = drain(&ch, &dq).await;
    assert_eq!(copies.len(), 1);
    let d = &copies[0].delivery;
    assert_eq!(d.data, b"payload-0");
    let p = &d.properties;
    assert_eq!(p.delivery_mode(), &Some(2));
    assert_eq!(p.priority(), &Some(6));
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), "id-0");
    assert_eq!(p.correlation_id().as_ref().unwrap().as_str(), "corr-0");
    assert_eq!(p.content_type().as_ref().unwrap().as_str(), "text/plain");
    let h = p.headers().as_ref().unwrap().inner();
    let text = |k: &str| match h.get(k) {
        Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec()).unwrap(),
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(text("tenant"), "acme");
    assert_eq!(h.get("trace"), Some(&AMQPValue::LongLongInt(42)));
    assert_eq!(text("triage-criticality"), "high");
    assert_eq!(text("triage-reason"), "overloaded");
    assert_eq!(text("triage-origin-queue"), q);
    assert_eq!(text("triage-attempt"), "1");
    assert_eq!(text("triage-deferrals"), "2");
    assert_eq!(text("triage-deadline-ms"), "4102444800000");
    assert!(!h.contains_key("triage-error"));
    // The two original headers and six triage ones, each once.
    assert_eq!(h.len(), 8);
    delete(&ch, &q).await;
    delete(&ch, &dq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_carries_the_error() {
    let (_conn, ch) = admin().await;
    let dq = rand_queue("dead");
    let sink = AmqpDeferSink::connect(AmqpSinkConfig::new(uri(), &dq))
        .await
        .unwrap();
    let msg = triage_amqp::AmqpMessage::new(b"b".to_vec()).with_queue("orders");
    DeadLetterSink::publish(&sink, &msg, &republish(Some("boom")))
        .await
        .unwrap();
    let copies = drain(&ch, &dq).await;
    let h = copies[0]
        .delivery
        .properties
        .headers()
        .as_ref()
        .unwrap()
        .inner();
    assert_eq!(
        h.get("triage-error"),
        Some(&AMQPValue::LongString(LongString::from("boom")))
    );
    assert_eq!(
        h.get("triage-reason"),
        Some(&AMQPValue::LongString(LongString::from("failed")))
    );
    delete(&ch, &dq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_publish_is_an_error_and_the_delivery_stays_unacked() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("unroutable-src");
    let dq = rand_queue("unroutable");
    let mut source = source_with_one(&ch, &q).await;
    // Declared, but published through amq.direct with a key nothing is bound to.
    let mut cfg = AmqpSinkConfig::new(uri(), &dq);
    cfg.exchange = "amq.direct".to_owned();
    cfg.routing_key = Some(rand_queue("nobody"));
    let sink = AmqpDeferSink::connect(cfg).await.unwrap();

    let env = source.next().await.unwrap();
    let err = DeferSink::publish(&sink, &env.payload, &republish(None))
        .await
        .unwrap_err();
    assert!(matches!(err, SinkError::NotConfirmed(_)), "{err:?}");
    assert!(err.to_string().contains("NO_ROUTE"), "{err}");
    // The runtime falls back to backpressure: the delivery is still held, unacked.
    assert_eq!(ctl_counts(&q), (0, 1));
    assert_eq!(drain(&ch, &dq).await.len(), 0);

    // The sink's channel survives a return: a routable publish afterwards is confirmed.
    let ok = AmqpDeferSink::connect(AmqpSinkConfig::new(uri(), &dq))
        .await
        .unwrap();
    DeferSink::publish(&ok, &env.payload, &republish(None))
        .await
        .unwrap();
    DeferSink::publish(&sink, &env.payload, &republish(None))
        .await
        .unwrap_err();
    env.ack.resolve(Disposition::Deferred);
    source.shutdown().await;
    assert_eq!(ctl_counts(&q), (0, 0));
    assert_eq!(drain(&ch, &dq).await.len(), 1);
    delete(&ch, &q).await;
    delete(&ch, &dq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_copies_keep_their_tier_and_deferral_count() {
    let (_conn, ch) = admin().await;
    let dq = rand_queue("drain-tiers");
    let sink = AmqpDeferSink::connect(AmqpSinkConfig::new(uri(), &dq))
        .await
        .unwrap();
    let tiers = [
        (Criticality::Critical, 1),
        (Criticality::High, 2),
        (Criticality::Medium, 1),
        (Criticality::Sheddable, 3),
    ];
    for (i, (tier, deferrals)) in tiers.iter().enumerate() {
        let info = Republish {
            criticality: *tier,
            attempt: 0,
            deferrals: *deferrals,
            deadline: None,
            reason: "overloaded",
            error: None,
        };
        // A priority that alone would say Critical: the tier header wins on the drain.
        let msg = triage_amqp::AmqpMessage::new(format!("m{i}").into_bytes())
            .with_properties(BasicProperties::default().with_priority(9));
        DeferSink::publish(&sink, &msg, &info).await.unwrap();
    }
    let mut cfg = AmqpSourceConfig::drain(uri(), &dq);
    cfg.prefetch = 10;
    let mut drain = AmqpSource::connect(cfg, NonZeroUsize::new(10).unwrap())
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..tiers.len() {
        let env = drain.next().await.unwrap();
        got.push((env.criticality, env.deferrals));
        env.ack.resolve(Disposition::Completed);
    }
    drain.shutdown().await;
    assert_eq!(got, tiers);
    assert_eq!(drain.stats().unclassified, 0);
    delete(&ch, &dq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_limits_agree_at_start_up_and_a_too_large_copy_is_refused_unsent() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("limits-src");
    let dq = rand_queue("limits");
    let mut sink_cfg = AmqpSinkConfig::new(uri(), &dq);
    sink_cfg.max_message_bytes = 8_192;
    let sink = AmqpDeferSink::connect(sink_cfg).await.unwrap();

    // The source accepts 16 MiB by default: more than the sink can re-publish.
    let err = AmqpSource::connect_republishing(
        AmqpSourceConfig::new(uri(), &q),
        NonZeroUsize::new(100).unwrap(),
        &[&sink],
    )
    .await
    .unwrap_err();
    let triage_amqp::AmqpError::Config(e) = err else {
        panic!("{err:?}")
    };
    assert_eq!(e.field(), "max_payload_bytes");
    assert!(e.to_string().contains("max_message_bytes = 8192"), "{e}");
    assert!(e.to_string().contains("at most 4096"), "{e}");

    let mut agreeing = AmqpSourceConfig::new(uri(), &q);
    agreeing.max_payload_bytes = 4_096;
    let source =
        AmqpSource::connect_republishing(agreeing, NonZeroUsize::new(100).unwrap(), &[&sink])
            .await
            .unwrap();
    drop(source);

    // A copy the sink cannot take is refused before it is sent, and is no outage.
    let big = triage_amqp::AmqpMessage::new(vec![0u8; 4_097]);
    let err = DeferSink::publish(&sink, &big, &republish(None))
        .await
        .unwrap_err();
    assert!(matches!(err, SinkError::Rejected(_)), "{err:?}");
    assert!(sink.is_healthy());
    let fits = triage_amqp::AmqpMessage::new(vec![0u8; 4_096]);
    DeferSink::publish(&sink, &fits, &republish(None))
        .await
        .unwrap();
    assert_eq!(drain(&ch, &dq).await.len(), 1);
    delete(&ch, &q).await;
    delete(&ch, &dq).await;
}
