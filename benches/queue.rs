//! Queue benches, each against its baseline in the same run:
//!
//! - `push_pop/*`: one thread, push then pop, against crossbeam's `ArrayQueue`, a `VecDeque`,
//!   and a naive `Mutex<[VecDeque; 4]>` priority queue; `*_pop_batch32` pushes 32 items one
//!   by one and takes them with one `pop_batch` of 32 (as the runtime's workers do);
//! - `priority_1t/<queue>/{empty,depth512}`: one thread, push then pop, the four tiers in turn,
//!   near empty and at a standing depth of 512 in a queue of 1,024, against the priority queues
//!   a user would reach for instead: a `Mutex<BinaryHeap>` ordered by tier then sequence
//!   (FIFO within a tier, as triage), the `async-priority-channel` crate, and the naive
//!   `Mutex<[VecDeque; 4]>` (strict priority);
//! - `mpmc_async_4p_2c/<queue>/{empty,depth512}`: 4 producer tasks and 2 consumer tasks on 2
//!   tokio workers moving 100,000 items through a queue of 1,024, prefilled to 0 or 512,
//!   against the same heap (waiting on `tokio::sync::Notify`), `async-priority-channel`, and a
//!   bounded async-channel (FIFO, no priority); the mean depth the consumers saw is printed
//!   after the group;
//! - `refuse/*` and `evict/*`: the cost of the refuse paths (full, overloaded) and of an
//!   eviction, in ns per push;
//! - `runtime_refuse/*`: the runtime's whole admit-or-refuse decision (`Runtime::try_submit`),
//!   metrics included.
//!
//! `cargo bench --bench queue`; figures in BENCHMARKS.md.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use triage::admission::QueueAgeConfig;
use triage::quanta::Clock;
use triage::queue::{Meta, PushError, WfqConfig, WfqQueue};
use triage::runtime::{Ack, Envelope, Job, RefusalPolicy, Runtime, RuntimeConfig};
use triage::{Criticality, PerTier};

fn wfq(capacity: usize) -> WfqQueue<u64> {
    WfqQueue::new(WfqConfig {
        capacity: capacity.try_into().unwrap(),
        admission: QueueAgeConfig::disabled(),
        ..WfqConfig::default()
    })
    .expect("valid config")
}

fn push_pop(c: &mut Criterion) {
    let mut g = c.benchmark_group("push_pop");
    g.throughput(Throughput::Elements(1));
    let q = wfq(1024);
    g.bench_function("triage_wfq", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let tier = Criticality::ALL[(i & 3) as usize];
            let _ = q.push(black_box(i), Meta::new(tier));
            black_box(q.try_pop().ok());
        })
    });
    let q = WfqQueue::new(WfqConfig {
        capacity: 1024.try_into().unwrap(),
        ..WfqConfig::default()
    })
    .expect("valid config");
    g.bench_function("triage_wfq_with_admission", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let tier = Criticality::ALL[(i & 3) as usize];
            let _ = q.push(black_box(i), Meta::new(tier));
            black_box(q.try_pop().ok());
        })
    });
    // Pops in batches of 32 (`pop_batch`), as the runtime's workers take them: the lock, the
    // wake-up check and the clock read of a pop are paid once per batch. Time per item.
    let q = WfqQueue::new(WfqConfig {
        capacity: 1024.try_into().unwrap(),
        ..WfqConfig::default()
    })
    .expect("valid config");
    g.bench_function("triage_wfq_with_admission_pop_batch32", |b| {
        let mut i = 0u64;
        let mut out = Vec::new();
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut left = iters;
            while left > 0 {
                let n = left.min(32);
                left -= n;
                for _ in 0..n {
                    i += 1;
                    let tier = Criticality::ALL[(i & 3) as usize];
                    let _ = q.push(black_box(i), Meta::new(tier));
                }
                let _ = q.pop_batch(32, &mut out);
                black_box(out.drain(..).count());
            }
            start.elapsed()
        })
    });
    let aq = crossbeam_queue::ArrayQueue::new(1024);
    g.bench_function("crossbeam_array_queue", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let _ = aq.push(black_box(i));
            black_box(aq.pop());
        })
    });
    let mut vd = VecDeque::with_capacity(1024);
    g.bench_function("vecdeque", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            vd.push_back(black_box(i));
            black_box(vd.pop_front());
        })
    });
    let naive: Mutex<[VecDeque<u64>; 4]> = Mutex::new(Default::default());
    g.bench_function("naive_mutex_4_tiers", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            let mut t = naive.lock().expect("not poisoned");
            t[(i & 3) as usize].push_back(black_box(i));
            drop(t);
            let mut t = naive.lock().expect("not poisoned");
            black_box(t.iter_mut().rev().find_map(|q| q.pop_front()));
        })
    });
    g.finish();
}

