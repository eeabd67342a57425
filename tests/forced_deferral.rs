//! The operator's forced shed level and the too-late-to-defer rule. Deferral makes room; a
//! copy is worth its publish and fetch only if it can come back before its deadline. The
//! drains are closed while anything is refused, by the signals or by the operator, so under a
//! forced level a copy comes back only once the operator lifts it. A level that has been up
//! for `T` is taken to stay up about `T` more: a refused message of a `defer` tier whose
//! deadline is closer than that is shed at once (counted as too late to defer), and the first
//! refusals after the level is raised are still deferred.
//!
//! The scenario as a user met it: the overload example run with `forced_shed_level = 2`
//! deferred every refused Medium (250 ms window) and Sheddable (100 ms) message, copies that
//! could only expire in the deferred store while the level stayed up.

use std::sync::Arc;
use std::time::Duration;

use triage::quanta::Clock;
use triage::runtime::{HandlerError, Job, MemoryBroker, MemorySink, Runtime, RuntimeConfig};
use triage::Criticality;

async fn settle(broker: &MemoryBroker<u32>) {
    for _ in 0..100_000 {
        if broker.acks().pending == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("not settled: {:?}", broker.acks());
}

/// Publishes `n` messages of `tier`, due `window` from now on `clock`, ids from `first`.
fn publish(
    broker: &MemoryBroker<u32>,
    clock: &Clock,
    tier: Criticality,
    window: Duration,
    first: u32,
    n: u32,
) {
    for id in first..first + n {
        broker.publish(id, tier, Some(clock.now() + window));
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn under_a_forced_level_a_copy_that_could_not_return_in_time_is_shed_not_deferred() {
    let (clock, mock) = Clock::mock();
    let sink = Arc::new(MemorySink::new());
    let config = RuntimeConfig {
        forced_shed_level: 2,
        expert: triage::runtime::ExpertConfig {
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::builder(config)
        .clock(clock.clone())
        .defer_sink(Arc::clone(&sink))
        .start(|_job: Job<u32>| async { Ok::<(), HandlerError>(()) })
        .unwrap();
    let broker = MemoryBroker::new();
    rt.attach(broker.source());
    let (medium, sheddable) = (Duration::from_millis(250), Duration::from_millis(100));

    // The level was raised a moment ago: nothing says it will stay up, so the first refusals
    // are deferred (a copy comes back as soon as the operator lifts it).
    publish(&broker, &clock, Criticality::Medium, medium, 0, 10);
    publish(&broker, &clock, Criticality::Sheddable, sheddable, 100, 10);
    settle(&broker).await;
    let acks = broker.acks();
    assert_eq!((acks.deferred, acks.shed), (20, 0), "{acks:?}");

    // Up for a second now, taken to stay up about a second more: copies due in 250 and 100 ms
    // would expire in the deferred store, so they are shed at once. A Medium message due in
    // 5 s is still deferred, and the tiers the level leaves admitted are served.
    mock.increment(Duration::from_secs(1));
    publish(&broker, &clock, Criticality::Medium, medium, 200, 10);
    publish(&broker, &clock, Criticality::Sheddable, sheddable, 300, 10);
    publish(
        &broker,
        &clock,
        Criticality::Medium,
        Duration::from_secs(5),
        400,
        10,
    );
    publish(&broker, &clock, Criticality::High, medium, 500, 10);
    settle(&broker).await;
    let acks = broker.acks();
    assert_eq!(acks.deferred, 30, "{acks:?}");
    assert_eq!(acks.shed, 20, "{acks:?}");
    assert_eq!(acks.completed, 10, "{acks:?}");
    assert_eq!(sink.len(), 30);
    let stats = rt.stats();
    assert_eq!(stats.ledger.tier(Criticality::Medium).shed, 10);
    assert_eq!(stats.ledger.tier(Criticality::Sheddable).shed, 10);

    // Lifted, then raised again: a new episode, whose first refusals are deferred again.
    let mut config = RuntimeConfig::clone(&rt.config());
    config.forced_shed_level = 0;
    rt.reconfigure(config.clone()).unwrap();
    config.forced_shed_level = 2;
    rt.reconfigure(config).unwrap();
    publish(&broker, &clock, Criticality::Sheddable, sheddable, 600, 10);
    settle(&broker).await;
    let acks = broker.acks();
    assert_eq!((acks.deferred, acks.shed), (40, 20), "{acks:?}");

    broker.close();
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}
