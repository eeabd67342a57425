//! A single-partition in-memory log, like the core's `MemoryBroker`, that also tells the
//! producer how each message ended: the retry storm re-submits what was shed while it can
//! still be served in time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use triage::ledger::Disposition;
use triage::runtime::{Ack, AckRef, AckSink, Envelope, Source};
use triage::Criticality;

use crate::msg::Msg;

/// Called with each message's disposition, outside the broker's lock.
pub type OnSettle = Arc<dyn Fn(&Msg, Disposition) + Send + Sync>;

#[derive(Default)]
struct State {
    log: VecDeque<Envelope<Msg>>,
    /// Messages not yet acknowledged, by sequence number.
    unsettled: Vec<Option<Msg>>,
    closed: bool,
}

struct Inner {
    state: Mutex<State>,
    available: Notify,
    backlog: AtomicU64,
    on_settle: Mutex<Option<OnSettle>>,
}

impl AckSink for Inner {
    fn resolve(&self, token: AckRef, disposition: Disposition) {
        let msg = self
            .state
            .lock()
            .unsettled
            .get_mut(token.position as usize)
            .and_then(Option::take);
        let hook = self.on_settle.lock().clone();
        if let (Some(msg), Some(hook)) = (msg, hook) {
            hook(&msg, disposition);
        }
    }
}

/// The log. Cheap to clone.
#[derive(Clone)]
pub struct SimBroker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SimBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBroker")
            .field("backlog", &self.backlog())
            .finish()
    }
}

impl Default for SimBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl SimBroker {
    /// An empty, open log.
    pub fn new() -> Self {
        SimBroker {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                available: Notify::new(),
                backlog: AtomicU64::new(0),
                on_settle: Mutex::new(None),
            }),
        }
    }

    /// Calls `hook` with each disposition from now on (`None`: no more calls; clear it at the
    /// end of a run, since a hook that publishes here holds the broker).
    pub fn on_settle(&self, hook: Option<OnSettle>) {
        *self.inner.on_settle.lock() = hook;
    }

    /// Appends `msg` at `tier`, deferred `deferrals` times so far. Once the log is closed,
    /// nothing more is appended (a producer's late re-submission is lost with it).
    pub fn publish(&self, msg: Msg, tier: Criticality, deferrals: u32) {
        {
            let mut st = self.inner.state.lock();
            if st.closed {
                return;
            }
            let seq = st.unsettled.len() as u64;
            st.unsettled.push(Some(msg));
            let sink: Arc<dyn AckSink> = self.inner.clone();
            let ack = Ack::new(
                sink,
                AckRef {
                    stream: 0,
                    position: seq,
                    epoch: 0,
                },
            );
            let mut env = Envelope::new(msg, tier, ack)
                .with_deadline(msg.deadline)
                .with_size_bytes(msg.size as usize)
                .with_deferrals(deferrals)
                .with_ordering_key_opt(msg.key);
            env.cohort = Some(msg.cohort);
            st.log.push_back(env);
            self.inner
                .backlog
                .store(st.log.len() as u64, Ordering::Relaxed);
        }
        self.inner.available.notify_one();
    }

    /// No more messages: the source finishes once the log is drained.
    pub fn close(&self) {
        self.inner.state.lock().closed = true;
        self.inner.available.notify_waiters();
        self.inner.available.notify_one();
    }

    /// Messages published and not yet pulled.
    pub fn backlog(&self) -> usize {
        self.inner.state.lock().log.len()
    }

    /// A source over the log.
    pub fn source(&self) -> SimSource {
        SimSource {
            broker: self.clone(),
        }
    }
}

/// A [`Source`] over a [`SimBroker`].
#[derive(Debug)]
pub struct SimSource {
    broker: SimBroker,
}

impl Source for SimSource {
    type Payload = Msg;

    async fn next(&mut self) -> Option<Envelope<Msg>> {
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

    fn lag(&self) -> Option<u64> {
        Some(self.broker.inner.backlog.load(Ordering::Relaxed))
    }
}
