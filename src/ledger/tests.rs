use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::Criticality;

const P: &str = "orders-0";

fn tracker_with(offsets: &[u64]) -> (AckTracker<&'static str>, Vec<AckToken<&'static str>>) {
    let mut t = AckTracker::new();
    t.assign(P);
    let tokens = offsets.iter().map(|&o| t.track(&P, o).unwrap()).collect();
    (t, tokens)
}

#[test]
fn out_of_order_resolution_advances_contiguously() {
    let (mut t, tok) = tracker_with(&[10, 11, 12]);
    assert_eq!(t.watermark(&P), Some(10));
    assert_eq!(t.resolve(&tok[2]), Ok(None));
    assert_eq!(t.watermark(&P), Some(10));
    assert_eq!(t.resolve(&tok[0]), Ok(Some(11)));
    assert_eq!(t.watermark(&P), Some(11));
    assert_eq!(t.resolve(&tok[1]), Ok(Some(13)));
    assert_eq!(t.watermark(&P), Some(13));
    assert_eq!(t.pending(&P), Some(0));
    assert_eq!(t.pending_total(), 0);
}

#[test]
fn failing_message_holds_watermark_until_dead_lettered() {
    let (mut t, tok) = tracker_with(&[0, 1, 2, 3]);
    let ledger = Ledger::new();
    for _ in 0..4 {
        ledger.record_consumed(Criticality::Medium);
    }
    // Offset 1 keeps failing while it is retried; the others complete.
    for i in [0, 2, 3] {
        t.resolve(&tok[i]).unwrap();
        ledger.record(Criticality::Medium, Disposition::Completed);
    }
    assert_eq!(t.watermark(&P), Some(1));
    assert_eq!(t.pending(&P), Some(1));
    assert_eq!(ledger.snapshot().unresolved(), 1);
    // Retries exhausted: dead-lettered, which is its disposition.
    assert_eq!(t.resolve(&tok[1]), Ok(Some(4)));
    ledger.record(Criticality::Medium, Disposition::Failed);
    let snap = ledger.snapshot();
    assert_eq!(snap.tier(Criticality::Medium).failed, 1);
    assert_eq!(snap.tier(Criticality::Medium).completed, 3);
    assert_eq!(snap.unresolved(), 0);
}

#[test]
fn gaps_are_not_pending() {
    let (mut t, tok) = tracker_with(&[10, 11, 15]);
    assert_eq!(t.resolve(&tok[0]), Ok(Some(11)));
    assert_eq!(t.resolve(&tok[1]), Ok(Some(15)));
    assert_eq!(t.resolve(&tok[2]), Ok(Some(16)));
    assert_eq!(t.watermark(&P), Some(16));
    // A new offset after a gap moves the position to it: 16..=19 were never consumed.
    let t20 = t.track(&P, 20).unwrap();
    assert_eq!(t.watermark(&P), Some(20));
    assert_eq!(t.resolve(&t20), Ok(Some(21)));
}

#[test]
fn revoke_makes_old_tokens_stale_and_reassign_starts_fresh() {
    let (mut t, tok) = tracker_with(&[5, 6, 7]);
    let old_epoch = t.epoch(&P).unwrap();
    t.resolve(&tok[0]).unwrap();
    let revoked = t.revoke(&P).unwrap();
    assert_eq!(revoked.epoch, old_epoch);
    assert_eq!(revoked.watermark, Some(6));
    assert_eq!(revoked.pending, 2);
    assert_eq!(t.pending_total(), 0);
    assert_eq!(t.watermark(&P), None);
    assert_eq!(t.pending(&P), None);
    assert_eq!(
        t.resolve(&tok[1]),
        Err(ResolveError::Stale {
            offset: 6,
            epoch: old_epoch
        })
    );
    assert_eq!(t.track(&P, 8), Err(TrackError::NotAssigned { offset: 8 }));

    let assignment = t.assign(P);
    assert!(assignment.epoch > old_epoch);
    assert_eq!(assignment.replaced, None);
    // The start position comes from the group, not from the old epoch.
    assert_eq!(t.watermark(&P), None);
    let n6 = t.track(&P, 6).unwrap();
    assert_eq!(t.watermark(&P), Some(6));
    // A late completion of the old epoch must not settle the new 6 or 7.
    assert!(matches!(
        t.resolve(&tok[1]),
        Err(ResolveError::Stale { .. })
    ));
    assert!(matches!(
        t.resolve(&tok[2]),
        Err(ResolveError::Stale { .. })
    ));
    assert_eq!(t.watermark(&P), Some(6));
    assert_eq!(t.pending(&P), Some(1));
    assert_eq!(t.resolve(&n6), Ok(Some(7)));
}

