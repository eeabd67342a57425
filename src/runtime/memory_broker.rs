//! An in-memory broker, source and sinks: the embedded default, and the test double for unit
//! tests. Integration tests use real brokers.

use crate::sync::{AtomicBool, AtomicU64, Ordering};
use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use quanta::Instant;
use tokio::sync::Notify;

use crate::ledger::Disposition;
use crate::runtime::{
    Ack, AckRef, AckSink, DeadLetterSink, DeferSink, Envelope, Republish, SinkError, Source,
};
use crate::Criticality;

/// Acknowledgement states per message, by sequence number.
const PENDING: u8 = 0;
const RELEASED: u8 = 6;

fn code(d: Disposition) -> u8 {
    match d {
        Disposition::Completed => 1,
        Disposition::Failed => 2,
        Disposition::Deferred => 3,
        Disposition::Expired => 4,
        _ => 5,
    }
}

/// Acknowledgements seen by a [`MemoryBroker`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckCounts {
    /// Messages published.
    pub published: u64,
    /// Acknowledged `Completed`.
    pub completed: u64,
    /// Acknowledged `Failed`.
    pub failed: u64,
    /// Acknowledged `Deferred`.
    pub deferred: u64,
    /// Acknowledged `Expired`.
    pub expired: u64,
    /// Acknowledged `Shed`.
    pub shed: u64,
    /// Released unacknowledged.
    pub released: u64,
    /// Not yet acknowledged nor released (still in the broker or in the runtime).
    pub pending: u64,
    /// Second acknowledgements of an already settled message: must stay 0.
    pub duplicates: u64,
}

struct BrokerState<T> {
    log: VecDeque<Envelope<T>>,
    states: Vec<u8>,
    duplicates: u64,
    closed: bool,
}

struct BrokerInner<T> {
    state: Mutex<BrokerState<T>>,
    available: Notify,
    /// Messages published and not yet pulled, readable without the lock (the source's lag).
    backlog: AtomicU64,
}

impl<T: Send + 'static> AckSink for BrokerInner<T> {
    fn resolve(&self, token: AckRef, disposition: Disposition) {
        let mut st = self.state.lock();
        let duplicate = match st.states.get_mut(token.position as usize) {
            Some(s) if *s == PENDING || *s == RELEASED => {
                *s = code(disposition);
                false
            }
            _ => true,
        };
        if duplicate {
            st.duplicates += 1;
        }
    }

    fn release(&self, token: AckRef) {
        let mut st = self.state.lock();
        if let Some(s) = st.states.get_mut(token.position as usize) {
            if *s == PENDING {
                *s = RELEASED;
            }
        }
    }
}

/// An in-memory log of messages, like a single-partition topic, with the acknowledgement state
/// of each one. Cheap to clone (one `Arc`).
///
/// # Examples
///
/// ```
/// use triage::runtime::MemoryBroker;
/// use triage::Criticality;
///
/// let broker = MemoryBroker::new();
/// broker.publish("order-1", Criticality::Critical, None);
/// assert_eq!(broker.backlog(), 1);
/// assert_eq!(broker.acks().pending, 1);
/// ```
pub struct MemoryBroker<T> {
    inner: Arc<BrokerInner<T>>,
}

