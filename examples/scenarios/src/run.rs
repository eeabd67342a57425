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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread tokio runtime");
    rt.block_on(run_on(sc, consumer, true))
}
