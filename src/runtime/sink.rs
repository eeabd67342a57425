//! Where deferred and dead-lettered messages go.

use std::fmt;
use std::time::SystemTime;

use futures_util::future::BoxFuture;

use crate::Criticality;

/// Why a message is being deferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeferReason {
    /// Queue-age admission refused its tier.
    Overloaded,
    /// The queue was full with nothing lower to evict.
    Full,
    /// It was evicted by a more critical message.
    Evicted,
    /// The runtime was shutting down with it still queued.
    Shutdown,
}

impl DeferReason {
    /// Lowercase name, used in the `triage-reason` header and in metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeferReason::Overloaded => "overloaded",
            DeferReason::Full => "full",
            DeferReason::Evicted => "evicted",
            DeferReason::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for DeferReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What triage adds to a re-published message, besides the original payload, key and headers.
///
/// Connectors write it as headers: `triage-criticality`, `triage-attempt`,
/// `triage-deadline-ms` (Unix milliseconds), `triage-reason`, and the origin
/// (`triage-origin-topic`/`-partition`/`-offset` for Kafka, `triage-origin-queue` for AMQP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Republish {
    /// Criticality as classified at the source, before retry demotion.
    pub criticality: Criticality,
    /// Retries so far.
    pub attempt: u32,
    /// Deferrals of this message including this one when it is being deferred (the
    /// `triage-deferrals` header of the copy); for a dead letter, the deferrals so far.
    pub deferrals: u32,
    /// Deadline as wall-clock time, if the message had one.
    pub deadline: Option<SystemTime>,
    /// Why it is re-published: a [`DeferReason`] name, or `failed` / `panicked` for a dead
    /// letter.
    pub reason: &'static str,
    /// For a dead letter, the last error's text; `None` for a deferral.
    pub error: Option<String>,
}

/// A failed publish to a defer or dead-letter destination.
#[derive(Debug)]
#[non_exhaustive]
pub enum SinkError {
    /// The broker refused, returned or did not confirm the message in time.
    NotConfirmed(String),
    /// The destination could not be reached.
    Unavailable(String),
    /// The payload cannot be re-published (too large, not representable).
    Rejected(String),
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkError::NotConfirmed(m) => write!(f, "publish not confirmed: {m}"),
            SinkError::Unavailable(m) => write!(f, "destination unavailable: {m}"),
            SinkError::Rejected(m) => write!(f, "publish rejected: {m}"),
        }
    }
}

impl std::error::Error for SinkError {}

/// A durable destination for deferred work: a Kafka topic, a RabbitMQ queue.
///
/// [`publish`](DeferSink::publish) resolves `Ok` only once the broker has durably accepted the
/// copy (Kafka `acks=all` delivery report, RabbitMQ publisher confirm); only then is the source
/// message acknowledged as `Deferred`. On `Err` the runtime falls back to backpressure: the
/// source message stays unacknowledged.
///
/// The future is boxed so the runtime can hold any sink as `Arc<dyn DeferSink<T>>`; one
/// allocation per publish is nothing next to a broker round trip.
pub trait DeferSink<T>: Send + Sync + 'static {
    /// Re-publishes `payload` with the triage headers in `info`.
    ///
    /// # Errors
    ///
    /// [`SinkError`] when the broker did not confirm the copy.
    fn publish<'a>(
        &'a self,
        payload: &'a T,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>>;
}

/// A destination for messages that failed for good. Same contract as [`DeferSink`]: `Ok` only
/// after the broker's confirmation, and until then the source message stays unacknowledged.
pub trait DeadLetterSink<T>: Send + Sync + 'static {
    /// Publishes `payload` as a dead letter with the triage headers in `info`.
    ///
    /// # Errors
    ///
    /// [`SinkError`] when the broker did not confirm the copy.
    fn publish<'a>(
        &'a self,
        payload: &'a T,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>>;
}
