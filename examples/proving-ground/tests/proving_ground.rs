//! The proving ground's short form (issue 6), on the real brokers of `tests/brokers/up.sh`:
//! per broker, a capacity measurement, a few seconds at 3x, and a fault phase with one
//! `kill -9` of the worker and one broker restart. Asserts that every produced id is
//! accounted for and that goodput is ordered by tier; never a wall-clock threshold.
//!
//! The harness is the binary's own code (`examples/proving-ground/src/*.rs`, included by path).
//! The worker must be a separate process so it can be killed: this test binary starts
//! *itself* with the ignored test `proving_ground_worker` selected and the worker's
//! arguments in `PROVING_GROUND_WORKER`. That runs exactly the code under test, compiled
//! with this test's profile.
//!
//! The broker restart uses this checkout's `tests/brokers/*.sh`; a guard starts the broker
//! again even if the test fails, so the next test binary finds it up.

#[path = "../src/brokers.rs"]
mod brokers;
#[path = "../src/faults.rs"]
mod faults;
#[path = "../src/harness.rs"]
mod harness;
#[path = "../src/load.rs"]
mod load;
#[path = "../src/reconcile.rs"]
mod reconcile;
#[path = "../src/report.rs"]
mod report;
#[path = "../src/worker.rs"]
mod worker;

use std::time::Duration;

use clap::Parser;

/// The two runs share the machine's two cores: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[derive(Parser)]
struct WorkerCli {
    #[command(flatten)]
    args: worker::WorkerArgs,
}

/// The worker process of the short form. Does nothing unless started by the harness.
#[test]
#[ignore = "the worker process of the short form, started by the tests below"]
fn proving_ground_worker() {
    let Ok(raw) = std::env::var(faults::WORKER_ENV) else {
        return;
    };
    let argv = std::iter::once("worker".to_owned()).chain(raw.split('\n').map(str::to_owned));
    let cli = WorkerCli::parse_from(argv);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(worker::run(cli.args)).unwrap();
}

fn short_form(broker: worker::BrokerKind) -> harness::RunConfig {
    harness::RunConfig {
        brokers: vec![broker],
        factors: vec![3.0],
        phase: Duration::from_secs(4),
        capacity_phase: Duration::from_secs(1),
        service_ms: 2,
        workers: 8,
        queue_capacity: None,
        mix: [10, 20, 30, 40],
        windows_ms: [3000, 1500, 800, 400],
        poison_permille: 1,
        kills: 1,
        broker_restart: true,
        group_churn: false,
        fault_factor: 2.0,
        fault_phase: Duration::from_secs(8),
        settle_limit: Duration::from_secs(90),
        out: std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("proving-ground-{}", broker.as_str())),
        launcher: faults::Launcher::TestBinary {
            test: "proving_ground_worker".to_owned(),
        },
        layout: worker::Layout::Mixed,
        restart_backlog: Duration::ZERO,
        restart_fifo: false,
    }
}

fn check(broker: worker::BrokerKind) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    brokers::script(broker, "start").unwrap();
    let config = short_form(broker);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let results = rt.block_on(harness::run(&config));
    let md = report::write(
        &config.out,
        &config,
        &results,
        "cargo test -p triage-proving-ground --test proving_ground",
    )
    .unwrap();
    println!("{md}");
    let result = &results[0];
    for p in &result.phases {
        assert!(
            p.rec.unaccounted.is_empty(),
            "{} {}: {} ids unaccounted for, e.g. {:?}",
            broker.as_str(),
            p.name,
            p.rec.unaccounted.len(),
            &p.rec.unaccounted[..p.rec.unaccounted.len().min(10)]
        );
        assert!(p.rec.produced > 0, "{}: nothing produced", p.name);
    }
    let faults = result.phases.iter().find(|p| p.name == "faults").unwrap();
    assert!(
        faults.events.iter().any(|e| e.contains("kill -9")),
        "{:?}",
        faults.events
    );
    assert!(
        faults.events.iter().any(|e| e.contains("broker back")),
        "{:?}",
        faults.events
    );
    // Goodput share by tier at 3x: Critical >= High >= Medium >= Sheddable. Shares within one
    // point count as equal (a handful of messages at the phase's edges).
    let load = result.phases.iter().find(|p| p.name == "3x").unwrap();
    let shares: Vec<f64> = load.rows.iter().map(|r| r.goodput_share()).collect();
    for w in shares.windows(2) {
        assert!(
            w[0] + 0.01 >= w[1],
            "{}: goodput not ordered by tier at 3x: {shares:?}",
            broker.as_str()
        );
    }
    assert!(
        shares[0] > shares[3],
        "{}: Sheddable did not give way at 3x: {shares:?}",
        broker.as_str()
    );
}

#[test]
fn short_form_kafka() {
    check(worker::BrokerKind::Kafka);
}

#[test]
fn short_form_amqp() {
    check(worker::BrokerKind::Amqp);
}
