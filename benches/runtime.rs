//! The runtime end to end with a no-op handler: 100,000 in-memory messages through the source,
//! admission, the queue, 8 workers and the ledger, against the same messages through a plain
//! async-channel worker pool. `cargo bench --bench runtime`; figures in BENCHMARKS.md.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use triage::admission::QueueAgeConfig;
use triage::runtime::{
    HandlerError, Job, MemoryBroker, RefusalPolicy, Runtime, RuntimeConfig, Source,
};
use triage::{Criticality, PerTier};

const MESSAGES: u64 = 100_000;

fn filled() -> MemoryBroker<u64> {
    let broker = MemoryBroker::new();
    for i in 0..MESSAGES {
        broker.publish(i, Criticality::ALL[(i % 4) as usize], None);
    }
    broker.close();
    broker
}

async fn triage_run(broker: MemoryBroker<u64>) -> Duration {
    let mut config = RuntimeConfig {
        workers: 8.try_into().expect("non-zero"),
        ..RuntimeConfig::default()
    };
    config.queue.admission = QueueAgeConfig::disabled();
    config.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let mut runtime = Runtime::builder(config)
        .start(|job: Job<u64>| async move {
            std::hint::black_box(job.payload());
            Ok::<(), HandlerError>(())
        })
        .expect("valid config");
    let start = Instant::now();
    runtime.attach(broker.source());
    runtime.wait_idle().await;
    let elapsed = start.elapsed();
    let _report = runtime.shutdown(Duration::from_secs(5)).await;
    elapsed
}

async fn plain_run(broker: MemoryBroker<u64>) -> Duration {
    let start = Instant::now();
    let (tx, rx) = async_channel::bounded(1024);
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let rx = rx.clone();
            tokio::spawn(async move {
                while let Ok(env) = rx.recv().await {
                    let env: triage::runtime::Envelope<u64> = env;
                    std::hint::black_box(&env.payload);
                    env.ack.resolve(triage::ledger::Disposition::Completed);
                }
            })
        })
        .collect();
    let mut source = broker.source();
    while let Some(env) = source.next().await {
        tx.send(env).await.expect("open");
    }
    drop(tx);
    for w in workers {
        w.await.expect("no panic");
    }
    start.elapsed()
}

fn runtime(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut g = c.benchmark_group("runtime_100k_noop");
    g.throughput(Throughput::Elements(MESSAGES));
    g.sample_size(10);
    g.bench_function("triage_runtime", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(triage_run(filled()))).sum())
    });
    g.bench_function("plain_async_channel_pool", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| rt.block_on(plain_run(filled()))).sum())
    });
    g.finish();
}

criterion_group!(benches, runtime);
criterion_main!(benches);