impl<T> Clone for MemoryBroker<T> {
    fn clone(&self) -> Self {
        MemoryBroker {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> std::fmt::Debug for MemoryBroker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker").finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Default for MemoryBroker<T> {
    fn default() -> Self {
        MemoryBroker::new()
    }
}

impl<T: Send + 'static> MemoryBroker<T> {
    /// An empty, open broker.
    pub fn new() -> Self {
        MemoryBroker {
            inner: Arc::new(BrokerInner {
                state: Mutex::new(BrokerState {
                    log: VecDeque::new(),
                    states: Vec::new(),
                    duplicates: 0,
                    closed: false,
                }),
                available: Notify::new(),
                backlog: AtomicU64::new(0),
            }),
        }
    }

    /// Appends a message; returns its sequence number.
    pub fn publish(&self, payload: T, criticality: Criticality, deadline: Option<Instant>) -> u64 {
        self.publish_with(payload, criticality, deadline, 0)
    }

    /// Appends a message with a byte size (for the queue's byte budget); returns its sequence
    /// number.
    pub fn publish_with(
        &self,
        payload: T,
        criticality: Criticality,
        deadline: Option<Instant>,
        size_bytes: usize,
    ) -> u64 {
        self.publish_copy(payload, criticality, deadline, size_bytes, 0)
    }

    /// Appends a copy of a message that has been deferred `deferrals` times already, as a
    /// drain reads it back (its tier and its `triage-deferrals` count); returns its sequence
    /// number.
    pub fn publish_copy(
        &self,
        payload: T,
        criticality: Criticality,
        deadline: Option<Instant>,
        size_bytes: usize,
        deferrals: u32,
    ) -> u64 {
        self.append(|ack| {
            Envelope::new(payload, criticality, ack)
                .with_deadline_opt(deadline)
                .with_size_bytes(size_bytes)
                .with_deferrals(deferrals)
        })
    }

    /// Appends a message on behalf of a user or tenant (see
    /// [`Envelope::with_user`](crate::runtime::Envelope::with_user)): when its tier is admitted in part,
    /// the same users are served; returns its sequence number.
    pub fn publish_for(
        &self,
        payload: T,
        criticality: Criticality,
        deadline: Option<Instant>,
        user: &[u8],
    ) -> u64 {
        self.append(|ack| {
            Envelope::new(payload, criticality, ack)
                .with_deadline_opt(deadline)
                .with_user(user)
        })
    }

    /// Appends a message with an ordering key: the runtime processes the messages of one key
    /// one at a time, in publish order (see [`crate::ordering`]); returns its sequence number.
    pub fn publish_keyed(
        &self,
        payload: T,
        criticality: Criticality,
        deadline: Option<Instant>,
        key: u64,
    ) -> u64 {
        self.append(|ack| {
            Envelope::new(payload, criticality, ack)
                .with_deadline_opt(deadline)
                .with_ordering_key(key)
        })
    }

    /// Appends the envelope `build` makes around the message's ack.
    fn append(&self, build: impl FnOnce(Ack) -> Envelope<T>) -> u64 {
        let seq = {
            let mut st = self.inner.state.lock();
            let seq = st.states.len() as u64;
            st.states.push(PENDING);
            let sink: Arc<dyn AckSink> = self.inner.clone();
            let ack = Ack::new(
                sink,
                AckRef {
                    stream: 0,
                    position: seq,
                    epoch: 0,
                },
            );
            st.log.push_back(build(ack));
            self.inner
                .backlog
                .store(st.log.len() as u64, Ordering::Relaxed);
            seq
        };
        self.inner.available.notify_one();
        seq
    }

    /// No more messages: sources finish once the log is drained.
    pub fn close(&self) {
        self.inner.state.lock().closed = true;
        self.inner.available.notify_waiters();
        self.inner.available.notify_one();
    }

    /// Messages published and not yet pulled.
    pub fn backlog(&self) -> usize {
        self.inner.state.lock().log.len()
    }

    /// The acknowledgement state of message `seq`: `Some(disposition)` once acknowledged.
    pub fn disposition(&self, seq: u64) -> Option<Disposition> {
        let st = self.inner.state.lock();
        match st.states.get(seq as usize).copied() {
            Some(1) => Some(Disposition::Completed),
            Some(2) => Some(Disposition::Failed),
            Some(3) => Some(Disposition::Deferred),
            Some(4) => Some(Disposition::Expired),
            Some(5) => Some(Disposition::Shed),
            _ => None,
        }
    }

    /// Counts of acknowledgements so far.
    pub fn acks(&self) -> AckCounts {
        let st = self.inner.state.lock();
        let mut c = AckCounts {
            published: st.states.len() as u64,
            duplicates: st.duplicates,
            ..AckCounts::default()
        };
        for s in &st.states {
            match *s {
                1 => c.completed += 1,
                2 => c.failed += 1,
                3 => c.deferred += 1,
                4 => c.expired += 1,
                5 => c.shed += 1,
                RELEASED => c.released += 1,
                _ => c.pending += 1,
            }
        }
        c
    }

    /// A source that pulls from this broker's log.
    pub fn source(&self) -> MemorySource<T> {
        MemorySource {
            broker: self.clone(),
        }
    }
}

/// A [`Source`] over a [`MemoryBroker`]'s log. Finishes once the broker is closed and drained.
pub struct MemorySource<T> {
    broker: MemoryBroker<T>,
}

impl<T> std::fmt::Debug for MemorySource<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemorySource").finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Source for MemorySource<T> {
    type Payload = T;

