//! `AmqpSource` under the triage `Runtime`: priorities served first, graceful shutdown acks
//! finished work, every published message accounted for.

mod common;

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use tokio::sync::Semaphore;
use triage::admission::QueueAgeConfig;
use triage::queue::WfqConfig;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
use triage::Criticality;
use triage_amqp::{AmqpMessage, AmqpSource, AmqpSourceConfig};

fn runtime_config(workers: usize, capacity: usize) -> RuntimeConfig {
    let mut queue = WfqConfig::with_capacity(capacity);
    // This test is about dequeue order, not about shedding by queue age.
    queue.admission = QueueAgeConfig::disabled();
    RuntimeConfig {
        workers: NonZeroUsize::new(workers).unwrap(),
        queue,
        ..RuntimeConfig::default()
    }
}

async fn wait_for(mut f: impl FnMut() -> bool) {
    for _ in 0..600 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("condition never became true");
}

/// Dequeues of Sheddable work allowed before all 10 Critical ones are served.
const CRITICAL_WITHIN: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_deliveries_overtake_a_sheddable_backlog() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("priority");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, 1_010, b"x", |i| {
        BasicProperties::default().with_priority(if i < 1_000 { 0 } else { 9 })
    })
    .await;

    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.prefetch = 1_024;
    let source = AmqpSource::connect(cfg, NonZeroUsize::new(1_024).unwrap())
        .await
        .unwrap();
    // One worker, held busy by its first job until everything is queued.
    let gate = Arc::new(Semaphore::new(0));
    let served = Arc::new(Mutex::new(Vec::new()));
    let (g, s) = (Arc::clone(&gate), Arc::clone(&served));
    let mut rt = Runtime::builder(runtime_config(1, 1_024))
        .start(move |job: Job<AmqpMessage>| {
            let (g, s) = (Arc::clone(&g), Arc::clone(&s));
            async move {
                let first = {
                    let mut s = s.lock().unwrap();
                    s.push(job.criticality());
                    s.len() == 1
                };
                if first {
                    let _ = g.acquire().await;
                }
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    rt.attach(source);
    wait_for(|| rt.stats().ledger.total().consumed == 1_010).await;
    gate.add_permits(1);
    wait_for(|| rt.stats().ledger.total().completed == 1_010).await;
    let report = rt.shutdown(Duration::from_secs(10)).await;
    assert!(report.stats.balances());

    let served = served.lock().unwrap().clone();
    // The first job was a Sheddable one taken before the Critical ones arrived.
    let after_release = &served[1..];
    let last_critical = after_release
        .iter()
        .rposition(|&c| c == Criticality::Critical)
        .unwrap();
    eprintln!(
        "priority: all 10 critical served within the first {} dequeues after the backlog formed",
        last_critical + 1
    );
    assert_eq!(
        served
            .iter()
            .filter(|&&c| c == Criticality::Critical)
            .count(),
        10
    );
    assert!(last_critical < CRITICAL_WITHIN, "{last_critical}");
    assert_eq!(ctl_counts(&q), (0, 0));
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_handler_acks_the_finished_work_before_closing() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("shutdown");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, 1, b"x", |_| {
        BasicProperties::default().with_priority(9)
    })
    .await;
    let source = AmqpSource::connect(
        AmqpSourceConfig::new(uri(), &q),
        NonZeroUsize::new(100).unwrap(),
    )
    .await
    .unwrap();
    let mut rt = Runtime::builder(runtime_config(1, 100))
        .start(|_job: Job<AmqpMessage>| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    rt.attach(source);
    wait_for(|| rt.stats().running == 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = rt.shutdown(Duration::from_secs(10)).await;
    assert!(!report.grace_exceeded);
    assert_eq!(report.stats.ledger.total().completed, 1);
    // Acked before the channel closed: nothing ready again, nothing unacked.
    assert_eq!(ctl_counts(&q), (0, 0));
    assert_eq!(ready(&ch, &q).await, 0);
    delete(&ch, &q).await;
}

/// Issue 9, "Backlog": 20,000 Medium messages already in the queue, no new arrivals, deadlines
/// far away (15 minutes), a runtime with a defer sink. A backlog is not an overload: every
/// message is completed, none deferred, none expired, and nothing reaches the defer queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_served_in_order_not_deferred() {
    const BACKLOG: usize = 20_000;
    let (_conn, ch) = admin().await;
    let q = rand_queue("backlog-medium");
    let dq = rand_queue("backlog-medium-deferred");
    declare(&ch, &q, FieldTable::default()).await;
    let deadline = std::time::SystemTime::now() + Duration::from_secs(15 * 60);
    let mut headers = FieldTable::default();
    headers.insert(
        triage::wire::DEADLINE_MS.into(),
        lapin::types::AMQPValue::LongString(triage::wire::format_deadline_ms(deadline).into()),
    );
    publish_n(&ch, &q, BACKLOG, b"x", |_| {
        BasicProperties::default()
            .with_priority(3)
            .with_headers(headers.clone())
    })
    .await;

    let defer = Arc::new(
        triage_amqp::AmqpDeferSink::connect(triage_amqp::AmqpSinkConfig::new(uri(), &dq))
            .await
            .unwrap(),
    );
    let config = RuntimeConfig::default();
    let capacity = config.queue.capacity;
    let mut rt = Runtime::builder(config)
        .defer_sink(Arc::clone(&defer))
        .start(|job: Job<AmqpMessage>| async move {
            // A short service time: the backlog takes a few seconds of handler time.
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _ = job.payload();
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.prefetch = 500;
    rt.attach(
        AmqpSource::connect_republishing(cfg, capacity, &[&*defer])
            .await
            .unwrap(),
    );
    // Every delivery settled (completed, deferred or expired) leaves the queue.
    wait_for(|| ctl_counts(&q) == (0, 0)).await;
    let report = rt.shutdown(Duration::from_secs(20)).await;
    let total = report.stats.ledger.total();
    eprintln!(
        "backlog: completed {} deferred {} expired {}",
        total.completed, total.deferred, total.expired
    );
    assert_eq!(
        (total.completed, total.deferred, total.expired),
        (BACKLOG as u64, 0, 0)
    );
    assert_eq!(ready(&ch, &dq).await, 0);
    delete(&ch, &q).await;
    delete(&ch, &dq).await;
}