/// The bound of the queues compared in the `priority_*` and `mpmc_*` groups, and the standing
/// depth of their deep case: half of it (a queue under overload is deep, not empty).
const CAPACITY: usize = 1024;
const DEPTH: usize = CAPACITY / 2;

/// The depths each priority comparison runs at: near empty, and at a standing half capacity.
const DEPTHS: [(&str, usize); 2] = [("empty", 0), ("depth512", DEPTH)];

/// The tier of item `i`: the four tiers in turn.
fn tier_of(i: u64) -> Criticality {
    Criticality::ALL[(i & 3) as usize]
}

/// A deadline no item reaches during a bench: every pop checks it, none expires.
fn far_deadline(clock: &Clock) -> triage::quanta::Instant {
    clock.now() + Duration::from_secs(3600)
}

/// The priority queue a user writes in a few lines: a binary heap behind a mutex, ordered by
/// tier, then by a sequence number taken under the lock, so that a tier is served oldest first
/// as triage serves it. Bounded by a count, refusing when full; an async consumer waits on a
/// `Notify` that each push signals, and a producer waiting for room on one that each pop
/// signals.
struct HeapQueue<T> {
    inner: Mutex<HeapInner<T>>,
    capacity: usize,
    not_empty: tokio::sync::Notify,
    not_full: tokio::sync::Notify,
}

struct HeapInner<T> {
    heap: BinaryHeap<HeapEntry<T>>,
    seq: u64,
}

/// Ordered by tier (the more critical first), then by age (the older first).
struct HeapEntry<T> {
    rank: u8,
    seq: u64,
    item: T,
}

impl<T> HeapEntry<T> {
    fn key(&self) -> (u8, Reverse<u64>) {
        (self.rank, Reverse(self.seq))
    }
}

impl<T> PartialEq for HeapEntry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<T> Eq for HeapEntry<T> {}

impl<T> PartialOrd for HeapEntry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for HeapEntry<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl<T> HeapQueue<T> {
    fn new(capacity: usize) -> Self {
        HeapQueue {
            inner: Mutex::new(HeapInner {
                heap: BinaryHeap::with_capacity(capacity),
                seq: 0,
            }),
            capacity,
            not_empty: tokio::sync::Notify::new(),
            not_full: tokio::sync::Notify::new(),
        }
    }

    fn try_push(&self, item: T, tier: Criticality) -> Result<(), T> {
        let mut inner = self.inner.lock().expect("not poisoned");
        if inner.heap.len() >= self.capacity {
            return Err(item);
        }
        inner.seq += 1;
        let seq = inner.seq;
        inner.heap.push(HeapEntry {
            rank: tier.rank() as u8,
            seq,
            item,
        });
        Ok(())
    }

    fn try_pop(&self) -> Option<T> {
        let mut inner = self.inner.lock().expect("not poisoned");
        inner.heap.pop().map(|e| e.item)
    }

    async fn push(&self, mut item: T, tier: Criticality) {
        loop {
            match self.try_push(item, tier) {
                Ok(()) => {
                    self.not_empty.notify_one();
                    return;
                }
                Err(back) => {
                    item = back;
                    self.not_full.notified().await;
                }
            }
        }
    }

