//! Running a scenario: in virtual time (tokio's paused clock on one thread, the quanta mock
//! following it; the same seed gives the same ledger) or in real time (the cross-check).

use std::time::Duration;

use crate::clock::RunClock;
use crate::consumer::Consumer;
use crate::fifo::run_fifo;
use crate::outcome::Outcome;
use crate::scenario::Scenario;
use crate::triaged::run_triage;

/// Runs `sc` through `consumer` on the clock the current tokio runtime gives: call it inside
/// a paused runtime for virtual time (with the global `fastrand` seeded, for the retry
/// backoff's jitter), or a running one for real time.
pub async fn run_on(sc: &Scenario, consumer: &Consumer, real_time: bool) -> Outcome {
    let clock = if real_time {
        RunClock::system()
    } else {
        RunClock::following_tokio()
    };
    // Let the follower take its first step, so that the run starts on a settled clock.
    tokio::time::sleep(Duration::from_millis(1)).await;
    match consumer {
        Consumer::Fifo { capacity } => run_fifo(sc, *capacity, &clock.clock).await,
        Consumer::Triage(config) => run_triage(sc, (**config).clone(), &clock.clock).await,
    }
}

/// Runs `sc` through `consumer` in virtual time, on a tokio runtime of its own on this thread.
///
/// # Panics
///
/// If the tokio runtime cannot be built.
pub fn run_virtual(sc: &Scenario, consumer: &Consumer) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread tokio runtime");
    // The runtime's retry backoff draws its jitter from the thread's generator.
    fastrand::seed(sc.seed);
    rt.block_on(run_on(sc, consumer, false))
}

/// Runs `sc` through `consumer` in real time (it takes as long as the scenario lasts).
///
/// # Panics
///
/// If the tokio runtime cannot be built.
pub fn run_real_time(sc: &Scenario, consumer: &Consumer) -> Outcome {
    real_time_runtime().block_on(run_on(sc, consumer, true))
}

fn real_time_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread tokio runtime")
}

/// The workers' capacity on real timers, messages per second: `sc.workers` tasks calling
/// sleep for the drawn service times back to back for `over`.
///
/// # Panics
///
/// If the tokio runtime cannot be built.
pub fn real_capacity(sc: &Scenario, over: Duration) -> f64 {
    real_time_runtime().block_on(async {
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for w in 0..sc.workers as u64 {
            let service = sc.service;
            let seed = sc.seed;
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while start.elapsed() < over {
                    let id = w * 1_000_000 + n;
                    tokio::time::sleep(service.draw(seed, id, 0, Duration::ZERO)).await;
                    n += 1;
                }
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap_or(0);
        }
        total as f64 / start.elapsed().as_secs_f64()
    })
}
