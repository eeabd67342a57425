//! The Kafka source and sinks under triage's runtime, against the real broker.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig, Source};
use triage_kafka::{KafkaDeferSink, KafkaMessage, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_handlers_are_dead_lettered_and_the_position_moves_past_them() {
    let _broker = broker_shared().await;
    let (topic, dlq, group) = (rand_name("rt"), rand_name("rt-dead"), rand_name("g"));
    let big_topic = [("max.message.bytes", "26214400")];
    create_topic(&topic, 1, &big_topic).await;
    create_topic(&dlq, 1, &big_topic).await;
    let mut records: Vec<Rec> = (0..13)
        .map(|i| (None, format!("m{i}").into_bytes(), vec![]))
        .collect();
    records.push((None, vec![1u8; 20 * 1024 * 1024], vec![]));
    produce(&topic, records).await;

    let mut sink_config = KafkaSinkConfig::new(BROKERS, &dlq);
    sink_config.max_message_bytes = 25 * 1024 * 1024;
    let dead_letters = Arc::new(KafkaDeferSink::new(sink_config).unwrap());
    let mut config = RuntimeConfig::default();
    config.retry.max_retries = 2;
    config.expert.retry.base_backoff_ms = 1;
    config.expert.retry.max_backoff_ms = 5;
    let mut runtime = Runtime::builder(config)
        .dead_letter_sink(Arc::clone(&dead_letters))
        .start(|job: Job<KafkaMessage>| async move {
            // 11 fails for good after its retries; 13 (20 MB) always panics.
            match job.payload().offset {
                11 => Err(HandlerError::retryable("dependency down")),
                13 => panic!("handler bug"),
                _ => Ok(()),
            }
        })
        .unwrap();
    let mut source_config = KafkaSourceConfig::new(BROKERS, &group, [&topic]);
    source_config.commit_interval_ms = 50;
    // Agrees with the dead-letter sink's 25 MiB (checked by `republish_to`).
    source_config.max_payload_bytes = 21 * 1024 * 1024;
    let source = KafkaSource::builder(source_config)
        .republish_to(&dead_letters)
        .build()
        .unwrap();
    runtime.attach(source);

    // 11 holds the position until it is dead-lettered; 13 likewise.
    assert_eq!(committed_at_least(&group, &topic, 14).await, 14);
    let report = runtime.shutdown(Duration::from_secs(20)).await;
    assert_eq!(report.stats.ledger.total().failed, 2);
    assert_eq!(report.stats.ledger.total().completed, 12);
    assert_eq!(committed(&group, &topic), Some(14));

    let mut reader =
        triage_kafka::drain::builder(KafkaSourceConfig::new(BROKERS, rand_name("g"), [&dlq]))
            .build()
            .unwrap();
    let letters = take(&mut reader, 2).await;
    let mut origins: Vec<_> = letters
        .iter()
        .map(|e| {
            let m = &e.payload;
            let h = |n| String::from_utf8(m.header(n).unwrap().to_vec()).unwrap();
            assert!(m.header("triage-error").is_some());
            (
                h("triage-origin-offset"),
                h("triage-attempt"),
                m.payload.as_ref().unwrap().len(),
            )
        })
        .collect();
    origins.sort();
    assert_eq!(origins[0].0, "11");
    assert_eq!(origins[0].1, "2", "dead-lettered after max_retries");
    assert_eq!(origins[1].0, "13");
    assert_eq!(origins[1].2, 20 * 1024 * 1024);
    reader.shutdown().await;
}

/// Issue 10 point 1: a dead letter larger than the dead-letter sink's `max_message_bytes` ends
/// as a reference copy (key, first KiB of the payload, original headers, origin coordinates,
/// reason and error), the position moves past it, and the only worker serves the next record
/// meanwhile. On the code before the fix the sink refused reference copies, so the record was
/// held unacknowledged and the commit never passed offset 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_dead_letter_becomes_a_reference_copy() {
    use std::num::NonZeroUsize;

    let _broker = broker_shared().await;
    let (topic, dlq, group) = (rand_name("ref"), rand_name("ref-dead"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    create_topic(&dlq, 1, &[]).await;
    let trace = vec![("trace-id".to_owned(), Some(b"t-0".to_vec()))];
    produce(
        &topic,
        vec![
            (Some(b"k-0".to_vec()), vec![7u8; 200 * 1024], trace),
            (None, b"next".to_vec(), vec![]),
        ],
    )
    .await;

    let mut sink_config = KafkaSinkConfig::new(BROKERS, &dlq);
    sink_config.max_message_bytes = 64 * 1024;
    let dead_letters = Arc::new(KafkaDeferSink::new(sink_config).unwrap());
    let config = RuntimeConfig {
        workers: NonZeroUsize::MIN,
        ..RuntimeConfig::default()
    };
    let (served, mut served_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut runtime = Runtime::builder(config)
        .dead_letter_sink(dead_letters)
        .start(move |job: Job<KafkaMessage>| {
            let offset = job.payload().offset;
            let served = served.clone();
            async move {
                if offset == 0 {
                    return Err(HandlerError::permanent("bad record"));
                }
                let _ = served.send(offset);
                Ok(())
            }
        })
        .unwrap();
    let mut source_config = KafkaSourceConfig::new(BROKERS, &group, [&topic]);
    source_config.commit_interval_ms = 50;
    runtime.attach(KafkaSource::builder(source_config).build().unwrap());

    let served_next = tokio::time::timeout(HANG_GUARD, served_rx.recv()).await;
    assert_eq!(
        served_next.unwrap(),
        Some(1),
        "the worker served the next record"
    );
    assert_eq!(committed_at_least(&group, &topic, 2).await, 2);
    let report = runtime.shutdown(Duration::from_secs(20)).await;
    assert_eq!(report.stats.ledger.total().failed, 1);
    assert_eq!(report.stats.ledger.total().completed, 1);

    let mut reader =
        triage_kafka::drain::builder(KafkaSourceConfig::new(BROKERS, rand_name("g"), [&dlq]))
            .build()
            .unwrap();
    let letter = next(&mut reader).await.payload;
    let h = |n| String::from_utf8(letter.header(n).unwrap().to_vec()).unwrap();
    assert_eq!(h("triage-reason"), "dead_letter_rejected");
    assert_eq!(h("triage-origin-topic"), topic);
    assert_eq!(h("triage-origin-partition"), "0");
    assert_eq!(h("triage-origin-offset"), "0");
    assert_eq!(h("trace-id"), "t-0");
    let error = h("triage-error");
    assert!(
        error.contains("exceeds max_message_bytes 65536") && error.contains("bad record"),
        "{error}"
    );
    assert_eq!(letter.key.as_deref(), Some(&b"k-0"[..]));
    assert_eq!(
        letter.payload.as_deref(),
        Some(&[7u8; triage_kafka::REFERENCE_PAYLOAD_BYTES][..])
    );
    reader.shutdown().await;
}

/// Issue 10 point 9: a record deferred after two retries keeps its retry budget and its
/// demotion when its copy is drained. The copy is written by the defer sink exactly as the
/// runtime writes it (`triage-attempt: 2`, `triage-deferrals: 1`); drained with
/// `max_retries = 3`, the handler runs twice more (attempts 2 and 3), demoted two and three
/// levels from Critical, and the dead letter says attempt 3, deferrals 1, criticality critical.
/// On the code before the fix the handler ran four times, from attempt 0, all Sheddable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_history_survives_a_deferral() {
    use std::sync::Mutex;
    use triage::ledger::Disposition;
    use triage::runtime::Republish;
    use triage::Criticality;

    let _broker = broker_shared().await;
    let (topic, defer, dlq) = (
        rand_name("hist"),
        rand_name("hist-deferred"),
        rand_name("hist-dead"),
    );
    for t in [&topic, &defer, &dlq] {
        create_topic(t, 1, &[]).await;
    }
    produce_n(&topic, 1).await;
    let mut source =
        KafkaSource::builder(KafkaSourceConfig::new(BROKERS, rand_name("g"), [&topic]))
            .build()
            .unwrap();
    let original = next(&mut source).await;
    let defer_sink = KafkaDeferSink::new(KafkaSinkConfig::new(BROKERS, &defer)).unwrap();
    let deferred_after_two_retries = Republish {
        criticality: Criticality::Critical,
        attempt: 2,
        deferrals: 1,
        deadline: None,
        reason: "overloaded",
        error: None,
    };
    defer_sink
        .send(&original.payload, &deferred_after_two_retries)
        .await
        .unwrap();
    original.ack.resolve(Disposition::Deferred);
    source.shutdown().await;

    let dead_letters = Arc::new(KafkaDeferSink::new(KafkaSinkConfig::new(BROKERS, &dlq)).unwrap());
    let mut config = RuntimeConfig::default();
    config.retry.max_retries = 3;
    config.expert.retry.base_backoff_ms = 1;
    config.expert.retry.max_backoff_ms = 5;
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&runs);
    let mut runtime = Runtime::builder(config)
        .dead_letter_sink(dead_letters)
        .start(move |job: Job<KafkaMessage>| {
            seen.lock()
                .unwrap()
                .push((job.attempt(), job.criticality()));
            async { Err::<(), _>(HandlerError::retryable("dependency down")) }
        })
        .unwrap();
    let drain_group = rand_name("g");
    let mut drain_config = KafkaSourceConfig::new(BROKERS, &drain_group, [&defer]);
    drain_config.commit_interval_ms = 50;
    runtime.attach_drain(triage_kafka::drain::builder(drain_config).build().unwrap());
    // Settled (dead-lettered) once the drain's position passes the copy.
    assert_eq!(committed_at_least(&drain_group, &defer, 1).await, 1);
    let report = runtime.shutdown(Duration::from_secs(20)).await;
    assert_eq!(report.stats.ledger.total().failed, 1);
    assert_eq!(
        *runs.lock().unwrap(),
        [(2, Criticality::Medium), (3, Criticality::Sheddable)],
        "the budget left after two retries, and the demotion they earned"
    );

    let mut reader =
        triage_kafka::drain::builder(KafkaSourceConfig::new(BROKERS, rand_name("g"), [&dlq]))
            .build()
            .unwrap();
    let letter = next(&mut reader).await;
    let h = |n| String::from_utf8(letter.payload.header(n).unwrap().to_vec()).unwrap();
    assert_eq!(h("triage-attempt"), "3");
    assert_eq!(h("triage-deferrals"), "1");
    assert_eq!(h("triage-criticality"), "critical");
    reader.shutdown().await;
}

/// Issue 9: a drained copy keeps the tier it was deferred with. A Medium record (no label, the
/// default tier) deferred once is read back from the defer topic as Medium with one deferral,
/// and the runtime's drain serves it as Medium (it was Sheddable whatever its tier before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_copy_keeps_its_tier() {
    use std::sync::Mutex;
    use triage::ledger::Disposition;
    use triage::runtime::Republish;
    use triage::Criticality;

    let _broker = broker_shared().await;
    let (topic, defer) = (rand_name("keep"), rand_name("keep-deferred"));
    create_topic(&topic, 1, &[]).await;
    create_topic(&defer, 1, &[]).await;
    produce_n(&topic, 1).await;
    let mut source =
        KafkaSource::builder(KafkaSourceConfig::new(BROKERS, rand_name("g"), [&topic]))
            .build()
            .unwrap();
    let original = next(&mut source).await;
    assert_eq!(
        (original.criticality, original.attempt, original.deferrals),
        (Criticality::Medium, 0, 0)
    );
    // What the runtime hands its defer sink for a first deferral.
    let info = Republish {
        criticality: original.criticality,
        attempt: original.attempt,
        deferrals: original.deferrals + 1,
        deadline: None,
        reason: "overloaded",
        error: None,
    };
    let sink = KafkaDeferSink::new(KafkaSinkConfig::new(BROKERS, &defer)).unwrap();
    sink.send(&original.payload, &info).await.unwrap();
    original.ack.resolve(Disposition::Deferred);
    source.shutdown().await;

    let mut drain =
        triage_kafka::drain::builder(KafkaSourceConfig::new(BROKERS, rand_name("g"), [&defer]))
            .build()
            .unwrap();
    let copy = next(&mut drain).await;
    assert_eq!(
        (copy.criticality, copy.attempt, copy.deferrals),
        (Criticality::Medium, 0, 1)
    );
    assert_eq!(copy.payload.payload.as_deref(), Some(&b"m0"[..]));
    drop(copy); // released, never settled: this reader's group commits nothing
    drain.shutdown().await;

    let served = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&served);
    let mut runtime = Runtime::builder(RuntimeConfig::default())
        .start(move |job: Job<KafkaMessage>| {
            seen.lock().unwrap().push(job.criticality());
            async { Ok::<(), HandlerError>(()) }
        })
        .unwrap();
    let drain_group = rand_name("g");
    let mut drain_config = KafkaSourceConfig::new(BROKERS, &drain_group, [&defer]);
    drain_config.commit_interval_ms = 50;
    runtime.attach_drain(triage_kafka::drain::builder(drain_config).build().unwrap());
    assert_eq!(committed_at_least(&drain_group, &defer, 1).await, 1);
    let report = runtime.shutdown(Duration::from_secs(20)).await;
    assert_eq!(report.stats.ledger.total().completed, 1);
    assert_eq!(*served.lock().unwrap(), [Criticality::Medium]);
}

