//! A broker backlog of 100,000 messages of 10 KB (about 1 GB) consumed slowly with a prefetch
//! of 1,000 and a runtime queue of 1,000: the broker keeps the backlog, the process holds at
//! most the prefetch, and its resident memory stays flat.
//!
//! Asserts the prefetch bound (at the broker and in the process), not a memory figure: RSS
//! depends on the allocator. The RSS samples are printed for the record.

mod common;

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::time::Duration;

use common::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use triage::ledger::Disposition;
use triage::runtime::Source;
use triage_amqp::{AmqpSource, AmqpSourceConfig};

const BACKLOG: usize = 100_000;
const BODY: usize = 10 * 1024;
const PREFETCH: u16 = 1_000;
const CAPACITY: usize = 1_000;
/// Messages consumed by the slow worker: enough to cycle the prefetch window 30 times.
const CONSUMED: usize = 30_000;

/// Deletes the 1 GB queue even if the test fails.
struct DeleteOnDrop(String);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args(["-q", "delete_queue", &self.0])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_stays_at_the_broker_and_memory_stays_flat() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("backlog");
    let _cleanup = DeleteOnDrop(q.clone());
    declare(&ch, &q, FieldTable::default()).await;
    let body = vec![0xabu8; BODY];
    publish_n(&ch, &q, BACKLOG, &body, |_| BasicProperties::default()).await;

    let rss_start = rss_kib();
    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.prefetch = PREFETCH;
    let mut source = AmqpSource::connect(cfg, NonZeroUsize::new(CAPACITY).unwrap())
        .await
        .unwrap();

    // A slow worker in front of a queue of CAPACITY: it holds up to CAPACITY deliveries and
    // finishes the oldest one only when full, pausing a little every 100 messages.
    let mut queue = VecDeque::with_capacity(CAPACITY);
    let mut samples = Vec::new();
    let mut max_outstanding = 0;
    let mut broker_unacked = Vec::new();
    for i in 0..CONSUMED {
        let env = source.next().await.unwrap();
        assert_eq!(env.size_bytes, BODY);
        queue.push_back(env);
        if queue.len() == CAPACITY {
            if let Some(done) = queue.pop_front() {
                done.ack.resolve(Disposition::Completed);
            }
        }
        max_outstanding = max_outstanding.max(source.outstanding());
        if i % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if i % 5_000 == 0 {
            samples.push((i, rss_kib()));
        }
        if i % 10_000 == 5_000 {
            broker_unacked.push(ctl_counts(&q).1);
        }
    }
    let rss_end = rss_kib();
    samples.push((CONSUMED, rss_end));
    for env in queue.drain(..) {
        env.ack.resolve(Disposition::Completed);
    }
    source.shutdown().await;

    eprintln!("backlog: rss at start {rss_start} KiB; samples (consumed, KiB): {samples:?}");
    eprintln!("backlog: broker unacked samples {broker_unacked:?}, max outstanding in process {max_outstanding}");
    assert!(max_outstanding <= usize::from(PREFETCH));
    assert!(!broker_unacked.is_empty());
    assert!(broker_unacked.iter().all(|&u| u <= u64::from(PREFETCH)));
    let stats = source.stats();
    assert_eq!(stats.deliveries, CONSUMED as u64);
    assert_eq!(stats.acked, CONSUMED as u64);
    // Deliveries prefetched but never taken go back to ready when the broker has processed the
    // channel close; wait for that to settle (a convergence wait, not a timing assertion).
    let mut left = 0;
    for _ in 0..100 {
        left = ready(&ch, &q).await as usize;
        if left == BACKLOG - CONSUMED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, BACKLOG - CONSUMED);
}
