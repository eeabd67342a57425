//! Circuit-breaker-aware admission on the in-memory broker, on virtual time: tokio's paused
//! clock for the runtime's timers, a mock quanta clock for the breakers' recovery time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::admission::{BreakerConfig, CircuitState, Decision, PullAdmissionConfig};
use triage::ledger::Disposition;
use triage::runtime::{
    HandlerError, Job, MemoryBroker, RefusalPolicy, Runtime, RuntimeConfig, RuntimeStats,
};
use triage::{Criticality, PerTier};

type Msg = (&'static str, u32);

const MIN_CALLS: u32 = 5;
const PROBES: u32 = 2;
const RECOVERY: Duration = Duration::from_millis(1_000);

fn config(policy: RefusalPolicy) -> RuntimeConfig {
    let mut c = RuntimeConfig {
        policy: PerTier::new(policy, policy, policy, policy),
        expert: triage::runtime::ExpertConfig {
            // The mock clock does not move while handlers run: no capacity to measure.
            admission: PullAdmissionConfig::disabled(),
            breaker: BreakerConfig {
                failure_rate: 0.5,
                window_ms: 10_000,
                min_calls: MIN_CALLS,
                recovery_ms: RECOVERY.as_millis() as u64,
                half_open_probes: PROBES,
                ..BreakerConfig::default()
            },
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    c.retry.max_retries = 0;
    c
}

/// Handler calls and dispositions per downstream key.
#[derive(Default)]
struct Seen {
    calls: Mutex<HashMap<&'static str, u64>>,
    ends: Mutex<HashMap<(&'static str, Disposition), u64>>,
}

impl Seen {
    fn calls(&self, key: &str) -> u64 {
        self.calls.lock().get(key).copied().unwrap_or(0)
    }
    fn ended(&self, key: &'static str, d: Disposition) -> u64 {
        self.ends.lock().get(&(key, d)).copied().unwrap_or(0)
    }
}

fn start(
    policy: RefusalPolicy,
    failing: Arc<AtomicBool>,
    seen: Arc<Seen>,
    clock: triage::quanta::Clock,
) -> Runtime<Msg> {
    let observed = Arc::clone(&seen);
    Runtime::builder(config(policy))
        .clock(clock)
        .downstream(|m: &Msg| Some(m.0))
        .observe(move |m: &Msg, _, d| *observed.ends.lock().entry((m.0, d)).or_default() += 1)
        .start(move |job: Job<Msg>| {
            let seen = Arc::clone(&seen);
            let failing = Arc::clone(&failing);
            async move {
                let key = job.payload().0;
                *seen.calls.lock().entry(key).or_default() += 1;
                if key == "payments" && failing.load(Ordering::Relaxed) {
                    return Err(HandlerError::downstream("payments", "503"));
                }
                Ok(())
            }
        })
        .unwrap()
}

/// Publishes `n` messages of each key, interleaved.
fn publish(broker: &MemoryBroker<Msg>, tier: Criticality, keys: &[&'static str], n: u32) {
    static ID: AtomicU64 = AtomicU64::new(0);
    for _ in 0..n {
        for key in keys {
            let id = ID.fetch_add(1, Ordering::Relaxed) as u32;
            broker.publish((key, id), tier, None);
        }
    }
}

/// Waits (virtual time) until nothing published is left unacknowledged.
async fn settle(broker: &MemoryBroker<Msg>) {
    for _ in 0..100_000 {
        if broker.acks().pending == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("not settled: {:?}", broker.acks());
}

fn decisions_add_up(stats: &RuntimeStats) {
    let consumed = stats.ledger.total().consumed;
    let admitted: u64 = Criticality::ALL.iter().map(|t| stats.admitted[*t]).sum();
    let refused: u64 = Criticality::ALL.iter().map(|t| stats.refused[*t]).sum();
    assert_eq!(admitted + refused, consumed, "{stats:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_open_circuit_keeps_its_messages_from_the_handler_and_the_healthy_key_flowing() {
    let (clock, mock) = triage::quanta::Clock::mock();
    let failing = Arc::new(AtomicBool::new(true));
    let seen = Arc::new(Seen::default());
    let broker = MemoryBroker::new();
    let mut runtime = start(
        RefusalPolicy::Drop,
        Arc::clone(&failing),
        Arc::clone(&seen),
        clock,
    );
    runtime.attach(broker.source());
    let breakers = runtime.breakers();

    // 1. Every payments call fails: after MIN_CALLS the circuit opens and the rest of its
    //    messages are shed with reason circuit; inventory is served in full.
    publish(&broker, Criticality::Medium, &["payments", "inventory"], 50);
    settle(&broker).await;
    assert_eq!(breakers.state("payments"), Some(CircuitState::Open));
    assert_eq!(seen.calls("payments"), u64::from(MIN_CALLS));
    assert_eq!(seen.ended("payments", Disposition::Failed), 5);
    assert_eq!(seen.ended("payments", Disposition::Shed), 45);
    assert_eq!(seen.calls("inventory"), 50);
    assert_eq!(seen.ended("inventory", Disposition::Completed), 50);

    // 2. Still open (no time passed): the call count for payments stops growing while
    //    inventory keeps its throughput.
    publish(&broker, Criticality::Medium, &["payments", "inventory"], 50);
    settle(&broker).await;
    assert_eq!(seen.calls("payments"), 5);
    assert_eq!(seen.ended("payments", Disposition::Shed), 95);
    assert_eq!(seen.ended("inventory", Disposition::Completed), 100);

    // 3. After the recovery time one probe goes through; it fails, and the circuit opens again.
    mock.increment(RECOVERY);
    publish(&broker, Criticality::Medium, &["payments"], 5);
    settle(&broker).await;
    assert_eq!(seen.calls("payments"), 6, "one half-open probe");
    assert_eq!(breakers.state("payments"), Some(CircuitState::Open));
    assert_eq!(seen.ended("payments", Disposition::Shed), 99);

    // 4. The downstream recovers: after the recovery time the probes succeed, the circuit
    //    closes after PROBES successes, and every payments message is served again.
    failing.store(false, Ordering::Relaxed);
    mock.increment(RECOVERY);
    publish(&broker, Criticality::Medium, &["payments", "inventory"], 10);
    settle(&broker).await;
    assert_eq!(breakers.state("payments"), Some(CircuitState::Closed));
    assert_eq!(seen.calls("payments"), 16);
    assert_eq!(seen.ended("payments", Disposition::Completed), 10);
    assert_eq!(breakers.opened_total(), 2);
    assert_eq!(breakers.open_count(), 0);

    broker.close();
    runtime.wait_idle().await;
    // The decision breakdown: each consumed message's first decision, adding up to the offered
    // count; the payments messages refused at admission are `shed-circuit`.
    let decisions = runtime.decisions()[Criticality::Medium];
    assert_eq!(decisions.total(), 225);
    let report = runtime.shutdown(Duration::from_secs(5)).await;
    let stats = report.stats;
    assert!(stats.balances(), "{stats:?}");
    // Every message ended in exactly one disposition, and the counts add up.
    let acks = broker.acks();
    assert_eq!(acks.published, 225);
    assert_eq!(acks.duplicates, 0);
    assert_eq!(acks.completed, 110 + 10);
    assert_eq!(acks.failed, 6);
    assert_eq!(acks.shed, 99);
    assert_eq!(acks.completed + acks.failed + acks.shed, acks.published);
    assert_eq!(stats.ledger.total().consumed, 225);
    // Refused at admission, or withdrawn from the queue when the circuit opened while they
    // waited: 99 in all, none of them handled.
    let withdrawn = stats.withdrawn[Criticality::Medium];
    assert!(withdrawn > 0 && withdrawn < 99, "{withdrawn}");
    assert_eq!(stats.refused[Criticality::Medium] + withdrawn, 99);
    assert_eq!(
        decisions.get(Decision::ShedCircuit),
        stats.refused[Criticality::Medium]
    );
    assert_eq!(
        decisions.get(Decision::Admitted),
        stats.admitted[Criticality::Medium]
    );
    decisions_add_up(&stats);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn under_backpressure_an_open_circuit_parks_its_messages_without_blocking_the_tier() {
    let (clock, mock) = triage::quanta::Clock::mock();
    let failing = Arc::new(AtomicBool::new(true));
    let seen = Arc::new(Seen::default());
    let broker = MemoryBroker::new();
    let mut runtime = start(
        RefusalPolicy::Backpressure,
        Arc::clone(&failing),
        Arc::clone(&seen),
        clock,
    );
    runtime.attach(broker.source());
    let breakers = runtime.breakers();

    // Trip the circuit with Critical messages.
    publish(&broker, Criticality::Critical, &["payments"], MIN_CALLS);
    settle(&broker).await;
    assert_eq!(breakers.state("payments"), Some(CircuitState::Open));

    // While open, payments messages are parked (held, unacknowledged); inventory messages of
    // the same tier behind them are served.
    publish(
        &broker,
        Criticality::Critical,
        &["payments", "inventory"],
        20,
    );
    for _ in 0..10_000 {
        if seen.ended("inventory", Disposition::Completed) == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(seen.ended("inventory", Disposition::Completed), 20);
    assert_eq!(seen.calls("payments"), 5);
    assert_eq!(runtime.stats().held, 20);
    assert_eq!(broker.acks().pending, 20);

    // The downstream recovers; once the recovery time passed, the parked messages are probed,
    // the circuit closes and every one is served: none lost, none called while open.
    failing.store(false, Ordering::Relaxed);
    mock.increment(RECOVERY);
    settle(&broker).await;
    assert_eq!(breakers.state("payments"), Some(CircuitState::Closed));
    assert_eq!(seen.ended("payments", Disposition::Completed), 20);
    assert_eq!(seen.calls("payments"), 25);

    broker.close();
    runtime.wait_idle().await;
    let stats = runtime.shutdown(Duration::from_secs(5)).await.stats;
    assert!(stats.balances(), "{stats:?}");
    let acks = broker.acks();
    assert_eq!(acks.completed + acks.failed, acks.published);
    assert_eq!(acks.duplicates, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn breaker_settings_change_live_all_or_nothing() {
    let (clock, _mock) = triage::quanta::Clock::mock();
    let runtime = start(
        RefusalPolicy::Drop,
        Arc::new(AtomicBool::new(false)),
        Arc::new(Seen::default()),
        clock,
    );
    let mut next = config(RefusalPolicy::Drop);
    next.expert.breaker.recovery_ms = 30_000;
    next.expert.breaker.failure_rate = 0.2;
    runtime.reconfigure(next.clone()).unwrap();
    assert_eq!(runtime.breakers().config().recovery_ms, 30_000);
    assert_eq!(runtime.breakers().config().failure_rate, 0.2);

    let mut bad = next.clone();
    bad.expert.breaker.half_open_probes = 0;
    bad.expert.breaker.recovery_ms = 1;
    let err = runtime.reconfigure(bad).unwrap_err();
    assert!(
        err.to_string().contains("expert.breaker.half_open_probes"),
        "{err}"
    );
    assert!(err.to_string().contains("1..=10000"), "{err}");
    assert_eq!(
        runtime.breakers().config(),
        next.expert.breaker,
        "nothing changed"
    );
    runtime.shutdown(Duration::from_secs(1)).await;
}
