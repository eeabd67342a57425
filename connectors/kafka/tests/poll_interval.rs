//! Kafka's counterpart of RabbitMQ's consumer timeout (issue 34): `max.poll.interval.ms` bounds
//! the time between two polls, not the time a record waits. A runtime that holds records (and
//! pauses the source) for longer than that must still poll: the source's poll thread polls all
//! the time, paused or not, so the consumer never leaves its group for a long hold.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use triage::runtime::{HandlerError, Job, RefusalPolicy, Runtime, RuntimeConfig};
use triage::PerTier;
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

/// The consumer's `max.poll.interval.ms` (and `session.timeout.ms`: librdkafka wants the poll
/// interval at least the session timeout, and the broker's `group.min.session.timeout.ms` is
/// 6 s by default).
const POLL_INTERVAL_MS: u64 = 6_000;

/// Every record refused by the operator's forced shed level and held under Backpressure, the
/// held buffer full at one record so the source is paused, for 2.5 times the poll interval;
/// then the level is lifted. Had the poll loop stopped, the consumer would have left its group
/// and come back: its records delivered again (consumed twice) and the held one handled twice.
/// Every record is consumed once, handled once and committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_longer_than_max_poll_interval_keeps_the_consumer_in_its_group() {
    const RECORDS: usize = 5;
    let _broker = broker_shared().await;
    let (topic, group) = (rand_name("hold"), rand_name("g"));
    create_topic(&topic, 1, &[]).await;
    produce_n(&topic, RECORDS).await;

    let calls: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let c = Arc::clone(&calls);
    let mut config = RuntimeConfig {
        workers: 1.try_into().unwrap(),
        policy: PerTier::splat(RefusalPolicy::Backpressure),
        forced_shed_level: 3,
        expert: triage::runtime::ExpertConfig {
            max_held: 1.try_into().unwrap(),
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    let mut runtime = Runtime::builder(config.clone())
        .start(move |job: Job<KafkaMessage>| {
            *c.lock().unwrap().entry(job.payload().offset).or_default() += 1;
            async { Ok::<(), HandlerError>(()) }
        })
        .unwrap();
    let mut source_config = KafkaSourceConfig::new(BROKERS, &group, [&topic]);
    source_config.commit_interval_ms = 100;
    for key in ["max.poll.interval.ms", "session.timeout.ms"] {
        source_config
            .properties
            .insert(key.into(), POLL_INTERVAL_MS.to_string());
    }
    runtime.attach(KafkaSource::builder(source_config).build().unwrap());
    wait_until("a record held", || {
        let held = runtime.stats().held;
        async move { held == 1 }
    })
    .await;
    // Held, the source paused, for 2.5 poll intervals: the broker's limit, in real time.
    tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS * 5 / 2)).await;
    assert_eq!(runtime.stats().held, 1);
    assert!(calls.lock().unwrap().is_empty());
    config.forced_shed_level = 0;
    runtime.reconfigure(config).unwrap();
    assert_eq!(
        committed_at_least(&group, &topic, RECORDS as i64).await,
        RECORDS as i64
    );
    let report = runtime.shutdown(Duration::from_secs(20)).await;

    let total = report.stats.ledger.total();
    assert_eq!(
        (total.consumed, total.completed, total.released),
        (RECORDS as u64, RECORDS as u64, 0),
        "a record consumed twice: the consumer left its group\n{report}"
    );
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), RECORDS);
    assert!(calls.values().all(|&n| n == 1), "{calls:?}");
}
