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
    let mut queue = WfqConfig {
        capacity: capacity.try_into().unwrap(),
        ..WfqConfig::default()
    };
    // This test is about dequeue order, not about shedding by queue age.
    queue.admission = QueueAgeConfig::disabled();
    RuntimeConfig {
        workers: NonZeroUsize::new(workers).unwrap(),
        expert: triage::runtime::ExpertConfig {
            queue,
            ..triage::runtime::ExpertConfig::default()
        },
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

/// Prefetch of the test's consumer: what the broker hands out before it waits for acks.
const PREFETCH: u16 = 20;
/// Dequeues of Sheddable work allowed before all 10 Critical ones are served: what the
/// process already held when they arrived (the prefetch) plus a little slack.
const CRITICAL_WITHIN: usize = 2 * PREFETCH as usize;

/// A mixed queue with a Sheddable backlog: the intake pulls only what the workers can serve
/// soon (pull-based admission), so the backlog waits in the broker, and Critical work that
/// arrives later must overtake it there. A RabbitMQ priority queue with a small prefetch does
/// that (the layout the proving ground uses); `tier_queues` is the strict alternative.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_deliveries_overtake_a_sheddable_backlog() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("priority");
    let mut args = FieldTable::default();
    args.insert(
        "x-max-priority".into(),
        lapin::types::AMQPValue::ShortShortUInt(9),
    );
    declare(&ch, &q, args).await;
    publish_n(&ch, &q, 1_000, b"x", |_| {
        BasicProperties::default().with_priority(0)
    })
    .await;

    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.prefetch = PREFETCH;
    cfg.declare.max_priority = Some(9);
    let source = AmqpSource::connect(cfg, NonZeroUsize::new(1_024).unwrap())
        .await
        .unwrap();
    // One worker, held busy by its first job until the Critical ones are in the broker.
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
    wait_for(|| rt.stats().running == 1).await;
    publish_n(&ch, &q, 10, b"c", |_| {
        BasicProperties::default().with_priority(9)
    })
    .await;
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
        "priority: all 10 critical served within the first {} dequeues after they arrived",
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