#[test]
fn reassign_without_revoke_reports_replaced_state() {
    let (mut t, tok) = tracker_with(&[1, 2]);
    let first = t.epoch(&P).unwrap();
    let a = t.assign(P);
    let replaced = a.replaced.unwrap();
    assert_eq!(replaced.epoch, first);
    assert_eq!(replaced.watermark, Some(1));
    assert_eq!(replaced.pending, 2);
    assert_eq!(t.pending_total(), 0);
    assert_eq!(t.watermark(&P), None);
    assert!(matches!(
        t.resolve(&tok[0]),
        Err(ResolveError::Stale { .. })
    ));
}

#[test]
fn errors_are_reported_and_change_nothing() {
    let (mut t, tok) = tracker_with(&[10, 11, 13]);
    assert_eq!(t.resolve(&tok[1]), Ok(None));
    assert_eq!(
        t.resolve(&tok[1]),
        Err(ResolveError::AlreadyResolved { offset: 11 })
    );
    let epoch = t.epoch(&P).unwrap();
    // 12 is a gap inside the window; 14 and 99 lie beyond the last tracked offset.
    for never in [12, 14, 99] {
        let forged = AckToken::from_parts(P, never, epoch);
        assert_eq!(
            t.resolve(&forged),
            Err(ResolveError::Unknown { offset: never })
        );
    }
    assert_eq!(t.resolve(&tok[0]), Ok(Some(13)));
    // Below the window: settled and popped.
    assert_eq!(
        t.resolve(&tok[0]),
        Err(ResolveError::AlreadyResolved { offset: 10 })
    );
    assert_eq!(
        t.track(&P, 13),
        Err(TrackError::NotIncreasing {
            offset: 13,
            last: 13
        })
    );
    assert_eq!(
        t.track(&P, 2),
        Err(TrackError::NotIncreasing {
            offset: 2,
            last: 13
        })
    );
    assert_eq!(
        t.track(&P, u64::MAX),
        Err(TrackError::OutOfRange { offset: u64::MAX })
    );
    assert_eq!(
        t.track(&"other", 1),
        Err(TrackError::NotAssigned { offset: 1 })
    );
    assert_eq!(t.watermark(&P), Some(13));
    assert_eq!(t.pending(&P), Some(1));
    assert_eq!(t.resolve(&tok[2]), Ok(Some(14)));
    // Empty window: everything up to the last tracked offset is settled.
    assert_eq!(
        t.resolve(&tok[2]),
        Err(ResolveError::AlreadyResolved { offset: 13 })
    );
    assert_eq!(
        t.resolve(&AckToken::from_parts(P, 14, epoch)),
        Err(ResolveError::Unknown { offset: 14 })
    );
}

#[test]
fn token_from_another_tracker_is_stale() {
    let (_a, tok_a) = tracker_with(&[1]);
    let (mut b, _tok_b) = tracker_with(&[1]);
    assert!(matches!(
        b.resolve(&tok_a[0]),
        Err(ResolveError::Stale { .. })
    ));
    assert_eq!(b.pending(&P), Some(1));
}

#[test]
fn committable_offers_changes_until_marked() {
    let mut t = AckTracker::new();
    t.assign("a");
    t.assign("b");
    assert_eq!(t.committable().count(), 0);
    let a0 = t.track(&"a", 0).unwrap();
    let _b7 = t.track(&"b", 7).unwrap();
    let mut c: Vec<_> = t.committable().map(|(p, o)| (*p, o)).collect();
    c.sort();
    assert_eq!(c, [("a", 0), ("b", 7)]);
    assert!(t.mark_committed(&"a", 0));
    assert!(t.mark_committed(&"b", 7));
    assert_eq!(t.committable().count(), 0);

    t.resolve(&a0).unwrap();
    let c: Vec<_> = t.committable().map(|(p, o)| (*p, o)).collect();
    assert_eq!(c, [("a", 1)]);
    // Beyond the watermark, or unassigned: refused.
    assert!(!t.mark_committed(&"a", 2));
    assert!(!t.mark_committed(&"zzz", 1));
    // A late callback of an older commit does not undo a newer one.
    assert!(t.mark_committed(&"a", 1));
    assert!(t.mark_committed(&"a", 0));
    assert_eq!(t.committable().count(), 0);
    let mut parts: Vec<_> = t.partitions().copied().collect();
    parts.sort();
    assert_eq!(parts, ["a", "b"]);
}

