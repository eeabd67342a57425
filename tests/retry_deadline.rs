//! A retry's backoff never outlasts its message's deadline: on tokio's paused clock with the
//! runtime's clock following it, so the counts do not depend on the machine's load.

mod common;

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::ledger::Disposition;
use triage::runtime::{HandlerError, Job, MemoryBroker, RetryConfig, Runtime, RuntimeConfig};
use triage::Criticality;

/// 200 High messages due 150 ms after publishing, each failing its first call (a 1 ms handler);
/// the default retry settings (backoff before the first retry drawn in 0..200 ms). Returns how
/// many completed and how many expired.
async fn run() -> (u64, u64, Vec<Duration>) {
    fastrand::seed(7);
    let clock = common::following_tokio();
    let config = RuntimeConfig {
        workers: 4.try_into().unwrap(),
        retry: RetryConfig::default(),
        expert: triage::runtime::ExpertConfig {
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    let failed_once: Arc<Mutex<HashMap<u32, Duration>>> = Arc::default();
    let seen = Arc::clone(&failed_once);
    let retried_at: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let retries = Arc::clone(&retried_at);
    let origin = clock.now();
    let retry_clock = clock.clone();
    let mut rt = Runtime::builder(config)
        .clock(clock.clone())
        .start(move |job: Job<u32>| {
            let now = retry_clock.now().saturating_duration_since(origin);
            let first = match seen.lock().entry(*job.payload()) {
                Entry::Vacant(v) => {
                    v.insert(now);
                    true
                }
                Entry::Occupied(o) => {
                    // The wait between the failed call and its retry.
                    retries.lock().push(now.saturating_sub(*o.get()));
                    false
                }
            };
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                if first {
                    Err(HandlerError::retryable("downstream hiccup"))
                } else {
                    Ok(())
                }
            }
        })
        .unwrap();
    let broker = MemoryBroker::new();
    rt.attach(broker.source());
    for id in 0..200u32 {
        broker.publish(
            id,
            Criticality::High,
            Some(clock.now() + Duration::from_millis(150)),
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    broker.close();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    let total = report.stats.ledger.total();
    assert_eq!(total.consumed, 200, "{report}");
    assert_eq!(total.consumed, total.settled(), "{report}");
    let count = |d: Disposition| {
        (0..200)
            .filter(|&s| broker.disposition(s) == Some(d))
            .count()
    };
    let retried_at = retried_at.lock().clone();
    (
        count(Disposition::Completed) as u64,
        count(Disposition::Expired) as u64,
        retried_at,
    )
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retry_waits_no_longer_than_its_deadline_allows() {
    let (completed, expired, retried_at) = run().await;
    println!("completed {completed}, expired {expired}");
    // Each message has 150 ms; its retry waits at most half of what is left after a handler
    // run, so every retry is served in time.
    assert_eq!((completed, expired), (200, 0));
    // And the jitter is drawn below that cap, not clamped to it: the waits of messages that
    // failed alike stay spread: about 14 per 5 ms bucket over the 72 ms cap (a clamp put 117
    // of 200 in one bucket, at the cap).
    let mut buckets = HashMap::<u128, u32>::new();
    for at in &retried_at {
        *buckets.entry(at.as_millis() / 5).or_default() += 1;
    }
    let fullest = buckets.values().copied().max().unwrap_or(0);
    assert!(fullest <= 30, "{fullest} retries in one 5 ms bucket");
}
