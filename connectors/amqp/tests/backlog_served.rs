//! Issue 9, "Backlog", on RabbitMQ: a backlog is not an overload. Its own test binary, so no
//! other test of this crate competes for the two cores while the runtime measures its
//! capacity.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
use triage_amqp::{AmqpMessage, AmqpSource, AmqpSourceConfig};

async fn wait_for(mut f: impl FnMut() -> bool) {
    for _ in 0..600 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("condition never became true");
}

/// Issue 9, "Backlog": 20,000 Medium messages already in the queue, no new arrivals, deadlines
/// far away (15 minutes), a runtime with a defer sink. A backlog is not an overload: every
/// message is completed, none deferred, none expired, nothing reaches the defer queue, and
/// every worker is busy while the backlog lasts.
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
    let capacity = config.expert.queue.capacity;
    let workers = config.workers.get() as u64;
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
    // Every delivery settled (completed, deferred or expired) leaves the queue; meanwhile
    // the most workers seen running at once.
    let mut most_running = 0;
    wait_for(|| {
        most_running = most_running.max(rt.stats().running);
        ctl_counts(&q) == (0, 0)
    })
    .await;
    let report = rt.shutdown(Duration::from_secs(20)).await;
    let total = report.stats.ledger.total();
    eprintln!(
        "backlog: completed {} deferred {} expired {}, at most {most_running} of {workers} workers running",
        total.completed, total.deferred, total.expired
    );
    assert_eq!(most_running, workers);
    assert_eq!(
        (total.completed, total.deferred, total.expired),
        (BACKLOG as u64, 0, 0)
    );
    assert_eq!(ready(&ch, &dq).await, 0);
    delete(&ch, &q).await;
    delete(&ch, &dq).await;
}
