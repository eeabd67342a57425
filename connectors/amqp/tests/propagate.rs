//! Propagation to the next hop on the real broker: stage one consumes, stamps its follow-up
//! messages with the job's criticality and deadline (`triage_amqp::stamped`) and publishes
//! them to a second queue; stage two, trusting that queue, classifies by the stamped
//! criticality and expires, without calling its handler, what arrives past the stamped
//! deadline.

mod common;

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
use triage::{wire, Criticality};
use triage_amqp::{AmqpMessage, AmqpSource, AmqpSourceConfig};

const N: u32 = 40;

fn id_of(msg: &AmqpMessage) -> u32 {
    std::str::from_utf8(msg.body())
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u32::MAX)
}

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

/// Ids whose follow-up stage one gives only 100 ms: stage two, started later, receives them
/// past their stamped deadline.
fn short(id: u32) -> bool {
    id % 5 == 0
}

async fn source(queue: &str) -> AmqpSource {
    let mut config = AmqpSourceConfig::new(uri(), queue);
    config.classify.trusted_queues = vec![queue.to_owned()];
    AmqpSource::connect(config, NonZeroUsize::new(1_024).unwrap())
        .await
        .unwrap()
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1_200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("hang guard: gave up waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stamped_criticality_and_deadline_are_honoured_by_the_next_stage() {
    let (_conn, ch) = admin().await;
    let (input, output) = (rand_queue("prop-in"), rand_queue("prop-out"));
    declare(&ch, &input, FieldTable::default()).await;
    declare(&ch, &output, FieldTable::default()).await;
    let deadline_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 120_000;
    for id in 0..N {
        let mut headers = FieldTable::default();
        headers.insert(
            wire::CRITICALITY.into(),
            AMQPValue::LongString(LongString::from(tier_in(id).as_str())),
        );
        headers.insert(
            wire::DEADLINE_MS.into(),
            AMQPValue::LongString(LongString::from(deadline_ms.to_string())),
        );
        let props = BasicProperties::default().with_headers(headers);
        ch.basic_publish(
            "",
            &input,
            BasicPublishOptions::default(),
            id.to_string().as_bytes(),
            props,
        )
        .await
        .expect("publish");
    }
    assert!(ch.wait_for_confirms().await.expect("confirms").is_empty());

    // Stage one: consume, transform, stamp and publish (the two lines are `stamped` and
    // `basic_publish`).
    let (_out_conn, out_ch) = admin().await;
    let out_ch = Arc::new(out_ch);
    let out = output.clone();
    let raised = Arc::new(Mutex::new(0u32));
    let raised_seen = Arc::clone(&raised);
    let mut stage_one = Runtime::builder(RuntimeConfig::default())
        .start(move |job: Job<AmqpMessage>| {
            let (ch, out, raised) = (Arc::clone(&out_ch), out.clone(), Arc::clone(&raised));
            async move {
                let id = id_of(job.payload());
                let mut next = job.propagation();
                if next.lower_to(Criticality::Critical).is_err() {
                    *raised.lock().unwrap() += 1;
                }
                if id % 3 == 0 {
                    next = next
                        .lower_to(Criticality::Sheddable)
                        .map_err(HandlerError::permanent)?;
                }
                if short(id) {
                    next = next.within(Duration::from_millis(100));
                }
                let props = triage_amqp::stamped(BasicProperties::default(), &next);
                ch.basic_publish(
                    "",
                    &out,
                    BasicPublishOptions::default(),
                    job.payload().body(),
                    props,
                )
                .await
                .map_err(|e| HandlerError::downstream("rabbitmq", e))?
                .await
                .map(drop)
                .map_err(|e| HandlerError::downstream("rabbitmq", e))
            }
        })
        .unwrap();
    stage_one.attach(source(&input).await);
    wait_for("stage one completes every message", || {
        stage_one.stats().ledger.total().completed == u64::from(N)
    })
    .await;
    let one = stage_one.shutdown(Duration::from_secs(10)).await.stats;
    assert!(one.balances(), "{one:?}");
    let below_critical = (0..N)
        .filter(|&id| tier_in(id) != Criticality::Critical)
        .count();
    assert_eq!(*raised_seen.lock().unwrap() as usize, below_critical);
    // The short ones' 100 ms are over before stage two reads them.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Stage two: trusts the output queue; records its handler calls.
    type Calls = BTreeMap<u32, (Criticality, Option<String>)>;
    let calls: Arc<Mutex<Calls>> = Arc::default();
    let seen = Arc::clone(&calls);
    let mut stage_two = Runtime::builder(RuntimeConfig::default())
        .start(move |job: Job<AmqpMessage>| {
            let seen = Arc::clone(&seen);
            async move {
                let id = id_of(job.payload());
                let deadline = job
                    .payload()
                    .header_str(wire::DEADLINE_MS)
                    .map(str::to_owned);
                seen.lock()
                    .unwrap()
                    .insert(id, (job.criticality(), deadline));
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    stage_two.attach(source(&output).await);
    wait_for("stage two settles every message", || {
        stage_two.stats().ledger.total().settled() == u64::from(N)
    })
    .await;
    let two = stage_two.shutdown(Duration::from_secs(10)).await.stats;
    assert!(two.balances(), "{two:?}");

    let expected_short = (0..N).filter(|&id| short(id)).count() as u64;
    assert_eq!(two.ledger.total().expired, expected_short);
    assert_eq!(two.ledger.total().completed, u64::from(N) - expected_short);
    let calls = calls.lock().unwrap().clone();
    for id in 0..N {
        match calls.get(&id) {
            None => assert!(short(id), "message {id} was not handled"),
            Some((tier, deadline)) => {
                assert!(
                    !short(id),
                    "message {id} arrived past its deadline and was handled"
                );
                assert_eq!(*tier, tier_out(id), "message {id}");
                let stamped: u64 = deadline.as_deref().unwrap().parse().unwrap();
                assert!(
                    stamped.abs_diff(deadline_ms) <= 5,
                    "{stamped} vs {deadline_ms}"
                );
            }
        }
    }
    for tier in Criticality::ALL {
        let stamped = (0..N).filter(|&id| tier_out(id) == tier).count() as u64;
        assert_eq!(two.ledger.tier(tier).consumed, stamped, "{tier}");
    }
    delete(&ch, &input).await;
    delete(&ch, &output).await;
}
