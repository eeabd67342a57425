//! A source takes back messages the runtime holds (a Kafka partition revoked, issue 30 item 9),
//! through the [`Recall`] the runtime gave it when attached: those queued, held, parked or on
//! their way to a handler are released, never served; the handlers already running them are
//! waited for, within a bound; the other streams' messages go on.
//!
//! On tokio's paused clock with the runtime's clock following it, so the counts do not depend
//! on the machine's load. The source's side of a recall runs on threads of its own, outside
//! the tokio runtime, as a rebalance callback does: that is what these tests exist to show,
//! so those threads are real and `Recall::wait_running` waits on the real clock. The test
//! joins them from tokio's blocking pool, which keeps the paused clock still meanwhile.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use triage::ledger::Disposition;
use triage::runtime::{
    Ack, AckRef, AckSink, Envelope, HandlerError, Job, Recall, RefusalPolicy, RetryConfig, Runtime,
    RuntimeConfig, Source,
};
use triage::Criticality;

/// (stream, key, seq): a message of a partition, by key.
type Msg = (u64, u64, u64);

/// The broker's side: what is taken back, and every acknowledgement.
#[derive(Default)]
struct Acks {
    revoked: Mutex<HashSet<u64>>,
    resolved: Mutex<Vec<(AckRef, Disposition)>>,
    released: Mutex<Vec<AckRef>>,
}

impl AckSink for Acks {
    fn resolve(&self, token: AckRef, disposition: Disposition) {
        self.resolved.lock().unwrap().push((token, disposition));
    }

    fn release(&self, token: AckRef) {
        self.released.lock().unwrap().push(token);
    }

    fn is_current(&self, token: AckRef) -> bool {
        !self.revoked.lock().unwrap().contains(&token.stream)
    }
}

/// A source fed by the test, keeping the runtime's [`Recall`].
struct Revocable {
    rx: mpsc::UnboundedReceiver<Envelope<Msg>>,
    recall: Arc<Mutex<Option<Recall>>>,
}

impl Source for Revocable {
    type Payload = Msg;

    async fn next(&mut self) -> Option<Envelope<Msg>> {
        self.rx.recv().await
    }

    fn attached(&mut self, recall: Recall) {
        *self.recall.lock().unwrap() = Some(recall);
    }
}

struct Broker {
    tx: mpsc::UnboundedSender<Envelope<Msg>>,
    acks: Arc<Acks>,
    sink: Arc<dyn AckSink>,
    recall: Arc<Mutex<Option<Recall>>>,
    next_position: u64,
}

impl Broker {
    fn new() -> (Broker, Revocable) {
        let (tx, rx) = mpsc::unbounded_channel();
        let acks = Arc::new(Acks::default());
        let recall = Arc::default();
        let broker = Broker {
            tx,
            sink: acks.clone(),
            acks,
            recall: Arc::clone(&recall),
            next_position: 0,
        };
        (broker, Revocable { rx, recall })
    }

    fn publish(&mut self, msg: Msg, tier: Criticality) {
        self.publish_keyed(msg, tier, msg.0 * 1_000 + msg.1);
    }

    /// With an ordering key of the test's choosing (two streams may share one: a hash
    /// collision).
    fn publish_keyed(&mut self, msg: Msg, tier: Criticality, ordering_key: u64) {
        let token = AckRef {
            stream: msg.0,
            position: self.next_position,
            epoch: 1,
        };
        self.next_position += 1;
        let envelope = Envelope::new(msg, tier, Ack::new(Arc::clone(&self.sink), token))
            .with_ordering_key(ordering_key);
        self.tx.send(envelope).unwrap();
    }

    fn recall(&self) -> Recall {
        self.recall.lock().unwrap().clone().expect("attached")
    }

    /// Revokes `stream` as a Kafka source does: marks it (`is_current` says no from now on),
    /// then releases what the runtime holds of it, from a thread of the source's own (outside
    /// the tokio runtime, as a rebalance callback). Returns how many were released at once.
    async fn revoke(&self, stream: u64) -> usize {
        self.acks.revoked.lock().unwrap().insert(stream);
        let (recall, sink) = (self.recall(), Arc::clone(&self.sink));
        on_own_thread(move || recall.release_where(&sink, |t| t.stream == stream)).await
    }

