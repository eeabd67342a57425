//! Ordered processing on the real broker (issue 14): 100 keys × 200 records over 4
//! partitions, a handler with random service times and some retries. In `key` mode every
//! key's completions are in offset order and the committed positions reach the end; the same
//! run `unordered` completes some keys out of order, so the check can tell.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::ordering::OrderingMode;
use triage::runtime::{
    BackoffConfig, ExpertConfig, HandlerError, Job, RetryConfig, Runtime, RuntimeConfig,
};
use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};

use common::{
    broker_shared, create_topic, positions, produce_keyed, rand_name, BROKERS, HANG_GUARD,
};

const KEYS: u32 = 100;
const PER_KEY: u32 = 200;
const PARTITIONS: i32 = 4;
const TOTAL: usize = (KEYS * PER_KEY) as usize;

/// Per key, (seq, offset) in completion order.
type Completions = BTreeMap<u32, Vec<(u32, i64)>>;

struct Outcome {
    completions: Completions,
    /// Keys with a record started while another of the key was in the handler.
    overlapped: HashSet<u32>,
}

async fn consume(topic: &str, mode: OrderingMode) -> Outcome {
    let group = rand_name("g-order");
    let completions: Arc<Mutex<Completions>> = Arc::default();
    let running: Arc<Mutex<HashSet<u32>>> = Arc::default();
    let overlapped: Arc<Mutex<HashSet<u32>>> = Arc::default();
    let config = RuntimeConfig {
        workers: 16.try_into().unwrap(),
        retry: RetryConfig { max_retries: 5 },
        expert: ExpertConfig {
            retry: BackoffConfig {
                base_backoff_ms: 1,
                max_backoff_ms: 5,
            },
            poll_interval_ms: 1,
            ..ExpertConfig::default()
        },
        // The default refusal policies: a keyed backlog is not an overload, so nothing is
        // shed (before the intake bounded its look-ahead past parked messages, pull-based
        // admission read the key-mode run's pull bursts as arrival and shed Medium records).
        ..RuntimeConfig::default()
    };
    let (done, busy, over) = (
        Arc::clone(&completions),
        Arc::clone(&running),
        Arc::clone(&overlapped),
    );
    let mut runtime = Runtime::builder(config)
        .start(move |job: Job<KafkaMessage>| {
            let (done, busy, over) = (Arc::clone(&done), Arc::clone(&busy), Arc::clone(&over));
            async move {
                let text =
                    std::str::from_utf8(job.payload().payload.as_deref().unwrap_or_default())
                        .unwrap()
                        .to_owned();
                let (key, seq) = text.split_once(':').unwrap();
                let (key, seq): (u32, u32) = (key.parse().unwrap(), seq.parse().unwrap());
                if !busy.lock().insert(key) {
                    over.lock().insert(key);
                }
                // Random service time, 0 to 1 ms; about one first attempt in 20 fails.
                tokio::time::sleep(Duration::from_micros(fastrand::u64(0..1_000))).await;
                let fail = job.attempt() == 0 && fastrand::u8(0..20) == 0;
                busy.lock().remove(&key);
                if fail {
                    return Err(HandlerError::retryable("flaky"));
                }
                done.lock()
                    .entry(key)
                    .or_default()
                    .push((seq, job.payload().offset));
                Ok(())
            }
        })
        .unwrap();
    let mut source_config = KafkaSourceConfig::new(BROKERS, &group, [topic]);
    source_config.commit_interval_ms = 100;
    runtime.attach(
        KafkaSource::builder(source_config)
            .ordering(mode)
            .build()
            .unwrap(),
    );
    let waited = tokio::time::timeout(HANG_GUARD, async {
        loop {
            let n: usize = completions.lock().values().map(Vec::len).sum();
            if n >= TOTAL {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "hang guard: not every record completed ({mode}): {}",
        runtime.stats()
    );
    // The committed positions reach the end of every partition.
    let (g, t) = (group.clone(), topic.to_owned());
    let reached = tokio::time::timeout(HANG_GUARD, async {
        loop {
            let (g, t) = (g.clone(), t.clone());
            let at = tokio::task::spawn_blocking(move || positions(&g, &t, PARTITIONS))
                .await
                .unwrap();
            if at.iter().all(|(c, h)| c == h) {
                return at;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("hang guard: the committed positions did not reach the end");
    assert_eq!(
        reached.iter().map(|(_, h)| *h).sum::<i64>(),
        TOTAL as i64,
        "{reached:?}"
    );
    let report = runtime.shutdown(Duration::from_secs(20)).await;
    assert!(report.stats.balances(), "{report}");
    let total = report.stats.ledger.total();
    // Nothing unaccounted: every record consumed once, completed once, nothing else.
    assert_eq!(
        (
            total.consumed,
            total.completed,
            total.released,
            report.stats.alive
        ),
        (TOTAL as u64, TOTAL as u64, 0, 0),
        "{report}"
    );
    let completions = std::mem::take(&mut *completions.lock());
    let mut seen: Vec<(u32, u32)> = completions
        .iter()
        .flat_map(|(k, v)| v.iter().map(move |(s, _)| (*k, *s)))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), TOTAL, "each record completed exactly once");
    let overlapped = std::mem::take(&mut *overlapped.lock());
    Outcome {
        completions,
        overlapped,
    }
}

/// Keys whose completions are not in offset order.
fn out_of_order(outcome: &Outcome) -> Vec<u32> {
    outcome
        .completions
        .iter()
        .filter(|(_, v)| !v.windows(2).all(|w| w[0].1 < w[1].1 && w[0].0 < w[1].0))
        .map(|(k, _)| *k)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_mode_completes_every_key_in_offset_order_and_unordered_does_not() {
    let _broker = broker_shared().await;
    let topic = rand_name("ordering");
    create_topic(&topic, PARTITIONS, &[]).await;
    produce_keyed(&topic, KEYS, PER_KEY).await;

    let keyed = consume(&topic, OrderingMode::Key).await;
    assert_eq!(out_of_order(&keyed), Vec::<u32>::new());
    assert!(keyed.overlapped.is_empty(), "{:?}", keyed.overlapped);
    assert!(keyed
        .completions
        .values()
        .all(|v| v.iter().map(|(s, _)| *s).eq(0..PER_KEY)));

    // The same topic read again by a fresh group, unordered: some keys complete out of order.
    let unordered = consume(&topic, OrderingMode::Unordered).await;
    assert!(!out_of_order(&unordered).is_empty());
}
