//! Issue 9, "a backlog is not an overload", on the in-memory broker: a backlog is served in
//! order by every worker and never deferred; what is past its deadline is expired at intake
//! without a handler call; a copy is deferred at most `max_deferrals` times; shares are
//! work-conserving; a source is told which tiers are shed; nothing is deferred whose copy could
//! not come back before its deadline. Assertions on counts and order, never on times, on
//! tokio's paused clock with the runtime's clock following it, so the counts do not depend on
//! the machine's load. (The same backlog on the real brokers: the connectors' `runtime` tests.)

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use triage::queue::TierMask;
use triage::runtime::{
    Ack, Envelope, HandlerError, Job, MemoryBroker, MemorySink, MemorySource, RefusalPolicy,
    Runtime, RuntimeConfig, Source, SubmitError,
};
use triage::{Criticality, PerTier};

/// Tier of the i-th of every ten messages: the mix 10/20/30/40 %.
const MIX: [Criticality; 10] = [
    Criticality::Critical,
    Criticality::High,
    Criticality::High,
    Criticality::Medium,
    Criticality::Medium,
    Criticality::Medium,
    Criticality::Sheddable,
    Criticality::Sheddable,
    Criticality::Sheddable,
    Criticality::Sheddable,
];

/// Counts handlers running at once and, for each start, how many were running with it.
#[derive(Default)]
struct Concurrency {
    running: AtomicUsize,
    max: AtomicUsize,
    starts: Mutex<Vec<(u32, usize)>>,
}

impl Concurrency {
    fn handler(
        self: &Arc<Self>,
        service: Duration,
    ) -> impl Fn(Job<u32>) -> futures_util::future::BoxFuture<'static, Result<(), HandlerError>>
           + Send
           + Sync
           + 'static {
        let this = Arc::clone(self);
        move |job: Job<u32>| {
            let this = Arc::clone(&this);
            let id = *job.payload();
            Box::pin(async move {
                let now = this.running.fetch_add(1, Ordering::SeqCst) + 1;
                this.max.fetch_max(now, Ordering::SeqCst);
                this.starts.lock().push((id, now));
                tokio::time::sleep(service).await;
                this.running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        }
    }
}

/// 20,000 Medium messages already waiting, no new arrivals, deadlines far away, a defer sink
/// ready: all completed, none deferred or expired, started in the order of the log, and every
/// worker kept busy while the backlog lasts.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_backlog_is_served_in_order_by_every_worker_and_never_deferred() {
    const BACKLOG: u32 = 20_000;
    const WORKERS: usize = 8;
    let clock = common::following_tokio();
    let broker = MemoryBroker::new();
    let far = clock.now() + Duration::from_secs(3600);
    for i in 0..BACKLOG {
        broker.publish(i, Criticality::Medium, Some(far));
    }
    broker.close();
    let sink = Arc::new(MemorySink::new());
    let seen = Arc::new(Concurrency::default());
    let mut rt = Runtime::builder(RuntimeConfig::default())
        .clock(clock)
        .defer_sink(Arc::clone(&sink))
        .start(seen.handler(Duration::from_millis(1)))
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let total = report.stats.ledger.total();
    assert_eq!(
        (total.completed, total.deferred, total.expired, total.shed),
        (u64::from(BACKLOG), 0, 0, 0),
        "{report}"
    );
    assert_eq!(sink.len(), 0, "nothing re-published");
    assert_eq!(broker.acks().completed, u64::from(BACKLOG));

    let starts = seen.starts.lock();
    assert_eq!(seen.max.load(Ordering::SeqCst), WORKERS);
    // In order: workers pop in log order, and on one thread nothing overtakes a worker
    // between its pop and its handler's first line.
    let displaced: Vec<(usize, u32)> = starts
        .iter()
        .enumerate()
        .filter(|&(i, &(id, _))| id as usize != i)
        .map(|(i, &(id, _))| (i, id))
        .take(10)
        .collect();
    assert_eq!(displaced, [], "(start, id) out of the log's order");
    // Busy: while the backlog lasts, every handler starts with the other workers busy.
    // (Before work-conserving shares and paced intake, Medium had at most 6 of 8 workers.)
    let steady = &starts[WORKERS..starts.len() - WORKERS];
    let full = steady.iter().filter(|(_, n)| *n == WORKERS).count();
    assert_eq!(
        full,
        steady.len(),
        "only {full} of {} starts found the other workers busy",
        steady.len()
    );
}