    async fn pop(&self) -> T {
        loop {
            if let Some(item) = self.try_pop() {
                // Every pop signals: a pop that signalled only when the heap had been full
                // would leave a second waiting producer asleep once the first refilled it.
                self.not_full.notify_one();
                return item;
            }
            self.not_empty.notified().await;
        }
    }

    fn len(&self) -> usize {
        self.inner.lock().expect("not poisoned").heap.len()
    }
}

/// async-priority-channel's priority: the tier, then the order of sending (the crate's heap
/// does not keep the order of equal priorities, so FIFO within a tier needs the sequence).
type ChannelPriority = (u8, Reverse<u64>);

fn channel_priority(tier: Criticality, seq: u64) -> ChannelPriority {
    (tier.rank() as u8, Reverse(seq))
}

/// One thread: push then pop of one `u64`, the tiers in turn, near empty and at a standing
/// depth of half the capacity (the pop takes the most critical item, so at depth the queue
/// holds the lowest tiers' backlog and a pushed item of a higher tier goes to its front).
fn priority_single_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("priority_1t");
    g.throughput(Throughput::Elements(1));
    for (label, depth) in DEPTHS {
        let q = wfq(CAPACITY);
        let far = far_deadline(q.clock());
        for i in 0..depth as u64 {
            assert!(q.push(i, Meta::new(tier_of(i)).deadline(far)).is_ok());
        }
        g.bench_function(BenchmarkId::new("triage_wfq", label), |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                let _ = q.push(black_box(i), Meta::new(tier_of(i)).deadline(far));
                black_box(q.try_pop().ok());
            })
        });
        assert_eq!(q.len(), depth, "the standing depth held");

        let heap = HeapQueue::new(CAPACITY);
        for i in 0..depth as u64 {
            assert!(heap.try_push(i, tier_of(i)).is_ok());
        }
        g.bench_function(BenchmarkId::new("mutex_binary_heap", label), |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                let _ = heap.try_push(black_box(i), tier_of(i));
                black_box(heap.try_pop());
            })
        });
        assert_eq!(heap.len(), depth, "the standing depth held");

        let (tx, rx) = async_priority_channel::bounded(CAPACITY as u64);
        let mut seq = 0u64;
        for i in 0..depth as u64 {
            seq += 1;
            assert!(tx.try_send(i, channel_priority(tier_of(i), seq)).is_ok());
        }
        g.bench_function(BenchmarkId::new("async_priority_channel", label), |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                seq += 1;
                let _ = tx.try_send(black_box(i), channel_priority(tier_of(i), seq));
                black_box(rx.try_recv().ok());
            })
        });
        assert_eq!(rx.len(), depth as u64, "the standing depth held");

        let naive: Mutex<[VecDeque<u64>; 4]> = Mutex::new(Default::default());
        for i in 0..depth as u64 {
            naive.lock().expect("not poisoned")[tier_of(i).rank()].push_back(i);
        }
        g.bench_function(BenchmarkId::new("naive_mutex_4_tiers", label), |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                let mut t = naive.lock().expect("not poisoned");
                t[tier_of(i).rank()].push_back(black_box(i));
                drop(t);
                let mut t = naive.lock().expect("not poisoned");
                black_box(t.iter_mut().rev().find_map(|q| q.pop_front()));
            })
        });
    }
    g.finish();
}

const MPMC_ITEMS: u64 = 100_000;
const PRODUCERS: u64 = 4;
const CONSUMERS: u64 = 2;

/// A bounded queue moved through by async producers and consumers: `push` waits for room (or
/// stands in for it), `pop` waits for an item.
trait MpmcQueue: Send + Sync + 'static {
    fn with_capacity(capacity: usize) -> Self;
    fn push(&self, item: u64, tier: Criticality) -> impl Future<Output = ()> + Send;
    fn pop(&self) -> impl Future<Output = ()> + Send;
    fn depth(&self) -> usize;
}

