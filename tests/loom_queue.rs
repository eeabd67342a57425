//! Loom models of the hand-written waiter protocols: the queue's (a consumer counts itself,
//! listens, checks once more under the lock; a push, or a pop that leaves items, notifies only
//! when someone is counted; `src/queue/wfq/waiting.rs`) and the concurrency limit's (a waiter counts itself per tier;
//! a release, or a live `set_shares`/`set_algorithm` that makes room, wakes one waiter per
//! slot it frees); and a model of the runtime's hand-over of a source from its intake to the
//! workers that pull for it. Loom runs every interleaving of the atomics, the lock and
//! event-listener's internals, so a lost wake-up shows as a deadlock.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test --test loom_queue --release
//! ```
//!
//! Built only under `cfg(loom)` (see `src/loom.rs`); the normal suite skips this file.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use triage::admission::QueueAgeConfig;
use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
use triage::quanta::Clock;
use triage::queue::{Closed, Meta, WfqConfig, WfqQueue};
use triage::Criticality;

fn queue(capacity: usize) -> WfqQueue<u32> {
    let config = WfqConfig {
        capacity: capacity.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    };
    WfqQueue::with_clock(config, Clock::mock().0).unwrap()
}

/// Bounded preemptions keep each model to seconds; every wake-up bug found so far in this kind
/// of protocol needs one or two.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// Waits in the async pop on a loom thread.
fn pop_waiting(q: &WfqQueue<u32>) -> Result<u32, Closed> {
    loom::future::block_on(q.pop()).map(|d| d.into_entry().into_inner())
}

#[test]
fn a_push_wakes_a_waiting_consumer() {
    model(|| {
        let q = Arc::new(queue(4));
        let consumer = {
            let q = Arc::clone(&q);
            thread::spawn(move || pop_waiting(&q))
        };
        assert!(q.push(7, Meta::new(Criticality::High)).unwrap().is_empty());
        assert_eq!(consumer.join().unwrap(), Ok(7));
    });
}

/// A push wakes one consumer at a time; the second consumer is reached through the first,
/// whose pop leaves an item (`wake_next`), or by the second push if the first was already
/// back.
#[test]
fn two_pushes_reach_two_waiting_consumers() {
    model(|| {
        let q = Arc::new(queue(4));
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let q = Arc::clone(&q);
                thread::spawn(move || pop_waiting(&q))
            })
            .collect();
        for i in 0..2 {
            assert!(q.push(i, Meta::new(Criticality::High)).unwrap().is_empty());
        }
        let mut got: Vec<u32> = consumers
            .into_iter()
            .map(|c| c.join().unwrap().unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1]);
    });
}

/// `close` racing a push wakes the waiting consumer, and the item is handed out exactly once:
/// served to the consumer, or back from `close`.
#[test]
fn close_racing_a_push_wakes_the_consumer_and_hands_the_item_out_once() {
    model(|| {
        let q = Arc::new(queue(4));
        let consumer = {
            let q = Arc::clone(&q);
            thread::spawn(move || pop_waiting(&q))
        };
        let producer = {
            let q = Arc::clone(&q);
            thread::spawn(move || q.push(7, Meta::new(Criticality::High)).is_ok())
        };
        let left: Vec<u32> = q.close().into_iter().map(|e| e.into_inner()).collect();
        let pushed = producer.join().unwrap();
        let served = consumer.join().unwrap();
        let mut out: Vec<u32> = left;
        out.extend(served.ok());
        assert_eq!(out, if pushed { vec![7] } else { vec![] });
        assert_eq!(pop_waiting(&q), Err(Closed));
    });
}

#[test]
fn a_release_wakes_a_waiter_for_a_slot() {
    model(|| {
        let limit = ConcurrencyLimit::new(Fixed::new(1).unwrap().into(), TierShares::default());
        let held = limit.try_acquire(Criticality::Critical).unwrap();
        let waiter = {
            let limit = limit.clone();
            thread::spawn(move || {
                loom::future::block_on(limit.acquire(Criticality::Critical)).in_flight_at_start()
            })
        };
        drop(held);
        assert_eq!(waiter.join().unwrap(), 1);
        assert_eq!(limit.in_flight(), 0);
    });
}

#[test]
fn two_releases_wake_two_waiters_of_different_tiers() {
    model(|| {
        let limit = ConcurrencyLimit::new(Fixed::new(2).unwrap().into(), TierShares::default());
        let a = limit.try_acquire(Criticality::Critical).unwrap();
        let b = limit.try_acquire(Criticality::Critical).unwrap();
        let waiters: Vec<_> = [Criticality::Critical, Criticality::High]
            .into_iter()
            .map(|tier| {
                let limit = limit.clone();
                thread::spawn(move || {
                    drop(loom::future::block_on(limit.acquire(tier)));
                })
            })
            .collect();
        drop(a);
        drop(b);
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(limit.in_flight(), 0);
    });
}

