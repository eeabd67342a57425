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
    config.retry.base_backoff_ms = 1;
    config.retry.max_backoff_ms = 5;
    let mut runtime = Runtime::builder(config)
        .dead_letter_sink(dead_letters)
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
    runtime.attach(KafkaSource::builder(source_config).build().unwrap());

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