/// triage's queue with admission off (every item must arrive, as through a channel) and a
/// deadline on every item. A push never waits: an item refused as full is offered again after
/// a yield (a pop is what makes room), and one evicted for a more critical item is pushed
/// again, so every item arrives; the queue's evictions are part of what is timed.
struct Wfq {
    queue: WfqQueue<u64>,
    deadline: triage::quanta::Instant,
}

impl MpmcQueue for Wfq {
    fn with_capacity(capacity: usize) -> Self {
        let queue = wfq(capacity);
        let deadline = far_deadline(queue.clock());
        Wfq { queue, deadline }
    }

    async fn push(&self, mut item: u64, mut tier: Criticality) {
        loop {
            match self
                .queue
                .push(item, Meta::new(tier).deadline(self.deadline))
            {
                Ok(mut evicted) => match evicted.next() {
                    Some(e) => {
                        tier = e.entry().criticality();
                        item = e.into_inner();
                    }
                    None => return,
                },
                Err(PushError::Full(back)) => {
                    item = back;
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("push refused: {e}"),
            }
        }
    }

    async fn pop(&self) {
        black_box(
            self.queue
                .pop()
                .await
                .expect("open")
                .ready()
                .expect("none expires"),
        );
    }

    fn depth(&self) -> usize {
        self.queue.len()
    }
}

impl MpmcQueue for HeapQueue<u64> {
    fn with_capacity(capacity: usize) -> Self {
        HeapQueue::new(capacity)
    }

    fn push(&self, item: u64, tier: Criticality) -> impl Future<Output = ()> + Send {
        HeapQueue::push(self, item, tier)
    }

    async fn pop(&self) {
        black_box(HeapQueue::pop(self).await);
    }

    fn depth(&self) -> usize {
        self.len()
    }
}

/// async-priority-channel, FIFO within a tier by a sequence number every producer takes from
/// one shared counter.
struct PriorityChannel {
    tx: async_priority_channel::Sender<u64, ChannelPriority>,
    rx: async_priority_channel::Receiver<u64, ChannelPriority>,
    seq: AtomicU64,
}

impl MpmcQueue for PriorityChannel {
    fn with_capacity(capacity: usize) -> Self {
        let (tx, rx) = async_priority_channel::bounded(capacity as u64);
        PriorityChannel {
            tx,
            rx,
            seq: AtomicU64::new(0),
        }
    }

    async fn push(&self, item: u64, tier: Criticality) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.tx
            .send(item, channel_priority(tier, seq))
            .await
            .expect("open");
    }

    async fn pop(&self) {
        black_box(self.rx.recv().await.expect("open"));
    }

    fn depth(&self) -> usize {
        self.rx.len() as usize
    }
}

/// A FIFO channel, no priority: what moving the items costs without ordering them.
struct FifoChannel {
    tx: async_channel::Sender<u64>,
    rx: async_channel::Receiver<u64>,
}

impl MpmcQueue for FifoChannel {
    fn with_capacity(capacity: usize) -> Self {
        let (tx, rx) = async_channel::bounded(capacity);
        FifoChannel { tx, rx }
    }

    async fn push(&self, item: u64, _tier: Criticality) {
        self.tx.send(item).await.expect("open");
    }

    async fn pop(&self) {
        black_box(self.rx.recv().await.expect("open"));
    }

    fn depth(&self) -> usize {
        self.rx.len()
    }
}

/// Mean depths seen by the consumers, per bench, printed after the group: the check that the
/// deep case stayed deep and the empty one near empty.
static DEPTH_SEEN: Mutex<Vec<(String, u64, u64)>> = Mutex::new(Vec::new());

/// The two regimes of the 4p/2c bench: near empty, where each producer yields after each push
/// so that the consumers keep up (they wait, and pushes wake them), and deep, prefilled with
/// half the capacity and the producers free-running (they outrun the consumers, so the queue
/// swings between full and well below, about half full on average; the consumers' mean depth
/// is printed after the group).
const MPMC_CASES: [(&str, usize, bool); 2] = [("empty", 0, true), ("depth512", DEPTH, false)];