/// A live `set_shares` that gives a tier more room wakes its waiter: limit 4, Sheddable's share
/// 0.25 (one slot), taken; a Sheddable waiter blocks; raising the share to 0.5 must let it in
/// (the waiter counts itself and fences before its last check, `set_shares` fences before it
/// reads the counts).
#[test]
fn set_shares_wakes_a_waiter_it_makes_room_for() {
    model(|| {
        let narrow = TierShares::new(1.0, 0.9, 0.75, 0.25).unwrap();
        let wide = TierShares::new(1.0, 0.9, 0.75, 0.5).unwrap();
        let limit = ConcurrencyLimit::new(Fixed::new(4).unwrap().into(), narrow);
        let held = limit.try_acquire(Criticality::Sheddable).unwrap();
        let waiter = {
            let limit = limit.clone();
            thread::spawn(move || {
                loom::future::block_on(limit.acquire(Criticality::Sheddable)).in_flight_at_start()
            })
        };
        limit.set_shares(wide);
        assert_eq!(waiter.join().unwrap(), 2);
        drop(held);
        assert_eq!(limit.in_flight(), 0);
    });
}

/// A live `set_algorithm` that raises the limit wakes a waiter: limit 1, taken; a Critical
/// waiter blocks; a fixed limit of 2 must let it in without any release.
#[test]
fn set_algorithm_wakes_a_waiter_it_makes_room_for() {
    model(|| {
        let limit = ConcurrencyLimit::new(Fixed::new(1).unwrap().into(), TierShares::default());
        let held = limit.try_acquire(Criticality::Critical).unwrap();
        let waiter = {
            let limit = limit.clone();
            thread::spawn(move || {
                loom::future::block_on(limit.acquire(Criticality::Critical)).in_flight_at_start()
            })
        };
        limit.set_algorithm(Fixed::new(2).unwrap().into());
        assert_eq!(waiter.join().unwrap(), 2);
        drop(held);
        assert_eq!(limit.in_flight(), 0);
    });
}

/// The intake's hand-over of its source to the workers (`src/runtime/intake.rs`, `Shared` and
/// `PullForIntake`), as a model of its three steps: the intake sets `open` before it waits for
/// room and clears it when it wakes, then takes the source's lock; a worker pulls only holding
/// that lock (`try_lock`) and seeing `open` under it, and leaves what the intake must hold in
/// `returned` before it lets go. So once the intake has the lock back, no worker pulls until it
/// opens again, and the intake sees everything a worker left (the runtime's code uses tokio's
/// and parking_lot's mutexes where this model has loom's).
#[test]
fn no_worker_pulls_once_the_intake_has_its_source_back() {
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::sync::Mutex;

    struct Source {
        pulled: u32,
        /// The intake took the source back (it never opens again in this model).
        intake_has_it: bool,
    }
    struct Shared {
        open: AtomicBool,
        source: Mutex<Source>,
        returned: Mutex<Vec<u32>>,
    }
    fn worker_pull(shared: &Shared) {
        if !shared.open.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut source) = shared.source.try_lock() else {
            return;
        };
        if !shared.open.load(Ordering::Acquire) {
            return;
        }
        assert!(
            !source.intake_has_it,
            "a worker pulled after the intake took its source back"
        );
        source.pulled += 1;
        // Each pull leaves one refused message for the intake to hold.
        shared.returned.lock().unwrap().push(source.pulled);
    }
    model(|| {
        let shared = Arc::new(Shared {
            // The intake opened before it waited.
            open: AtomicBool::new(true),
            source: Mutex::new(Source {
                pulled: 0,
                intake_has_it: false,
            }),
            returned: Mutex::new(Vec::new()),
        });
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let shared = Arc::clone(&shared);
                thread::spawn(move || worker_pull(&shared))
            })
            .collect();
        // The intake wakes: closes, then takes its source back.
        shared.open.store(false, Ordering::Release);
        let pulled = {
            let mut source = shared.source.lock().unwrap();
            source.intake_has_it = true;
            let returned = shared.returned.lock().unwrap().len() as u32;
            assert_eq!(
                returned, source.pulled,
                "a hand-back the intake did not see"
            );
            source.pulled
        };
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(shared.source.lock().unwrap().pulled, pulled);
    });
}

/// The queue's own lock (`src/queue/lock.rs`: taken by a compare-and-swap, given back by a
/// plain release store, never parked on): two threads pushing and popping at once never
/// overlap inside it (the state sits in loom's cell, which reports any access the lock does
/// not order), and every item comes out exactly once.
#[test]
fn the_lock_orders_concurrent_pushes_and_pops() {
    model(|| {
        let q = Arc::new(queue(4));
        let other = {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                assert!(q.push(1, Meta::new(Criticality::High)).unwrap().is_empty());
                q.try_pop().map(|d| d.into_entry().into_inner())
            })
        };
        assert!(q
            .push(2, Meta::new(Criticality::Sheddable))
            .unwrap()
            .is_empty());
        let mine = q.try_pop().map(|d| d.into_entry().into_inner());
        let theirs = other.join().unwrap();
        let mut got = vec![mine.unwrap(), theirs.unwrap()];
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        assert!(q.is_empty());
    });
}
