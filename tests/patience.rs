//! The broker's patience (issue 34): a message of a source that states one is handed back
//! before it has waited that long in the runtime, queued, held or parked. On tokio's paused
//! clock, with the runtime's clock a mock moved in step with it, against a broker double that
//! does what RabbitMQ does with a released delivery: puts it back at its place in the queue and
//! delivers it again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use triage::ledger::Disposition;
use triage::quanta::{Clock, Mock};
use triage::queue::WfqConfig;
use triage::runtime::{
    Ack, AckRef, AckSink, Envelope, HandlerError, Job, MemorySink, RefusalPolicy, Runtime,
    RuntimeConfig, Source,
};
use triage::Criticality;

/// RabbitMQ's patience in these tests; messages are handed back after 80% of it.
const PATIENCE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug)]
struct Msg {
    id: u32,
    tier: Criticality,
    key: Option<u64>,
}

#[derive(Default)]
struct State {
    /// Ready messages by their place in the queue (a released one goes back to its place).
    ready: BTreeMap<u64, Msg>,
    /// Delivered and unsettled, by delivery tag: the place and the message.
    out: HashMap<u64, (u64, Msg)>,
    next_place: u64,
    next_tag: u64,
    closed: bool,
    /// Ids released, in order.
    released: Vec<u32>,
    /// Ids settled, in order, with their disposition.
    settled: Vec<(u32, Disposition)>,
    /// What `release_waiting` was asked for.
    release_waiting: Vec<Duration>,
}

/// A queue that requeues what is released, at its place, as RabbitMQ does.
#[derive(Default)]
struct Broker {
    state: Mutex<State>,
    ready: Notify,
}

impl Broker {
    fn publish(&self, id: u32, tier: Criticality, key: Option<u64>) {
        let mut st = self.state.lock();
        let place = st.next_place;
        st.next_place += 1;
        st.ready.insert(place, Msg { id, tier, key });
        drop(st);
        self.ready.notify_one();
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_one();
    }

    fn completed(&self) -> usize {
        let st = self.state.lock();
        st.settled
            .iter()
            .filter(|(_, d)| *d == Disposition::Completed)
            .count()
    }

    fn released(&self) -> Vec<u32> {
        self.state.lock().released.clone()
    }

    fn settled(&self) -> Vec<(u32, Disposition)> {
        self.state.lock().settled.clone()
    }
}

impl AckSink for Broker {
    fn resolve(&self, token: AckRef, disposition: Disposition) {
        let mut st = self.state.lock();
        let (_, msg) = st.out.remove(&token.position).expect("settled once");
        st.settled.push((msg.id, disposition));
    }

    fn release(&self, token: AckRef) {
        let mut st = self.state.lock();
        let (place, msg) = st.out.remove(&token.position).expect("released once");
        st.ready.insert(place, msg);
        st.released.push(msg.id);
        drop(st);
        self.ready.notify_one();
    }
}

struct Consumer(Arc<Broker>);

impl Source for Consumer {
    type Payload = u32;

