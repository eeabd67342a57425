//! Propagation to the next hop on the real broker: stage one consumes, stamps its follow-up
//! records with the job's criticality and deadline (`triage_kafka::stamp`) and produces them
//! to a second topic; stage two, trusting that topic, classifies by the stamped criticality
//! and expires, without calling its handler, what arrives past the stamped deadline.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use parking_lot::Mutex;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::FutureRecord;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
use triage::{wire, Criticality};
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

const N: u32 = 40;

fn id_of(msg: &KafkaMessage) -> u32 {
    std::str::from_utf8(msg.payload.as_deref().unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u32::MAX)
}

/// The tier record `id` enters stage one with.
fn tier_in(id: u32) -> Criticality {
    Criticality::ALL[(id % 4) as usize]
}

/// What stage one stamps: ids divisible by 3 lowered to Sheddable, the rest inherited.
fn tier_out(id: u32) -> Criticality {
    if id % 3 == 0 {
        Criticality::Sheddable
    } else {
        tier_in(id)
    }
}

/// Ids whose follow-up stage one gives only 100 ms (`Propagation::within`): stage two, started
/// later, receives them past their stamped deadline.
fn short(id: u32) -> bool {
    id % 5 == 0
}

fn source(group: &str, topic: &str) -> KafkaSource {
    let mut config = KafkaSourceConfig::new(BROKERS, group, [topic]);
    config.criticality.trusted_topics = vec![topic.to_owned()];
    config.commit_interval_ms = 50;
    KafkaSource::builder(config).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stamped_criticality_and_deadline_are_honoured_by_the_next_stage() {
    let _broker = broker_shared().await;
    let (input, output) = (rand_name("prop-in"), rand_name("prop-out"));
    create_topic(&input, 1, &[]).await;
    create_topic(&output, 1, &[]).await;
    let deadline_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 120_000;
    let records: Vec<Rec> = (0..N)
        .map(|id| {
            let headers = vec![
                (
                    wire::CRITICALITY.to_owned(),
                    Some(tier_in(id).as_str().as_bytes().to_vec()),
                ),
                (
                    wire::DEADLINE_MS.to_owned(),
                    Some(deadline_ms.to_string().into_bytes()),
                ),
            ];
            (None, id.to_string().into_bytes(), headers)
        })
        .collect();
    produce(&input, records).await;

    // Stage one: consume, transform, stamp and produce (the two lines are `stamp` and `send`).
    let producer = Arc::new(producer(1_000_000));
    let out = output.clone();
    let raised = Arc::new(Mutex::new(0u32));
    let raised_seen = Arc::clone(&raised);
    let mut stage_one = Runtime::builder(RuntimeConfig::default())
        .start(move |job: Job<KafkaMessage>| {
            let (producer, out, raised) = (Arc::clone(&producer), out.clone(), Arc::clone(&raised));
            async move {
                let id = id_of(job.payload());
                let mut next = job.propagation();
                if next.lower_to(Criticality::Critical).is_err() {
                    *raised.lock() += 1;
                }
                if id % 3 == 0 {
                    next = next
                        .lower_to(Criticality::Sheddable)
                        .map_err(HandlerError::permanent)?;
                }
                if short(id) {
                    next = next.within(Duration::from_millis(100));
                }
                let body = id.to_string();
                let headers = triage_kafka::stamp(OwnedHeaders::new(), &next);
                producer
                    .send(
                        FutureRecord::<(), _>::to(&out)
                            .payload(&body)
                            .headers(headers),
                        Duration::from_secs(30),
                    )
                    .await
                    .map(drop)
                    .map_err(|(e, _)| HandlerError::downstream("kafka", e))
            }
        })
        .unwrap();
    stage_one.attach(source(&rand_name("g1"), &input));
    wait_until("stage one completes every record", || {
        let done = stage_one.stats().ledger.total().completed == u64::from(N);
        async move { done }
    })
    .await;
    let one = stage_one.shutdown(Duration::from_secs(10)).await.stats;
    assert!(one.balances(), "{one:?}");
    // Every job below Critical was refused a raise to Critical.
    let below_critical = (0..N)
        .filter(|&id| tier_in(id) != Criticality::Critical)
        .count();
    assert_eq!(*raised_seen.lock() as usize, below_critical);
    // The short ones' 100 ms are over before stage two reads them.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Stage two: trusts the output topic; records its handler calls.
    type Calls = BTreeMap<u32, (Criticality, Option<Vec<u8>>)>;
    let calls: Arc<Mutex<Calls>> = Arc::default();
    let seen = Arc::clone(&calls);
    let mut stage_two = Runtime::builder(RuntimeConfig::default())
        .start(move |job: Job<KafkaMessage>| {
            let seen = Arc::clone(&seen);
            async move {
                let id = id_of(job.payload());
                let deadline = job.payload().header(wire::DEADLINE_MS).map(<[u8]>::to_vec);
                seen.lock().insert(id, (job.criticality(), deadline));
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    stage_two.attach(source(&rand_name("g2"), &output));
    wait_until("stage two settles every record", || {
        let s = stage_two.stats();
        let done = s.ledger.total().settled() == u64::from(N);
        async move { done }
    })
    .await;
    let two = stage_two.shutdown(Duration::from_secs(10)).await.stats;
    assert!(two.balances(), "{two:?}");

    let expected_short = (0..N).filter(|&id| short(id)).count() as u64;
    assert_eq!(two.ledger.total().expired, expected_short);
    assert_eq!(two.ledger.total().completed, u64::from(N) - expected_short);
    let calls = calls.lock();
    for id in 0..N {
        match calls.get(&id) {
            None => assert!(short(id), "record {id} was not handled"),
            Some((tier, deadline)) => {
                assert!(
                    !short(id),
                    "record {id} arrived past its deadline and was handled"
                );
                assert_eq!(*tier, tier_out(id), "record {id}");
                // The original absolute deadline, passed down (to the millisecond, give or
                // take the monotonic-to-wall conversion).
                let stamped: u64 = std::str::from_utf8(deadline.as_deref().unwrap())
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(
                    stamped.abs_diff(deadline_ms) <= 5,
                    "{stamped} vs {deadline_ms}"
                );
            }
        }
    }
    // Stage two classified by the stamped tier: per tier, as many consumed as stamped.
    for tier in Criticality::ALL {
        let stamped = (0..N).filter(|&id| tier_out(id) == tier).count() as u64;
        assert_eq!(two.ledger.tier(tier).consumed, stamped, "{tier}");
    }
}
