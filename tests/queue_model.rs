//! Model test: arbitrary push / pop / advance-the-clock / reconfigure sequences run against the
//! queue and against a plain reference model of its rules.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use triage::admission::QueueAgeConfig;
use triage::quanta::{Clock, Instant};
use triage::queue::{Meta, PushError, Weight, WfqConfig, WfqQueue};
use triage::{Criticality, PerTier};

#[derive(Clone, Debug)]
enum Action {
    Push {
        tier: Criticality,
        deadline_ms: Option<u16>,
        size: usize,
        /// When it must leave the queue, served or not (`WfqQueue::take_due`), from now.
        hand_back_ms: Option<u16>,
    },
    Pop,
    Advance(u16),
    Reconfigure {
        capacity: usize,
        max_bytes: Option<usize>,
        weights: [u32; 4],
    },
    /// Withdraws the items whose id is `rest` modulo `modulo` (a revoked partition's, say).
    DrainWhere {
        modulo: u64,
        rest: u64,
    },
    /// Starts reading the items' hand-back instants (`WfqQueue::track_hand_backs`).
    Track,
    /// Takes out the items whose hand-back instant has come.
    TakeDue,
}

fn tier() -> impl Strategy<Value = Criticality> {
    prop_oneof![
        Just(Criticality::Critical),
        Just(Criticality::High),
        Just(Criticality::Medium),
        Just(Criticality::Sheddable),
    ]
}

/// Mostly small sizes; now and then one so large that two add up past `usize::MAX`, which a
/// queue without a byte budget must hold by count alone.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        15 => 0..64usize,
        1 => (usize::MAX / 2)..=usize::MAX,
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (tier(), proptest::option::weighted(0.5, 0..200u16), size(), proptest::option::weighted(0.6, 0..300u16))
            .prop_map(|(tier, deadline_ms, size, hand_back_ms)| Action::Push { tier, deadline_ms, size, hand_back_ms }),
        4 => Just(Action::Pop),
        2 => (0..100u16).prop_map(Action::Advance),
        1 => (1..24usize, proptest::option::of(64..400usize), proptest::array::uniform4(1..10u32))
            .prop_map(|(capacity, max_bytes, weights)| Action::Reconfigure { capacity, max_bytes, weights }),
        1 => (1..4u64, 0..4u64).prop_map(|(modulo, rest)| Action::DrainWhere { modulo, rest }),
        1 => Just(Action::Track),
        2 => Just(Action::TakeDue),
    ]
}

#[derive(Clone, Debug)]
struct Item {
    id: u64,
    deadline_ms: Option<u64>,
    size: usize,
    hand_back_ms: Option<u64>,
}

/// What the queue holds in the model run: the id, and the hand-back instant the queue reads
/// with [`hand_back_of`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Id(u64, Option<Instant>);

fn hand_back_of(item: &Id) -> Option<Instant> {
    item.1
}

/// The rules, written as plainly as possible.
struct Model {
    tiers: [VecDeque<Item>; 4],
    capacity: usize,
    max_bytes: Option<usize>,
}