/// A backlog older than its usefulness window costs no handler call: expired at intake, from
/// the envelope alone, never queued.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_backlog_past_its_deadline_is_expired_at_intake() {
    let clock = common::following_tokio();
    // The clock starts at zero: let time pass so that a deadline can lie in the past.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let broker = MemoryBroker::new();
    let past = clock.now() - Duration::from_secs(1);
    let live = clock.now() + Duration::from_secs(3600);
    for i in 0..1_000u32 {
        broker.publish(i, Criticality::ALL[(i % 4) as usize], Some(past));
    }
    broker.publish(1_000, Criticality::Medium, Some(live));
    broker.close();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c2 = Arc::clone(&calls);
    let mut rt = Runtime::builder(RuntimeConfig::default())
        .clock(clock)
        .start(move |job: Job<u32>| {
            c2.lock().push(*job.payload());
            async { Ok::<(), HandlerError>(()) }
        })
        .unwrap();
    rt.attach(broker.source());
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(
        *calls.lock(),
        [1_000],
        "only the live message reached the handler"
    );
    let total = report.stats.ledger.total();
    assert_eq!((total.expired, total.completed), (1_000, 1), "{report}");
    // Never queued: the only admission is the live one.
    let admitted: u64 = report.stats.admitted.iter().map(|(_, n)| *n).sum();
    assert_eq!(admitted, 1);
    assert_eq!(broker.acks().expired, 1_000);
}

