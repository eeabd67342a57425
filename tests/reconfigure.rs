//! Live reconfiguration of a running runtime (issue 12): weights and cut-offs switch and the
//! dequeue shares follow; an invalid configuration changes nothing; a shrinking queue evicts
//! by the push rule and every evicted message ends in one disposition; the operator's forced
//! shed and brownout levels; reloading the configuration file.
//!
//! Time comes from quanta's mock clock (queue ages, deadlines) and tokio's paused clock; the
//! handlers are gated by a semaphore the test opens a number of pops at a time, so the pop
//! order is the queue's alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::admission::QueueAgeConfig;
use triage::ledger::Disposition;
use triage::queue::WfqConfig;
use triage::runtime::{
    Ack, Envelope, HandlerError, Job, MemoryBroker, MemorySink, ReconfigureError, RefusalPolicy,
    Runtime, RuntimeConfig, SubmitError,
};
use triage::{Criticality, PerTier};

/// One worker, a fixed limit of 1 (every tier's share is then 1 slot), a large queue, and
/// Backpressure everywhere so that a refusal comes back to `try_submit`'s caller.
fn one_worker() -> RuntimeConfig {
    RuntimeConfig {
        workers: 1.try_into().unwrap(),
        policy: PerTier::splat(RefusalPolicy::Backpressure),
        expert: triage::runtime::ExpertConfig {
            queue: WfqConfig {
                capacity: 20_000.try_into().unwrap(),
                ..WfqConfig::default()
            },
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    }
}

/// A handler that waits for a permit per message and records the order it was served in.
struct Gated {
    gate: Arc<tokio::sync::Semaphore>,
    served: Arc<Mutex<Vec<(u32, Criticality, u8)>>>,
}

impl Gated {
    fn new() -> Self {
        Gated {
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            served: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn handler(&self) -> impl Fn(Job<u32>) -> futures_like::BoxFut + Send + Sync + 'static {
        let gate = Arc::clone(&self.gate);
        let served = Arc::clone(&self.served);
        move |job: Job<u32>| {
            let gate = Arc::clone(&gate);
            let served = Arc::clone(&served);
            Box::pin(async move {
                gate.acquire().await.expect("never closed").forget();
                served
                    .lock()
                    .push((*job.payload(), job.criticality(), job.brownout()));
                Ok::<(), HandlerError>(())
            })
        }
    }

    /// Lets `n` more messages through and waits until they are served.
    async fn serve(&self, n: usize) {
        let target = self.served.lock().len() + n;
        self.gate.add_permits(n);
        while self.served.lock().len() < target {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Per-tier counts of the messages served in `range` (0-based serve order).
    fn shares(&self, range: std::ops::Range<usize>) -> [usize; 4] {
        let served = self.served.lock();
        let mut out = [0; 4];
        for (_, tier, _) in &served[range] {
            out[Criticality::ALL.iter().position(|t| t == tier).unwrap()] += 1;
        }
        out
    }
}

mod futures_like {
    pub type BoxFut = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), triage::runtime::HandlerError>> + Send>,
    >;
}

fn submit(rt: &Runtime<u32>, id: u32, tier: Criticality) -> Result<(), SubmitError<u32>> {
    rt.try_submit(Envelope::new(id, tier, Ack::noop()))
}

/// Submits `per_tier` messages of each tier, interleaved, with ids from 0.
fn fill(rt: &Runtime<u32>, per_tier: u32) {
    for i in 0..per_tier {
        for (k, tier) in Criticality::ALL.into_iter().enumerate() {
            submit(rt, i * 4 + k as u32, tier).unwrap();
        }
    }
}

/// `counts` (Critical first) against `weights`' shares of `total` pops, within `slack`.
fn assert_shares(counts: [usize; 4], weights: [u32; 4], slack: f64) {
    let total: usize = counts.iter().sum();
    let sum: u32 = weights.iter().sum();
    for (i, tier) in Criticality::ALL.into_iter().enumerate() {
        let expected = total as f64 * f64::from(weights[i]) / f64::from(sum);
        assert!(
            (counts[i] as f64 - expected).abs() <= slack,
            "{tier:?}: {} served, expected {expected:.1} of {total} at weights {weights:?} \
             (all counts {counts:?})",
            counts[i]
        );
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn weights_and_cutoffs_switch_live_and_the_shares_follow() {
    let (clock, mock) = quanta::Clock::mock();
    let gated = Gated::new();
    let rt = Runtime::builder(one_worker())
        .clock(clock)
        .start(gated.handler())
        .unwrap();
    fill(&rt, 3_000);

    // Default weights 8/4/2/1.
    gated.serve(1_000).await;
    let before = gated.shares(0..1_000);
    assert_shares(before, [8, 4, 2, 1], 1.0);

    // Inverted, live. The worker already holds the 1,001st pop (taken under the old weights).
    let mut config = RuntimeConfig::clone(&rt.config());
    config.expert.queue.weights =
        PerTier::new(1, 2, 4, 8).map(|_, w| triage::queue::Weight::new(w).unwrap());
    let done = rt.reconfigure(config).unwrap();
    assert_eq!(done.generation, 2);
    assert_eq!(
        done.changes,
        [
            "expert.queue.weights.critical: 8 -> 1",
            "expert.queue.weights.high: 4 -> 2",
            "expert.queue.weights.medium: 2 -> 4",
            "expert.queue.weights.sheddable: 1 -> 8",
        ]
    );
    assert_eq!(rt.config_generation(), 2);
    gated.serve(1_000).await;
    let after = gated.shares(1_000..2_000);
    // Within 4 of the exact shares (0.4% of the pops): the 1,001st pop was taken under the old
    // weights, and the stride scheduler's pass values carry over one round.
    assert_shares(after, [1, 2, 4, 8], 4.0);

    // Cut-offs: the oldest message has waited 40 ms, past Sheddable's 20 ms cut-off.
    mock.increment(Duration::from_millis(40));
    submit(&rt, 100_000, Criticality::Critical).unwrap(); // a push re-evaluates admission
    let refused = submit(&rt, 100_001, Criticality::Sheddable).unwrap_err();
    assert!(matches!(refused, SubmitError::Overloaded(_)), "{refused:?}");
    assert_eq!(rt.load().shed_tiers(), 1);
    // Raised live to 100 ms: 40 ms is below half of it (the exit ratio), so Sheddable is
    // admitted again at once.
    let mut config = RuntimeConfig::clone(&rt.config());
    config.expert.queue.admission = QueueAgeConfig {
        cutoff_ms: PerTier::new(400, 200, 150, 100),
        ..QueueAgeConfig::default()
    };
    let done = rt.reconfigure(config).unwrap();
    assert_eq!(done.generation, 3);
    assert_eq!(
        done.changes,
        [
            "expert.queue.admission.cutoff_ms.medium: 80 -> 150",
            "expert.queue.admission.cutoff_ms.sheddable: 20 -> 100",
        ]
    );
    submit(&rt, 100_002, Criticality::Sheddable).unwrap();
    assert_eq!(rt.load().shed_tiers(), 0);

    gated.gate.add_permits(100_000);
    drop(rt);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_invalid_config_is_refused_naming_the_field_and_changes_nothing() {
    let (clock, _mock) = quanta::Clock::mock();
    let gated = Gated::new();
    let rt = Runtime::builder(one_worker())
        .clock(clock)
        .start(gated.handler())
        .unwrap();
    fill(&rt, 3_000);
    let original = rt.config();

    // Valid new weights beside one value out of range: nothing of it applies.
    let mut bad = RuntimeConfig::clone(&original);
    bad.expert.queue.weights =
        PerTier::new(1, 2, 4, 8).map(|_, w| triage::queue::Weight::new(w).unwrap());
    bad.forced_shed_level = 2;
    bad.retry.max_retries = 1_000;
    let err = rt.reconfigure(bad.clone()).unwrap_err();
    assert_eq!(err.field(), Some("retry.max_retries"));
    assert_eq!(
        err.to_string(),
        "configuration refused, the one in force stays: retry.max_retries = 1000 is out of \
         range: allowed 0..=100"
    );
    assert_eq!(*rt.config(), *original);
    assert_eq!(rt.config_generation(), 1);

    // A setting that cannot change while running, named with the value in force.
    bad.retry.max_retries = 3;
    bad.workers = 4.try_into().unwrap();
    let err = rt.reconfigure(bad.clone()).unwrap_err();
    assert_eq!(err.field(), Some("workers"));
    assert!(
        err.to_string().contains("allowed 1 (the value in force"),
        "{err}"
    );
    assert_eq!(*rt.config(), *original);

    // A defer policy without a defer sink.
    bad.workers = 1.try_into().unwrap();
    bad.policy.medium = RefusalPolicy::Defer;
    let err = rt.reconfigure(bad).unwrap_err();
    assert_eq!(err.field(), Some("policy.medium"));
    assert_eq!(*rt.config(), *original);
    assert_eq!(rt.config_generation(), 1);
    assert_eq!(rt.config_refused(), 3);

    // Behaviour unchanged: the old weights still rule the pops, nothing is forced.
    gated.serve(1_000).await;
    assert_shares(gated.shares(0..1_000), [8, 4, 2, 1], 1.0);
    submit(&rt, 200_000, Criticality::Sheddable).unwrap();

    gated.gate.add_permits(100_000);
    drop(rt);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shrinking_the_queue_evicts_newest_of_lowest_tier_each_once() {
    let (clock, _mock) = quanta::Clock::mock();
    let gated = Gated::new();
    let dispositions = Arc::new(Mutex::new(Vec::<(u32, Disposition)>::new()));
    let seen = Arc::clone(&dispositions);
    let sink = Arc::new(MemorySink::new());
    let mut config = one_worker();
    config.expert.queue = WfqConfig {
        capacity: 200.try_into().unwrap(),
        ..WfqConfig::default()
    };
    config.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Drop,
        RefusalPolicy::Defer,
        RefusalPolicy::Drop,
    );
    let rt = Runtime::builder(config)
        .clock(clock)
        .defer_sink(Arc::clone(&sink))
        .observe(move |id: &u32, _, d| seen.lock().push((*id, d)))
        .start(gated.handler())
        .unwrap();
    // 40 Critical (ids 0..40), 30 High (100..130), 20 Medium (200..220), 10 Sheddable
    // (300..310), each tier oldest first.
    let counts = [40u32, 30, 20, 10];
    for (k, tier) in Criticality::ALL.into_iter().enumerate() {
        for i in 0..counts[k] {
            submit(&rt, k as u32 * 100 + i, tier).unwrap();
        }
    }
    // The worker takes the first pop (a Critical message) and waits at the gate.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(rt.stats().queued, 99);

    let mut smaller = RuntimeConfig::clone(&rt.config());
    smaller.expert.queue.capacity = 50.try_into().unwrap();
    let done = rt.reconfigure(smaller).unwrap();
    assert_eq!(done.changes, ["expert.queue.capacity: 200 -> 50"]);
    // 49 out: all of Sheddable, all of Medium, then the newest 19 of High.
    assert_eq!(done.evicted, PerTier::new(0, 19, 20, 10));
    assert_eq!(rt.stats().queued, 50);

    gated.gate.add_permits(10_000);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");

    let mut by_id: HashMap<u32, Vec<Disposition>> = HashMap::new();
    for (id, d) in dispositions.lock().iter() {
        by_id.entry(*id).or_default().push(*d);
    }
    assert_eq!(by_id.len(), 100, "every message ends once");
    for (id, ds) in &by_id {
        assert_eq!(ds.len(), 1, "message {id}: {ds:?}");
        let expected = match id {
            0..=39 => Disposition::Completed,
            100..=110 => Disposition::Completed,
            111..=129 => Disposition::Shed, // the newest 19 High, dropped by policy
            200..=219 => Disposition::Deferred,
            300..=309 => Disposition::Shed,
            _ => unreachable!("{id}"),
        };
        assert_eq!(ds[0], expected, "message {id}");
    }
    assert_eq!(sink.len(), 20);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn forced_shed_level_refuses_the_bottom_tiers_and_brownout_reaches_the_job() {
    let broker = MemoryBroker::new();
    let gated = Gated::new();
    gated.gate.add_permits(1_000_000);
    let mut rt = Runtime::builder(RuntimeConfig {
        expert: triage::runtime::ExpertConfig {
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    })
    .start(gated.handler())
    .unwrap();

    let mut config = RuntimeConfig::clone(&rt.config());
    config.forced_shed_level = 2;
    config.brownout_level = 3;
    let done = rt.reconfigure(config.clone()).unwrap();
    assert_eq!(
        done.changes,
        ["brownout_level: 0 -> 3", "forced_shed_level: 0 -> 2"]
    );
    assert_eq!(rt.load().shed_tiers(), 2);

    // Nothing is loaded, and still Medium and Sheddable are refused: Drop without a sink.
    for i in 0..400u32 {
        broker.publish(i, Criticality::ALL[(i % 4) as usize], None);
    }
    broker.close();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let acks = broker.acks();
    assert_eq!(acks.completed, 200, "{acks:?}");
    assert_eq!(acks.shed, 200, "{acks:?}");
    let stats = rt.stats();
    assert_eq!(stats.refused, PerTier::new(0, 0, 100, 100));
    // A capacity decision (the operator says capacity is short), under reason `forced`.
    let decisions = rt.decisions();
    assert_eq!(decisions.medium.shed_capacity, 100);
    assert_eq!(decisions.sheddable.shed_capacity, 100);
    assert_eq!(decisions.high.admitted, 100);
    let served = gated.served.lock().clone();
    assert!(served
        .iter()
        .all(|(_, t, b)| t.rank() >= Criticality::High.rank() && *b == 3));

    // Level 3 refuses High too: under Backpressure it comes back to the caller.
    config.forced_shed_level = 3;
    rt.reconfigure(config.clone()).unwrap();
    let back = submit(&rt, 9_000, Criticality::High).unwrap_err();
    assert!(matches!(back, SubmitError::Overloaded(_)), "{back:?}");
    submit(&rt, 9_001, Criticality::Critical).unwrap();

    // Back to 0: everything admitted, full service.
    config.forced_shed_level = 0;
    config.brownout_level = 0;
    let done = rt.reconfigure(config).unwrap();
    assert_eq!(done.generation, 4);
    submit(&rt, 9_002, Criticality::Sheddable).unwrap();
    rt.wait_idle().await;
    let sheddable = gated.served.lock().iter().find(|s| s.0 == 9_002).copied();
    assert_eq!(sheddable, Some((9_002, Criticality::Sheddable, 0)));
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_unchanged_config_changes_nothing_and_a_stopped_runtime_says_so() {
    let rt = Runtime::builder(RuntimeConfig::default())
        .start(|_job: Job<u32>| async { Ok::<(), HandlerError>(()) })
        .unwrap();
    let handle = rt.config_handle();
    let done = handle.reconfigure(RuntimeConfig::default()).unwrap();
    assert!(done.changes.is_empty());
    assert_eq!(done.generation, 1);
    // `defer_or_drop` resolved to `drop` (no sink) reads back as such, and compares equal.
    assert_eq!(rt.config().policy.medium, RefusalPolicy::Drop);
    assert_eq!(handle.generation(), Some(1));
    let _ = rt.shutdown(Duration::from_secs(1)).await;
    assert!(matches!(
        handle.reconfigure(RuntimeConfig::default()),
        Err(ReconfigureError::Stopped)
    ));
    assert_eq!(handle.generation(), None);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn reload_reads_the_file_and_a_bad_file_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("triage-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runtime.toml");
    let policy = "[policy]\ncritical = \"backpressure\"\nhigh = \"backpressure\"\n\
                  medium = \"drop\"\nsheddable = \"backpressure\"\n";
    std::fs::write(&path, format!("workers = 2\n{policy}")).unwrap();
    let config = RuntimeConfig::from_toml(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let rt = Runtime::builder(config)
        .start(|_job: Job<u32>| async { Ok::<(), HandlerError>(()) })
        .unwrap();

    std::fs::write(
        &path,
        format!("workers = 2\nforced_shed_level = 1\n{policy}"),
    )
    .unwrap();
    let done = rt.reload(&path).unwrap();
    assert_eq!(done.generation, 2);
    assert_eq!(done.changes, ["forced_shed_level: 0 -> 1"]);
    assert!(matches!(
        submit(&rt, 1, Criticality::Sheddable),
        Err(SubmitError::Overloaded(_))
    ));

    // Out of range, then not TOML for this structure, then gone: each refused, nothing changes.
    std::fs::write(&path, "workers = 2\nforced_shed_level = 9\n").unwrap();
    let err = rt.reload(&path).unwrap_err();
    assert_eq!(err.field(), Some("forced_shed_level"));
    std::fs::write(&path, "workers = 2\nforced_shed_levle = 0\n").unwrap();
    let err = rt.reload(&path).unwrap_err();
    assert!(matches!(err, ReconfigureError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("forced_shed_levle"), "{err}");
    std::fs::remove_file(&path).unwrap();
    let err = rt.reload(&path).unwrap_err();
    assert!(matches!(err, ReconfigureError::Read { .. }), "{err}");
    assert_eq!(rt.config_generation(), 2);
    assert_eq!(rt.config_refused(), 3);
    assert_eq!(rt.config().forced_shed_level, 1);
    assert!(submit(&rt, 2, Criticality::Sheddable).is_err());
    let _ = std::fs::remove_dir_all(&dir);
    drop(rt);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_limit_the_shares_and_pull_admission_change_live() {
    let rt = Runtime::builder(RuntimeConfig::default())
        .start(|_job: Job<u32>| async { Ok::<(), HandlerError>(()) })
        .unwrap();
    let limit = rt.concurrency_limit();
    assert_eq!(rt.stats().limit, 8); // fixed at `workers` without a [limit]
    assert_eq!(limit.allowed(Criticality::Sheddable), 4);

    let mut config = RuntimeConfig::clone(&rt.config());
    config.expert.limit = Some(triage::limit::LimitConfig::Fixed { limit: 4 });
    config.expert.shares = triage::limit::TierShares::new(1.0, 0.5, 0.5, 0.25).unwrap();
    config.expert.admission.prefetch_per_slot = 5;
    let done = rt.reconfigure(config.clone()).unwrap();
    assert_eq!(
        done.changes,
        [
            "expert.admission.prefetch_per_slot: 2 -> 5",
            "expert.limit: (none) -> { kind = \"fixed\", limit = 4 }",
            "expert.shares.high: 0.9 -> 0.5",
            "expert.shares.medium: 0.75 -> 0.5",
            "expert.shares.sheddable: 0.5 -> 0.25",
        ]
    );
    assert_eq!(rt.stats().limit, 4);
    assert_eq!(limit.allowed(Criticality::High), 2);
    assert_eq!(limit.allowed(Criticality::Sheddable), 1);
    assert_eq!(rt.config().expert.admission.prefetch_per_slot, 5);

    // Shares alone: the limit algorithm is not rebuilt.
    config.expert.shares = triage::limit::TierShares::default();
    let done = rt.reconfigure(config).unwrap();
    assert_eq!(done.changes.len(), 3, "{:?}", done.changes);
    assert_eq!(rt.stats().limit, 4);
    assert_eq!(limit.allowed(Criticality::Sheddable), 2);
    drop(rt);
}
