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
    /// The circuit of its downstream was open (see
    /// [`RuntimeBuilder::downstream`](crate::runtime::RuntimeBuilder::downstream)).
    Circuit,
    /// Its tier's token bucket (and its lenders') had no token.
    Rate,
    /// The bytes held passed its tier's share of the memory budget.
    Memory,
    /// The operator's forced shed level refused its tier
    /// ([`RuntimeConfig::forced_shed_level`](crate::runtime::RuntimeConfig::forced_shed_level)).
    Forced,
    /// Held under backpressure while its source delivered more important work: the held
    /// buffer was full, and deferring it let the intake read on to that work instead of
    /// pausing the source (see
    /// [`RuntimeConfig::defer_held_to_make_room`](crate::runtime::RuntimeConfig::defer_held_to_make_room)).
    MakeRoom,
    /// It waited as long as its source's broker lets a delivery stay unacknowledged, less a
    /// margin (see [`ExpertConfig::patience_share`](crate::runtime::ExpertConfig::patience_share)):
    /// deferred rather than left for the broker to take back by closing the channel.
    Patience,
}

impl DeferReason {
    /// Lowercase name, used in the `triage-reason` header and in metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeferReason::Overloaded => "overloaded",
            DeferReason::Full => "full",
            DeferReason::Evicted => "evicted",
            DeferReason::Shutdown => "shutdown",
            DeferReason::Circuit => "circuit",
            DeferReason::Rate => "rate",
            DeferReason::Memory => "memory",
            DeferReason::Forced => "forced",
            DeferReason::MakeRoom => "make_room",
            DeferReason::Patience => "patience",
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
    /// Why it is re-published: a [`DeferReason`] name; for a dead letter `failed` or
    /// `panicked` (the handler), `defer_rejected` (the defer sink refused this message for
    /// good); for a reference copy `dead_letter_rejected`.
    pub reason: &'static str,
    /// For a dead letter, the last error's text; `None` for a deferral.
    pub error: Option<String>,
}

/// A failed publish to a defer or dead-letter destination.
///
/// Errors fall in two classes ([`is_permanent`](SinkError::is_permanent)), and the runtime
/// treats them differently:
///
/// - **transient** ([`NotConfirmed`](SinkError::NotConfirmed),
///   [`Unavailable`](SinkError::Unavailable)): the transport failed; the same publish may
///   succeed later. A deferral falls back to backpressure and marks the defer sink unhealthy
///   for `defer_cooldown_ms`; a dead letter is retried with the [`BackoffConfig`] backoff, off the
///   workers.
/// - **permanent** ([`Rejected`](SinkError::Rejected)): this message can never be published
///   there (larger than the producer's maximum, a missing topic, an unroutable AMQP publish).
///   A deferral goes to the dead-letter path once (reason `defer_rejected`), and the defer sink
///   stays healthy for every other message; a dead letter is replaced by a *reference copy*
///   ([`DeadLetterSink::publish_reference`]), and if that is refused for good too, the message
///   is held unacknowledged (its source position kept) and counted in
///   `triage_dead_letter_rejected_total`.
///
/// [`BackoffConfig`]: crate::runtime::BackoffConfig
#[derive(Debug)]
#[non_exhaustive]
pub enum SinkError {
    /// The broker refused, returned or did not confirm the message in time. Transient.
    NotConfirmed(String),
    /// The destination could not be reached. Transient.
    Unavailable(String),
    /// This message can never be published there: too large, a missing topic, unroutable.
    /// Permanent: publishing it again would be refused again.
    Rejected(String),
}

impl SinkError {
    /// Whether publishing the same message again would be refused again
    /// ([`Rejected`](SinkError::Rejected)), as opposed to a transport failure that may pass.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::runtime::SinkError;
    ///
    /// assert!(SinkError::Rejected("record too large".into()).is_permanent());
    /// assert!(!SinkError::Unavailable("connection refused".into()).is_permanent());
    /// ```
    pub fn is_permanent(&self) -> bool {
        matches!(self, SinkError::Rejected(_))
    }
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
/// message acknowledged as `Deferred`. On a transient `Err` the runtime falls back to
/// backpressure (the source message stays unacknowledged) and treats the sink as down for
/// `defer_cooldown_ms`; on a permanent one ([`SinkError::is_permanent`]) only that message is
/// given up on: it goes to the dead-letter path once (reason `defer_rejected`) and the sink
/// stays in use for the others.
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
///
/// The runtime publishes dead letters off its workers, at most
/// [`max_dead_lettering`](crate::runtime::ExpertConfig::max_dead_lettering) at once, so a
/// slow or refusing sink never keeps a worker from the next message:
///
/// 1. [`publish`](DeadLetterSink::publish) the full copy; a transient error is retried with
///    the retry backoff for as long as it lasts.
/// 2. A permanent error ([`SinkError::is_permanent`]) is answered with
///    [`publish_reference`](DeadLetterSink::publish_reference): a copy without the payload
///    that says where the original is and why it is not there.
/// 3. If the reference copy is refused for good too, the message is held unacknowledged (the
///    Kafka watermark stops before it, the AMQP delivery stays unacked), counted in
///    `triage_dead_letter_rejected_total` and logged (at most one line per 10 s); it is tried
///    again after the longest retry backoff, and released unacknowledged at shutdown.
///
/// Either way the message is recorded `Failed` only once a copy is confirmed.
pub trait DeadLetterSink<T>: Send + Sync + 'static {
    /// Publishes `payload` as a dead letter with the triage headers in `info`.
    ///
    /// # Errors
    ///
    /// [`SinkError`] when the broker did not confirm the copy; [`SinkError::Rejected`] when
    /// it never will (too large, a missing topic, unroutable).
    fn publish<'a>(
        &'a self,
        payload: &'a T,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>>;

    /// Publishes a *reference copy* in place of a dead letter that [`publish`] refused for
    /// good: the original's coordinates in the headers (`triage-origin-*`, as for any copy),
    /// the payload left empty or cut short so that it fits, `info.reason` set to
    /// `dead_letter_rejected` and `info.error` saying why the full copy was refused (at most
    /// [`wire::MAX_ERROR_BYTES`](crate::wire::MAX_ERROR_BYTES)). The original stays where it
    /// was consumed (a Kafka offset keeps its record until retention removes it).
    ///
    /// The default refuses ([`SinkError::Rejected`]): a sink that cannot build a smaller
    /// copy of its payload type leaves the message held unacknowledged, as step 3 of the
    /// trait's policy says.
    ///
    /// # Errors
    ///
    /// As [`publish`].
    ///
    /// [`publish`]: DeadLetterSink::publish
    fn publish_reference<'a>(
        &'a self,
        payload: &'a T,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        let _ = (payload, info);
        Box::pin(async {
            Err(SinkError::Rejected(
                "this dead-letter sink publishes no reference copies".to_owned(),
            ))
        })
    }
}