    /// `wait_running` on a thread of its own, as a rebalance callback calls it.
    fn wait_running(&self, stream: u64, bound: Duration) -> std::thread::JoinHandle<usize> {
        let (recall, sink) = (self.recall(), Arc::clone(&self.sink));
        std::thread::spawn(move || recall.wait_running(&sink, |t| t.stream == stream, bound))
    }

    fn was_released(&self, stream: u64, position: u64) -> bool {
        let released = self.acks.released.lock().unwrap();
        released
            .iter()
            .any(|t| (t.stream, t.position) == (stream, position))
    }

    fn released_of(&self, stream: u64) -> usize {
        let released = self.acks.released.lock().unwrap();
        released.iter().filter(|t| t.stream == stream).count()
    }
}

/// Runs `f` on a thread outside the tokio runtime (as librdkafka's poll thread is).
async fn on_own_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    joined(std::thread::spawn(f)).await
}

/// What `thread` returned, waited for from tokio's blocking pool: the runtime's tasks go on
/// meanwhile, and the paused clock does not move while a thread outside it works.
async fn joined<R: Send + 'static>(thread: std::thread::JoinHandle<R>) -> R {
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .expect("the blocking pool's task")
        .expect("the thread panicked")
}

/// Every handler call, with whether it had ended.
#[derive(Default)]
struct Calls {
    started: Mutex<Vec<Msg>>,
    ended: Mutex<Vec<Msg>>,
}

async fn wait_for(what: &str, check: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("hang guard: {what}"));
}

