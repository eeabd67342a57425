//! Unit tests of what needs the crate's own view of the queue (`requeue`, `looks_full_for`)
//! or a single scenario; the rules themselves are driven by `tests/queue_model.rs`.

use std::time::Duration;

use quanta::{Clock, Instant};

use crate::admission::QueueAgeConfig;
use crate::queue::{
    Closed, Entry, Evictions, Meta, PushError, Removed, TryPopError, WfqConfig, WfqQueue,
};
use crate::Criticality;

fn queue(capacity: usize) -> WfqQueue<u32> {
    let config = WfqConfig {
        capacity: capacity.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    };
    WfqQueue::with_clock(config, Clock::mock().0).expect("valid config")
}

fn items(q: &WfqQueue<u32>) -> Vec<u32> {
    std::iter::from_fn(|| q.try_pop().ok().map(|d| d.into_entry().into_inner())).collect()
}

/// Asking a batch pop for nothing takes nothing and is not an error while items are held.
#[test]
fn a_batch_pop_of_zero_items_is_ok_zero() {
    let q = queue(4);
    let mut out = Vec::new();
    assert_eq!(q.pop_batch(0, &mut out), Ok(0));
    assert_eq!(
        q.push(1, Meta::new(Criticality::High))
            .expect("room")
            .count(),
        0
    );
    assert_eq!(q.pop_batch(0, &mut out), Ok(0));
    assert!(out.is_empty());
    assert_eq!(q.len(), 1);
    assert_eq!(q.close().len(), 1);
    assert_eq!(q.pop_batch(0, &mut out), Err(TryPopError::Closed));
}

/// A push refused because the queue is closed is counted like any other refusal, by every
/// push path, and the stats still balance.
#[test]
fn pushes_after_close_are_counted_as_refused_closed() {
    let q = queue(4);
    q.close();
    assert!(matches!(
        q.push(1, Meta::new(Criticality::High)),
        Err(PushError::Closed(1))
    ));
    assert!(matches!(
        q.push_admitted(2, Meta::new(Criticality::High)),
        Err(PushError::Closed(2))
    ));
    assert!(matches!(
        q.push_admitted_quiet(3, Meta::new(Criticality::Sheddable), &mut Evictions::none()),
        Err(PushError::Closed(3))
    ));
    let stats = q.stats();
    let high = stats.tier(Criticality::High);
    assert_eq!(high.refused_for(crate::queue::RefuseReason::Closed), 2);
    assert_eq!(high.pushed, 2);
    let sheddable = stats.tier(Criticality::Sheddable);
    assert_eq!(sheddable.refused_for(crate::queue::RefuseReason::Closed), 1);
    assert!(stats.balances(), "{stats}");
}

/// The pushes that leave what they removed in the caller's `removed` (the runtime's) report
/// the same evictions a returned `Evictions` would, and leave it empty when nothing was removed.
#[test]
fn pushes_into_removed_report_their_evictions() {
    let q = queue(1);
    let mut removed = Evictions::none();
    q.push_into(1, Meta::new(Criticality::Sheddable), true, &mut removed)
        .unwrap();
    assert!(removed.is_empty());
    q.push_admitted_quiet(2, Meta::new(Criticality::Critical), &mut removed)
        .unwrap();
    let got: Vec<_> = removed.map(|r| (r.is_expired(), r.into_inner())).collect();
    assert_eq!(got, vec![(false, 1)]);
    let mut removed = Evictions::none();
    assert!(matches!(
        q.push_into(3, Meta::new(Criticality::Sheddable), false, &mut removed),
        Err(PushError::Full(3))
    ));
    assert!(removed.is_empty());
}

/// A full queue does not evict a live item for one whose own deadline has passed: the
/// incoming item is refused and the live one kept. Room made by discarding expired items
/// alone is still used.
#[test]
fn an_item_expired_on_arrival_evicts_no_live_item() {
    let (clock, mock) = Clock::mock();
    let config = WfqConfig {
        capacity: 1.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    };
    let q = WfqQueue::with_clock(config, clock.clone()).expect("valid config");
    mock.increment(Duration::from_secs(1));
    let past = clock.now() - Duration::from_millis(1);
    assert_eq!(
        q.push(1, Meta::new(Criticality::Sheddable))
            .expect("room")
            .count(),
        0
    );
    let dead = Meta::new(Criticality::Critical).deadline(past);
    assert!(matches!(q.push(2, dead), Err(PushError::Full(2))));
    assert_eq!(items(&q), [1]);
    // The held item expired: discarding it makes room, no live item is evicted.
    let soon = clock.now() + Duration::from_millis(5);
    assert_eq!(
        q.push(3, Meta::new(Criticality::Sheddable).deadline(soon))
            .expect("room")
            .count(),
        0
    );
    mock.increment(Duration::from_millis(10));
    let removed: Vec<_> = q.push(4, dead).unwrap().collect();
    assert!(matches!(removed[..], [Removed::Expired(_)]));
    assert!(q.stats().balances());
}

