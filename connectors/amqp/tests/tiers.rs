//! Issue 9 on RabbitMQ: `Source::lag` is the consumed queues' ready count, measured off the
//! hot path; a source over a queue per tier stops reading the shed tiers' queues, so their
//! messages wait in the broker and Critical ones never wait behind them. Counts only.

mod common;

use std::num::NonZeroUsize;

use common::*;
use lapin::types::FieldTable;
use lapin::BasicProperties;
use triage::ledger::Disposition;
use triage::queue::TierMask;
use triage::runtime::Source;
use triage::Criticality;
use triage_amqp::{AmqpSource, AmqpSourceConfig, TierQueue};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_is_the_ready_count_of_the_queue() {
    let (_conn, ch) = admin().await;
    let q = rand_queue("lag");
    declare(&ch, &q, FieldTable::default()).await;
    publish_n(&ch, &q, 50, b"x", |_| BasicProperties::default()).await;
    let mut cfg = AmqpSourceConfig::new(uri(), &q);
    cfg.prefetch = 10;
    cfg.lag_refresh_ms = 50;
    let mut source = AmqpSource::connect(cfg, NonZeroUsize::new(10).unwrap())
        .await
        .unwrap();
    // Ten are with the consumer (unacked), forty ready in the broker.
    assert!(
        eventually(|| source.lag() == Some(40)).await,
        "{:?}",
        source.lag()
    );
    for _ in 0..10 {
        source
            .next()
            .await
            .unwrap()
            .ack
            .resolve(Disposition::Completed);
    }
    // Acked ten: the broker sends ten more, thirty stay ready.
    assert!(
        eventually(|| source.lag() == Some(30)).await,
        "{:?}",
        source.lag()
    );
    source.shutdown().await;
    delete(&ch, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_tiers_queue_is_not_read_and_critical_never_waits_behind_it() {
    let (_conn, ch) = admin().await;
    let critical = rand_queue("tier-critical");
    let sheddable = rand_queue("tier-sheddable");
    declare(&ch, &critical, FieldTable::default()).await;
    declare(&ch, &sheddable, FieldTable::default()).await;
    publish_n(&ch, &sheddable, 20, b"s", |_| BasicProperties::default()).await;

    let mut cfg = AmqpSourceConfig::new(uri(), "");
    cfg.tier_queues = vec![
        TierQueue::new(&sheddable, Criticality::Sheddable),
        TierQueue::new(&critical, Criticality::Critical),
    ];
    cfg.prefetch = 5;
    cfg.lag_refresh_ms = 50;
    let mut source = AmqpSource::connect(cfg, NonZeroUsize::new(5).unwrap())
        .await
        .unwrap();
    // The runtime sheds Sheddable: its queue is not read from now on.
    source.pause_tiers(TierMask::NONE.with(Criticality::Sheddable));
    // The broker sent the consumer its prefetch of Sheddable before the pause; no more.
    assert!(eventually(|| ctl_counts(&sheddable) == (15, 5)).await);
    // Critical work arriving now is read at once, ahead of the buffered Sheddable ones.
    publish_n(&ch, &critical, 8, b"c", |_| BasicProperties::default()).await;
    for _ in 0..8 {
        let env = source.next().await.unwrap();
        assert_eq!(env.criticality, Criticality::Critical);
        assert_eq!(env.payload.queue(), critical);
        env.ack.resolve(Disposition::Completed);
    }
    assert_eq!(ctl_counts(&sheddable), (15, 5));
    assert!(eventually(|| ctl_counts(&critical) == (0, 0)).await);
    // The lag covers both queues: the fifteen Sheddable ones waiting in the broker.
    assert!(
        eventually(|| source.lag() == Some(15)).await,
        "{:?}",
        source.lag()
    );

    // Sheddable is admitted again: its queue is read to the end.
    source.pause_tiers(TierMask::NONE);
    for _ in 0..20 {
        let env = source.next().await.unwrap();
        assert_eq!(env.criticality, Criticality::Sheddable);
        env.ack.resolve(Disposition::Completed);
    }
    source.shutdown().await;
    let stats = source.stats();
    assert_eq!((stats.deliveries, stats.acked), (28, 28));
    assert_eq!(ctl_counts(&sheddable), (0, 0));
    delete(&ch, &critical).await;
    delete(&ch, &sheddable).await;
}