/// Issue 9, "Backlog": 20,000 Medium records already in the topic, no new arrivals, deadlines
/// far away (Medium's window is 15 minutes), a runtime with a defer sink. A backlog is not an
/// overload: every record is completed, none deferred, none expired, and nothing is written to
/// the defer topic. (Before pull-based admission, queue-age admission deferred most of such a
/// backlog: 24,533 of 30,000 in issue 9's run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_served_in_order_not_deferred() {
    use rdkafka::producer::FutureRecord;

    const BACKLOG: usize = 20_000;
    let _broker = broker_shared().await;
    let (topic, defer, group) = (
        rand_name("backlog"),
        rand_name("backlog-deferred"),
        rand_name("g"),
    );
    create_topic(&topic, 1, &[]).await;
    create_topic(&defer, 1, &[]).await;
    // Enqueued all at once, then confirmed: seconds rather than 20,000 round trips.
    let producer = producer(1_000_000);
    let deliveries: Vec<_> = (0..BACKLOG)
        .map(|i| {
            let payload = format!("m{i}");
            producer
                .send_result(FutureRecord::<(), _>::to(&topic).payload(&payload))
                .map_err(|(e, _)| e)
                .expect("enqueue")
        })
        .collect();
    for d in deliveries {
        d.await
            .expect("delivery")
            .map_err(|(e, _)| e)
            .expect("produced");
    }

    let defer_sink = Arc::new(KafkaDeferSink::new(KafkaSinkConfig::new(BROKERS, &defer)).unwrap());
    let mut runtime = Runtime::builder(RuntimeConfig::default())
        .defer_sink(Arc::clone(&defer_sink))
        .start(|job: Job<KafkaMessage>| async move {
            // A short service time: the backlog takes a few seconds of handler time.
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _ = job.payload();
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let mut source_config = KafkaSourceConfig::new(BROKERS, &group, [&topic]);
    source_config.commit_interval_ms = 100;
    runtime.attach(
        KafkaSource::builder(source_config)
            .republish_to(&defer_sink)
            .build()
            .unwrap(),
    );
    // Every record settled (completed, or deferred, or expired) moves the position.
    assert_eq!(
        committed_at_least(&group, &topic, BACKLOG as i64).await,
        BACKLOG as i64
    );
    let report = runtime.shutdown(Duration::from_secs(20)).await;
    let total = report.stats.ledger.total();
    assert_eq!(
        (total.completed, total.deferred, total.expired),
        (BACKLOG as u64, 0, 0),
        "{report}"
    );
    // Nothing was written to the defer topic (its high watermark, as GetOffsetShell shows it).
    let reader: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", BROKERS)
        .create()
        .unwrap();
    let (_, high) =
        rdkafka::consumer::Consumer::fetch_watermarks(&reader, &defer, 0, Duration::from_secs(30))
            .unwrap();
    assert_eq!(high, 0);
}