fn config(workers: usize) -> RuntimeConfig {
    RuntimeConfig {
        workers: workers.try_into().unwrap(),
        expert: triage::runtime::ExpertConfig {
            poll_interval_ms: 1,
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    }
}

/// Stream 0's first message of each of two keys runs (held inside the handler), the rest of
/// those keys is parked; stream 1 runs freely. Revoking stream 0 releases the ten parked at
/// once, waits for the two running, and serves nothing of stream 0 after; stream 1 completes.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_revoked_stream_is_released_and_its_running_handlers_waited_for() {
    let (mut broker, source) = Broker::new();
    let calls = Arc::new(Calls::default());
    let gate = Arc::new(Semaphore::new(0));
    let (c, g) = (Arc::clone(&calls), Arc::clone(&gate));
    let mut runtime = Runtime::builder(config(4))
        .clock(common::following_tokio())
        .start(move |job: Job<Msg>| {
            let (calls, gate) = (Arc::clone(&c), Arc::clone(&g));
            async move {
                let msg = *job.payload();
                calls.started.lock().unwrap().push(msg);
                if msg.0 == 0 {
                    gate.acquire().await.unwrap().forget();
                }
                calls.ended.lock().unwrap().push(msg);
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    runtime.attach(source);
    for seq in 0..6 {
        for key in [1, 2] {
            broker.publish((0, key, seq), Criticality::High);
        }
        broker.publish((1, 3, seq), Criticality::High);
    }
    wait_for("stream 1 done and two of stream 0 running", || {
        let ended = calls.ended.lock().unwrap().len();
        let started = calls.started.lock().unwrap().len();
        ended == 6 && started == 8
    })
    .await;
    assert_eq!(runtime.stats().parked, 10);

    assert_eq!(broker.revoke(0).await, 10, "the parked ones, at once");
    assert_eq!(broker.released_of(0), 10);
    assert_eq!(runtime.stats().parked, 0);
    let waiting = broker.wait_running(0, Duration::from_secs(60));
    // It waits while the two run (however long that is): no sooner. The wait is on the real
    // clock, on a thread of its own: it is given real time to return early (the handlers
    // are gated, so nothing of the runtime's moves meanwhile).
    std::thread::sleep(Duration::from_millis(50));
    assert!(!waiting.is_finished(), "returned while two handlers ran");
    gate.add_permits(2);
    assert_eq!(joined(waiting).await, 0, "both handlers finished in time");
    // What the wait saw end had ended and was acknowledged.
    let ended: Vec<Msg> = calls.ended.lock().unwrap().clone();
    assert_eq!(ended.iter().filter(|m| m.0 == 0).count(), 2);
    let resolved = broker.acks.resolved.lock().unwrap().len();
    assert_eq!(resolved, 8);

    // Stream 1 goes on; stream 0 is never served again.
    for seq in 6..9 {
        broker.publish((1, 3, seq), Criticality::High);
    }
    wait_for("stream 1's later ones", || {
        calls.ended.lock().unwrap().len() == 11
    })
    .await;
    let started: Vec<Msg> = calls.started.lock().unwrap().clone();
    assert_eq!(
        started.iter().filter(|m| m.0 == 0).count(),
        2,
        "{started:?}"
    );
    let stats = runtime.stats();
    assert_eq!(
        (
            stats.ledger.total().released,
            stats.ledger.total().completed
        ),
        (10, 11)
    );
    drop(broker);
    let report = runtime.shutdown(Duration::from_secs(5)).await;
    assert!(report.stats.balances(), "{report}");
    assert_eq!(report.stats.alive, 0);
}

/// Messages held by the intake (their tier refused under Backpressure) and one that fails
/// after the revocation and waits for its retry are not where `release_where` looks: they are
/// released where they move on (the intake's next turn, the retry's dispatch), never served.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn held_and_retrying_messages_of_a_revoked_stream_are_released_where_they_move() {
    let (mut broker, source) = Broker::new();
    let calls = Arc::new(Calls::default());
    let gate = Arc::new(Semaphore::new(0));
    let mut config = config(2);
    config.policy[Criticality::Sheddable] = RefusalPolicy::Backpressure;
    // The operator sheds Sheddable: its messages are held by the intake.
    config.forced_shed_level = 1;
    config.retry = RetryConfig { max_retries: 3 };
    config.expert.retry = triage::runtime::BackoffConfig {
        base_backoff_ms: 1,
        max_backoff_ms: 5,
    };
    let (c, g) = (Arc::clone(&calls), Arc::clone(&gate));
    let mut runtime = Runtime::builder(config.clone())
        .clock(common::following_tokio())
        .start(move |job: Job<Msg>| {
            let (calls, gate) = (Arc::clone(&c), Arc::clone(&g));
            async move {
                let msg = *job.payload();
                calls.started.lock().unwrap().push(msg);
                // Stream 0's High message runs until the test lets it fail: then it waits
                // for its retry.
                let fail = msg == (0, 9, 0) && job.attempt() == 0;
                if fail {
                    gate.acquire().await.unwrap().forget();
                }
                calls.ended.lock().unwrap().push(msg);
                if fail {
                    return Err(HandlerError::retryable("flaky"));
                }
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    runtime.attach(source);
    for seq in 0..4 {
        broker.publish((0, 1, seq), Criticality::Sheddable);
        broker.publish((1, 2, seq), Criticality::Sheddable);
    }
    broker.publish((0, 9, 0), Criticality::High);
    wait_for("the High one running and the Sheddable ones held", || {
        calls.started.lock().unwrap().len() == 1 && runtime.stats().held == 2
    })
    .await;
    assert_eq!(runtime.stats().parked, 6);

    // Parked ones leave at once; the held one (the first published, position 0) at the
    // intake's next turn, while Sheddable is still refused (so not by being offered and
    // popped); the retry at its dispatch.
    assert_eq!(broker.revoke(0).await, 3);
    wait_for("the held one released", || broker.was_released(0, 0)).await;
    assert_eq!(runtime.stats().held, 1);
    gate.add_permits(1);
    config.forced_shed_level = 0;
    runtime.reconfigure(config).unwrap();
    wait_for(
        "stream 1 served, stream 0's held and retry released",
        || calls.ended.lock().unwrap().len() == 5 && broker.released_of(0) == 5,
    )
    .await;
    let started: Vec<Msg> = calls.started.lock().unwrap().clone();
    assert_eq!(
        started.iter().filter(|m| m.0 == 0).collect::<Vec<_>>(),
        [&(0, 9, 0)],
        "nothing of stream 0 served after the revocation: {started:?}"
    );
    drop(broker);
    runtime.wait_idle().await;
    let report = runtime.shutdown(Duration::from_secs(5)).await;
    let total = report.stats.ledger.total();
    assert_eq!((total.completed, total.released), (4, 5), "{report}");
    assert!(report.stats.balances(), "{report}");
}

/// A handler that never ends: the wait gives up at its bound and says one still runs.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_wait_for_running_handlers_is_bounded() {
    let (mut broker, source) = Broker::new();
    let started = Arc::new(Semaphore::new(0));
    let s = Arc::clone(&started);
    let mut runtime = Runtime::builder(config(1))
        .clock(common::following_tokio())
        .start(move |_job: Job<Msg>| {
            let started = Arc::clone(&s);
            async move {
                started.add_permits(1);
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    runtime.attach(source);
    broker.publish((0, 1, 0), Criticality::Critical);
    started.acquire().await.unwrap().forget();
    assert_eq!(broker.revoke(0).await, 0);
    let still = broker.wait_running(0, Duration::from_millis(20));
    assert_eq!(joined(still).await, 1);
    // Another stream's messages are not waited for.
    assert_eq!(
        joined(broker.wait_running(1, Duration::from_secs(60))).await,
        0
    );
    let report = runtime.shutdown(Duration::from_millis(200)).await;
    assert!(report.grace_exceeded);
    assert_eq!(report.stats.ledger.total().released, 1);
}

/// A recall from the source's own thread frees the key of a queued message it takes back; the
/// next message of that key (another stream's: an ordering-key collision) is offered there,
/// refused (its tier shed under Backpressure) and held in a task of the runtime's. Nothing
/// panics for want of a tokio context; the held message is served later; the taken back one
/// never.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_key_freed_by_a_recall_offers_its_next_message_from_the_source_thread() {
    let (mut broker, source) = Broker::new();
    let calls = Arc::new(Calls::default());
    let gate = Arc::new(Semaphore::new(0));
    let mut config = config(1);
    config.policy[Criticality::Sheddable] = RefusalPolicy::Backpressure;
    let (c, g) = (Arc::clone(&calls), Arc::clone(&gate));
    let mut runtime = Runtime::builder(config.clone())
        .clock(common::following_tokio())
        .start(move |job: Job<Msg>| {
            let (calls, gate) = (Arc::clone(&c), Arc::clone(&g));
            async move {
                let msg = *job.payload();
                calls.started.lock().unwrap().push(msg);
                if msg == (0, 1, 0) {
                    gate.acquire().await.unwrap().forget();
                }
                calls.ended.lock().unwrap().push(msg);
                Ok::<(), HandlerError>(())
            }
        })
        .unwrap();
    runtime.attach(source);
    // The one worker runs (0, 1, 0); (0, 2, 0) waits in the queue; (1, 9, 0) shares its
    // ordering key and is parked behind it.
    broker.publish((0, 1, 0), Criticality::High);
    wait_for("the first one running", || {
        calls.started.lock().unwrap().len() == 1
    })
    .await;
    broker.publish_keyed((0, 2, 0), Criticality::High, 77);
    broker.publish_keyed((1, 9, 0), Criticality::Sheddable, 77);
    wait_for("one queued, one parked", || {
        let stats = runtime.stats();
        stats.queued == 1 && stats.parked == 1
    })
    .await;
    // Sheddable is shed by the operator: the parked one, once its key is free, is held.
    config.forced_shed_level = 1;
    runtime.reconfigure(config.clone()).unwrap();

    assert_eq!(broker.revoke(0).await, 1, "the queued one");
    wait_for("the freed key's next message held", || {
        runtime.stats().held == 1
    })
    .await;
    config.forced_shed_level = 0;
    runtime.reconfigure(config).unwrap();
    gate.add_permits(1);
    wait_for("the held one served", || {
        calls.ended.lock().unwrap().contains(&(1, 9, 0))
    })
    .await;
    let started: Vec<Msg> = calls.started.lock().unwrap().clone();
    assert!(!started.contains(&(0, 2, 0)), "{started:?}");
    drop(broker);
    runtime.wait_idle().await;
    let report = runtime.shutdown(Duration::from_secs(5)).await;
    let total = report.stats.ledger.total();
    assert_eq!((total.completed, total.released), (2, 1), "{report}");
    assert!(report.stats.balances(), "{report}");
}