/// A copy keeps its tier and counts its deferrals; once deferred `max_deferrals` times it is
/// not deferred again (held instead: handed back to an in-process caller as `Full`).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_copy_is_deferred_at_most_max_deferrals_times() {
    let mut config = RuntimeConfig {
        workers: 1.try_into().unwrap(),
        max_deferrals: 3,
        ..RuntimeConfig::default()
    };
    config.expert.queue.capacity = 1.try_into().unwrap();
    config.expert.queue.admission.enabled = false;
    config.policy = PerTier::new(
        RefusalPolicy::Backpressure,
        RefusalPolicy::Backpressure,
        RefusalPolicy::Defer,
        RefusalPolicy::Defer,
    );
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g2 = Arc::clone(&gate);
    let sink = Arc::new(MemorySink::new());
    let rt = Runtime::builder(config)
        .clock(common::following_tokio())
        .defer_sink(Arc::clone(&sink))
        .start(move |_job: Job<u32>| {
            let g = Arc::clone(&g2);
            async move {
                g.acquire().await.unwrap().forget();
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    let env =
        |id: u32, tier, deferrals| Envelope::new(id, tier, Ack::noop()).with_deferrals(deferrals);
    // One in the handler, one queued: the queue is full.
    rt.try_submit(env(0, Criticality::Critical, 0)).unwrap();
    while rt.stats().running == 0 {
        tokio::task::yield_now().await;
    }
    rt.try_submit(env(1, Criticality::Critical, 0)).unwrap();
    // Deferred twice before: deferred again, as Medium, carrying 3.
    rt.try_submit(env(2, Criticality::Medium, 2)).unwrap();
    while sink.is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (id, info) = sink.items()[0].clone();
    assert_eq!(
        (id, info.criticality, info.deferrals),
        (2, Criticality::Medium, 3)
    );
    // Deferred three times already: not again.
    match rt.try_submit(env(3, Criticality::Medium, 3)) {
        Err(SubmitError::Full(e)) => assert_eq!((e.payload, e.deferrals), (3, 3)),
        other => panic!("expected the copy back, got {other:?}"),
    }
    assert_eq!(sink.len(), 1);
    gate.add_permits(10);
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
}

/// Work-conserving shares: with only Sheddable work, every worker serves it (Sheddable's share
/// of 0.5 would leave 4 of 8 idle); with strict shares, 4.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn idle_workers_serve_lower_tiers_unless_shares_are_strict() {
    for (work_conserving, expected) in [(true, 8), (false, 4)] {
        let broker = MemoryBroker::new();
        for i in 0..200u32 {
            broker.publish(i, Criticality::Sheddable, None);
        }
        broker.close();
        let seen = Arc::new(Concurrency::default());
        let config = RuntimeConfig {
            expert: triage::runtime::ExpertConfig {
                work_conserving,
                ..triage::runtime::ExpertConfig::default()
            },
            ..RuntimeConfig::default()
        };
        let mut rt = Runtime::builder(config)
            .clock(common::following_tokio())
            .start(seen.handler(Duration::from_millis(10)))
            .unwrap();
        rt.attach(broker.source());
        rt.wait_idle().await;
        let report = rt.shutdown(Duration::from_secs(5)).await;
        assert!(report.stats.balances(), "{report}");
        assert_eq!(report.stats.ledger.total().completed, 200);
        assert_eq!(
            seen.max.load(Ordering::SeqCst),
            expected,
            "work_conserving = {work_conserving}"
        );
    }
}

/// A source that records what the runtime tells it to pause.
struct Recording {
    inner: MemorySource<u32>,
    paused: Arc<Mutex<Vec<TierMask>>>,
}

impl Source for Recording {
    type Payload = u32;

    async fn next(&mut self) -> Option<Envelope<u32>> {
        self.inner.next().await
    }

    fn lag(&self) -> Option<u64> {
        self.inner.lag()
    }

    fn pause_tiers(&mut self, tiers: TierMask) {
        self.paused.lock().push(tiers);
    }
}

/// Arrival at about 5x capacity: the runtime sheds from the bottom and tells the source which
/// tiers (a topic-per-tier source pauses them), never Critical, and un-pauses them once the
/// arrivals stop.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_source_is_told_which_tiers_are_shed() {
    let broker = MemoryBroker::new();
    let paused = Arc::new(Mutex::new(Vec::new()));
    let config = RuntimeConfig {
        workers: 2.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    let seen = Arc::new(Concurrency::default());
    let mut rt = Runtime::builder(config)
        .clock(common::following_tokio())
        .start(seen.handler(Duration::from_millis(10)))
        .unwrap();
    rt.attach(Recording {
        inner: broker.source(),
        paused: Arc::clone(&paused),
    });
    // Capacity about 200/s; offered about 1,000/s for two seconds, mix 10/20/30/40.
    for i in 0..2_000u32 {
        broker.publish(i, MIX[(i % 10) as usize], None);
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Then nothing arrives: the source must still hear that nothing is shed any more.
    let resumed = tokio::time::timeout(Duration::from_secs(60), async {
        while paused.lock().last() != Some(&TierMask::NONE) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    broker.close();
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    let calls = paused.lock().clone();
    assert!(
        calls.iter().any(|m| m.contains(Criticality::Sheddable)),
        "Sheddable never shed: {calls:?}"
    );
    assert!(
        calls.iter().all(|m| !m.contains(Criticality::Critical)),
        "Critical shed: {calls:?}"
    );
    assert!(resumed.is_ok(), "never resumed: {calls:?}");
}

/// The overload runs below: `config` with two workers, a 10 ms handler (capacity about
/// 200/s) and a defer sink, fed from a source offered the ids `ids` at about 1,000/s, each
/// message's tier and deadline from `offer(id, now)`, plus a second source already holding
/// `backlog` (if any). The ledger is checked to balance once the runtime is idle; the report
/// and the defer sink's copies come back.
async fn overload(
    mut config: RuntimeConfig,
    backlog: Option<MemoryBroker<u32>>,
    ids: std::ops::Range<u32>,
    offer: impl Fn(u32, triage::quanta::Instant) -> (Criticality, Option<triage::quanta::Instant>),
) -> (
    triage::runtime::Report,
    Vec<(u32, triage::runtime::Republish)>,
) {
    config.workers = 2.try_into().unwrap();
    let broker = MemoryBroker::new();
    let sink = Arc::new(MemorySink::new());
    let seen = Arc::new(Concurrency::default());
    let clock = common::following_tokio();
    let mut rt = Runtime::builder(config)
        .clock(clock.clone())
        .defer_sink(Arc::clone(&sink))
        .start(seen.handler(Duration::from_millis(10)))
        .unwrap();
    if let Some(backlog) = backlog {
        backlog.close();
        rt.attach(backlog.source());
    }
    rt.attach(broker.source());
    for i in ids {
        let (tier, deadline) = offer(i, clock.now());
        broker.publish(i, tier, deadline);
        if i % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    broker.close();
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    (report, sink.items())
}

/// Copies of `tier` among the defer sink's.
fn copies_of(copies: &[(u32, triage::runtime::Republish)], tier: Criticality) -> usize {
    copies
        .iter()
        .filter(|(_, info)| info.criticality == tier)
        .count()
}

/// Under sustained overload a refused message is deferred only if a drain could bring it back
/// in time: while anything is shed no drain is pulled, and the shed level comes down only after
/// `admission.recover_ms` (here 5 s). Sheddable with a 3 s window is shed at once (counted by
/// `triage_too_late_to_defer_total`), never published to the defer store; Medium with a 60 s
/// window is deferred as before.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_message_that_would_expire_before_any_drain_is_shed_not_deferred() {
    let mut config = RuntimeConfig::default();
    config.expert.admission.recover_ms = 5_000;
    // Offered about 1,000/s for two seconds, mix 10/20/30/40.
    let (report, copies) = overload(config, None, 0..2_000, |i, now| {
        let tier = MIX[(i % 10) as usize];
        let window = match tier {
            Criticality::Sheddable => Duration::from_secs(3),
            _ => Duration::from_secs(60),
        };
        (tier, Some(now + window))
    })
    .await;
    assert_eq!(copies_of(&copies, Criticality::Sheddable), 0, "{report}");
    assert!(
        copies_of(&copies, Criticality::Medium) > 0,
        "nothing deferred: {report}"
    );
    let sheddable = *report.stats.ledger.tier(Criticality::Sheddable);
    assert_eq!(sheddable.deferred, 0, "{report}");
    assert!(sheddable.shed > 0, "{report}");
}

/// An overload that has lasted `T` is taken to last about `T` more: a refused message is
/// deferred only while its deadline is further than `admission.recover_ms` plus the time
/// shedding has lasted. Here recover_ms is 200 ms and Medium has a 2 s window: early in a 4 s
/// overload its refused messages are deferred, later ones (whose copies the overload would
/// outlast) are shed at once. Sheddable without a deadline is always deferred. With only
/// `recover_ms` counted, no Medium message would be shed (2 s of slack is far above 200 ms).
/// The intake keeps to the prefetch here (`derive_bounds = false`): pulling ahead as the
/// zero-configuration default does, as far as the workers clear within Medium's 2 s, queues
/// 2 s of work, behind which no copy could come back in time, so every refused Medium message
/// is shed from the start (the rule holds, but there is no early phase left to see).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_sustained_overload_stops_deferring_what_it_would_outlast() {
    let mut config = RuntimeConfig::default();
    config.expert.admission.recover_ms = 200;
    config.expert.admission.derive_bounds = false;
    // Offered about 1,000/s for four seconds, 10% Critical (which fits: nothing is held, so
    // the source is never paused and Medium is read with its 2 s of slack nearly whole) and
    // the rest Medium and Sheddable.
    let (report, _) = overload(config, None, 0..4_000, |i, now| match i % 10 {
        0 => (Criticality::Critical, Some(now + Duration::from_secs(2))),
        1..=4 => (Criticality::Medium, Some(now + Duration::from_secs(2))),
        _ => (Criticality::Sheddable, None),
    })
    .await;
    let medium = *report.stats.ledger.tier(Criticality::Medium);
    assert!(medium.deferred > 0, "no Medium deferred early on: {report}");
    assert!(
        medium.shed > 0,
        "Medium still deferred after the overload outlasted its window: {report}"
    );
    let sheddable = *report.stats.ledger.tier(Criticality::Sheddable);
    assert!(sheddable.deferred > 0, "{report}");
    assert_eq!(
        sheddable.shed, 0,
        "a message without deadline shed: {report}"
    );
}

/// A held message of a `Defer` tier is not deferred to make room when its copy could not come
/// back in time: it is shed instead, and the room is made all the same. Sheddable here has a
/// 150 ms window against a `recover_ms` of 200 ms, so none of its copies could be served;
/// Critical (no deadline: always at risk) evicts Sheddable from the small queue, the victims
/// and the High held under backpressure fill the held buffer, and `make_room` clears it.
/// Before this rule, the evicted Sheddable were deferred (reason `make_room`) only to expire
/// on their way back.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_held_message_whose_copy_could_not_return_in_time_is_shed_to_make_room() {
    let mut config = RuntimeConfig {
        expert: triage::runtime::ExpertConfig {
            max_held: 32.try_into().unwrap(),
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    config.expert.queue.capacity = 16.try_into().unwrap();
    config.expert.admission.recover_ms = 200;
    // Offered about 1,000/s for three seconds: 10% Critical without a deadline, 30% High
    // (Backpressure), 60% Sheddable with 150 ms.
    let (report, copies) = overload(config, None, 0..3_000, |i, now| match i % 10 {
        0 => (Criticality::Critical, None),
        1..=3 => (Criticality::High, None),
        _ => (
            Criticality::Sheddable,
            Some(now + Duration::from_millis(150)),
        ),
    })
    .await;
    assert!(
        copies.iter().any(|(_, info)| info.reason == "make_room"),
        "no room was made: {report}"
    );
    assert_eq!(copies_of(&copies, Criticality::Sheddable), 0, "{report}");
    let sheddable = *report.stats.ledger.tier(Criticality::Sheddable);
    assert_eq!(sheddable.deferred, 0, "{report}");
    assert!(sheddable.shed > 0, "{report}");
    assert_eq!(
        report.stats.ledger.tier(Criticality::Critical).completed,
        300
    );
}

/// A backlog delays every drain: the drains are pulled only into room, and the workers have
/// none until the lag is served. 3,000 Critical messages (no deadline) wait in one source,
/// which two workers at 10 ms take about 15 s to clear; meanwhile about 1,000 messages a second
/// arrive in another for two seconds, half Medium useful for 2 s, half Sheddable without a
/// deadline. Medium is refused from the start of the overload, when shedding has lasted only
/// moments (which alone would allow a copy, as in the test above): its 2 s are less than the
/// backlog takes to clear, so each is shed at once. Sheddable, with no deadline, is still
/// deferred. (Two sources: in one FIFO source the arrivals would wait behind the backlog and
/// expire before they are read.)
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_message_refused_behind_a_backlog_it_cannot_outlast_is_shed_not_deferred() {
    let backlog = MemoryBroker::new();
    for i in 0..3_000u32 {
        backlog.publish(i, Criticality::Critical, None);
    }
    let (report, _) = overload(
        RuntimeConfig::default(),
        Some(backlog),
        3_000..5_000,
        |i, now| {
            if i % 2 == 0 {
                (Criticality::Medium, Some(now + Duration::from_secs(2)))
            } else {
                (Criticality::Sheddable, None)
            }
        },
    )
    .await;
    // The backlog holds every worker for longer than any Medium message's window: each is
    // refused, and shed; each Sheddable (no deadline) deferred.
    let medium = *report.stats.ledger.tier(Criticality::Medium);
    assert_eq!(medium.shed, 1_000, "Medium not refused: {report}");
    assert_eq!(medium.deferred, 0, "{report}");
    let sheddable = *report.stats.ledger.tier(Criticality::Sheddable);
    assert_eq!(sheddable.deferred, 1_000, "{report}");
    assert_eq!(
        report.stats.ledger.tier(Criticality::Critical).completed,
        3_000
    );
}