#[test]
fn disposition_names() {
    let names: Vec<_> = Disposition::ALL.iter().map(|d| d.as_str()).collect();
    assert_eq!(
        names,
        ["completed", "failed", "deferred", "expired", "shed"]
    );
    for (i, d) in Disposition::ALL.iter().enumerate() {
        assert_eq!(d.index(), i);
        assert_eq!(d.to_string(), d.as_str());
    }
}

#[test]
fn error_messages_name_the_offset() {
    assert_eq!(
        TrackError::NotIncreasing { offset: 3, last: 5 }.to_string(),
        "offset 3 is not above the last tracked offset 5"
    );
    assert_eq!(
        ResolveError::AlreadyResolved { offset: 9 }.to_string(),
        "offset 9 already has a disposition"
    );
}

#[test]
fn ledger_counts_concurrently_exactly() {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 10_000;
    let ledger = Ledger::new();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for i in 0..PER_THREAD {
                    let tier = Criticality::ALL[(i % 4) as usize];
                    ledger.record_consumed(tier);
                    // Leave one in ten per tier unresolved, as if still queued.
                    if i % 10 < 9 {
                        ledger.record(tier, Disposition::ALL[(i % 5) as usize]);
                    }
                }
            });
        }
    });
    let snap = ledger.snapshot();
    let total = snap.total();
    assert_eq!(total.consumed, THREADS * PER_THREAD);
    assert_eq!(total.settled(), THREADS * PER_THREAD * 9 / 10);
    assert_eq!(snap.unresolved(), THREADS * PER_THREAD / 10);
    for tier in Criticality::ALL {
        assert_eq!(snap.tier(tier).consumed, THREADS * PER_THREAD / 4);
    }
    // Per (tier, disposition): count i in 0..10_000 with given i%4, i%5 and i%10 < 9.
    for tier in Criticality::ALL {
        for d in Disposition::ALL {
            let expected = (0..PER_THREAD)
                .filter(|i| {
                    Criticality::ALL[(i % 4) as usize] == tier
                        && Disposition::ALL[(i % 5) as usize] == d
                        && i % 10 < 9
                })
                .count() as u64;
            assert_eq!(snap.tier(tier).count(d), THREADS * expected);
        }
    }
    let table = snap.to_string();
    assert_eq!(table.lines().count(), 6);
    assert!(table.lines().nth(1).unwrap().starts_with("critical"));
    assert!(table
        .lines()
        .last()
        .unwrap()
        .ends_with(&format!("{:>10}", THREADS * PER_THREAD / 10)));
}

#[test]
fn snapshot_never_shows_more_settled_than_consumed() {
    let ledger = Ledger::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..20_000 {
                ledger.record_consumed(Criticality::Critical);
                ledger.record(Criticality::Critical, Disposition::Completed);
            }
        });
        for _ in 0..2_000 {
            let c = *ledger.snapshot().tier(Criticality::Critical);
            assert!(c.settled() <= c.consumed, "{c:?}");
        }
    });
}

/// Reference model of one partition's commit position.
#[derive(Default)]
struct Model {
    unresolved: BTreeSet<u64>,
    last: Option<u64>,
}

impl Model {
    fn watermark(&self) -> Option<u64> {
        self.unresolved
            .first()
            .copied()
            .or(self.last.map(|l| l + 1))
    }
}

fn check(t: &AckTracker<&'static str>, p: &'static str, m: &Model, prev: &mut Option<u64>) {
    let wm = t.watermark(&p);
    assert_eq!(wm, m.watermark());
    assert!(wm >= *prev, "watermark went back from {prev:?} to {wm:?}");
    if let (Some(w), Some(&low)) = (wm, m.unresolved.first()) {
        assert!(w <= low, "watermark {w} passed unresolved {low}");
    }
    assert_eq!(t.pending(&p), Some(m.unresolved.len()));
    *prev = wm;
}

