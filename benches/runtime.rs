//! The runtime end to end with a no-op handler: 100,000 in-memory messages through the source,
//! admission, the queue, 8 workers and the ledger, against the same messages through a plain
//! async-channel worker pool. `cargo bench --bench runtime`; figures in BENCHMARKS.md.
//!
//! Before criterion's timing, both pipelines run `BENCH_CPU_RUNS` times each (default 10),
//! interleaved, and the process's CPU time (every thread's time on a CPU) per 100,000
//! messages is printed with the median wall time: on a machine shared with other work, wall
//! time moves with everyone's load, CPU time much less. `BENCH_CPU_ONLY=1` stops there.

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
    config.expert.queue.admission = QueueAgeConfig::disabled();
    if let Some(p) = std::env::var("BENCH_PREFETCH")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.expert.admission.prefetch_per_slot = p;
    }
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

/// CPU time this process has used so far, every thread included: the sum of each thread's
/// time on a CPU in `/proc/self/task/*/schedstat` (nanoseconds, where `/proc/self/stat` counts
/// 10 ms ticks). `None` off Linux.
fn cpu_time() -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        // A thread that ended since the listing has no file any more: its time is lost to
        // both readings alike.
        let Ok(stat) = std::fs::read_to_string(path) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// Both pipelines `runs` times each, interleaved: CPU time per 100,000 messages (mean and
/// median of the runs) and the median wall time.
fn cpu_report(rt: &tokio::runtime::Runtime) {
    let runs: u32 = std::env::var("BENCH_CPU_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
        .max(1);
    let mut cpu: [Vec<Duration>; 2] = Default::default();
    let mut wall: [Vec<Duration>; 2] = Default::default();
    for _ in 0..runs {
        for i in 0..2 {
            let broker = filled();
            let Some(before) = cpu_time() else {
                println!("CPU time unavailable (no /proc/self/task/*/schedstat)");
                return;
            };
            let took = if i == 0 {
                rt.block_on(triage_run(broker))
            } else {
                rt.block_on(plain_run(broker))
            };
            cpu[i].push(cpu_time().unwrap_or(before).saturating_sub(before));
            wall[i].push(took);
        }
    }
    let median = |w: &mut Vec<Duration>| {
        w.sort();
        w[w.len() / 2]
    };
    let mean = |w: &[Duration]| w.iter().sum::<Duration>() / runs;
    let (t_mean, p_mean) = (mean(&cpu[0]), mean(&cpu[1]));
    let [t, p] = &mut cpu;
    let (t_cpu, p_cpu) = (median(t), median(p));
    let [t, p] = &mut wall;
    let (t_wall, p_wall) = (median(t), median(p));
    println!(
        "CPU per 100,000 (median of {runs}): triage {t_cpu:.1?}, plain {p_cpu:.1?}: plain/triage {:.2}x \
         (means {t_mean:.1?}, {p_mean:.1?}: {:.2}x)",
        p_cpu.as_secs_f64() / t_cpu.as_secs_f64(),
        p_mean.as_secs_f64() / t_mean.as_secs_f64()
    );
    println!(
        "wall per 100,000 (median of {runs}): triage {t_wall:.1?}, plain {p_wall:.1?}: plain/triage {:.2}x",
        p_wall.as_secs_f64() / t_wall.as_secs_f64()
    );
}

fn runtime(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::env::var("BENCH_THREADS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2),
        )
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Some(runs) = std::env::var("BENCH_PROFILE_TRIAGE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        // For a profiler: the brokers filled first, then triage's runs alone.
        let brokers: Vec<_> = (0..runs).map(|_| filled()).collect();
        eprintln!("filled");
        std::thread::sleep(Duration::from_secs(2));
        eprintln!("running");
        for broker in brokers {
            rt.block_on(triage_run(broker));
        }
        return;
    }
    cpu_report(&rt);
    if std::env::var_os("BENCH_CPU_ONLY").is_some() {
        return;
    }
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