impl Model {
    fn len(&self) -> usize {
        self.tiers.iter().map(VecDeque::len).sum()
    }
    /// Bytes held, in `u128` so that no sum of sizes overflows.
    fn bytes(&self) -> u128 {
        self.tiers.iter().flatten().map(|i| i.size as u128).sum()
    }
    fn tier_bytes(&self, rank: usize) -> u128 {
        self.tiers[rank].iter().map(|i| i.size as u128).sum()
    }
    /// Bytes above the budget once `bytes` more are added: 0 without a budget.
    fn over_budget(&self, bytes: u128) -> u128 {
        self.max_bytes
            .map_or(0, |m| bytes.saturating_sub(m as u128))
    }
    fn fits(&self, extra_items: usize, extra_bytes: usize) -> bool {
        self.len() + extra_items <= self.capacity
            && self.over_budget(self.bytes() + extra_bytes as u128) == 0
    }
    fn expired(item: &Item, now_ms: u64) -> bool {
        matches!(item.deadline_ms, Some(d) if d <= now_ms)
    }
    /// Whether discarding the expired items and evicting below `rank` makes room for one item
    /// of `size` bytes.
    fn can_make_room(&self, rank: usize, size: usize, now_ms: u64) -> bool {
        let live = |r: usize| self.tiers[r].iter().filter(|i| !Self::expired(i, now_ms));
        let len: usize = (0..4).map(|r| live(r).count()).sum();
        let bytes: u128 = (0..4).flat_map(live).map(|i| i.size as u128).sum();
        let lower_items: usize = (0..rank).map(|r| live(r).count()).sum();
        let lower_bytes: u128 = (0..rank).flat_map(live).map(|i| i.size as u128).sum();
        let need_slot = len >= self.capacity;
        let need_bytes = self.over_budget(bytes + size as u128);
        !((need_slot && lower_items == 0) || lower_bytes < need_bytes)
    }
    /// Whether, once the expired items are discarded, one item of `size` bytes still needs
    /// evictions to fit.
    fn needs_eviction(&self, size: usize, now_ms: u64) -> bool {
        let live = || {
            self.tiers
                .iter()
                .flatten()
                .filter(|i| !Self::expired(i, now_ms))
        };
        live().count() >= self.capacity
            || self.over_budget(live().map(|i| i.size as u128).sum::<u128>() + size as u128) > 0
    }
    /// Removes and returns the ids of every expired item.
    fn remove_expired(&mut self, now_ms: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for tier in &mut self.tiers {
            out.extend(
                tier.iter()
                    .filter(|i| Self::expired(i, now_ms))
                    .map(|i| i.id),
            );
            tier.retain(|i| !Self::expired(i, now_ms));
        }
        out
    }
    /// Newest of the lowest non-empty tier strictly below `rank`.
    fn evict_below(&mut self, rank: usize) -> Option<Item> {
        (0..rank)
            .find(|r| !self.tiers[*r].is_empty())
            .and_then(|r| self.tiers[r].pop_back())
    }
}

fn config(
    capacity: usize,
    max_bytes: Option<usize>,
    weights: [u32; 4],
    admission: bool,
) -> WfqConfig {
    let mut c = WfqConfig {
        capacity: capacity.try_into().unwrap(),
        weights: PerTier::new(weights[0], weights[1], weights[2], weights[3])
            .map(|_, w| Weight::new(i64::from(w)).unwrap()),
        max_bytes: max_bytes.and_then(NonZeroUsize::new),
        ..WfqConfig::default()
    };
    c.admission = if admission {
        QueueAgeConfig::default()
    } else {
        QueueAgeConfig::disabled()
    };
    c
}

