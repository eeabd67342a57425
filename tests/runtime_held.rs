//! Messages held under backpressure by the intake, on the in-memory broker: one that cannot
//! finish in time is expired at its turn; a full held buffer pauses its source, or makes room
//! (defers its newest lower-tier messages) when the more important work behind it would miss
//! its deadline. On tokio's paused clock, with a quanta clock that follows it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, eventually, following_tokio, overload_config};
use parking_lot::Mutex;
use triage::admission::QueueAgeConfig;
use triage::ledger::Disposition;
use triage::queue::WfqConfig;
use triage::runtime::{HandlerError, Job, MemoryBroker, MemorySink, RefusalPolicy, Runtime};
use triage::{Criticality, PerTier};

/// A held message with less time left than a handler run takes is expired without a handler
/// call when its turn comes, not served to finish past its deadline; one with time left is
/// served. (The oldest held message is offered first, so under sustained overload it would
/// otherwise reach a worker right at its deadline.) The runtime's clock follows tokio's: it
/// measures the handler runs and sees the deadline pass.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_held_message_that_cannot_finish_in_time_is_expired_not_served() {
    let clock = following_tokio();
    let mut config = config(1, 1);
    config.expert.queue.admission = QueueAgeConfig::disabled();
    config.policy = PerTier::splat(RefusalPolicy::Backpressure);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (g, c) = (Arc::clone(&gate), Arc::clone(&calls));
    let mut rt = Runtime::builder(config)
        .clock(clock.clone())
        .start(move |job: Job<u32>| {
            let (g, c) = (Arc::clone(&g), Arc::clone(&c));
            async move {
                let id = *job.payload();
                c.lock().push(id);
                match id {
                    // The first call takes 2 s: a mean handler run of about 1 s after two.
                    0 => tokio::time::sleep(Duration::from_secs(2)).await,
                    // The second holds the only worker until the test lets it go.
                    1 => drop(g.acquire().await),
                    _ => {}
                }
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    let broker = MemoryBroker::new();
    rt.attach(broker.source());
    broker.publish(0, Criticality::Critical, None);
    // One at a time, so that no worker's batch takes 2 along with 1.
    broker.publish(1, Criticality::Critical, None);
    assert!(eventually(|| calls.lock().len() == 2).await);
    broker.publish(2, Criticality::Critical, None);
    assert!(eventually(|| rt.stats().queued == 1).await);
    // 1 runs, 2 waits in the queue (capacity 1), 3 and 4 are pulled and held (the held buffer
    // has room). 3 has 600 ms left, less than a mean handler run: it cannot finish in time, and
    // is expired at its turn. 4 has a minute.
    let now = clock.now();
    broker.publish(
        3,
        Criticality::Critical,
        Some(now + Duration::from_millis(600)),
    );
    broker.publish(
        4,
        Criticality::Critical,
        Some(now + Duration::from_secs(60)),
    );
    broker.close();
    assert!(eventually(|| rt.stats().held >= 1).await, "{}", rt.stats());
    gate.add_permits(1);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert_eq!(*calls.lock(), vec![0, 1, 2, 4], "{report}");
    let critical = report.stats.ledger.tier(Criticality::Critical);
    assert_eq!((critical.completed, critical.expired), (4, 1), "{report}");
    assert_eq!(broker.acks().expired, 1);
    assert!(report.stats.balances(), "{report}");
}

/// Opens the gate, waits until everything settled, shuts down: the report, its ledger checked.
async fn release(rt: Runtime<u32>, gate: &tokio::sync::Semaphore) -> triage::runtime::Report {
    gate.add_permits(1_000);
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    report
}

/// The held buffer fills (8), the source pauses with the Critical messages still in the
/// broker and nothing deferred; once the gate opens all 30 High are served.
async fn assert_paused_then_served(
    rt: Runtime<u32>,
    broker: &MemoryBroker<u32>,
    sink: &MemorySink<u32>,
    gate: &tokio::sync::Semaphore,
) -> triage::runtime::Report {
    assert!(
        eventually(|| rt.stats().held >= 8).await,
        "{:?}",
        rt.stats()
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Paused behind the held High: the Critical messages wait in the broker.
    assert!(broker.backlog() >= 5, "backlog {}", broker.backlog());
    assert_eq!(sink.len(), 0, "deferred although pausing was expected");
    let report = release(rt, gate).await;
    assert_eq!(report.stats.ledger.tier(Criticality::High).completed, 30);
    report
}

/// One mixed source: Critical, 30 High, 5 Critical more (with `deadline` from now), behind a
/// single worker held by a gate and a queue of 2. High is held under backpressure up to
/// `max_held` (8). With `first_free`, message 0 is served at once (a measured handler run of
/// about 5 ms) and the gate holds the next one.
async fn held_high_before_critical(
    make_room: bool,
    deadline: Option<Duration>,
    first_free: bool,
) -> (
    Runtime<u32>,
    MemoryBroker<u32>,
    Arc<MemorySink<u32>>,
    Arc<tokio::sync::Semaphore>,
) {
    let mut c = overload_config(RefusalPolicy::Backpressure);
    c.expert.max_held = 8.try_into().unwrap();
    c.expert.queue = WfqConfig {
        capacity: 2.try_into().unwrap(),
        ..WfqConfig::default()
    };
    c.expert.queue.admission = QueueAgeConfig::disabled();
    c.defer_held_to_make_room = make_room;
    let clock = following_tokio();
    let deadline = deadline.map(|d| clock.now() + d);
    let broker = MemoryBroker::new();
    broker.publish(0, Criticality::Critical, deadline);
    let sink = Arc::new(MemorySink::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = Arc::clone(&gate);
    let mut rt = Runtime::builder(c)
        .clock(clock)
        .defer_sink(Arc::clone(&sink))
        .start(move |job: Job<u32>| {
            let g = Arc::clone(&g);
            let free = first_free && *job.payload() == 0;
            async move {
                if free {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                } else {
                    g.acquire().await.unwrap().forget();
                }
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    rt.attach(broker.source());
    if first_free {
        assert!(eventually(|| broker.acks().completed == 1).await);
    }
    for i in 1..=30u32 {
        broker.publish(i, Criticality::High, None);
    }
    for i in 31..=35u32 {
        broker.publish(i, Criticality::Critical, deadline);
    }
    broker.close();
    (rt, broker, sink, gate)
}

/// A full held buffer makes room: the newest held High are deferred (reason `make_room`) so
/// the intake reads on to the Critical messages behind them in the same source, while the
/// single worker is still busy (no handler run measured yet: any deadline is at risk). With
/// the option off the source pauses and they wait in the broker.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_full_held_buffer_defers_its_newest_lower_tier_to_reach_critical_behind_it() {
    let (rt, broker, sink, gate) =
        held_high_before_critical(true, Some(Duration::from_secs(60)), false).await;
    assert!(
        eventually(|| broker.backlog() == 0).await,
        "the Critical messages behind the held High were never pulled: {:?}",
        broker.acks()
    );
    // Pulled while the only worker is still on message 0: the gate has not opened.
    assert_eq!(broker.acks().completed, 0);
    let report = release(rt, &gate).await;
    for i in [0, 31, 32, 33, 34, 35] {
        assert_eq!(
            broker.disposition(i),
            Some(Disposition::Completed),
            "critical {i}"
        );
    }
    let deferred: Vec<u32> = sink.items().iter().map(|(id, _)| *id).collect();
    assert!(!deferred.is_empty(), "{report}");
    for (id, info) in sink.items() {
        assert_eq!(info.criticality, Criticality::High, "message {id}");
        assert_eq!(info.reason, "make_room", "message {id}");
        assert_eq!(info.deferrals, 1, "message {id}");
    }
    // Newest first: of the High held in arrival order (3..=30; 1 and 2 took the queue and
    // were evicted by Critical later), those served are an oldest prefix and those deferred
    // the rest.
    let served: Vec<u32> = (3..=30)
        .filter(|&i| broker.disposition(u64::from(i)) == Some(Disposition::Completed))
        .collect();
    assert!(!served.is_empty(), "deferred {deferred:?}");
    assert_eq!(
        served,
        (3..3 + served.len() as u32).collect::<Vec<_>>(),
        "deferred {deferred:?}"
    );
    for i in served.len() as u32 + 3..=30 {
        assert!(
            deferred.contains(&i),
            "high {i} neither served nor deferred"
        );
    }
    let high = report.stats.ledger.tier(Criticality::High);
    assert_eq!(high.completed + high.deferred, 30, "{report}");
    assert_eq!(high.deferred, deferred.len() as u64, "{report}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn without_make_room_a_full_held_buffer_pauses_its_source() {
    let (rt, broker, sink, gate) =
        held_high_before_critical(false, Some(Duration::from_secs(60)), false).await;
    assert_paused_then_served(rt, &broker, &sink, &gate).await;
}

/// Critical with an hour of slack is not at risk behind a held buffer that the workers clear
/// in well under a second (a handler run measured at about 5 ms): the source pauses, and the
/// held High are served later rather than deferred.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_full_held_buffer_pauses_when_the_work_behind_it_has_time_to_spare() {
    let (rt, broker, sink, gate) =
        held_high_before_critical(true, Some(Duration::from_secs(3600)), true).await;
    let report = assert_paused_then_served(rt, &broker, &sink, &gate).await;
    assert_eq!(report.stats.ledger.tier(Criticality::Critical).completed, 6);
}

/// Critical with no deadline (a topic whose producers stamp none) is at risk behind a full
/// held buffer: nothing bounds its wait in the broker, so room is made, even with a handler
/// run measured.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_full_held_buffer_makes_room_for_critical_without_a_deadline() {
    let (rt, broker, sink, gate) = held_high_before_critical(true, None, true).await;
    assert!(
        eventually(|| broker.backlog() == 0).await,
        "the Critical messages behind the held High were never pulled"
    );
    assert!(!sink.is_empty());
    let report = release(rt, &gate).await;
    assert_eq!(report.stats.ledger.tier(Criticality::Critical).completed, 6);
    let high = report.stats.ledger.tier(Criticality::High);
    assert_eq!(high.completed + high.deferred, 30, "{report}");
}