/// Sizes near `usize::MAX` neither overflow the byte counters nor exceed the budget: what
/// cannot be held is refused.
#[test]
fn sizes_near_usize_max_are_refused_not_overflowed() {
    let config = WfqConfig {
        capacity: 4.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        max_bytes: std::num::NonZeroUsize::new(usize::MAX),
        ..WfqConfig::default()
    };
    let q = WfqQueue::with_clock(config, Clock::mock().0).expect("valid config");
    let none = q
        .push(
            1,
            Meta::new(Criticality::Sheddable).size_bytes(usize::MAX - 1),
        )
        .expect("room");
    assert_eq!(none.count(), 0);
    // Room by bytes only by evicting the Sheddable item.
    let evicted: Vec<_> = q
        .push(2, Meta::new(Criticality::Critical).size_bytes(10))
        .unwrap()
        .map(Removed::into_inner)
        .collect();
    assert_eq!(evicted, [1]);
    // Nothing below Critical to evict: refused, the held item kept.
    assert!(matches!(
        q.push(
            3,
            Meta::new(Criticality::Critical).size_bytes(usize::MAX - 1)
        ),
        Err(PushError::Full(3))
    ));
    assert_eq!(q.stats().tier(Criticality::Critical).bytes, 10);
    assert!(q.stats().balances());
}

/// Without a byte budget the queue bounds by count only, however large the sizes: sizes
/// adding up past `usize::MAX` evict nothing and are not refused while slots are free, and
/// the byte stats saturate rather than wrap.
#[test]
fn without_a_budget_sizes_past_usize_max_are_bounded_by_count_only() {
    let config = WfqConfig {
        capacity: 4.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    };
    let q = WfqQueue::with_clock(config, Clock::mock().0).expect("valid config");
    let huge = usize::MAX - 1;
    for (item, tier) in [
        (1, Criticality::Sheddable),
        (2, Criticality::Critical),
        (3, Criticality::Critical),
        (4, Criticality::Sheddable),
    ] {
        let removed = q
            .push(item, Meta::new(tier).size_bytes(huge))
            .expect("a free slot admits any size without a budget");
        assert_eq!(removed.count(), 0, "item {item} evicted something");
    }
    assert_eq!(q.len(), 4);
    assert_eq!(q.stats().tier(Criticality::Critical).bytes, u64::MAX);
    assert_eq!(
        q.stats().tier(Criticality::Sheddable).bytes,
        u64::MAX,
        "two sizes of usize::MAX - 1 saturate"
    );
    // Full by count: a Critical push evicts the newest Sheddable, as with small sizes.
    let evicted: Vec<_> = q
        .push(5, Meta::new(Criticality::Critical).size_bytes(huge))
        .expect("room by eviction")
        .map(Removed::into_inner)
        .collect();
    assert_eq!(evicted, [4]);
    assert_eq!(
        q.stats().tier(Criticality::Sheddable).bytes,
        huge as u64,
        "exact again once the total fits"
    );
    // Setting a budget evicts until the held sizes fit it, lowest tier first, newest first.
    let evicted: Vec<u32> = q
        .reconfigure(WfqConfig {
            capacity: 4.try_into().unwrap(),
            admission: QueueAgeConfig::disabled(),
            max_bytes: std::num::NonZeroUsize::new(usize::MAX),
            ..WfqConfig::default()
        })
        .expect("valid config")
        .into_iter()
        .map(Entry::into_inner)
        .collect();
    assert_eq!(evicted, [1, 5, 3]);
    assert_eq!(q.stats().tier(Criticality::Critical).bytes, huge as u64);
    // The budget now counts: one byte more than it leaves is refused.
    assert!(matches!(
        q.push(6, Meta::new(Criticality::Critical).size_bytes(2)),
        Err(PushError::Full(6))
    ));
    assert!(q.stats().balances());
}

