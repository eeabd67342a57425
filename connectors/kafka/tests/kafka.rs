//! Integration tests against a real Kafka broker (`tests/brokers/kafka.sh start`), a fresh
//! topic and group per test. Tests that stop the broker hold it exclusively.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use triage::ledger::Disposition;
use triage::runtime::{Republish, Source};
use triage::Criticality;
use triage_kafka::source::UnclassifiedReason;
use triage_kafka::{KafkaDeferSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};

fn config(group: &str, topic: &str, commit_interval_ms: u64) -> KafkaSourceConfig {
    let mut c = KafkaSourceConfig::new(BROKERS, group, [topic]);
    c.commit_interval_ms = commit_interval_ms;
    c.properties
        .insert("session.timeout.ms".into(), "6000".into());
    c
}

fn offsets(envs: &[triage::runtime::Envelope<triage_kafka::KafkaMessage>]) -> Vec<i64> {
    envs.iter().map(|e| e.payload.offset).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_only_the_contiguous_watermark() {
    let _broker = broker_shared().await;
    let (topic, group) = (rand_name("wm"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    produce_n(&topic, 13).await;

    let mut source = KafkaSource::builder(config(&group, &topic, 50))
        .build()
        .unwrap();
    let mut envs = take(&mut source, 13).await;
    assert_eq!(offsets(&envs), (0..13).collect::<Vec<_>>());
    let e12 = envs.pop().unwrap();
    let e11 = envs.pop().unwrap();
    let e10 = envs.pop().unwrap();
    for e in envs {
        e.ack.resolve(Disposition::Completed);
    }
    assert_eq!(committed_at_least(&group, &topic, 10).await, 10);
    // Each commit is confirmed and counted (the stats and `triage_kafka_commits_total`).
    assert!(source.stats().commits >= 1, "{:?}", source.stats());

    e12.ack.resolve(Disposition::Completed);
    e10.ack.resolve(Disposition::Completed);
    // The first commit after 12 and 10 are settled stops at 11: 11 is still pending.
    assert_eq!(committed_at_least(&group, &topic, 11).await, 11);
    assert_eq!(source.pending(), 1);

    e11.ack.resolve(Disposition::Failed);
    assert_eq!(committed_at_least(&group, &topic, 13).await, 13);
    source.shutdown().await;

    // A restart resumes at the committed position: nothing below it is missing or repeated.
    produce_n(&topic, 1).await;
    let mut again = KafkaSource::builder(config(&group, &topic, 50))
        .build()
        .unwrap();
    assert_eq!(next(&mut again).await.payload.offset, 13);
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_commits_the_watermark_and_ignores_late_acks() {
    let _broker = broker_shared().await;
    let (topic, group) = (rand_name("rev"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    produce_n(&topic, 106).await;

    // The periodic commit is never due: only the revocation can commit.
    let mut first = KafkaSource::builder(config(&group, &topic, 3_600_000))
        .build()
        .unwrap();
    let mut envs = take(&mut first, 106).await;
    let late: Vec<_> = envs.split_off(103); // 103, 104, 105 stay unresolved
    for e in envs {
        e.ack.resolve(Disposition::Completed);
    }
    assert_eq!(committed(&group, &topic), None);

    // A second member joins: the partition is revoked from the first (eager rebalance).
    let mut second = KafkaSource::builder(config(&group, &topic, 3_600_000))
        .build()
        .unwrap();
    let revoked = first.stats().revocations;
    wait_until("the revocation", || {
        let n = first.stats().revocations;
        async move { n > revoked }
    })
    .await;
    assert_eq!(committed(&group, &topic), Some(103));

    // Completions for the old assignment are ignored, never stored.
    let stale_before = first.stats().stale_acks;
    for e in late {
        e.ack.resolve(Disposition::Completed);
    }
    assert_eq!(first.stats().stale_acks, stale_before + 3);

    // Whoever owns the partition now resumes at the group's position, 103, never at the
    // first member's stale local position (106).
    let (from_first, got) = tokio::select! {
        e = next(&mut first) => (true, e),
        e = next(&mut second) => (false, e),
    };
    assert_eq!(got.payload.offset, 103);
    drop(got);
    first.shutdown().await;
    assert_eq!(committed(&group, &topic), Some(103));
    if from_first {
        // With the first member gone the second owns it and starts at 103 too.
        assert_eq!(next(&mut second).await.payload.offset, 103);
    }
    second.shutdown().await;
    assert_eq!(committed(&group, &topic), Some(103));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_defaults_counts_and_large_payloads_pass() {
    let _broker = broker_shared().await;
    let (topic, group) = (rand_name("bad"), rand_name("g"));
    create_topic(&topic, 1, &[("max.message.bytes", "26214400")]).await;
    let h = |v: &[u8]| vec![("triage-criticality".to_owned(), Some(v.to_vec()))];
    let big = vec![7u8; 20 * 1024 * 1024];
    produce(
        &topic,
        vec![
            (None, b"non-utf8 value".to_vec(), h(&[0xff, 0xfe, 0xfd])),
            (Some(vec![0xc3, 0x28]), b"non-utf8 key".to_vec(), vec![]),
            (
                None,
                b"twice".to_vec(),
                [h(b"high"), h(b"critical")].concat(),
            ),
            (None, b"missing".to_vec(), vec![]),
            (None, b"abc".to_vec(), h(b"abc")),
            (None, b"good".to_vec(), h(b"HIGH")),
            (None, big.clone(), h(b"critical")),
        ],
    )
    .await;

    let mut c = config(&group, &topic, 50);
    c.criticality.trusted_topics = vec![topic.clone()];
    let mut source = KafkaSource::builder(c).build().unwrap();
    let envs = take(&mut source, 7).await;
    let tiers: Vec<_> = envs.iter().map(|e| e.criticality).collect();
    use Criticality::*;
    assert_eq!(
        tiers,
        [Medium, Medium, Medium, Medium, Medium, High, Critical]
    );
    assert_eq!(envs[1].payload.key.as_deref(), Some(&[0xc3, 0x28][..]));
    assert_eq!(envs[6].payload.payload.as_deref(), Some(&big[..]));
    let stats = source.stats();
    assert_eq!(stats.unclassified(UnclassifiedReason::Malformed), 2);
    assert_eq!(stats.unclassified(UnclassifiedReason::Duplicate), 1);
    assert_eq!(stats.unclassified(UnclassifiedReason::Missing), 2);
    for e in envs {
        e.ack.resolve(Disposition::Completed);
    }
    assert_eq!(committed_at_least(&group, &topic, 7).await, 7);
    source.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_commits_what_is_settled() {
    let _broker = broker_shared().await;
    let (topic, group) = (rand_name("shut"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    produce_n(&topic, 101).await;
    let mut source = KafkaSource::builder(config(&group, &topic, 60_000))
        .build()
        .unwrap();
    for e in take(&mut source, 101).await {
        e.ack.resolve(Disposition::Completed);
    }
    assert_eq!(
        committed(&group, &topic),
        None,
        "periodic commit not yet due"
    );
    source.shutdown().await;
    assert_eq!(committed(&group, &topic), Some(101));
}

fn republish(reason: &'static str) -> Republish {
    Republish {
        criticality: Criticality::High,
        attempt: 1,
        deferrals: 1,
        deadline: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(4_000_000_000_000)),
        reason,
        error: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defer_copies_headers_exactly_once() {
    let _broker = broker_shared().await;
    let (topic, defer, group) = (rand_name("hdr"), rand_name("hdr-deferred"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    create_topic(&defer, 1, &[]).await;
    let headers = vec![
        ("a".to_owned(), Some(b"1".to_vec())),
        ("triage-attempt".to_owned(), Some(b"0".to_vec())),
        ("a".to_owned(), None),
        ("b".to_owned(), Some(vec![0xff])),
    ];
    produce(
        &topic,
        vec![(Some(b"k".to_vec()), b"body".to_vec(), headers)],
    )
    .await;

    let mut source = KafkaSource::builder(config(&group, &topic, 50))
        .build()
        .unwrap();
    let env = next(&mut source).await;
    let sink = KafkaDeferSink::new(KafkaSinkConfig::new(BROKERS, &defer)).unwrap();
    sink.send(&env.payload, &republish("overloaded"))
        .await
        .unwrap();
    env.ack.resolve(Disposition::Deferred);

    let mut drain = triage_kafka::drain::builder(config(&rand_name("g"), &defer, 50))
        .build()
        .unwrap();
    let copy = next(&mut drain).await;
    // The tier it was deferred with, its retries and its deferrals come back with it.
    assert_eq!(copy.criticality, Criticality::High);
    assert_eq!((copy.attempt, copy.deferrals), (1, 1));
    assert!(copy.deadline.is_some(), "the deadline header is honoured");
    assert_eq!(copy.payload.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(copy.payload.payload.as_deref(), Some(&b"body"[..]));
    let s = |v: &str| Some(v.as_bytes().to_vec());
    let expected = vec![
        ("a".to_owned(), s("1")),
        ("a".to_owned(), None),
        ("b".to_owned(), Some(vec![0xff])),
        ("triage-criticality".to_owned(), s("high")),
        ("triage-attempt".to_owned(), s("1")),
        ("triage-deferrals".to_owned(), s("1")),
        ("triage-deadline-ms".to_owned(), s("4000000000000")),
        ("triage-reason".to_owned(), s("overloaded")),
        ("triage-origin-topic".to_owned(), s(&topic)),
        ("triage-origin-partition".to_owned(), s("0")),
        ("triage-origin-offset".to_owned(), s("0")),
    ];
    assert_eq!(copy.payload.headers, expected);
    copy.ack.resolve(Disposition::Completed);
    drain.shutdown().await;
    source.shutdown().await;
    assert_eq!(committed(&group, &topic), Some(1));
}

/// Issue 10 point 2: a source that accepts records its defer or dead-letter producer would
/// refuse does not start; the error names both limits. (Before, the source accepted 32 MiB
/// and the producer refused anything over 1,000,000 bytes, found only when a record had to be
/// re-published.) No broker needed: it fails before connecting.
#[test]
fn a_source_whose_records_its_sinks_cannot_carry_does_not_start() {
    let mut sink_config = KafkaSinkConfig::new(BROKERS, "limits.deferred");
    sink_config.max_message_bytes = 1_000_000;
    let small_sink = KafkaDeferSink::new(sink_config).unwrap();
    let default_sink = KafkaDeferSink::new(KafkaSinkConfig::new(BROKERS, "limits.dead")).unwrap();
    let source_config = KafkaSourceConfig::new(BROKERS, "g", ["limits"]);
    let err = KafkaSource::builder(source_config.clone())
        .republish_to(&default_sink)
        .republish_to(&small_sink)
        .build()
        .unwrap_err();
    let triage_kafka::Error::Config(err) = err else {
        panic!("{err:?}");
    };
    assert_eq!(err.field(), "max_payload_bytes");
    let text = err.to_string();
    assert!(text.contains("max_payload_bytes = 33554432"), "{text}");
    assert!(text.contains("max_message_bytes = 1000000"), "{text}");
    assert!(text.contains("\"limits.deferred\""), "{text}");
    // The defaults agree with each other.
    source_config
        .validate_republish(&KafkaSinkConfig::new(BROKERS, "x"))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_defer_is_rejected() {
    let _broker = broker_shared().await;
    let defer = rand_name("big-deferred");
    // The broker of the tests allows 30 MiB; this topic 1,000,000 bytes.
    create_topic(&defer, 1, &[("max.message.bytes", "1000000")]).await;
    let msg = triage_kafka::KafkaMessage {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        key: None,
        payload: Some(vec![0; 2_000_000]),
        headers: vec![],
        timestamp_ms: None,
    };
    // Refused by the producer's own limit, before sending.
    let mut small = KafkaSinkConfig::new(BROKERS, &defer);
    small.max_message_bytes = 1_000_000;
    let sink = KafkaDeferSink::new(small).unwrap();
    let err = sink.send(&msg, &republish("full")).await.unwrap_err();
    assert!(
        matches!(err, triage::runtime::SinkError::Rejected(_)),
        "{err}"
    );
    // Within the producer's limit (the default, 32 MiB + 64 KiB) but over the topic's: the
    // broker refuses it, and that is a rejection too, not an outage.
    let sink = KafkaDeferSink::new(KafkaSinkConfig::new(BROKERS, &defer)).unwrap();
    let err = sink.send(&msg, &republish("full")).await.unwrap_err();
    assert!(
        matches!(err, triage::runtime::SinkError::Rejected(_)),
        "{err}"
    );
}

/// Issue 10 point 1: a dead-letter topic that does not exist is a permanent rejection, with the
/// sink's own metadata wait (no librdkafka property set for it), so the runtime gives up on the
/// full copy (and the reference copy) instead of retrying for ever. On the code before the fix
/// the broker's `Unknown topic or partition` was `Unavailable`, and with librdkafka's default
/// metadata wait (30 s) the record timed out first (`NotConfirmed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_topic_is_a_permanent_rejection() {
    use triage::runtime::DeadLetterSink;

    let _broker = broker_shared().await;
    let missing = rand_name("missing-dead");
    let mut config = KafkaSinkConfig::new(BROKERS, &missing);
    // The test broker auto-creates topics (`auto.create.topics.enable=true` in
    // tests/brokers/kafka.sh) when a producer asks, as librdkafka's producer does by default;
    // production brokers usually do not, so the client stops asking.
    config
        .properties
        .insert("allow.auto.create.topics".into(), "false".into());
    // The sink waits half the message timeout for a topic the cluster does not know, then
    // fails the record as an unknown topic (with librdkafka's own 30 s it would time out at
    // 10 s instead, which is transient). Shortened to keep the test short.
    config.message_timeout_ms = 2_000;
    let sink = KafkaDeferSink::new(config).unwrap();
    let msg = triage_kafka::KafkaMessage {
        topic: "orders".into(),
        partition: 0,
        offset: 7,
        key: Some(b"k".to_vec()),
        payload: Some(b"v".to_vec()),
        headers: vec![],
        timestamp_ms: None,
    };
    let mut info = republish("failed");
    info.error = Some("handler failed".into());
    let err = DeadLetterSink::publish(&sink, &msg, &info)
        .await
        .unwrap_err();
    assert!(err.is_permanent(), "{err}");
    info.reason = "dead_letter_rejected";
    let err = sink.publish_reference(&msg, &info).await.unwrap_err();
    assert!(err.is_permanent(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defer_with_broker_down_holds_the_position() {
    let _broker = broker_exclusive().await;
    let (topic, defer, group) = (
        rand_name("down"),
        rand_name("down-deferred"),
        rand_name("g"),
    );
    create_topic(&topic, 1, &[]).await;
    create_topic(&defer, 1, &[]).await;
    produce_n(&topic, 2).await;
    let mut source = KafkaSource::builder(config(&group, &topic, 50))
        .build()
        .unwrap();
    let mut envs = take(&mut source, 2).await;
    let second = envs.pop().unwrap();
    let first = envs.pop().unwrap();
    first.ack.resolve(Disposition::Completed);
    assert_eq!(committed_at_least(&group, &topic, 1).await, 1);

    let mut sink_config = KafkaSinkConfig::new(BROKERS, &defer);
    sink_config.message_timeout_ms = 3000;
    let sink = KafkaDeferSink::new(sink_config).unwrap();
    {
        let _restart = RestartOnDrop;
        broker("stop");
        let err = tokio::time::timeout(
            HANG_GUARD,
            sink.send(&second.payload, &republish("overloaded")),
        )
        .await
        .expect("hang guard: the sink must fail within its timeout")
        .unwrap_err();
        assert!(
            matches!(err, triage::runtime::SinkError::NotConfirmed(_)),
            "{err}"
        );
        // Not confirmed: the runtime leaves the record unacknowledged.
    }
    assert_eq!(
        committed(&group, &topic),
        Some(1),
        "position did not pass it"
    );

    sink.send(&second.payload, &republish("overloaded"))
        .await
        .unwrap();
    second.ack.resolve(Disposition::Deferred);
    // The outage may have cost the consumer its assignment (session timeout): then that
    // resolve was stale, ignored, and the record comes again to be deferred again.
    let after = tokio::select! {
        pos = committed_at_least(&group, &topic, 2) => pos,
        again = next(&mut source) => {
            assert_eq!(again.payload.offset, 1);
            sink.send(&again.payload, &republish("overloaded")).await.unwrap();
            again.ack.resolve(Disposition::Deferred);
            committed_at_least(&group, &topic, 2).await
        }
    };
    assert_eq!(after, 2);
    source.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_with_the_broker_down() {
    let _broker = broker_exclusive().await;
    let (topic, group) = (rand_name("shutdown-down"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    produce_n(&topic, 3).await;
    let mut c = config(&group, &topic, 60_000);
    c.commit_timeout_ms = 2000;
    c.close_timeout_ms = 2000;
    let mut source = KafkaSource::builder(c).build().unwrap();
    for e in take(&mut source, 3).await {
        e.ack.resolve(Disposition::Completed);
    }
    let _restart = RestartOnDrop;
    broker("stop");
    let returned = tokio::time::timeout(Duration::from_secs(30), source.shutdown()).await;
    assert!(returned.is_ok(), "shutdown hung with the broker down");
}

/// A broker restart that outlasts the session, for a static member (`group.instance.id`)
/// that was paused when the broker went away, resumed while it had no partitions, and had a
/// commit queued meanwhile: the source must consume again once the broker is back. Two
/// librdkafka behaviours stopped it for good before: a partition's pause flag survives an
/// unassign and a later assign (so the source sets it on every assignment), and the queued
/// commit is sent after the session timed out with the member id reset, which fences the
/// static member with a fatal error (so the source replaces its client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumes_again_after_a_broker_restart_that_outlasts_the_session() {
    let _broker = broker_exclusive().await;
    let (topic, group) = (rand_name("outage"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    produce_n(&topic, 2).await;
    let mut c = config(&group, &topic, 50);
    c.properties
        .insert("group.instance.id".into(), rand_name("instance"));
    let mut source = KafkaSource::builder(c).build().unwrap();
    let mut before = take(&mut source, 2).await;
    let second = before.pop().unwrap();
    before.pop().unwrap().ack.resolve(Disposition::Completed);
    assert_eq!(committed_at_least(&group, &topic, 1).await, 1);

    source.pause();
    wait_until("the poll thread to pause", || {
        let paused = source.stats().pauses >= 1;
        async move { paused }
    })
    .await;
    let revoked = source.stats().revocations;
    {
        let _restart = RestartOnDrop;
        broker("stop");
        // Settled while the coordinator is away: its commit waits in the client.
        second.ack.resolve(Disposition::Completed);
        wait_until("the assignment to be lost", || {
            let lost = source.stats().revocations > revoked;
            async move { lost }
        })
        .await;
        source.resume();
        // Let the poll thread resume its (empty) assignment while the broker is still down.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    produce_n(&topic, 5).await;
    // Offset 1 comes again if its commit was lost with the session (at-least-once).
    let mut seen = Vec::new();
    while seen.last() != Some(&6) {
        let e = next(&mut source).await;
        seen.push(e.payload.offset);
        e.ack.resolve(Disposition::Completed);
    }
    let stats = source.stats();
    // A replaced client starts again from the committed position: repeats are allowed
    // (at-least-once), gaps are not.
    let mut distinct = seen.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct == [2, 3, 4, 5, 6] || distinct == [1, 2, 3, 4, 5, 6],
        "{seen:?} {stats:?}"
    );
    assert_eq!(committed_at_least(&group, &topic, 7).await, 7, "{stats:?}");
    eprintln!("after the outage: {seen:?}, {stats:?}");
    source.shutdown().await;
}

/// A static member fenced by another client with the same `group.instance.id` gets a fatal
/// error from librdkafka and its client is unusable: the source replaces the client,
/// withdraws nothing settled, and consumes on from the committed watermark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_static_member_replaces_its_client_and_consumes_on() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};

    let _broker = broker_shared().await;
    let (topic, group, instance) = (rand_name("fenced"), rand_name("g"), rand_name("i"));
    create_topic(&topic, 1, &[]).await;
    produce_n(&topic, 1).await;
    let mut c = config(&group, &topic, 50);
    c.properties
        .insert("group.instance.id".into(), instance.clone());
    let mut source = KafkaSource::builder(c).build().unwrap();
    next(&mut source).await.ack.resolve(Disposition::Completed);
    assert_eq!(committed_at_least(&group, &topic, 1).await, 1);

    // The intruder joins under the same instance id: the broker fences the source's client.
    let intruder: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .set("group.id", &group)
        .set("group.instance.id", &instance)
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    intruder.subscribe(&[topic.as_str()]).unwrap();
    let intruder = std::sync::Arc::new(intruder);
    wait_until("the source to replace its client", || {
        let intruder = std::sync::Arc::clone(&intruder);
        let replaced = source.stats().client_restarts >= 1;
        async move {
            if !replaced {
                let _ = tokio::task::spawn_blocking(move || {
                    drop(intruder.poll(Duration::from_millis(100)));
                })
                .await;
            }
            replaced
        }
    })
    .await;
    // The new client took the instance id back (fencing the intruder in turn).
    tokio::task::spawn_blocking(move || drop(intruder));

    produce_n(&topic, 3).await;
    // Until offset 3 is seen: should the intruder's own join come last and fence the new
    // client too, the next one starts again from the committed position (repeats allowed,
    // gaps not).
    let mut seen = Vec::new();
    while seen.last() != Some(&3) {
        let e = next(&mut source).await;
        seen.push(e.payload.offset);
        e.ack.resolve(Disposition::Completed);
    }
    let mut distinct = seen.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct, vec![1, 2, 3], "{seen:?} {:?}", source.stats());
    assert_eq!(committed_at_least(&group, &topic, 4).await, 4);
    assert!(source.stats().client_restarts >= 1, "{:?}", source.stats());
    source.shutdown().await;
}

/// The high watermark of `topic`/0 as the broker reports it (what Kafka's `GetOffsetShell`
/// prints), read by a separate client.
fn high_watermark(topic: &str) -> i64 {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .create()
        .unwrap();
    consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(30))
        .unwrap()
        .1
}

async fn lag_becomes(source: &KafkaSource, want: u64) {
    wait_until(&format!("lag {want}"), || {
        let lag = source.lag();
        async move { lag == Some(want) }
    })
    .await;
}

/// Issue 9: `Source::lag` is what was produced minus what the runtime pulled, also while the
/// source is paused (a paused partition is not fetched, so librdkafka's cached high watermark
/// would freeze).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_is_what_was_produced_minus_what_was_pulled() {
    let _broker = broker_shared().await;
    let (topic, group) = (rand_name("lag"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    produce_n(&topic, 100).await;
    let mut c = config(&group, &topic, 50);
    c.lag_interval_ms = 20;
    c.max_prefetch_messages = 10;
    let mut source = KafkaSource::builder(c).build().unwrap();
    let pulled = take(&mut source, 30).await;
    assert_eq!(high_watermark(&topic), 100);
    lag_becomes(&source, 70).await;

    produce_n(&topic, 50).await;
    assert_eq!(high_watermark(&topic), 150);
    lag_becomes(&source, 120).await;

    source.pause();
    wait_until("the poll thread to pause", || {
        let paused = source.stats().pauses >= 1;
        async move { paused }
    })
    .await;
    produce_n(&topic, 25).await;
    lag_becomes(&source, 145).await;
    source.resume();

    let rest = take(&mut source, 145).await;
    assert_eq!(rest.last().unwrap().payload.offset, 174);
    lag_becomes(&source, 0).await;
    drop((pulled, rest));
    source.shutdown().await;
}

/// Issue 9, a topic per tier: while the runtime sheds Sheddable, the Sheddable topic is not
/// consumed at all and the Critical topic keeps flowing; its records wait in the broker (and
/// in the lag), and come once the tier is admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_tiers_holds_the_shed_topic_while_critical_flows() {
    use triage::queue::TierMask;

    let _broker = broker_shared().await;
    let (critical, sheddable, group) = (rand_name("tier-c"), rand_name("tier-s"), rand_name("g"));
    create_topic(&critical, 1, &[]).await;
    create_topic(&sheddable, 1, &[]).await;
    produce_n(&sheddable, 5).await;
    produce_n(&critical, 5).await;
    let mut c = KafkaSourceConfig::new(BROKERS, &group, [&critical, &sheddable]);
    c.lag_interval_ms = 20;
    c.criticality.topic_tiers = [
        (critical.clone(), Criticality::Critical),
        (sheddable.clone(), Criticality::Sheddable),
    ]
    .into();
    let mut source = KafkaSource::builder(c).build().unwrap();
    source.pause_tiers(TierMask::NONE.with(Criticality::Sheddable));

    let mut served = take(&mut source, 5).await;
    produce_n(&critical, 5).await;
    produce_n(&sheddable, 5).await;
    served.extend(take(&mut source, 5).await);
    assert!(
        served
            .iter()
            .all(|e| *e.payload.topic == *critical && e.criticality == Criticality::Critical),
        "only the Critical topic flows"
    );
    // All ten Sheddable records wait in the broker: none was consumed.
    lag_becomes(&source, 10).await;
    assert_eq!(source.stats().consumed, 10);

    source.pause_tiers(TierMask::NONE);
    let shed = take(&mut source, 10).await;
    assert!(shed
        .iter()
        .all(|e| *e.payload.topic == *sheddable && e.criticality == Criticality::Sheddable));
    assert_eq!(
        shed.iter().map(|e| e.payload.offset).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    lag_becomes(&source, 0).await;
    drop((served, shed));
    source.shutdown().await;
}
