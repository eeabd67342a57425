//! Helpers shared by the runtime's test files (`tests/runtime_*.rs`): configurations, gated
//! and failing handlers, a sink that never answers, waiting on virtual time, and a quanta
//! clock that follows tokio's paused clock.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use triage::admission::{PullAdmissionConfig, QueueAgeConfig};
use triage::quanta::Clock;
use triage::queue::WfqConfig;
use triage::runtime::{
    DeadLetterSink, DeferSink, HandlerError, Job, MemoryBroker, RefusalPolicy, Report, Republish,
    RetryConfig, Runtime, RuntimeConfig, SinkError,
};
use triage::PerTier;

/// `workers` workers, a queue of `capacity`, quick retries (3, backoff 1-5 ms) and a 1 ms poll
/// interval.
pub fn config(workers: usize, capacity: usize) -> RuntimeConfig {
    RuntimeConfig {
        workers: workers.try_into().unwrap(),
        retry: RetryConfig { max_retries: 3 },
        expert: triage::runtime::ExpertConfig {
            retry: triage::runtime::BackoffConfig {
                base_backoff_ms: 1,
                max_backoff_ms: 5,
            },
            queue: WfqConfig {
                capacity: capacity.try_into().unwrap(),
                ..WfqConfig::default()
            },
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    }
}

/// One worker, a queue of 4 filled to its capacity by the intake whatever the load signals
/// say, `policy` for every tier but Critical (Backpressure).
pub fn overload_config(policy: RefusalPolicy) -> RuntimeConfig {
    let mut c = config(1, 4);
    c.expert.queue.admission = QueueAgeConfig::disabled();
    // The intake fills the queue to its capacity (not paced to twice the limit), so these tests
    // reach the full-queue refusals they are about whatever the load signal says.
    c.expert.admission = PullAdmissionConfig::disabled();
    c.expert.admission.prefetch_per_slot = 1000;
    c.policy = PerTier::splat(policy);
    c.policy.critical = RefusalPolicy::Backpressure;
    c
}

pub type BoxedResult = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

/// Waits on a gate so the test controls when the workers proceed: one permit per message.
pub fn gated(
    gate: Arc<tokio::sync::Semaphore>,
) -> impl Fn(Job<u32>) -> BoxedResult + Send + Sync + 'static {
    move |_job| {
        let gate = Arc::clone(&gate);
        Box::pin(async move {
            gate.acquire().await.unwrap().forget();
            Ok(())
        })
    }
}

pub fn ok_handler(_job: Job<u32>) -> BoxedResult {
    Box::pin(async { Ok(()) })
}

/// Waits on tokio's clock (paused in these tests: virtual time, not wall-clock) until `done`,
/// for at most a virtual minute; `false` if it never happened.
pub async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .is_ok()
}

/// A quanta clock that follows tokio's paused clock, a millisecond at a time, for a test whose
/// runtime must see time pass (handler runs measured, deadlines passing) while tokio's timers
/// drive it: the mock moves by what tokio's clock moved, on a task of its own.
pub fn following_tokio() -> Clock {
    let (clock, mock) = Clock::mock();
    let start = tokio::time::Instant::now();
    tokio::spawn(async move {
        let mut seen = Duration::ZERO;
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let now = start.elapsed();
            mock.increment(now - seen);
            seen = now;
        }
    });
    clock
}

/// A defer and dead-letter sink whose broker never answers: each publish waits for ever.
#[derive(Default)]
pub struct Hanging {
    started: AtomicU32,
}

impl Hanging {
    fn hang<'a>(&'a self) -> BoxFuture<'a, Result<(), SinkError>> {
        self.started.fetch_add(1, Ordering::Relaxed);
        Box::pin(std::future::pending())
    }

    /// Publishes begun.
    pub fn started(&self) -> u32 {
        self.started.load(Ordering::Relaxed)
    }
}

impl DeferSink<u32> for Hanging {
    fn publish<'a>(&'a self, _: &'a u32, _: &'a Republish) -> BoxFuture<'a, Result<(), SinkError>> {
        self.hang()
    }
}

impl DeadLetterSink<u32> for Hanging {
    fn publish<'a>(&'a self, _: &'a u32, _: &'a Republish) -> BoxFuture<'a, Result<(), SinkError>> {
        self.hang()
    }
}

/// Closes `broker`, lets what is queued finish (3 s), shuts `rt` down and checks its ledger:
/// nothing left alive, every message consumed settled or released.
pub async fn close_and_shut_down<T: Send + Sync + 'static>(
    rt: Runtime<T>,
    broker: &MemoryBroker<T>,
) -> Report {
    broker.close();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = rt.shutdown(Duration::from_secs(10)).await;
    let total = report.stats.ledger.total();
    assert_eq!(report.stats.alive, 0, "{report}");
    assert_eq!(total.consumed, total.settled() + total.released, "{report}");
    report
}