    async fn next(&mut self) -> Option<Envelope<u32>> {
        loop {
            let notified = self.0.ready.notified();
            {
                let mut st = self.0.state.lock();
                if let Some((place, msg)) = st.ready.pop_first() {
                    let tag = st.next_tag;
                    st.next_tag += 1;
                    st.out.insert(tag, (place, msg));
                    let sink: Arc<dyn AckSink> = Arc::clone(&self.0) as Arc<dyn AckSink>;
                    let token = AckRef {
                        stream: 0,
                        position: tag,
                        epoch: 0,
                    };
                    return Some(
                        Envelope::new(msg.id, msg.tier, Ack::new(sink, token))
                            .with_ordering_key_opt(msg.key),
                    );
                }
                if st.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    fn patience(&self) -> Option<Duration> {
        Some(PATIENCE)
    }

    fn release_waiting(&mut self, waited: Duration) -> usize {
        self.0.state.lock().release_waiting.push(waited);
        0
    }
}

/// Moves the runtime's mock clock in step with tokio's paused one.
fn in_step(mock: Arc<Mock>) {
    tokio::spawn(async move {
        let step = Duration::from_millis(10);
        loop {
            tokio::time::sleep(step).await;
            mock.increment(step);
        }
    });
}

/// Two workers, shares kept strict for a second after Critical work was queued: a Sheddable
/// message may start only with no handler running, which a Critical backlog never allows.
fn config() -> RuntimeConfig {
    RuntimeConfig {
        workers: 2.try_into().unwrap(),
        expert: triage::runtime::ExpertConfig {
            queue: WfqConfig {
                capacity: 64.try_into().unwrap(),
                ..WfqConfig::default()
            },
            share_reserve_ms: 1_000,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    }
}

/// Handler calls per id, and the ids in the order their handlers finished.
#[derive(Default)]
struct Calls {
    per_id: HashMap<u32, u32>,
    finished: Vec<u32>,
}

/// A handler that takes `run(id)` on the paused clock.
fn handler(
    calls: Arc<Mutex<Calls>>,
    run: impl Fn(u32) -> Duration + Send + Sync + 'static,
) -> impl Fn(Job<u32>) -> futures_util::future::BoxFuture<'static, Result<(), HandlerError>>
       + Send
       + Sync
       + 'static {
    let run = Arc::new(run);
    move |job: Job<u32>| {
        let id = *job.payload();
        *calls.lock().per_id.entry(id).or_default() += 1;
        let (calls, run) = (Arc::clone(&calls), Arc::clone(&run));
        Box::pin(async move {
            tokio::time::sleep(run(id)).await;
            calls.lock().finished.push(id);
            Ok(())
        })
    }
}

async fn until(mut done: impl FnMut() -> bool) {
    while !done() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The scenario: one Sheddable message, then a Critical backlog of 20 s (400 messages
/// of 100 ms on 2 workers). Patience 10 s: the Sheddable one is handed back at 8 s and at 16 s
/// (released: no defer sink, so its tier drops, and a drop is for refusals, not for waiting),
/// delivered again each time, and served once the backlog is done, at 20 s. Every handler runs
/// once; the ledger counts 403 consumed, 401 completed, 2 released.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_sheddable_message_behind_a_critical_backlog_is_released_in_time() {
    let (clock, mock) = Clock::mock();
    in_step(mock);
    let broker = Arc::new(Broker::default());
    broker.publish(0, Criticality::Sheddable, None);
    for id in 1..=400 {
        broker.publish(id, Criticality::Critical, None);
    }
    let calls = Arc::new(Mutex::new(Calls::default()));
    let mut rt = Runtime::builder(config())
        .clock(clock)
        .start(handler(Arc::clone(&calls), |_| Duration::from_millis(100)))
        .unwrap();
    rt.attach(Consumer(Arc::clone(&broker)));
    until(|| broker.completed() == 401).await;
    broker.close();
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;

    assert_eq!(broker.released(), [0, 0], "handed back at 8 s and 16 s");
    let calls = calls.lock();
    assert!(calls.per_id.values().all(|&n| n == 1), "no work done twice");
    assert_eq!(calls.per_id.len(), 401);
    assert_eq!(calls.finished.last(), Some(&0), "served after the backlog");
    let stats = report.stats;
    assert!(stats.balances(), "{stats}");
    let total = stats.ledger.total();
    assert_eq!(
        (total.consumed, total.completed, total.released),
        (403, 401, 2)
    );
    assert_eq!(stats.handed_back[Criticality::Sheddable], 2);
    assert_eq!(stats.handed_back[Criticality::Critical], 0);
    assert_eq!(stats.queue.tier(Criticality::Sheddable).drained, 2);
    // The source was asked for what waited 80% of its patience in its own buffer.
    let asked = broker.state.lock().release_waiting.clone();
    assert!(!asked.is_empty());
    assert!(
        asked.iter().all(|&w| w == Duration::from_secs(8)),
        "{asked:?}"
    );
}

/// With a defer sink, the Sheddable tier defers: the waiting message is deferred at 8 s
/// (reason `patience`), not released, and its handler never runs here (its copy will, from
/// the defer queue).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_message_of_a_defer_tier_is_deferred_in_time() {
    let (clock, mock) = Clock::mock();
    in_step(mock);
    let broker = Arc::new(Broker::default());
    broker.publish(0, Criticality::Sheddable, None);
    for id in 1..=400 {
        broker.publish(id, Criticality::Critical, None);
    }
    let sink = Arc::new(MemorySink::new());
    let calls = Arc::new(Mutex::new(Calls::default()));
    let mut rt = Runtime::builder(config())
        .clock(clock)
        .defer_sink(Arc::clone(&sink))
        .start(handler(Arc::clone(&calls), |_| Duration::from_millis(100)))
        .unwrap();
    rt.attach(Consumer(Arc::clone(&broker)));
    until(|| broker.settled().len() == 401).await;
    broker.close();
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;

    assert!(broker.released().is_empty());
    assert!(broker.settled().contains(&(0, Disposition::Deferred)));
    let copies = sink.items();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].0, 0);
    assert_eq!(copies[0].1.reason, "patience");
    assert_eq!(calls.lock().per_id.get(&0), None);
    let stats = report.stats;
    assert!(stats.balances(), "{stats}");
    let total = stats.ledger.total();
    assert_eq!(
        (
            total.consumed,
            total.completed,
            total.deferred,
            total.released
        ),
        (401, 400, 1, 0)
    );
    assert_eq!(stats.handed_back[Criticality::Sheddable], 1);
}

/// A High message held under Backpressure (the operator refuses every tier but Critical) for
/// 20 s is handed back at 8 s and 16 s, and served once, after the operator lifts the level.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_held_message_is_released_in_time() {
    let (clock, mock) = Clock::mock();
    in_step(mock);
    let broker = Arc::new(Broker::default());
    broker.publish(0, Criticality::High, None);
    let mut c = config();
    c.forced_shed_level = 3;
    c.policy.high = RefusalPolicy::Backpressure;
    let calls = Arc::new(Mutex::new(Calls::default()));
    let mut rt = Runtime::builder(c.clone())
        .clock(clock)
        .start(handler(Arc::clone(&calls), |_| Duration::from_millis(100)))
        .unwrap();
    rt.attach(Consumer(Arc::clone(&broker)));
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(rt.stats().held, 1);
    c.forced_shed_level = 0;
    rt.reconfigure(c).unwrap();
    until(|| broker.completed() == 1).await;
    broker.close();
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;