    async fn next(&mut self) -> Option<Envelope<T>> {
        loop {
            let notified = self.broker.inner.available.notified();
            {
                let mut st = self.broker.inner.state.lock();
                if let Some(env) = st.log.pop_front() {
                    self.broker
                        .inner
                        .backlog
                        .store(st.log.len() as u64, Ordering::Relaxed);
                    return Some(env);
                }
                if st.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// The messages published and not yet pulled.
    fn lag(&self) -> Option<u64> {
        Some(self.broker.inner.backlog.load(Ordering::Relaxed))
    }
}

/// Which payloads a [`MemorySink`] refuses for good.
type RejectIf<T> = Box<dyn Fn(&T) -> bool + Send + Sync>;

/// A defer and dead-letter sink that keeps what it is given, for the embedded default and
/// tests. It can be made to fail the way a broker does, to exercise the runtime's policies:
/// [`set_failing`](MemorySink::set_failing) fails every publish in transport
/// ([`SinkError::Unavailable`]), [`set_rejecting`](MemorySink::set_rejecting) and
/// [`reject_if`](MemorySink::reject_if) refuse full copies for good ([`SinkError::Rejected`],
/// like a record over the producer's maximum), and
/// [`set_rejecting_references`](MemorySink::set_rejecting_references) refuses reference
/// copies too (like a missing topic).
pub struct MemorySink<T> {
    items: Mutex<Vec<(T, Republish)>>,
    references: Mutex<Vec<(T, Republish)>>,
    failing: AtomicBool,
    rejecting: AtomicBool,
    rejecting_references: AtomicBool,
    reject_if: Option<RejectIf<T>>,
}

impl<T> std::fmt::Debug for MemorySink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemorySink")
            .field("len", &self.items.lock().len())
            .field("references", &self.references.lock().len())
            .finish_non_exhaustive()
    }
}

impl<T> Default for MemorySink<T> {
    fn default() -> Self {
        MemorySink {
            items: Mutex::new(Vec::new()),
            references: Mutex::new(Vec::new()),
            failing: AtomicBool::new(false),
            rejecting: AtomicBool::new(false),
            rejecting_references: AtomicBool::new(false),
            reject_if: None,
        }
    }
}

impl<T: Clone> MemorySink<T> {
    /// An empty sink that accepts everything.
    pub fn new() -> Self {
        MemorySink::default()
    }

    /// Refuses for good ([`SinkError::Rejected`]) the full copy of every payload for which
    /// `reject` is true, as a broker refuses a record too large for it.
    #[must_use]
    pub fn reject_if(mut self, reject: impl Fn(&T) -> bool + Send + Sync + 'static) -> Self {
        self.reject_if = Some(Box::new(reject));
        self
    }

    /// Makes every publish fail in transport (`true`, [`SinkError::Unavailable`]) or succeed
    /// (`false`).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::Relaxed);
    }

    /// Makes every full copy be refused for good (`true`, [`SinkError::Rejected`]) or not.
    pub fn set_rejecting(&self, rejecting: bool) {
        self.rejecting.store(rejecting, Ordering::Relaxed);
    }

    /// Makes every reference copy ([`DeadLetterSink::publish_reference`]) be refused for
    /// good (`true`) or accepted (`false`, the default).
    pub fn set_rejecting_references(&self, rejecting: bool) {
        self.rejecting_references
            .store(rejecting, Ordering::Relaxed);
    }

    /// Everything published so far, with its triage headers.
    pub fn items(&self) -> Vec<(T, Republish)> {
        self.items.lock().clone()
    }

    /// The reference copies published so far, with their triage headers. A broker's sink
    /// writes the original's coordinates and no payload; this one keeps the payload, which
    /// stands for the coordinates.
    pub fn references(&self) -> Vec<(T, Republish)> {
        self.references.lock().clone()
    }

    /// Number of messages published (reference copies not included).
    pub fn len(&self) -> usize {
        self.items.lock().len()
    }

    /// Whether nothing was published.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn accept(&self, payload: &T, info: &Republish) -> Result<(), SinkError> {
        if self.failing.load(Ordering::Relaxed) {
            return Err(SinkError::Unavailable("memory sink set to fail".into()));
        }
        if self.rejecting.load(Ordering::Relaxed)
            || self.reject_if.as_ref().is_some_and(|r| r(payload))
        {
            return Err(SinkError::Rejected("memory sink set to reject".into()));
        }
        self.items.lock().push((payload.clone(), info.clone()));
        Ok(())
    }

    fn accept_reference(&self, payload: &T, info: &Republish) -> Result<(), SinkError> {
        if self.failing.load(Ordering::Relaxed) {
            return Err(SinkError::Unavailable("memory sink set to fail".into()));
        }
        if self.rejecting_references.load(Ordering::Relaxed) {
            return Err(SinkError::Rejected(
                "memory sink set to reject references".into(),
            ));
        }
        self.references.lock().push((payload.clone(), info.clone()));
        Ok(())
    }
}

impl<T: Clone + Send + Sync + 'static> DeferSink<T> for MemorySink<T> {
    fn publish<'a>(
        &'a self,
        payload: &'a T,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move { self.accept(payload, info) })
    }
}

impl<T: Clone + Send + Sync + 'static> DeadLetterSink<T> for MemorySink<T> {
    fn publish<'a>(
        &'a self,
        payload: &'a T,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move { self.accept(payload, info) })
    }

    fn publish_reference<'a>(
        &'a self,
        payload: &'a T,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move { self.accept_reference(payload, info) })
    }
}
