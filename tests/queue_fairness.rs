//! Weighted-fair dequeue: shares match weights, and no backlogged tier waits past the bound.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use triage::admission::QueueAgeConfig;
use triage::quanta::Clock;
use triage::queue::{Meta, TierMask, Weight, WfqConfig, WfqQueue};
use triage::{Criticality, PerTier};

fn queue(capacity: usize, w: [u32; 4]) -> WfqQueue<u32> {
    let config = WfqConfig {
        capacity: capacity.try_into().unwrap(),
        weights: PerTier::new(w[0], w[1], w[2], w[3])
            .map(|_, w| Weight::new(i64::from(w)).unwrap()),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    };
    WfqQueue::with_clock(config, Clock::mock().0).unwrap()
}

/// Weights in `ALL` order (Critical first).
fn weight_of(w: [u32; 4], tier: Criticality) -> u32 {
    w[3 - tier.rank()]
}

/// The stated bound: a backlogged tier `i` is skipped at most
/// `sum over j != i of (ceil(w_j / w_i) + 1)` consecutive dequeues.
fn skip_bound(w: [u32; 4], tier: Criticality) -> usize {
    let wi = weight_of(w, tier);
    Criticality::ALL
        .into_iter()
        .filter(|t| *t != tier)
        .map(|t| weight_of(w, t).div_ceil(wi) as usize + 1)
        .sum()
}

fn backlogged_shares(w: [u32; 4], pops: usize) -> ([usize; 4], [usize; 4]) {
    let q = queue(4 * 64, w);
    for tier in Criticality::ALL {
        for _ in 0..64 {
            let _ = q.push(0, Meta::new(tier)).unwrap();
        }
    }
    let mut served = [0usize; 4];
    let mut since = [0usize; 4];
    let mut max_skip = [0usize; 4];
    for _ in 0..pops {
        let tier = q.try_pop().unwrap().ready().unwrap().criticality();
        // Keep every tier backlogged.
        let _ = q.push(0, Meta::new(tier)).unwrap();
        served[tier.rank()] += 1;
        for r in 0..4 {
            if r == tier.rank() {
                since[r] = 0;
            } else {
                since[r] += 1;
                max_skip[r] = max_skip[r].max(since[r]);
            }
        }
    }
    (served, max_skip)
}

#[test]
fn shares_of_15000_pops_match_8_4_2_1_within_one_point() {
    let w = [8, 4, 2, 1];
    let (served, max_skip) = backlogged_shares(w, 15_000);
    for tier in Criticality::ALL {
        let share = served[tier.rank()] as f64 / 15_000.0;
        let expected = f64::from(weight_of(w, tier)) / 15.0;
        assert!(
            (share - expected).abs() < 0.01,
            "{tier}: share {share:.4}, expected {expected:.4}"
        );
    }
    // Every tier stays backlogged, so each is skipped at most the others' combined weight
    // divided by its own, rounded up: Critical 1, High 3, Medium 7, Sheddable 14.
    assert_eq!(max_skip, [14, 7, 3, 1], "max consecutive skips, by rank");
    for tier in Criticality::ALL {
        assert!(max_skip[tier.rank()] <= skip_bound(w, tier));
    }
}

#[test]
fn other_weights_are_honoured_too() {
    for w in [[1, 1, 1, 1], [3, 3, 2, 1], [100, 10, 5, 1], [1, 2, 3, 4]] {
        let total: u32 = w.iter().sum();
        let pops = total as usize * 1000;
        let (served, _) = backlogged_shares(w, pops);
        for tier in Criticality::ALL {
            let share = served[tier.rank()] as f64 / pops as f64;
            let expected = f64::from(weight_of(w, tier)) / f64::from(total);
            assert!(
                (share - expected).abs() < 0.01,
                "weights {w:?}, {tier}: share {share:.4}, expected {expected:.4}"
            );
        }
    }
}

#[test]
fn a_lone_tier_gets_everything() {
    let q = queue(100, [8, 4, 2, 1]);
    for i in 0..100 {
        let _ = q.push(i, Meta::new(Criticality::Sheddable)).unwrap();
    }
    let got: Vec<u32> = (0..100)
        .map(|_| q.try_pop().unwrap().ready().unwrap().into_inner())
        .collect();
    assert_eq!(got, (0..100).collect::<Vec<_>>());
}