    assert_eq!(broker.released(), [0, 0]);
    assert_eq!(calls.lock().per_id.get(&0), Some(&1));
    let stats = report.stats;
    assert!(stats.balances(), "{stats}");
    let total = stats.ledger.total();
    assert_eq!((total.consumed, total.completed, total.released), (3, 1, 2));
    assert_eq!(stats.handed_back[Criticality::High], 2);
}

/// Key 7's first message runs for 12 s; the two behind it wait in the key gate. At 8 s both
/// are handed back (the first due takes the later one with it), delivered again in order, and
/// parked again; the key runs them in order once its first message is done.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn parked_messages_are_released_in_time_and_keep_their_order() {
    let (clock, mock) = Clock::mock();
    in_step(mock);
    let broker = Arc::new(Broker::default());
    for id in 0..3 {
        broker.publish(id, Criticality::High, Some(7));
    }
    let calls = Arc::new(Mutex::new(Calls::default()));
    let mut rt = Runtime::builder(config())
        .clock(clock)
        .start(handler(Arc::clone(&calls), |id| {
            Duration::from_secs(if id == 0 { 12 } else { 0 })
        }))
        .unwrap();
    rt.attach(Consumer(Arc::clone(&broker)));
    until(|| broker.completed() == 3).await;
    broker.close();
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;

    assert_eq!(broker.released(), [1, 2]);
    let calls = calls.lock();
    assert_eq!(calls.finished, [0, 1, 2]);
    assert!(calls.per_id.values().all(|&n| n == 1));
    let stats = report.stats;
    assert!(stats.balances(), "{stats}");
    assert_eq!(stats.handed_back[Criticality::High], 2);
    assert_eq!(stats.ledger.total().released, 2);
}

/// Key 7's first message is Sheddable, queued behind a Critical backlog of 20 s; its second,
/// Critical, waits behind it in the key gate. When the first is handed back from the queue,
/// the second goes back with it (served first, it would run before the first comes back), and
/// the key is free: both come back in order, twice, and run in order after the backlog.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_message_released_from_the_queue_takes_its_key_along() {
    let (clock, mock) = Clock::mock();
    in_step(mock);
    let broker = Arc::new(Broker::default());
    broker.publish(0, Criticality::Sheddable, Some(7));
    broker.publish(1, Criticality::Critical, Some(7));
    for id in 100..500 {
        broker.publish(id, Criticality::Critical, None);
    }
    let calls = Arc::new(Mutex::new(Calls::default()));
    let mut rt = Runtime::builder(config())
        .clock(clock)
        .start(handler(Arc::clone(&calls), |_| Duration::from_millis(100)))
        .unwrap();
    rt.attach(Consumer(Arc::clone(&broker)));
    until(|| broker.completed() == 402).await;
    broker.close();
    rt.wait_idle().await;
    let report = rt.shutdown(Duration::from_secs(5)).await;

    assert_eq!(broker.released(), [0, 1, 0, 1]);
    let calls = calls.lock();
    assert!(calls.per_id.values().all(|&n| n == 1));
    let order: Vec<u32> = calls
        .finished
        .iter()
        .copied()
        .filter(|&id| id < 2)
        .collect();
    assert_eq!(order, [0, 1]);
    let stats = report.stats;
    assert!(stats.balances(), "{stats}");
    assert_eq!(stats.ledger.total().released, 4);
    assert_eq!(stats.handed_back[Criticality::Sheddable], 2);
    assert_eq!(stats.handed_back[Criticality::Critical], 2);
    assert_eq!(stats.parked, 0);
}

#[test]
fn patience_share_out_of_range_is_refused_naming_the_field() {
    for share in [0.0, 0.04, 0.96, 1.0, f64::NAN] {
        let c = RuntimeConfig {
            expert: triage::runtime::ExpertConfig {
                patience_share: share,
                ..triage::runtime::ExpertConfig::default()
            },
            ..RuntimeConfig::default()
        };
        let err = c.validate().unwrap_err();
        assert_eq!(err.field(), "expert.patience_share");
        assert_eq!(err.allowed(), "0.05..=0.95");
    }
    let c = RuntimeConfig::from_toml("patience_share = 0.5").unwrap();
    assert_eq!(c.expert.patience_share, 0.5);
}
