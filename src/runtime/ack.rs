//! Acknowledgement as a value with a status: one disposition per message, or "not processed".

use std::fmt;
use std::sync::Arc;

use crate::ledger::Disposition;

/// Where a source's acknowledgements go. Implemented by each connector.
///
/// The runtime calls [`resolve`](AckSink::resolve) exactly once per message, after the
/// message's disposition is final (for `Deferred`, after the defer sink's broker confirmed the
/// copy). A connector turns it into its broker's acknowledgement: Kafka stores the contiguous
/// watermark of its partition and commits it; RabbitMQ acks or rejects the delivery.
pub trait AckSink: Send + Sync + 'static {
    /// Records the message's final disposition. Called once per [`AckRef`].
    fn resolve(&self, token: AckRef, disposition: Disposition);

    /// Records the same final disposition for several messages, as [`resolve`](AckSink::resolve)
    /// would one after the other, in slice order. The runtime's workers settle the messages of
    /// a batch with one call, so a connector can take its lock (or send to its settle task)
    /// once per batch rather than once per message; the default calls `resolve` for each.
    fn resolve_all(&self, tokens: &[AckRef], disposition: Disposition) {
        for &token in tokens {
            self.resolve(token, disposition);
        }
    }

    /// The message was handed back without a disposition (shutdown, revocation, a dropped
    /// [`Ack`]): it must not be acknowledged, so the broker redelivers it. The default does
    /// nothing, which for a watermark-committing source is exactly "not acknowledged".
    fn release(&self, token: AckRef) {
        let _ = token;
    }

    /// Whether the message is still this consumer's to process: `false` once its broker took
    /// it back (its Kafka partition revoked, say). The default says `true`, for a source whose
    /// broker never takes a message back.
    ///
    /// A source that takes messages back through a [`Recall`](crate::runtime::Recall) answers
    /// `false` for them from before its [`Recall::release_where`](crate::runtime::Recall::release_where)
    /// call on: the runtime then asks, for every message it took before that call, at the
    /// places a message moves on (before a handler call, before a held message is offered
    /// again), and releases those taken back instead. Only messages taken before the latest
    /// recall are asked about, so it may take a lock; it must not block, nor call into the
    /// runtime.
    fn is_current(&self, token: AckRef) -> bool {
        let _ = token;
        true
    }
}

/// The identity of one [`AckSink`] object (its address): which source a message came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SinkId(usize);

impl SinkId {
    pub(crate) fn of(sink: &Arc<dyn AckSink>) -> Self {
        SinkId(Arc::as_ptr(sink).cast::<()>() as usize)
    }

    /// The value a worker's slot stores (never 0: an `Arc`'s address).
    pub(crate) fn get(self) -> usize {
        self.0
    }
}

/// A connector-defined reference to one consumed message: three numbers, so that carrying it
/// costs no allocation. Kafka uses `(partition index, offset, assignment epoch)`, RabbitMQ
/// `(channel id, delivery tag, connection epoch)`; the in-memory source uses a sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AckRef {
    /// The partition, channel or stream the message came from (connector-defined index).
    pub stream: u64,
    /// Position within the stream: Kafka offset, AMQP delivery tag, sequence number.
    pub position: u64,
    /// Generation of the stream's ownership (assignment or connection epoch): an
    /// acknowledgement from an older generation must be ignored.
    pub epoch: u64,
}

/// A message's acknowledgement handle: resolves to exactly one [`Disposition`].
///
/// Dropped without [`resolve`](Ack::resolve), it *releases* the message (not processed, never
/// done), so a bug or a cancelled task leads to a redelivery, not a loss.
///
/// # Examples
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use triage::ledger::Disposition;
/// use triage::runtime::{Ack, AckRef, AckSink};
///
/// #[derive(Default)]
/// struct Log(Mutex<Vec<(u64, Option<Disposition>)>>);
/// impl AckSink for Log {
///     fn resolve(&self, t: AckRef, d: Disposition) { self.0.lock().unwrap().push((t.position, Some(d))); }
///     fn release(&self, t: AckRef) { self.0.lock().unwrap().push((t.position, None)); }
/// }
///
/// let log = Arc::new(Log::default());
/// let at = |position| AckRef { stream: 0, position, epoch: 0 };
/// Ack::new(log.clone(), at(1)).resolve(Disposition::Completed);
/// drop(Ack::new(log.clone(), at(2)));
/// assert_eq!(*log.0.lock().unwrap(), vec![(1, Some(Disposition::Completed)), (2, None)]);
/// ```
pub struct Ack {
    sink: Option<Arc<dyn AckSink>>,
    token: AckRef,
}

impl Ack {
    /// A handle that reports to `sink` for `token`.
    pub fn new(sink: Arc<dyn AckSink>, token: AckRef) -> Self {
        Ack {
            sink: Some(sink),
            token,
        }
    }

    /// A handle that acknowledges nothing: for sources with no broker behind them (tests,
    /// in-process producers).
    pub fn noop() -> Self {
        Ack {
            sink: None,
            token: AckRef {
                stream: 0,
                position: 0,
                epoch: 0,
            },
        }
    }

    /// The message this handle acknowledges.
    pub fn token(&self) -> AckRef {
        self.token
    }

    /// Whether the message is still the consumer's to process ([`AckSink::is_current`]);
    /// `true` for a [`noop`](Ack::noop) handle.
    pub fn is_current(&self) -> bool {
        self.sink.as_ref().is_none_or(|s| s.is_current(self.token))
    }

    /// The sink this handle reports to and the message's reference; `None` for a
    /// [`noop`](Ack::noop) handle.
    pub(crate) fn ident(&self) -> Option<(SinkId, AckRef)> {
        Some((SinkId::of(self.sink.as_ref()?), self.token))
    }

    /// Records the final disposition, consuming the handle.
    pub fn resolve(mut self, disposition: Disposition) {
        if let Some(sink) = self.sink.take() {
            sink.resolve(self.token, disposition);
        }
    }

    /// The sink and the token, taken out without resolving or releasing: the caller must
    /// resolve the token on the sink (the worker's batch settlement, `AckSink::resolve_all`).
    /// `None` for a [`noop`](Ack::noop) handle.
    pub(crate) fn into_parts(self) -> Option<(Arc<dyn AckSink>, AckRef)> {
        let mut this = std::mem::ManuallyDrop::new(self);
        // The sink is moved out, so nothing is left for the skipped drop to release or leak.
        let token = this.token;
        this.sink.take().map(|sink| (sink, token))
    }

    /// Hands the message back unacknowledged (it will be redelivered), consuming the handle.
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        if let Some(sink) = self.sink.take() {
            sink.release(self.token);
        }
    }
}

impl fmt::Debug for Ack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ack")
            .field("token", &self.token)
            .field("noop", &self.sink.is_none())
            .finish()
    }
}