/// One run: `prefill` items queued first (untimed), then 4 producer tasks push 100,000 items
/// (the tiers in turn; each yielding after each push when `paced`) while 2 consumer tasks pop
/// as many. The queue ends as deep as it started. Returns the time from the start to the last
/// pop; the consumers read the depth every 256 pops.
async fn mpmc_run<Q: MpmcQueue>(prefill: usize, paced: bool, name: &str) -> Duration {
    let q = Arc::new(Q::with_capacity(CAPACITY));
    for i in 0..prefill as u64 {
        q.push(u64::MAX - i, tier_of(i)).await;
    }
    let start = Instant::now();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                for i in 0..MPMC_ITEMS / PRODUCERS {
                    q.push(p * MPMC_ITEMS + i, tier_of(i)).await;
                    if paced {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                let (mut sum, mut samples) = (0u64, 0u64);
                for n in 0..MPMC_ITEMS / CONSUMERS {
                    q.pop().await;
                    if n % 256 == 0 {
                        sum += q.depth() as u64;
                        samples += 1;
                    }
                }
                (sum, samples)
            })
        })
        .collect();
    let (mut sum, mut samples) = (0, 0);
    for c in consumers {
        let (s, n) = c.await.expect("no panic");
        sum += s;
        samples += n;
    }
    let elapsed = start.elapsed();
    for p in producers {
        p.await.expect("no panic");
    }
    assert_eq!(q.depth(), prefill, "every item arrived");
    DEPTH_SEEN
        .lock()
        .expect("not poisoned")
        .push((name.to_owned(), sum, samples));
    elapsed
}

fn bench_mpmc<Q: MpmcQueue>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    name: &str,
) {
    for (label, depth, paced) in MPMC_CASES {
        let id = format!("{name}/{label}");
        g.bench_function(BenchmarkId::new(name, label), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let id = id.clone();
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += mpmc_run::<Q>(depth, paced, &id).await;
                    }
                    total
                }
            })
        });
    }
}