#[derive(Clone, Debug)]
enum Op {
    Track { partition: usize, gap: u64 },
    Resolve { pick: usize },
    Revoke { partition: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..4u64).prop_map(|(partition, gap)| Op::Track { partition, gap }),
        4 => any::<usize>().prop_map(|pick| Op::Resolve { pick }),
        1 => (0..2usize).prop_map(|partition| Op::Revoke { partition }),
    ]
}

proptest! {
    #[test]
    fn watermark_matches_model_for_any_resolution_order(
        start in 0u64..1_000,
        gaps in prop::collection::vec(0u64..4, 1..80),
        order_seed in any::<u64>(),
        keep_unresolved in prop::collection::vec(any::<bool>(), 80),
    ) {
        let mut offsets = Vec::with_capacity(gaps.len());
        let mut next = start;
        for g in gaps {
            next += g;
            offsets.push(next);
            next += 1;
        }
        let (mut t, tokens) = tracker_with(&offsets);
        let mut m = Model { unresolved: offsets.iter().copied().collect(), last: offsets.last().copied() };
        let mut prev = None;
        check(&t, P, &m, &mut prev);

        // A permutation from the seed (Fisher-Yates with a small LCG), minus the kept ones.
        let mut order: Vec<usize> = (0..tokens.len()).collect();
        let mut s = order_seed | 1;
        for i in (1..order.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(i, (s >> 33) as usize % (i + 1));
        }
        for i in order.into_iter().filter(|&i| !keep_unresolved[i]) {
            let before = m.watermark();
            let got = t.resolve(&tokens[i]).unwrap();
            m.unresolved.remove(&offsets[i]);
            let after = m.watermark();
            prop_assert_eq!(got, if after != before { after } else { None });
            check(&t, P, &m, &mut prev);
            prop_assert_eq!(t.resolve(&tokens[i]), Err(ResolveError::AlreadyResolved { offset: offsets[i] }));
        }
        prop_assert_eq!(t.pending_total(), m.unresolved.len());
    }

    #[test]
    fn two_partitions_with_revokes_match_model(ops in prop::collection::vec(op(), 1..200)) {
        const PARTS: [&str; 2] = ["a", "b"];
        let mut t = AckTracker::new();
        let mut models = [Model::default(), Model::default()];
        let mut prev: [Option<u64>; 2] = [None, None];
        let mut next = [0u64; 2];
        // (partition index, token, whether it belongs to the current epoch)
        let mut outstanding: Vec<(usize, AckToken<&'static str>, bool)> = Vec::new();
        for p in PARTS {
            t.assign(p);
        }
        for op in ops {
            match op {
                Op::Track { partition, gap } => {
                    let offset = next[partition] + gap;
                    next[partition] = offset + 1;
                    let tok = t.track(&PARTS[partition], offset).unwrap();
                    models[partition].unresolved.insert(offset);
                    models[partition].last = Some(offset);
                    outstanding.push((partition, tok, true));
                }
                Op::Resolve { pick } => {
                    if outstanding.is_empty() {
                        continue;
                    }
                    let (partition, tok, current) = outstanding.swap_remove(pick % outstanding.len());
                    let m = &mut models[partition];
                    let before = m.watermark();
                    let got = t.resolve(&tok);
                    if current {
                        m.unresolved.remove(&tok.offset());
                        let after = m.watermark();
                        prop_assert_eq!(got, Ok(if after != before { after } else { None }));
                    } else {
                        let stale = matches!(got, Err(ResolveError::Stale { .. }));
                        prop_assert!(stale, "{:?}", got);
                    }
                }
                Op::Revoke { partition } => {
                    let p = PARTS[partition];
                    let r = t.revoke(&p).unwrap();
                    prop_assert_eq!(r.watermark, models[partition].watermark());
                    prop_assert_eq!(r.pending, models[partition].unresolved.len());
                    for entry in outstanding.iter_mut().filter(|e| e.0 == partition) {
                        entry.2 = false;
                    }
                    // The next owner resumes from the committed position, so offsets
                    // restart at the old watermark (redelivery of the pending ones).
                    if let Some(w) = r.watermark {
                        next[partition] = w;
                    }
                    t.assign(p);
                    models[partition] = Model::default();
                    prev[partition] = None;
                }
            }
            for (i, p) in PARTS.into_iter().enumerate() {
                check(&t, p, &models[i], &mut prev[i]);
            }
            let total: usize = models.iter().map(|m| m.unresolved.len()).sum();
            prop_assert_eq!(t.pending_total(), total);
        }
    }
}
