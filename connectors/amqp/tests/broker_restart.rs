//! Broker restart: the source reconnects with backoff, unacked deliveries come back and are
//! processed, none is lost; the sink fails while the broker is down and recovers after.
//!
//! Its own test binary with one test, so nothing else runs while the broker is down; cargo
//! runs test binaries one after another. A guard starts the broker again even if the test
//! fails.

mod common;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::Duration;

use common::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use triage::ledger::Disposition;
use triage::runtime::{DeferSink, Republish, Source};
use triage::Criticality;
use triage_amqp::{AmqpDeferSink, AmqpMessage, AmqpSinkConfig, AmqpSource, AmqpSourceConfig};

/// Starts the broker on drop, so a failing test never leaves it down for the next one.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        broker("start");
    }
}

const N: usize = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_loses_nothing() {
    let (conn, ch) = admin().await;
    let q = rand_queue("restart");
    let dq = rand_queue("restart-defer");
    declare(&ch, &q, FieldTable::default()).await;
    // Persistent on a durable queue, confirmed: on disk before the broker stops.
    publish_n(&ch, &q, N, b"x", |_| {
        BasicProperties::default().with_delivery_mode(2)
    })
    .await;
    let _ = conn.close(200, "done").await;

    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.prefetch = 50;
    cfg.reconnect.initial_backoff_ms = 100;
    cfg.reconnect.max_backoff_ms = 2_000;
    let mut source = AmqpSource::connect(cfg, NonZeroUsize::new(50).unwrap())
        .await
        .unwrap();
    let mut sink_cfg = AmqpSinkConfig::new(uri(), &dq);
    sink_cfg.reconnect.initial_backoff_ms = 100;
    sink_cfg.reconnect.max_backoff_ms = 1_000;
    let sink = AmqpDeferSink::connect(sink_cfg).await.unwrap();
    let info = Republish {
        criticality: Criticality::Medium,
        attempt: 0,
        deferrals: 0,
        deadline: None,
        reason: "overloaded",
        error: None,
    };
    let probe = AmqpMessage::new(b"probe".to_vec());

    // Complete 100, hold 30 unresolved.
    let mut completed: HashMap<String, u32> = HashMap::new();
    for _ in 0..100 {
        let env = source.next().await.unwrap();
        *completed
            .entry(env.payload.message_id().unwrap().to_owned())
            .or_default() += 1;
        env.ack.resolve(Disposition::Completed);
    }
    let mut held = Vec::new();
    for _ in 0..30 {
        held.push(source.next().await.unwrap());
    }
    DeferSink::publish(&sink, &probe, &info).await.unwrap();

    let guard = RestartOnDrop;
    broker("stop");
    // Pulling while the broker is down: the source notices the loss and retries with
    // backoff; nothing is delivered. Dropping the call mid-retry must be harmless.
    let down = tokio::time::timeout(Duration::from_secs(3), source.next()).await;
    assert!(
        down.is_err(),
        "nothing can be delivered while the broker is down"
    );
    assert!(source.stats().connect_failures >= 1);
    assert_eq!(source.epoch(), 0);
    // Settling the old channel's deliveries now must ack nothing, here or on the next one.
    for env in held {
        env.ack.resolve(Disposition::Completed);
    }
    assert_eq!(source.stats().stale_settles, 30);
    let sink_down = DeferSink::publish(&sink, &probe, &info).await;
    assert!(sink_down.is_err());
    broker("start");
    drop(guard);

    // Everything not acked before the stop comes back; process until all N are done.
    let mut redelivered_seen = 0;
    while completed.len() < N {
        let env = tokio::time::timeout(Duration::from_secs(120), source.next())
            .await
            .expect("a delivery after the restart")
            .unwrap();
        if env.payload.redelivered() {
            redelivered_seen += 1;
        }
        *completed
            .entry(env.payload.message_id().unwrap().to_owned())
            .or_default() += 1;
        env.ack.resolve(Disposition::Completed);
    }
    source.shutdown().await;
    let stats = source.stats();
    let duplicates: u32 = completed.values().map(|c| c - 1).sum();
    eprintln!(
        "restart: reconnects {} connect_failures {} redelivered {} duplicates {} stale {} settle_errors {}",
        stats.reconnects,
        stats.connect_failures,
        stats.redelivered,
        duplicates,
        stats.stale_settles,
        stats.settle_errors
    );
    assert_eq!(completed.len(), N, "every message processed");
    assert!(stats.reconnects >= 1);
    // The 30 held ones were never acked: they come back flagged.
    assert!(redelivered_seen >= 30);
    assert_eq!(stats.redelivered, redelivered_seen);
    // Settles of the dead channel were dropped (stale) or failed to send, never sent on the
    // new channel: had one been, it would have acked a different, unprocessed message, and
    // the loop above would never have seen all N.
    assert!(stats.stale_settles + stats.settle_errors >= 30);

    // The sink reconnects after the restart (its backoff allows a retry within seconds).
    let mut sink_ok = false;
    for _ in 0..100 {
        if DeferSink::publish(&sink, &probe, &info).await.is_ok() {
            sink_ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(sink_ok, "sink publishes again after the restart");

    let (_conn, ch) = admin().await;
    assert_eq!(ready(&ch, &q).await, 0);
    assert_eq!(drain(&ch, &dq).await.len(), 2);
    delete(&ch, &q).await;
    delete(&ch, &dq).await;
}