#[derive(Clone, Debug)]
enum Op {
    Push(Criticality),
    Pop,
    /// A pop among the tiers whose bit is set only.
    PopMasked(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Push(Criticality::Critical)),
        1 => Just(Op::Push(Criticality::High)),
        1 => Just(Op::Push(Criticality::Medium)),
        1 => Just(Op::Push(Criticality::Sheddable)),
        4 => Just(Op::Pop),
        2 => (1..16u8).prop_map(Op::PopMasked),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/queue_fairness.txt",
        ))),
        ..ProptestConfig::default()
    })]

    /// With tiers arriving and draining at random, and pops restricted to random sets of tiers,
    /// a tier that stays backlogged and eligible is never skipped for more than the stated bound.
    #[test]
    fn no_backlogged_tier_waits_past_the_bound(
        ops in proptest::collection::vec(op(), 1..2000),
        w in proptest::array::uniform4(1..=16u32),
    ) {
        let q = queue(1 << 16, w);
        // Dequeues of other tiers since this tier last got service or became backlogged.
        let mut skipped = [0usize; 4];
        for op in ops {
            match op {
                Op::Push(t) => {
                    if q.depths()[t] == 0 {
                        skipped[t.rank()] = 0;
                    }
                    let _ = q.push(0, Meta::new(t)).unwrap();
                }
                Op::Pop | Op::PopMasked(_) => {
                    let mask = match op {
                        Op::PopMasked(bits) => TierMask::from_bits(bits),
                        _ => TierMask::ALL,
                    };
                    let before = q.depths();
                    let Ok(d) = q.try_pop_masked(mask) else { continue };
                    let served = d.ready().unwrap().criticality();
                    for t in Criticality::ALL {
                        if t == served || !mask.contains(t) {
                            // Served, or not eligible: its wait starts again when it is.
                            skipped[t.rank()] = 0;
                        } else if before[t] > 0 {
                            skipped[t.rank()] += 1;
                            prop_assert!(
                                skipped[t.rank()] <= skip_bound(w, t),
                                "{t} skipped {} times, bound {} (weights {w:?})",
                                skipped[t.rank()], skip_bound(w, t)
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Issue 10, point 7: a tier left out of pops (masked, as the runtime does when a tier has used
/// its concurrency share) builds no credit meanwhile. After 1,000 pops restricted to Critical,
/// every tier backlogged, no backlogged tier waits past the bound once all tiers are eligible.
#[test]
fn masked_pops_build_no_credit() {
    let w = [8, 4, 2, 1];
    let q = queue(4 * 64, w);
    for tier in Criticality::ALL {
        for _ in 0..64 {
            let _ = q.push(0, Meta::new(tier)).unwrap();
        }
    }
    let only_critical = TierMask::NONE.with(Criticality::Critical);
    for _ in 0..1_000 {
        let d = q.try_pop_masked(only_critical).unwrap().ready().unwrap();
        assert_eq!(d.criticality(), Criticality::Critical);
        let _ = q.push(0, Meta::new(Criticality::Critical)).unwrap();
    }
    // Every tier eligible again, every tier kept backlogged.
    let mut since = [0usize; 4];
    let mut max_skip = [0usize; 4];
    let mut served = [0usize; 4];
    for _ in 0..1_500 {
        let tier = q.try_pop().unwrap().ready().unwrap().criticality();
        let _ = q.push(0, Meta::new(tier)).unwrap();
        served[tier.rank()] += 1;
        for r in 0..4 {
            if r == tier.rank() {
                since[r] = 0;
            } else {
                since[r] += 1;
                max_skip[r] = max_skip[r].max(since[r]);
            }
        }
    }
    for tier in Criticality::ALL {
        assert!(
            max_skip[tier.rank()] <= skip_bound(w, tier),
            "{tier} skipped {} pops in a row after masked pops, bound {}",
            max_skip[tier.rank()],
            skip_bound(w, tier)
        );
        let share = served[tier.rank()] as f64 / 1_500.0;
        let expected = f64::from(weight_of(w, tier)) / 15.0;
        assert!(
            (share - expected).abs() < 0.01,
            "{tier}: share {share:.4} after masked pops, expected {expected:.4}"
        );
    }
}