/// The lock-free hint agrees with what a push would do: full by count with nothing below
/// a tier refuses that tier, an item of a lower tier makes room for it, and a pop opens room.
#[test]
fn looks_full_for_matches_the_push() {
    let q = queue(2);
    assert!(!q.looks_full_for(Criticality::Critical));
    assert_eq!(q.push(1, Meta::new(Criticality::High)).unwrap().count(), 0);
    assert_eq!(
        q.push(2, Meta::new(Criticality::Medium)).unwrap().count(),
        0
    );
    // Full: Critical and High could evict the Medium item, Medium and Sheddable could not.
    assert!(!q.looks_full_for(Criticality::Critical));
    assert!(!q.looks_full_for(Criticality::High));
    assert!(q.looks_full_for(Criticality::Medium));
    assert!(q.looks_full_for(Criticality::Sheddable));
    assert!(matches!(
        q.push(3, Meta::new(Criticality::Medium)),
        Err(PushError::Full(3))
    ));
    // High evicts the Medium item: now nothing below High.
    let evicted = q.push(4, Meta::new(Criticality::High)).unwrap();
    assert_eq!(evicted.count(), 1);
    assert!(q.looks_full_for(Criticality::High));
    assert!(!q.looks_full_for(Criticality::Critical));
    assert!(matches!(
        q.push(5, Meta::new(Criticality::High)),
        Err(PushError::Full(5))
    ));
    // A pop makes room for every tier.
    assert_eq!(q.try_pop().unwrap().into_entry().into_inner(), 1);
    assert!(!q.looks_full_for(Criticality::Sheddable));
    drop(q.close());
    assert!(!q.looks_full_for(Criticality::Critical));
}

/// A worker took a batch of 8 from a full queue of 8, served the first, and while its
/// handler waits the intake filled 6 of the 8 slots again: only 2 of the 7 it hands back
/// fit. They are the last 2 of the batch's pops; the first 5 stay with the worker, in
/// order, and the queue holds 8, never 13 (it held 13 before: the bound was ignored).
#[test]
fn requeue_stays_within_capacity() {
    let q = queue(8);
    for i in 0..8 {
        assert!(q.push(i, Meta::new(Criticality::High)).unwrap().is_empty());
    }
    let mut batch = Vec::new();
    assert_eq!(q.pop_batch(8, &mut batch), Ok(8));
    batch.reverse();
    let served = batch.pop().unwrap().into_entry().into_inner();
    assert_eq!(served, 0);
    for i in 100..106 {
        assert!(q.push(i, Meta::new(Criticality::High)).unwrap().is_empty());
    }
    assert_eq!(q.requeue(&mut batch, Criticality::High), Ok(2));
    assert_eq!(q.len(), 8);
    let kept: Vec<u32> = batch
        .into_iter()
        .rev()
        .map(|d| d.into_entry().into_inner())
        .collect();
    assert_eq!(kept, [1, 2, 3, 4, 5]);
    assert_eq!(items(&q), [6, 7, 100, 101, 102, 103, 104, 105]);
}

/// With room, everything goes back, and the weighted-fair order goes on as if the batch
/// had not been taken: the same sequence as a queue that only served the first item.
#[test]
fn requeue_with_room_restores_the_order() {
    let fill = |q: &WfqQueue<u32>| {
        for i in 0..16 {
            let tier = Criticality::ALL[(i % 4) as usize];
            assert!(q.push(i, Meta::new(tier)).unwrap().is_empty());
        }
    };
    let (a, b) = (queue(32), queue(32));
    fill(&a);
    fill(&b);
    let mut batch = Vec::new();
    assert_eq!(a.pop_batch(6, &mut batch), Ok(6));
    batch.reverse();
    let first = batch.pop().unwrap().into_entry();
    assert_eq!(a.requeue(&mut batch, first.criticality()), Ok(5));
    assert!(batch.is_empty());
    let only_first = b.try_pop().unwrap().into_entry();
    assert_eq!(first.into_inner(), only_first.into_inner());
    assert_eq!(items(&a), items(&b));
}

