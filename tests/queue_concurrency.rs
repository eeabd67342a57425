//! Many producers, many consumers, on threads and on tasks, close: every item is handed out
//! exactly once (served, expired, evicted, refused or drained at close) and dropped exactly once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use triage::admission::QueueAgeConfig;
use triage::queue::{Closed, Dequeued, Meta, PushError, WfqConfig, WfqQueue};
use triage::Criticality;

static DROPS: AtomicUsize = AtomicUsize::new(0);

/// Counts its drops, so a lost or duplicated item shows.
struct Tracked(u64);

impl Drop for Tracked {
    fn drop(&mut self) {
        DROPS.fetch_add(1, Ordering::Relaxed);
    }
}

fn queue(capacity: usize) -> WfqQueue<Tracked> {
    WfqQueue::new(WfqConfig {
        capacity: capacity.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    })
    .unwrap()
}

/// The async pop from a plain thread, outside any runtime: the way a thread waits for an item.
fn pop_on_thread<T>(q: &WfqQueue<T>) -> Result<Dequeued<T>, Closed> {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(q.pop())
}

#[test]
fn four_producers_two_consumers_account_for_every_item_once() {
    const PER_PRODUCER: u64 = 25_000;
    let q = Arc::new(queue(64));
    let start = Arc::new(Barrier::new(6));
    let before = DROPS.load(Ordering::Relaxed);
    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let q = Arc::clone(&q);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                let mut evicted = Vec::new();
                let mut refused = Vec::new();
                for i in 0..PER_PRODUCER {
                    let id = p * PER_PRODUCER + i;
                    let tier = Criticality::ALL[(id % 4) as usize];
                    match q.push(Tracked(id), Meta::new(tier)) {
                        Ok(ev) => evicted.extend(ev.map(|e| e.into_inner().0)),
                        Err(PushError::Full(t)) => refused.push(t.0),
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
                (evicted, refused)
            })
        })
        .collect();
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let q = Arc::clone(&q);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                start.wait();
                let mut got = Vec::new();
                loop {
                    match rt.block_on(q.pop()) {
                        Ok(Dequeued::Ready(e)) => got.push(e.into_inner().0),
                        Ok(Dequeued::Expired(_)) => panic!("no deadlines were set"),
                        Err(Closed) => return got,
                    }
                }
            })
        })
        .collect();
    let mut seen = Vec::new();
    let mut evicted_n = 0;
    let mut refused_n = 0;
    for p in producers {
        let (evicted, refused) = p.join().unwrap();
        evicted_n += evicted.len();
        refused_n += refused.len();
        seen.extend(evicted);
        seen.extend(refused);
    }
    // Producers are done: close, and take back what is still queued.
    let drained: Vec<u64> = q.close().into_iter().map(|e| e.into_inner().0).collect();
    let drained_n = drained.len();
    seen.extend(drained);
    let mut served_n = 0;
    for c in consumers {
        let got = c.join().unwrap();
        served_n += got.len();
        seen.extend(got);
    }
    let total = 4 * PER_PRODUCER as usize;
    assert_eq!(
        seen.len(),
        total,
        "served {served_n}, evicted {evicted_n}, refused {refused_n}, drained {drained_n}"
    );
    let unique: HashSet<u64> = seen.iter().copied().collect();
    assert_eq!(unique.len(), total, "an item was handed out twice");
    assert_eq!(
        DROPS.load(Ordering::Relaxed) - before,
        total,
        "an item was dropped inside the queue or twice"
    );
    let stats = q.stats();
    assert!(stats.balances(), "{stats:?}");
    assert_eq!(stats.total(|t| t.popped) as usize, served_n);
    assert_eq!(stats.total(|t| t.evicted) as usize, evicted_n);
}

/// A thread waiting in the async pop (no runtime of its own but `block_on`) is woken by a push,
/// whether or not it is asleep yet, and by `close`.
#[test]
fn a_waiting_thread_is_woken_by_a_push_and_by_close() {
    let q = Arc::new(
        WfqQueue::<u32>::new(WfqConfig {
            capacity: 4.try_into().unwrap(),
            ..WfqConfig::default()
        })
        .unwrap(),
    );
    let q2 = Arc::clone(&q);
    let waiter = thread::spawn(move || pop_on_thread(&q2));
    assert!(q.push(7, Meta::new(Criticality::High)).unwrap().is_empty());
    let got = waiter
        .join()
        .unwrap()
        .unwrap()
        .ready()
        .unwrap()
        .into_inner();
    assert_eq!(got, 7);

    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let q = Arc::clone(&q);
            thread::spawn(move || pop_on_thread(&q).map(|d| d.into_entry().into_inner()))
        })
        .collect();
    assert!(q.close().is_empty());
    for w in waiters {
        assert_eq!(w.join().unwrap(), Err(Closed));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_wakes_every_async_waiter_and_hands_items_back() {
    let q = Arc::new(
        WfqQueue::<u32>::new(WfqConfig {
            capacity: 8.try_into().unwrap(),
            ..WfqConfig::default()
        })
        .unwrap(),
    );
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.pop().await.map(|d| d.into_entry().into_inner()) })
        })
        .collect();
    tokio::task::yield_now().await;
    assert!(q
        .push(1, Meta::new(Criticality::Critical))
        .unwrap()
        .is_empty());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let left = q.close();
    assert!(left.is_empty() || left.len() == 1);
    let mut results = Vec::new();
    for w in waiters {
        results.push(w.await.unwrap());
    }
    let served = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(served + left.len(), 1, "{results:?}");
    assert_eq!(results.iter().filter(|r| r.is_err()).count(), 4 - served);
    assert!(matches!(
        q.push(2, Meta::new(Criticality::Critical)),
        Err(PushError::Closed(2))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_pops_lose_nothing() {
    let q = Arc::new(
        WfqQueue::<u32>::new(WfqConfig {
            capacity: 100_000.try_into().unwrap(),
            admission: QueueAgeConfig::disabled(),
            ..WfqConfig::default()
        })
        .unwrap(),
    );
    let producer = {
        let q = Arc::clone(&q);
        tokio::spawn(async move {
            for i in 0..20_000u32 {
                assert!(q
                    .push(i, Meta::new(Criticality::ALL[(i % 4) as usize]))
                    .unwrap()
                    .is_empty());
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let mut got = Vec::new();
    while got.len() < 20_000 {
        // A pop abandoned at its first wait must not take an item with it.
        if let Ok(Ok(d)) = tokio::time::timeout(Duration::from_micros(50), q.pop()).await {
            got.push(d.into_entry().into_inner());
        }
    }
    producer.await.unwrap();
    got.sort_unstable();
    assert_eq!(got, (0..20_000).collect::<Vec<_>>());
    assert!(q.is_empty());
}