fn run(actions: Vec<Action>, admission: bool) -> Result<(), TestCaseError> {
    let (clock, mock) = Clock::mock();
    let origin = clock.now();
    let queue = WfqQueue::with_clock(config(8, None, [8, 4, 2, 1], admission), clock).unwrap();
    let mut model = Model {
        tiers: Default::default(),
        capacity: 8,
        max_bytes: None,
    };
    let mut now_ms: u64 = 0;
    let mut next_id = 0u64;
    let mut enqueued_at = std::collections::HashMap::new();
    let cutoffs = QueueAgeConfig::default();
    let mut tracked = false;

    for action in actions {
        match action {
            Action::Push {
                tier,
                deadline_ms,
                size,
                hand_back_ms,
            } => {
                let id = next_id;
                next_id += 1;
                let item = Item {
                    id,
                    deadline_ms: deadline_ms.map(|d| now_ms + u64::from(d)),
                    size,
                    hand_back_ms: hand_back_ms.map(|h| now_ms + u64::from(h)),
                };
                let hand_back = item.hand_back_ms.map(|h| origin + Duration::from_millis(h));
                let mut meta = Meta::new(tier).size_bytes(item.size);
                if let Some(d) = item.deadline_ms {
                    meta = meta.deadline(origin + Duration::from_millis(d));
                }
                let rank = tier.rank();
                // A push that needs room first discards every expired item, if that (with
                // evictions below) makes room; otherwise nothing is removed. An item whose own
                // deadline has passed evicts no live item: it is refused instead.
                // (Admission refuses before any of that.)
                let dead_on_arrival =
                    Model::expired(&item, now_ms) && model.needs_eviction(item.size, now_ms);
                let makes_room = !model.fits(1, item.size)
                    && model.can_make_room(rank, item.size, now_ms)
                    && !dead_on_arrival;
                match queue.push(Id(id, hand_back), meta) {
                    Ok(removed) => {
                        let mut expected_expired = Vec::new();
                        if makes_room {
                            expected_expired = model.remove_expired(now_ms);
                        }
                        let mut expired = Vec::new();
                        let mut evicted = Vec::new();
                        for r in removed {
                            if r.is_expired() {
                                expired.push(r.into_inner().0);
                            } else {
                                evicted.push(r.into_inner().0);
                            }
                        }
                        expired.sort_unstable();
                        expected_expired.sort_unstable();
                        prop_assert_eq!(
                            &expired,
                            &expected_expired,
                            "a push into a full queue discards exactly the expired items"
                        );
                        let mut expected = Vec::new();
                        while !model.fits(1, item.size) {
                            let victim = model.evict_below(rank);
                            prop_assert!(
                                victim.is_some(),
                                "queue evicted {evicted:?} but the model had nothing below"
                            );
                            expected.push(victim.unwrap().id);
                        }
                        prop_assert_eq!(
                            &evicted,
                            &expected,
                            "eviction must take the newest of the lowest tier below"
                        );
                        model.tiers[rank].push_back(item);
                        enqueued_at.insert(id, now_ms);
                    }
                    Err(PushError::Full(back)) => {
                        prop_assert_eq!(back.0, id);
                        prop_assert!(
                            !makes_room,
                            "refused as full although discarding the expired and evicting would make room"
                        );
                        let lower_items: usize =
                            model.tiers[..rank].iter().map(VecDeque::len).sum();
                        let lower_bytes: u128 = (0..rank).map(|r| model.tier_bytes(r)).sum();
                        let need_slot = model.len() >= model.capacity;
                        let need_bytes = model.over_budget(model.bytes() + item.size as u128);
                        prop_assert!(
                            dead_on_arrival
                                || (need_slot && lower_items == 0)
                                || lower_bytes < need_bytes,
                            "refused as full although room could be made"
                        );
                    }
                    Err(PushError::TooLarge(back)) => {
                        prop_assert_eq!(back.0, id);
                        prop_assert!(model.max_bytes.is_some_and(|m| item.size > m));
                    }
                    Err(PushError::Overloaded(back)) => {
                        prop_assert_eq!(back.0, id);
                        prop_assert!(admission, "refused by admission while it is disabled");
                        // Shed means the age this tier sees has not fallen to its exit point
                        // since it crossed the cut-off; ages only grow between observations.
                        let age = (rank..4)
                            .filter_map(|r| model.tiers[r].front())
                            .map(|i| now_ms - enqueued_at[&i.id])
                            .max()
                            .unwrap_or(0);
                        let exit = (cutoffs.cutoff_ms[tier] as f64 * cutoffs.exit_ratio) as u64;
                        prop_assert!(
                            age > exit,
                            "{tier} refused at age {age} ms, exit point {exit} ms"
                        );
                    }
                    Err(other) => prop_assert!(false, "unexpected {other:?}"),
                }
            }
            Action::Pop => match queue.try_pop() {
                Ok(d) => {
                    let expired = d.is_expired();
                    let entry = d.into_entry();
                    let rank = entry.criticality().rank();
                    let head = model.tiers[rank].pop_front();
                    prop_assert!(head.is_some());
                    let head = head.unwrap();
                    prop_assert_eq!(entry.item().0, head.id, "FIFO within a tier");
                    let model_expired = matches!(head.deadline_ms, Some(d) if d <= now_ms);
                    prop_assert_eq!(
                        expired,
                        model_expired,
                        "expired item returned ready, or the reverse"
                    );
                }
                Err(_) => prop_assert_eq!(model.len(), 0),
            },
            Action::Advance(ms) => {
                mock.increment(Duration::from_millis(u64::from(ms)));
                now_ms += u64::from(ms);
            }
            Action::Reconfigure {
                capacity,
                max_bytes,
                weights,
            } => {
                let evicted: Vec<u64> = queue
                    .reconfigure(config(capacity, max_bytes, weights, admission))
                    .unwrap()
                    .into_iter()
                    .map(|e| e.into_inner().0)
                    .collect();
                model.capacity = capacity;
                model.max_bytes = max_bytes;
                let mut expected = Vec::new();
                while !model.fits(0, 0) {
                    expected.push(model.evict_below(4).unwrap().id);
                }
                prop_assert_eq!(evicted, expected, "shrinking evicts by the push rule");
            }
            Action::DrainWhere { modulo, rest } => {
                let matches = |id: u64| id % modulo == rest;
                let drained: Vec<u64> = queue
                    .drain_where(|i| matches(i.0))
                    .into_iter()
                    .map(|e| e.into_inner().0)
                    .collect();
                // Most critical first, oldest first; the rest keep their order.
                let expected: Vec<u64> = model
                    .tiers
                    .iter()
                    .rev()
                    .flatten()
                    .map(|i| i.id)
                    .filter(|&id| matches(id))
                    .collect();
                for tier in &mut model.tiers {
                    tier.retain(|i| !matches(i.id));
                }
                prop_assert_eq!(drained, expected, "drain_where takes exactly the matches");
            }
            Action::Track => {
                queue.track_hand_backs(hand_back_of);
                tracked = true;
            }
            Action::TakeDue => {
                let taken: Vec<u64> = queue
                    .take_due()
                    .into_iter()
                    .map(|e| e.into_inner().0)
                    .collect();
                let due = |i: &Item| tracked && i.hand_back_ms.is_some_and(|h| h <= now_ms);
                // Most critical first, oldest first; the rest keep their order.
                let expected: Vec<u64> = model
                    .tiers
                    .iter()
                    .rev()
                    .flatten()
                    .filter(|i| due(i))
                    .map(|i| i.id)
                    .collect();
                for tier in &mut model.tiers {
                    tier.retain(|i| !due(i));
                }
                prop_assert_eq!(taken, expected, "take_due takes exactly what is due");
            }
        }
        // Invariants after every step.
        let stats = queue.stats();
        prop_assert!(
            stats.balances(),
            "pushed != popped + expired + evicted + refused + len: {stats:?}"
        );
        prop_assert_eq!(stats.depth() as usize, model.len());
        prop_assert_eq!(queue.len(), model.len());
        prop_assert!(queue.len() <= model.capacity, "over capacity");
        for t in Criticality::ALL {
            // Saturated, not wrapped, when sizes held without a budget add up past `u64::MAX`.
            let expected = u64::try_from(model.tier_bytes(t.rank())).unwrap_or(u64::MAX);
            prop_assert_eq!(stats.tier(t).bytes, expected, "{} bytes", t);
        }
        let depths = queue.depths();
        for t in Criticality::ALL {
            prop_assert_eq!(depths[t], model.tiers[t.rank()].len());
        }
    }
    // Close hands back exactly what the model holds, most critical first, oldest first.
    let drained: Vec<u64> = queue
        .close()
        .into_iter()
        .map(|e| e.into_inner().0)
        .collect();
    let expected: Vec<u64> = model.tiers.iter().rev().flatten().map(|i| i.id).collect();
    prop_assert_eq!(drained, expected);
    prop_assert!(queue.stats().balances());
    prop_assert!(matches!(
        queue.push(Id(u64::MAX, None), Meta::new(Criticality::Critical)),
        Err(PushError::Closed(_))
    ));
    let _ = PerTier::splat(0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/queue_model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn queue_follows_the_model(actions in proptest::collection::vec(action(), 1..300)) {
        run(actions, false)?;
    }

    #[test]
    fn queue_follows_the_model_with_admission(actions in proptest::collection::vec(action(), 1..300)) {
        run(actions, true)?;
    }
}

/// Issue 10, point 6: expired items do not hold the room. A push into a full queue discards
/// what has expired first (handed back as expired), then evicts or refuses by the usual rule.
#[test]
fn expired_items_do_not_hold_the_room() {
    let (clock, mock) = Clock::mock();
    let deadline = clock.now() + Duration::from_millis(10);
    let queue = WfqQueue::with_clock(config(2, None, [8, 4, 2, 1], false), clock).unwrap();
    // Full of Critical items that will expire: nothing lower to evict.
    for id in 0..2u64 {
        let meta = Meta::new(Criticality::Critical).deadline(deadline);
        assert!(queue.push(id, meta).unwrap().is_empty());
    }
    mock.increment(Duration::from_millis(10));
    // A live Critical push is taken; both dead items come back, as expired.
    let removed: Vec<(u64, bool)> = queue
        .push(2, Meta::new(Criticality::Critical))
        .unwrap_or_else(|_| panic!("expired items must not refuse a live push"))
        .map(|r| (r.is_expired(), r.into_inner()))
        .map(|(expired, id)| (id, expired))
        .collect();
    assert_eq!(removed, vec![(0, true), (1, true)]);
    assert_eq!(queue.len(), 1);
    let stats = queue.stats();
    assert_eq!(stats.tier(Criticality::Critical).expired, 2);
    assert!(stats.balances(), "{stats:?}");

    // [live Sheddable, expired High]: a High push removes the expired High, not the Sheddable.
    let (clock, mock) = Clock::mock();
    let deadline = clock.now() + Duration::from_millis(10);
    let queue = WfqQueue::with_clock(config(2, None, [8, 4, 2, 1], false), clock).unwrap();
    assert!(queue
        .push(10, Meta::new(Criticality::Sheddable))
        .unwrap()
        .is_empty());
    let meta = Meta::new(Criticality::High).deadline(deadline);
    assert!(queue.push(11, meta).unwrap().is_empty());
    mock.increment(Duration::from_millis(20));
    let removed: Vec<(u64, bool)> = queue
        .push(12, Meta::new(Criticality::High))
        .unwrap()
        .map(|r| (r.is_expired(), r.into_inner()))
        .map(|(expired, id)| (id, expired))
        .collect();
    assert_eq!(removed, vec![(11, true)], "the live Sheddable item stays");
    assert_eq!(queue.depths()[Criticality::Sheddable], 1);
}

#[derive(Clone, Debug)]
enum BatchAction {
    Push(Vec<(Criticality, Option<u16>, u16)>),
    Pop { max: usize, mask: u8 },
    Advance(u16),
}

fn batch_action() -> impl Strategy<Value = BatchAction> {
    let push = (tier(), proptest::option::weighted(0.5, 0..200u16), 0..64u16);
    prop_oneof![
        3 => proptest::collection::vec(push, 0..12).prop_map(BatchAction::Push),
        3 => (0..12usize, 1..16u8).prop_map(|(max, mask)| BatchAction::Pop { max, mask }),
        1 => (0..100u16).prop_map(BatchAction::Advance),
    ]
}

/// What an operation handed back, comparable across the single and the batch forms.
#[derive(Debug, PartialEq, Eq)]
enum Out {
    Removed(u64, bool),
    Refused(u64, String),
    Served(u64, bool),
}

/// `pop_batch_masked` decides exactly as the same pops one by one: the same items served and
/// expired, in the same order, the same counters and the same admission decisions, over queues
/// that pushes and time have brought to the same state.
fn run_batches(actions: Vec<BatchAction>, admission: bool) -> Result<(), TestCaseError> {
    use triage::queue::TierMask;
    let (clock, mock) = Clock::mock();
    let origin = clock.now();
    let single =
        WfqQueue::with_clock(config(8, Some(300), [8, 4, 2, 1], admission), clock.clone()).unwrap();
    let batch = WfqQueue::with_clock(config(8, Some(300), [8, 4, 2, 1], admission), clock).unwrap();
    let mut now_ms = 0u64;
    let mut next_id = 0u64;
    let mut served = Vec::new();
    for action in actions {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        match action {
            BatchAction::Push(items) => {
                let items: Vec<(u64, Meta)> = items
                    .into_iter()
                    .map(|(tier, deadline, size)| {
                        next_id += 1;
                        let mut meta = Meta::new(tier).size_bytes(usize::from(size));
                        if let Some(d) = deadline {
                            meta = meta
                                .deadline(origin + Duration::from_millis(now_ms + u64::from(d)));
                        }
                        (next_id, meta)
                    })
                    .collect();
                for (id, meta) in items {
                    for (q, out) in [(&single, &mut a), (&batch, &mut b)] {
                        match q.push(id, meta) {
                            Ok(r) => out.extend(r.map(|r| Out::Removed(*r.item(), r.is_expired()))),
                            Err(e) => out.push(Out::Refused(id, e.to_string())),
                        }
                    }
                }
            }
            BatchAction::Pop { max, mask } => {
                let mask = TierMask::from_bits(mask);
                for _ in 0..max {
                    match single.try_pop_masked(mask) {
                        Ok(d) => a.push(Out::Served(*d.entry().item(), d.is_expired())),
                        Err(_) => break,
                    }
                }
                let _ = batch.pop_batch_masked(mask, max, &mut served);
                b.extend(
                    served
                        .drain(..)
                        .map(|d| Out::Served(*d.entry().item(), d.is_expired())),
                );
            }
            BatchAction::Advance(ms) => {
                mock.increment(Duration::from_millis(u64::from(ms)));
                now_ms += u64::from(ms);
            }
        }
        prop_assert_eq!(a, b);
        prop_assert_eq!(single.stats(), batch.stats());
        prop_assert_eq!(single.shed_level(), batch.shed_level());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/queue_model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn batch_pops_decide_as_single_pops(
        actions in proptest::collection::vec(batch_action(), 1..100),
        admission in any::<bool>(),
    ) {
        run_batches(actions, admission)?;
    }
}
