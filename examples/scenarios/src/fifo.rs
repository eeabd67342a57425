//! The plain bounded FIFO: one puller moves messages from the broker into a bounded channel in
//! order, acknowledging each at once; the workers serve whatever comes out. In key mode a
//! worker waits for the key's previous message to finish (a lock per key, taken in channel
//! order), as a naive ordered consumer does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::ledger::Disposition;
use triage::quanta::Clock;
use triage::runtime::Source;

use crate::broker::SimBroker;
use crate::generate::generate;
use crate::outcome::Outcome;
use crate::scenario::Scenario;
use crate::tally::Tally;
use crate::work::Work;

/// Retries of a failed call, at once.
const RETRIES: u32 = 3;

type KeyLocks = Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>;

/// Runs `sc` through the FIFO; it stops once nothing offered can still be served in time.
pub async fn run_fifo(sc: &Scenario, capacity: usize, clock: &Clock) -> Outcome {
    let wall = std::time::Instant::now();
    let origin = clock.now();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let work = Arc::new(Work::new(sc, Arc::clone(&tally), clock.clone()));
    let broker = SimBroker::new();
    let (tx, rx) = async_channel::bounded(capacity.max(1));
    let locks: Arc<KeyLocks> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..sc.workers {
        let (rx, work, locks) = (rx.clone(), Arc::clone(&work), Arc::clone(&locks));
        tasks.push(tokio::spawn(async move {
            while let Ok(msg) = rx.recv().await {
                let msg: crate::msg::Msg = msg;
                let lock = msg
                    .key
                    .map(|k| Arc::clone(locks.lock().entry(k).or_default()));
                let _guard = match &lock {
                    Some(l) => Some(l.lock().await),
                    None => None,
                };
                for attempt in 0..=RETRIES {
                    if work.serve(&msg, attempt).await {
                        break;
                    }
                }
            }
        }));
    }
    let mut source = broker.source();
    tasks.push(tokio::spawn(async move {
        while let Some(env) = source.next().await {
            let msg = env.payload;
            env.ack.resolve(Disposition::Completed);
            if tx.send(msg).await.is_err() {
                break;
            }
        }
    }));
    generate(sc, &broker, &tally, clock).await;
    broker.close();
    tokio::time::sleep(sc.mix.longest_window() + Duration::from_millis(10)).await;
    for t in tasks {
        t.abort();
    }
    let (goodput, offers) = {
        let tally = tally.lock();
        (tally.goodput(), tally.offers(origin))
    };
    Outcome {
        goodput,
        stats: None,
        balances: true,
        shed_series: Vec::new(),
        cohort_series: Vec::new(),
        recovery: None,
        resubmitted: 0,
        offers,
        max_alive: 0,
        wall: wall.elapsed(),
    }
}
