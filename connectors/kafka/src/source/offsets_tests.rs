//! Unit tests of `source::offsets`, beside it so that its file holds the code.

use std::sync::mpsc;
use std::time::Duration;

use super::*;

fn position(tpl: &TopicPartitionList) -> i64 {
    match tpl.elements()[0].offset() {
        Offset::Offset(o) => o,
        other => panic!("{other:?}"),
    }
}

/// Issue 10 point 10: an interval commit whose snapshot (position 5) was taken before the
/// revocation's commit (position 10) must not land after it. Before commits were
/// serialised, the revocation committed while the interval commit was in flight, and the
/// latter landed last: the landed positions were [10, 5], the group's position moved back.
#[test]
fn a_late_commit_never_lands_after_a_newer_one() {
    let offsets = Arc::new(Offsets::default());
    offsets.assign([("t", 0)]);
    let tokens: Vec<AckRef> = (0..10)
        .map(|o| offsets.track("t", 0, o).unwrap().0)
        .collect();
    for t in &tokens[..5] {
        offsets.resolve(*t);
    }
    let landed = Arc::new(Mutex::new(Vec::new()));
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let interval = {
        let (offsets, landed) = (Arc::clone(&offsets), Arc::clone(&landed));
        std::thread::spawn(move || {
            offsets.commit_with(
                CommitTrigger::Interval,
                |_| true,
                None,
                |tpl| {
                    let pos = position(tpl);
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    landed.lock().push(pos);
                    Ok(())
                },
            )
        })
    };
    started.recv().unwrap();
    // Settled meanwhile; then the partition is revoked, whose commit covers 10.
    for t in &tokens[5..] {
        offsets.resolve(*t);
    }
    let (done_tx, done) = mpsc::channel();
    let revoke = {
        let (offsets, landed) = (Arc::clone(&offsets), Arc::clone(&landed));
        std::thread::spawn(move || {
            let r = offsets.commit_with(
                CommitTrigger::Revoke,
                |_| true,
                Some(Duration::from_secs(60)),
                |tpl| {
                    landed.lock().push(position(tpl));
                    Ok(())
                },
            );
            done_tx.send(()).unwrap();
            r
        })
    };
    // Give the revocation every chance to overtake; it must wait instead. (A revocation
    // that finished here, before the release, is what the fix rules out.)
    let overtook = done.recv_timeout(Duration::from_millis(300)).is_ok();
    release.send(()).unwrap();
    assert_eq!(interval.join().unwrap(), Committed::Done);
    assert_eq!(revoke.join().unwrap(), Committed::Done);
    assert!(
        !overtook,
        "the revocation committed while a commit was in flight"
    );
    assert_eq!(*landed.lock(), [5, 10], "positions land in order");
    // Nothing is left to commit: the position marked is the newest.
    let nothing = offsets.commit_with(
        CommitTrigger::Interval,
        |_| true,
        None,
        |_| panic!("nothing changed"),
    );
    assert_eq!(nothing, Committed::Nothing);
}

/// A revocation that cannot get the commit lock in time commits nothing (the older
/// position stays; the next owner repeats, never skips) and counts a failed commit.
#[test]
fn a_revocation_behind_a_stuck_commit_commits_nothing() {
    let offsets = Offsets::default();
    offsets.assign([("t", 0)]);
    let (token, _) = offsets.track("t", 0, 0).unwrap();
    offsets.resolve(token);
    let _stuck = offsets.commit_lock.lock();
    let r = offsets.commit_with(
        CommitTrigger::Revoke,
        |_| true,
        Some(Duration::from_millis(1)),
        |_| panic!("must not commit"),
    );
    assert_eq!(r, Committed::Failed);
    assert_eq!(offsets.stats.snapshot().commits_failed, 1);
}

/// The poll thread's cache of the last partition's index survives a revocation and a new
/// assignment of that partition: the index names the partition for good, and the epoch
/// comes from the tracker, so a record tracked after the new assignment carries the new
/// epoch, and a disposition of the old one is stale.
#[test]
fn the_cached_partition_index_follows_reassignment() {
    let offsets = Offsets::default();
    offsets.assign([("t", 0), ("t", 1)]);
    let mut last = LastStream::default();
    let (old, _, _) = offsets.track_cached(&mut last, "t", 0, 5).unwrap();
    assert_eq!(last.get("t", 0), Some(old.stream));
    assert_eq!(last.get("t", 1), None);
    offsets.revoke([("t", 0)]);
    assert!(offsets.track_cached(&mut last, "t", 0, 6).is_none());
    offsets.assign([("t", 0)]);
    // Redelivered from the committed position, below the old epoch's last offset.
    let (new, _, _) = offsets.track_cached(&mut last, "t", 0, 3).unwrap();
    assert_eq!(new.stream, old.stream);
    assert_ne!(new.epoch, old.epoch);
    offsets.resolve(old);
    assert_eq!(offsets.stats.snapshot().stale_acks, 1);
    assert_eq!(offsets.pending_total(), 1);
    offsets.resolve(new);
    assert_eq!(offsets.pending_total(), 0);
    // Another partition replaces the cached one.
    let (other, _, topic) = offsets.track_cached(&mut last, "t", 1, 0).unwrap();
    assert_ne!(other.stream, old.stream);
    assert_eq!(last.get("t", 1), Some(other.stream));
    assert_eq!(&*topic, "t");
}

/// Records name their topic with the partition's one allocation, however the topics'
/// records interleave (the per-tier layout reads several topics at once).
#[test]
fn records_of_a_partition_share_its_topic() {
    let offsets = Offsets::default();
    offsets.assign([("a", 0), ("b", 0)]);
    let mut last = LastStream::default();
    let mut topics = Vec::new();
    for (i, t) in ["a", "b", "a", "b"].into_iter().enumerate() {
        topics.push(offsets.track_cached(&mut last, t, 0, i as i64).unwrap().2);
    }
    assert!(Arc::ptr_eq(&topics[0], &topics[2]));
    assert!(Arc::ptr_eq(&topics[1], &topics[3]));
    assert_eq!(&*topics[1], "b");
}

/// Issue 10 point 10: a rebalance error gives up every partition. Dispositions arriving
/// later are stale (never stored, so never committed), queued records are withdrawn, and
/// no commit covers the partitions any more.
#[test]
fn a_rebalance_error_gives_up_every_partition() {
    let offsets = Offsets::default();
    offsets.assign([("t", 0), ("t", 1), ("u", 0)]);
    let a = offsets.track("t", 0, 7).unwrap();
    let b = offsets.track("u", 0, 3).unwrap();
    offsets.resolve(a.0);
    offsets.revoke_all();
    assert_eq!(offsets.pending_total(), 0);
    assert!(
        !offsets.is_current(b.0, b.1),
        "queued records are withdrawn"
    );
    offsets.resolve(b.0);
    assert_eq!(offsets.stats.snapshot().stale_acks, 1);
    let r = offsets.commit_with(
        CommitTrigger::Interval,
        |_| true,
        None,
        |_| panic!("nothing is owned any more"),
    );
    assert_eq!(r, Committed::Nothing);
    assert!(offsets.track("t", 1, 0).is_none(), "not assigned any more");
    // A later assignment starts a fresh epoch.
    offsets.assign([("t", 0)]);
    assert!(offsets.track("t", 0, 8).is_some());
}
