//! Queue benches, each against its baseline in the same run:
//!
//! - `push_pop/*`: one thread, push then pop, against crossbeam's `ArrayQueue`, a `VecDeque`,
//!   and a naive `Mutex<[VecDeque; 4]>` priority queue; `*_pop_batch32` pushes 32 items one
//!   by one and takes them with one `pop_batch` of 32 (as the runtime's workers do);
//! - `mpmc_async_4p_2c/*`: 4 producer tasks and 2 consumer tasks on 2 tokio workers moving
//!   100,000 items through a bounded queue of 1,024, against a bounded async-channel and tokio's
//!   bounded mpsc;
//! - `refuse/*` and `evict/*`: the cost of the refuse paths (full, overloaded) and of an
//!   eviction, in ns per push;
//! - `runtime_refuse/*`: the runtime's whole admit-or-refuse decision (`Runtime::try_submit`),
//!   metrics included.
//!
//! `cargo bench --bench queue`; figures in BENCHMARKS.md.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use triage::admission::QueueAgeConfig;
use triage::quanta::Clock;
use triage::queue::{Meta, PushError, WfqConfig, WfqQueue};
use triage::runtime::{Ack, Envelope, Job, RefusalPolicy, Runtime, RuntimeConfig};
use triage::{Criticality, PerTier};

fn wfq(capacity: usize) -> WfqQueue<u64> {
    WfqQueue::new(WfqConfig::with_capacity(capacity).admission(QueueAgeConfig::disabled()))
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
    let q = WfqQueue::new(WfqConfig::with_capacity(1024)).expect("valid config");
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
    let q = WfqQueue::new(WfqConfig::with_capacity(1024)).expect("valid config");
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

const MPMC_ITEMS: u64 = 100_000;
const PRODUCERS: u64 = 4;
const CONSUMERS: u64 = 2;

fn mpmc(c: &mut Criterion) {
    // Async consumers: 4 producer tasks, 2 consumer tasks on a 2-thread tokio runtime.
    let mut g = c.benchmark_group("mpmc_async_4p_2c");
    g.throughput(Throughput::Elements(MPMC_ITEMS));
    g.sample_size(10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    g.bench_function("triage_wfq", |b| {
        b.to_async(&rt).iter(|| async {
            let q = Arc::new(wfq(1024));
            let mut hs = Vec::new();
            for p in 0..PRODUCERS {
                let q = Arc::clone(&q);
                hs.push(tokio::spawn(async move {
                    for i in 0..MPMC_ITEMS / PRODUCERS {
                        // A push never waits: an item refused as full is offered again after a
                        // yield (a pop is what makes room), and an evicted item is pushed again,
                        // so that every item arrives, as through a channel.
                        let mut next = (p * MPMC_ITEMS + i, Criticality::ALL[(i & 3) as usize]);
                        loop {
                            match q.push(next.0, Meta::new(next.1)) {
                                Ok(mut evicted) => match evicted.next() {
                                    Some(e) => next = (e.into_inner(), Criticality::Sheddable),
                                    None => break,
                                },
                                Err(PushError::Full(item)) => {
                                    next.0 = item;
                                    tokio::task::yield_now().await;
                                }
                                Err(e) => panic!("push refused: {e}"),
                            }
                        }
                    }
                    0u64
                }));
            }
            for _ in 0..CONSUMERS {
                let q = Arc::clone(&q);
                hs.push(tokio::spawn(async move {
                    let mut n = 0;
                    for _ in 0..MPMC_ITEMS / CONSUMERS {
                        if q.pop().await.is_ok() {
                            n += 1;
                        }
                    }
                    n
                }));
            }
            let mut total = 0;
            for h in hs {
                total += h.await.expect("no panic");
            }
            assert_eq!(total, MPMC_ITEMS);
        })
    });
    g.bench_function("async_channel", |b| {
        b.to_async(&rt).iter(|| async {
            let (tx, rx) = async_channel::bounded(1024);
            let mut hs = Vec::new();
            for p in 0..PRODUCERS {
                let tx = tx.clone();
                hs.push(tokio::spawn(async move {
                    for i in 0..MPMC_ITEMS / PRODUCERS {
                        tx.send(p * MPMC_ITEMS + i).await.expect("open");
                    }
                    0u64
                }));
            }
            for _ in 0..CONSUMERS {
                let rx = rx.clone();
                hs.push(tokio::spawn(async move {
                    let mut n = 0;
                    for _ in 0..MPMC_ITEMS / CONSUMERS {
                        if rx.recv().await.is_ok() {
                            n += 1;
                        }
                    }
                    n
                }));
            }
            let mut total = 0;
            for h in hs {
                total += h.await.expect("no panic");
            }
            assert_eq!(total, MPMC_ITEMS);
        })
    });
    g.bench_function("tokio_mpsc", |b| {
        // tokio's mpsc has one receiver: two consumer tasks share it behind an async mutex,
        // the usual way to fan a tokio channel out to a worker pool.
        b.to_async(&rt).iter(|| async {
            let (tx, rx) = tokio::sync::mpsc::channel(1024);
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            let mut hs = Vec::new();
            for p in 0..PRODUCERS {
                let tx = tx.clone();
                hs.push(tokio::spawn(async move {
                    for i in 0..MPMC_ITEMS / PRODUCERS {
                        tx.send(p * MPMC_ITEMS + i).await.expect("open");
                    }
                    0u64
                }));
            }
            for _ in 0..CONSUMERS {
                let rx = Arc::clone(&rx);
                hs.push(tokio::spawn(async move {
                    let mut n = 0;
                    for _ in 0..MPMC_ITEMS / CONSUMERS {
                        if rx.lock().await.recv().await.is_some() {
                            n += 1;
                        }
                    }
                    n
                }));
            }
            let mut total = 0;
            for h in hs {
                total += h.await.expect("no panic");
            }
            assert_eq!(total, MPMC_ITEMS);
        })
    });
    g.finish();
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
    let q = WfqQueue::with_clock(WfqConfig::with_capacity(64), clock).expect("valid config");
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
        config.queue.capacity = 4.try_into().expect("non-zero");
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
        config.queue.admission = QueueAgeConfig::disabled();
        config.buckets = BucketsConfig::default()
            .with(
                Criticality::High,
                Some(BucketConfig::per_second(1.0).burst(1)),
            )
            .with(
                Criticality::Sheddable,
                Some(BucketConfig::per_second(1.0).burst(1)),
            );
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
            breaker: BreakerConfig {
                min_calls: 1,
                ..BreakerConfig::default()
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

criterion_group!(benches, push_pop, mpmc, refuse_and_evict, runtime_refuse);
criterion_main!(benches);
