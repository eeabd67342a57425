//! A scenario through the triage runtime: the scenario's broker as the source, a second one
//! as the defer topic drained back when load falls (as in README's first command), the
//! downstream of each message named for the circuit breakers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use triage::ledger::Disposition;
use triage::quanta::Clock;
use triage::runtime::{DeferSink, HandlerError, Job, Republish, Runtime, RuntimeConfig, SinkError};

use crate::broker::{OnSettle, SimBroker};
use crate::generate::generate;
use crate::msg::Msg;
use crate::outcome::Outcome;
use crate::recovery::recovery;
use crate::scenario::Scenario;
use crate::tally::Tally;
use crate::work::Work;

/// How often the shed level and the messages inside are sampled.
const SAMPLE: Duration = Duration::from_millis(10);
/// The longest the run waits, after the last arrival, for everything inside to settle.
const SETTLE: Duration = Duration::from_secs(30);

/// Defers into the defer broker: the copy keeps its tier, its deferrals and its deadline.
struct DeferTo(SimBroker);

impl DeferSink<Msg> for DeferTo {
    fn publish<'a>(
        &'a self,
        payload: &'a Msg,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        self.0.publish(*payload, info.criticality, info.deferrals);
        Box::pin(async { Ok(()) })
    }
}

/// How long a producer takes to see that its message was shed and publish it again: a round
/// trip. Without it, in virtual time, a refusal and its re-submission would follow each other
/// for ever within one instant.
const RESUBMIT_AFTER: Duration = Duration::from_millis(1);
/// Re-submissions of one message at most: the producer's retry budget.
const MAX_RESUBMITS: u32 = 20;

/// The retry storm: a shed message is published again a round trip later while it can still
/// be in time.
fn resubmit_shed(main: &SimBroker, clock: &Clock, count: &Arc<AtomicU64>) -> OnSettle {
    let (main, clock, count) = (main.clone(), clock.clone(), Arc::clone(count));
    Arc::new(move |msg: &Msg, d: Disposition| {
        if d != Disposition::Shed || clock.now() >= msg.deadline || msg.resubmits >= MAX_RESUBMITS {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        count.fetch_add(1, Ordering::Relaxed);
        let main = main.clone();
        let again = Msg {
            resubmits: msg.resubmits + 1,
            ..*msg
        };
        handle.spawn(async move {
            tokio::time::sleep(RESUBMIT_AFTER).await;
            main.publish(again, again.tier, 0);
        });
    })
}

/// Runs `sc` through the runtime configured by `config` (the scenario's workers and memory
/// budget applied on top).
pub async fn run_triage(sc: &Scenario, config: RuntimeConfig, clock: &Clock) -> Outcome {
    let wall = std::time::Instant::now();
    let origin = clock.now();
    let start = tokio::time::Instant::now();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let work = Arc::new(Work::new(sc, Arc::clone(&tally), clock.clone()));
    let main = SimBroker::new();
    let deferred = SimBroker::new();
    let resubmitted = Arc::new(AtomicU64::new(0));
    if sc.retry_storm {
        let hook = resubmit_shed(&main, clock, &resubmitted);
        main.on_settle(Some(Arc::clone(&hook)));
        deferred.on_settle(Some(hook));
    }
    let handler = move |job: Job<Msg>| {
        let work = Arc::clone(&work);
        let (msg, attempt) = (*job.payload(), job.attempt());
        async move {
            if work.serve(&msg, attempt).await {
                Ok(())
            } else {
                Err(HandlerError::downstream("b", "downstream b failed"))
            }
        }
    };
    let mut rt = Runtime::builder(sc.apply(config))
        .clock(clock.clone())
        .defer_sink(Arc::new(DeferTo(deferred.clone())))
        .downstream(|m: &Msg| Some(if m.to_b { "b" } else { "a" }))
        .start(handler)
        .expect("the scenario's configuration is valid");
    rt.attach(main.source());
    rt.attach_drain(deferred.source());

    let mut series = Vec::new();
    let mut cohorts = Vec::new();
    let mut max_alive = 0u64;
    let mut sample = |rt: &Runtime<Msg>| {
        series.push((start.elapsed(), rt.load().shed_tiers()));
        cohorts.push(rt.admitted_cohorts());
        max_alive = max_alive.max(rt.stats().alive);
    };
    {
        let gen = generate(sc, &main, &tally, clock);
        tokio::pin!(gen);
        let mut every = tokio::time::interval(SAMPLE);
        loop {
            tokio::select! {
                biased;
                () = &mut gen => break,
                _ = every.tick() => sample(&rt),
            }
        }
    }
    main.close();
    let settle = tokio::time::Instant::now();
    loop {
        let inside = rt.stats().alive > 0 || main.backlog() > 0 || deferred.backlog() > 0;
        if !inside || settle.elapsed() >= SETTLE {
            break;
        }
        sample(&rt);
        tokio::time::sleep(SAMPLE).await;
    }
    deferred.close();
    main.on_settle(None);
    deferred.on_settle(None);
    let report = rt.shutdown(Duration::from_secs(10)).await;
    let (goodput, offers) = {
        let tally = tally.lock();
        (tally.goodput(), tally.offers(origin))
    };
    Outcome {
        goodput,
        stats: Some(report.stats),
        balances: report.stats.balances() && report.stats.alive == 0,
        recovery: sc.step.map(|st| recovery(&series, st.start, st.end)),
        shed_series: series,
        cohort_series: cohorts,
        offers,
        resubmitted: resubmitted.load(Ordering::Relaxed),
        max_alive,
        wall: wall.elapsed(),
    }
}
