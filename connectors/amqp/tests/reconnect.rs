//! Reconnecting under the runtime, on the real broker: a connection closed by the broker while
//! the runtime holds messages under backpressure (and so calls `next()` under a short timeout)
//! is reopened once, with backoff, and the consumer comes back; every attempt is counted. A
//! paused source notices a closed channel too, counts the settles of its deliveries as stale
//! and reconnects while paused.
//!
//! Closes only its own, uniquely named connections: safe under the shared broker lock.

mod common;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use tokio::sync::Semaphore;
use triage::admission::QueueAgeConfig;
use triage::ledger::Disposition;
use triage::queue::WfqConfig;
use triage::runtime::{HandlerError, Job, RefusalPolicy, Runtime, RuntimeConfig, Source};
use triage::PerTier;
use triage_amqp::{AmqpMessage, AmqpSource, AmqpSourceConfig};

/// One worker, a queue of one, backpressure for every tier: the third message is held.
fn holding_runtime() -> RuntimeConfig {
    let mut queue = WfqConfig {
        capacity: 1.try_into().unwrap(),
        ..WfqConfig::default()
    };
    queue.admission = QueueAgeConfig::disabled();
    RuntimeConfig {
        workers: NonZeroUsize::new(1).unwrap(),
        policy: PerTier::splat(RefusalPolicy::Backpressure),
        expert: triage::runtime::ExpertConfig {
            queue,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    }
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    assert!(eventually(&mut f).await, "never: {what}");
}

const N: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_while_holding_opens_one_connection_at_a_time() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("storm");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, N, b"x", |_| BasicProperties::default()).await;

    let name = format!("storm-test/{q}");
    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.prefetch = 3;
    cfg.connection_name = Some(name.clone());
    cfg.reconnect.initial_backoff_ms = 200;
    cfg.reconnect.max_backoff_ms = 2_000;
    let source = AmqpSource::connect(cfg, NonZeroUsize::new(3).unwrap())
        .await
        .unwrap();
    let stats = source.stats_handle();

    let gate = Arc::new(Semaphore::new(0));
    let g = Arc::clone(&gate);
    let mut rt = Runtime::builder(holding_runtime())
        .start(move |_job: Job<AmqpMessage>| {
            let g = Arc::clone(&g);
            async move {
                let _ = g.acquire().await.map(|p| p.forget());
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    rt.attach(source);
    // One running, one queued, one held: the intake now pulls under a short timeout.
    wait_for("a held message", || rt.stats().held >= 1).await;
    assert_eq!(ctl_counts(&q), (N as u64 - 3, 3));

    assert_eq!(close_connections_named(&name), 1);
    let mut seen = ConnectionSamples::default();
    // Sample until the consumer is back, then a few more times: every connection the source
    // opens lives at least until the next sample (a storm leaves dozens half-open).
    let mut back = false;
    for _ in 0..15 {
        seen.sample(&name);
        if consumers(&q) == 1 {
            back = true;
            break;
        }
    }
    for _ in 0..3 {
        seen.sample(&name);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "storm: {} distinct connections over {} samples, at most {} at once, consumer back: {back}",
        seen.distinct.len(),
        seen.samples,
        seen.max_at_once
    );
    let counted = stats.stats();
    eprintln!(
        "storm: attempts {} reconnects {} connect_failures {}",
        counted.connect_attempts, counted.reconnects, counted.connect_failures
    );
    assert!(back, "the consumer never came back");
    assert!(seen.max_at_once <= 1, "{seen:?}");
    assert!(seen.distinct.len() <= 2, "{seen:?}");
    assert_eq!(consumers(&q), 1);
    // Every attempt counted: the first connect, then one per failure or success.
    assert_eq!(counted.reconnects, 1);
    assert_eq!(
        counted.connect_attempts,
        1 + counted.reconnects + counted.connect_failures
    );
    // Each connection the broker showed was one of the counted attempts.
    assert!(seen.distinct.len() as u64 <= counted.connect_attempts);

    // Everything is served once the hold clears: the three of the closed channel come back
    // redelivered, their old handles settle nothing.
    gate.add_permits(1_000);
    wait_for("every message acked", || ctl_counts(&q) == (0, 0)).await;
    let report = rt.shutdown(Duration::from_secs(10)).await;
    assert!(report.stats.balances());
    assert!(report.stats.ledger.total().completed >= N as u64);
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_source_notices_a_closed_channel_and_reconnects() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("paused-close");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, 5, b"x", |_| BasicProperties::default()).await;
    let name = format!("paused-test/{q}");
    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.prefetch = 5;
    cfg.connection_name = Some(name.clone());
    cfg.reconnect.initial_backoff_ms = 50;
    cfg.reconnect.max_backoff_ms = 500;
    let mut source = AmqpSource::connect(cfg, NonZeroUsize::new(5).unwrap())
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(source.next().await.unwrap());
    }
    // Paused under backpressure: nobody calls next() from here on.
    source.pause();
    assert_eq!(close_connections_named(&name), 1);
    let stats = source.stats_handle();
    wait_for("a reconnect while paused", || stats.stats().reconnects == 1).await;
    assert_eq!(source.epoch(), 2);
    // The old channel is gone: its settles are stale, never sent (nor on the new channel).
    for env in held.drain(..) {
        env.ack.resolve(Disposition::Completed);
    }
    let s = stats.stats();
    assert_eq!((s.stale_settles, s.acked), (3, 0));
    // All five are back on the new channel, unacked, waiting for the source to resume.
    wait_for("five redelivered to the new consumer", || {
        ctl_counts(&q) == (0, 5)
    })
    .await;
    source.resume();
    for _ in 0..5 {
        let env = source.next().await.unwrap();
        assert!(env.payload.redelivered());
        env.ack.resolve(Disposition::Completed);
    }
    source.shutdown().await;
    let s = source.stats();
    assert_eq!((s.acked, s.stale_settles, s.redelivered), (5, 3, 5));
    assert_eq!(ctl_counts(&q), (0, 0));
    delete(&ch, &q).await;
}