/// `drain_where` takes exactly the matches, most critical first and oldest first, leaves
/// the others in their order, counts what it took as drained (the stats balance), makes
/// room for a push, and re-evaluates queue-age admission at once: draining the old head
/// that shed a tier admits it again without waiting for a push or a pop.
#[test]
fn drain_where_takes_the_matches_and_rereads_the_ages() {
    let (clock, mock) = Clock::mock();
    let config = WfqConfig {
        capacity: 4.try_into().unwrap(),
        ..WfqConfig::default()
    };
    let q = WfqQueue::with_clock(config, clock).expect("valid config");
    for (i, tier) in [
        Criticality::Sheddable,
        Criticality::High,
        Criticality::Sheddable,
        Criticality::High,
    ]
    .into_iter()
    .enumerate()
    {
        assert!(q.push(i as u32, Meta::new(tier)).unwrap().is_empty());
    }
    mock.increment(Duration::from_secs(1));
    q.refresh_admission();
    assert!(!q.admits(Criticality::Sheddable), "aged a second");
    let taken: Vec<u32> = q
        .drain_where(|&i| i != 2)
        .into_iter()
        .map(|e| e.into_inner())
        .collect();
    assert_eq!(taken, [1, 3, 0]);
    let stats = q.stats();
    assert_eq!(stats.tier(Criticality::High).drained, 2);
    assert_eq!(stats.tier(Criticality::Sheddable).drained, 1);
    assert!(stats.balances(), "{stats}");
    assert_eq!(q.len(), 1);
    assert!(q.drain_where(|_| false).is_empty());
    // The one left is as old as the drained ones: still shed. Drained too, the queue is
    // empty and admits again at once.
    assert!(!q.admits(Criticality::Sheddable));
    assert_eq!(q.drain_where(|_| true).len(), 1);
    assert!(q.admits(Criticality::Sheddable));
    assert_eq!(q.len(), 0);
}

/// A worker hands back to the head of its tier an item due later than the one now at the
/// head: the earlier one, behind it, is found when due all the same (it straggles), and
/// so is one queued behind an item that may wait for ever.
#[test]
fn take_due_finds_an_item_behind_a_later_one() {
    type Item = (u32, Option<Instant>);
    let (clock, mock) = Clock::mock();
    let config = WfqConfig {
        capacity: 8.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    };
    let q: WfqQueue<Item> = WfqQueue::with_clock(config, clock.clone()).expect("valid");
    q.track_hand_backs(|&(_, by)| by);
    let at = |ms| Some(clock.now() + Duration::from_millis(ms));
    let tier = Meta::new(Criticality::Sheddable);
    assert!(q.push((1, at(50)), tier).unwrap().is_empty());
    let mut batch = Vec::new();
    assert_eq!(q.pop_batch(1, &mut batch), Ok(1));
    assert!(q.push((2, at(10)), tier).unwrap().is_empty());
    assert!(q.push((3, None), tier).unwrap().is_empty());
    assert!(q.push((4, at(20)), tier).unwrap().is_empty());
    // Item 1 goes back in front of item 2, which is due sooner.
    assert_eq!(q.requeue(&mut batch, Criticality::High), Ok(1));
    let ids = |v: Vec<Entry<Item>>| v.into_iter().map(|e| e.into_inner().0).collect::<Vec<_>>();
    assert!(q.take_due().is_empty());
    mock.increment(Duration::from_millis(10));
    assert_eq!(ids(q.take_due()), [2]);
    mock.increment(Duration::from_millis(10));
    assert_eq!(ids(q.take_due()), [4]);
    mock.increment(Duration::from_millis(30));
    assert_eq!(ids(q.take_due()), [1]);
    let stats = q.stats();
    assert_eq!(stats.tier(Criticality::Sheddable).drained, 3);
    assert!(stats.balances(), "{stats}");
    assert_eq!(ids(q.close()), [3]);
}

#[test]
fn requeue_after_close_takes_nothing() {
    let q = queue(4);
    assert!(q.push(1, Meta::new(Criticality::High)).unwrap().is_empty());
    assert!(q.push(2, Meta::new(Criticality::High)).unwrap().is_empty());
    let mut batch = Vec::new();
    assert_eq!(q.pop_batch(2, &mut batch), Ok(2));
    let _ = q.close();
    assert_eq!(q.requeue(&mut batch, Criticality::High), Err(Closed));
    assert_eq!(batch.len(), 2);
}