/// 4 producer tasks and 2 consumer tasks on a 2-thread tokio runtime, near empty and deep
/// ([`MPMC_CASES`]).
fn mpmc(c: &mut Criterion) {
    let mut g = c.benchmark_group("mpmc_async_4p_2c");
    g.throughput(Throughput::Elements(MPMC_ITEMS));
    g.sample_size(10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    bench_mpmc::<Wfq>(&mut g, &rt, "triage_wfq");
    bench_mpmc::<HeapQueue<u64>>(&mut g, &rt, "mutex_binary_heap");
    bench_mpmc::<PriorityChannel>(&mut g, &rt, "async_priority_channel");
    bench_mpmc::<FifoChannel>(&mut g, &rt, "async_channel");
    g.finish();
    let seen = std::mem::take(&mut *DEPTH_SEEN.lock().expect("not poisoned"));
    let mut names: Vec<&str> = seen.iter().map(|(n, _, _)| n.as_str()).collect();
    names.dedup();
    for name in names {
        let (sum, samples) = seen
            .iter()
            .filter(|(n, _, _)| n == name)
            .fold((0, 0), |(s, k), (_, a, b)| (s + a, k + b));
        eprintln!(
            "mpmc_async_4p_2c/{name}: mean depth seen by the consumers {:.0} of {CAPACITY}",
            sum as f64 / samples.max(1) as f64
        );
    }
}

fn refuse_and_evict(c: &mut Criterion) {
    let mut g = c.benchmark_group("refuse");
    g.throughput(Throughput::Elements(1));
    let q = wfq(4);
    for i in 0..4 {
        let _ = q.push(i, Meta::new(Criticality::Sheddable));
    }
    g.bench_function("full_nothing_lower", |b| {
        b.iter(|| {
            black_box(
                q.push(black_box(7), Meta::new(Criticality::Sheddable))
                    .is_err(),
            )
        })
    });
    let (clock, mock) = Clock::mock();
    let q = WfqQueue::with_clock(
        WfqConfig {
            capacity: 64.try_into().unwrap(),
            ..WfqConfig::default()
        },
        clock,
    )
    .expect("valid config");
    let _ = q.push(0, Meta::new(Criticality::Critical));
    mock.increment(Duration::from_secs(1));
    let _ = q.push(1, Meta::new(Criticality::Critical));
    assert_eq!(q.shed_level(), 4);
    g.bench_function("overloaded_admission", |b| {
        b.iter(|| black_box(q.push(black_box(7), Meta::new(Criticality::High)).is_err()))
    });
    g.finish();

    let mut g = c.benchmark_group("evict");
    g.throughput(Throughput::Elements(1));
    g.bench_function("evict_newest_lowest", |b| {
        b.iter_batched_ref(
            || {
                let q = wfq(1024);
                for i in 0..1024 {
                    let _ = q.push(i, Meta::new(Criticality::ALL[3 - (i % 3) as usize]));
                }
                q
            },
            |q| {
                for i in 0..512 {
                    black_box(q.push(black_box(i), Meta::new(Criticality::Critical)).ok());
                }
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn runtime_refuse(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut g = c.benchmark_group("runtime_refuse");
    g.throughput(Throughput::Elements(1));
    let (clock, mock) = Clock::mock();
    let runtime = rt.block_on(async {
        let mut config = RuntimeConfig {
            workers: 1.try_into().expect("non-zero"),
            ..RuntimeConfig::default()
        };
        config.expert.queue.capacity = 4.try_into().expect("non-zero");
        config.policy = PerTier::new(
            RefusalPolicy::Backpressure,
            RefusalPolicy::Backpressure,
            RefusalPolicy::Drop,
            RefusalPolicy::Drop,
        );
        let runtime = Runtime::builder(config)
            .clock(clock)
            .start(|_job: Job<u64>| async {
                std::future::pending::<()>().await;
                Ok(())
            })
            .expect("valid config");
        for i in 0..5 {
            let _ = runtime.try_submit(Envelope::new(i, Criticality::Sheddable, Ack::noop()));
            tokio::task::yield_now().await;
        }
        runtime
    });
    g.bench_function("drop_policy_queue_full", |b| {
        b.iter_batched(
            || Envelope::new(7u64, Criticality::Sheddable, Ack::noop()),
            |e| black_box(runtime.try_submit(e).is_ok()),
            BatchSize::SmallInput,
        )
    });
    rt.block_on(async {
        mock.increment(Duration::from_secs(1));
        let _ = runtime.try_submit(Envelope::new(9, Criticality::Critical, Ack::noop()));
    });
    g.bench_function("backpressure_overloaded", |b| {
        b.iter_batched(
            || Envelope::new(7u64, Criticality::High, Ack::noop()),
            |e| black_box(runtime.try_submit(e).is_err()),
            BatchSize::SmallInput,
        )
    });
    g.finish();
    let _report = rt.block_on(runtime.shutdown(Duration::from_millis(100)));
    runtime_refuse_rate(c);
    runtime_refuse_circuit(c);
}

/// The reject path for reason `rate`: Sheddable's token bucket is empty (one token, a virtual
/// clock that never refills it), so every offer is one compare-and-swap that fails, then the
/// refusal (Drop: counted, settled `Shed`; Backpressure: the message handed back as
/// `RateLimited`).
fn runtime_refuse_rate(c: &mut Criterion) {
    use triage::admission::{BucketConfig, BucketsConfig, QueueAgeConfig};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut g = c.benchmark_group("runtime_refuse");
    g.throughput(Throughput::Elements(1));
    let (clock, _mock) = Clock::mock();
    let runtime = rt.block_on(async {
        let mut config = RuntimeConfig {
            workers: 1.try_into().expect("non-zero"),
            ..RuntimeConfig::default()
        };
        config.expert.queue.admission = QueueAgeConfig::disabled();
        config.buckets = BucketsConfig {
            high: Some(BucketConfig {
                rate: Some(1.0),
                burst: Some(1),
                ..BucketConfig::default()
            }),
            sheddable: Some(BucketConfig {
                rate: Some(1.0),
                burst: Some(1),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        };
        config.policy = PerTier::new(
            RefusalPolicy::Backpressure,
            RefusalPolicy::Backpressure,
            RefusalPolicy::Drop,
            RefusalPolicy::Drop,
        );
        let runtime = Runtime::builder(config)
            .clock(clock)
            .start(|_job: Job<u64>| async {
                std::future::pending::<()>().await;
                Ok(())
            })
            .expect("valid config");
        // Spend each bucket's one token.
        let _ = runtime.try_submit(Envelope::new(0, Criticality::Sheddable, Ack::noop()));
        let _ = runtime.try_submit(Envelope::new(1, Criticality::High, Ack::noop()));
        runtime
    });
    g.bench_function("drop_policy_rate", |b| {
        b.iter_batched(
            || Envelope::new(7u64, Criticality::Sheddable, Ack::noop()),
            |e| black_box(runtime.try_submit(e).is_ok()),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("backpressure_rate", |b| {
        b.iter_batched(
            || Envelope::new(7u64, Criticality::High, Ack::noop()),
            |e| black_box(runtime.try_submit(e).is_err()),
            BatchSize::SmallInput,
        )
    });
    g.finish();
    let _report = rt.block_on(runtime.shutdown(Duration::from_millis(100)));
}

/// The reject path for reason `circuit`: every message maps to `payments`, whose circuit is
/// open, so every offer is the key's lookup (a hash of a borrowed `&str`, an `Arc` clone), one
/// atomic load and a clock read, then the refusal (Drop: counted, settled `Shed`;
/// Backpressure: the message handed back as `CircuitOpen`).
fn runtime_refuse_circuit(c: &mut Criterion) {
    use triage::admission::BreakerConfig;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut g = c.benchmark_group("runtime_refuse");
    g.throughput(Throughput::Elements(1));
    let (clock, _mock) = Clock::mock();
    let runtime = rt.block_on(async {
        let mut config = RuntimeConfig {
            workers: 1.try_into().expect("non-zero"),
            expert: triage::runtime::ExpertConfig {
                breaker: BreakerConfig {
                    min_calls: 1,
                    ..BreakerConfig::default()
                },
                ..triage::runtime::ExpertConfig::default()
            },
            ..RuntimeConfig::default()
        };
        config.policy = PerTier::new(
            RefusalPolicy::Backpressure,
            RefusalPolicy::Backpressure,
            RefusalPolicy::Drop,
            RefusalPolicy::Drop,
        );
        let runtime = Runtime::builder(config)
            .clock(clock)
            .downstream(|m: &(&'static str, u64)| Some(m.0))
            .start(|_job: Job<(&'static str, u64)>| async { Ok(()) })
            .expect("valid config");
        runtime.breakers().record_failure("payments");
        runtime
    });
    g.bench_function("drop_policy_circuit", |b| {
        b.iter_batched(
            || Envelope::new(("payments", 7u64), Criticality::Sheddable, Ack::noop()),
            |e| black_box(runtime.try_submit(e).is_ok()),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("backpressure_circuit", |b| {
        b.iter_batched(
            || Envelope::new(("payments", 7u64), Criticality::High, Ack::noop()),
            |e| black_box(runtime.try_submit(e).is_err()),
            BatchSize::SmallInput,
        )
    });
    g.finish();
    let _report = rt.block_on(runtime.shutdown(Duration::from_millis(100)));
}

criterion_group!(
    benches,
    push_pop,
    priority_single_thread,
    mpmc,
    refuse_and_evict,
    runtime_refuse
);
criterion_main!(benches);
