//! [`KafkaDeferSink`]: durable re-publishing for deferred and dead-lettered records.
//!
//! A deferral is only safe if the copy is durable before the original's offset is settled,
//! so the producer runs with `acks=all` and idempotence, and `publish` resolves `Ok` only
//! from a successful delivery report. Anything else is an error, sorted the way the runtime
//! expects ([`SinkError::is_permanent`]): a record refused for good (too large, invalid, a
//! missing topic or partition, not authorized) is [`SinkError::Rejected`], a transport
//! problem (timeout, broker down, full queue) is transient. As a dead-letter sink it also
//! publishes reference copies ([`KafkaDeferSink::send_reference`]) in place of dead letters
//! refused for good.

mod config;
mod headers;

use std::fmt;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use triage::runtime::{DeadLetterSink, DeferSink, Republish, SinkError};

use crate::{metrics, Error, KafkaMessage};

pub use config::KafkaSinkConfig;

/// Room left for the record's framing and triage's headers when checking the size up front.
const OVERHEAD_BYTES: usize = 1024;

/// How much of the payload a reference copy keeps, in bytes: enough to recognise the record
/// by eye, small next to any `max_message_bytes` (at least 1000) once the headers are counted.
pub const REFERENCE_PAYLOAD_BYTES: usize = 1024;

/// A producer to one topic, usable as the runtime's [`DeferSink`] or [`DeadLetterSink`]
/// (build one instance per topic).
///
/// The copy carries the original key and payload, the original headers exactly once each
/// (an original header named like one of triage's is replaced, not repeated), and triage's
/// headers as the core's wire contract ([`triage::wire`]) names them: criticality, attempt,
/// deferrals, deadline, reason, origin topic/partition/offset, and for dead letters the error,
/// cut to [`triage::wire::MAX_ERROR_BYTES`].
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
/// use triage::runtime::DeferSink;
/// use triage_kafka::{KafkaDeferSink, KafkaMessage, KafkaSinkConfig};
///
/// let sink = KafkaDeferSink::new(KafkaSinkConfig::new("127.0.0.1:9092", "orders.deferred"))?;
/// let as_defer: Arc<dyn DeferSink<KafkaMessage>> = Arc::new(sink);
/// # let _ = as_defer;
/// # Ok::<(), triage_kafka::Error>(())
/// ```
pub struct KafkaDeferSink {
    producer: FutureProducer,
    topic: String,
    max_message_bytes: usize,
    message_timeout: Duration,
}

impl fmt::Debug for KafkaDeferSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaDeferSink")
            .field("topic", &self.topic)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("message_timeout", &self.message_timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaDeferSink {
    /// Validates `config` and creates the producer. Needs no async runtime to build, but
    /// publishing must run inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a value out of range, [`Error::Client`] if librdkafka refuses
    /// the properties.
    pub fn new(config: KafkaSinkConfig) -> Result<Self, Error> {
        config.validate()?;
        crate::metrics::describe();
        let mut client = ClientConfig::new();
        for (k, v) in config.client_properties() {
            client.set(k, v);
        }
        let producer: FutureProducer = client.create().map_err(Error::Client)?;
        Ok(KafkaDeferSink {
            producer,
            message_timeout: config.message_timeout(),
            max_message_bytes: config.max_message_bytes,
            topic: config.topic,
        })
    }

    /// The destination topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The largest record it sends, in bytes ([`KafkaSinkConfig::max_message_bytes`]).
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Publishes the copy and waits for its delivery report.
    ///
    /// # Errors
    ///
    /// [`SinkError::Rejected`] if the record can never be published there: it exceeds
    /// `max_message_bytes` (or the broker's or topic's limit), is invalid, the topic or
    /// partition does not exist, or the client is not authorized (see `classify_error` in
    /// this module for the exact codes). [`SinkError::Unavailable`] if the brokers are down or
    /// the local queue stays full, [`SinkError::NotConfirmed`] if the delivery otherwise failed
    /// or timed out.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not recall the record: it may still be delivered, so a
    /// cancelled publish must be treated as failed (the original stays unacknowledged;
    /// at-least-once).
    pub async fn send(&self, msg: &KafkaMessage, info: &Republish) -> Result<(), SinkError> {
        let headers = headers::republish_headers(msg, info);
        self.send_record(msg.key.as_deref(), msg.payload.as_deref(), &headers)
            .await
    }

    /// Publishes a *reference copy* of `msg` in place of a dead letter refused for good and
    /// waits for its delivery report: the key, the first [`REFERENCE_PAYLOAD_BYTES`] of the
    /// payload, the original headers if they still fit within `max_message_bytes` (dropped
    /// otherwise, since they may be what made the record too large), and triage's headers
    /// from `info` (origin topic/partition/offset, `triage-reason`, and `triage-error` cut to
    /// [`triage::wire::MAX_ERROR_BYTES`]). The original stays in its topic at its offset
    /// until retention removes it.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send): [`SinkError::Rejected`] when even the reference copy can never
    /// be published (a missing topic, a key larger than `max_message_bytes`).
    ///
    /// # Cancel safety
    ///
    /// As [`send`](Self::send).
    pub async fn send_reference(
        &self,
        msg: &KafkaMessage,
        info: &Republish,
    ) -> Result<(), SinkError> {
        let key = msg.key.as_deref();
        let payload = msg
            .payload
            .as_deref()
            .map(|p| &p[..p.len().min(REFERENCE_PAYLOAD_BYTES)]);
        let mut headers = headers::republish_headers(msg, info);
        if record_size(key, payload, &headers) + OVERHEAD_BYTES > self.max_message_bytes {
            headers = headers::triage_headers(msg, info);
        }
        self.send_record(key, payload, &headers).await
    }

    async fn send_record(
        &self,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: &[(String, Option<Vec<u8>>)],
    ) -> Result<(), SinkError> {
        let size = record_size(key, payload, headers);
        if size + OVERHEAD_BYTES > self.max_message_bytes {
            return Err(SinkError::Rejected(format!(
                "record of {size} bytes exceeds max_message_bytes {}",
                self.max_message_bytes
            )));
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.topic).headers(headers::to_owned_headers(headers));
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(payload) = payload {
            record = record.payload(payload);
        }
        // `message.timeout.ms` bounds the delivery; the outer timeout only guards against a
        // report that never comes (it should not happen), so it allows a few seconds more.
        let delivery = self.producer.send(record, self.message_timeout);
        match tokio::time::timeout(self.message_timeout + Duration::from_secs(5), delivery).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((err, _))) => Err(classify_error(err)),
            Err(_) => Err(SinkError::NotConfirmed(format!(
                "no delivery report within {:?}",
                self.message_timeout + Duration::from_secs(5)
            ))),
        }
    }

    /// Waits up to `timeout` for records still in flight (before dropping the sink).
    ///
    /// # Errors
    ///
    /// [`SinkError::NotConfirmed`] if some were not delivered in time.
    pub fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        self.producer
            .flush(timeout)
            .map_err(|e| SinkError::NotConfirmed(e.to_string()))
    }

    async fn publish_to(
        &self,
        destination: &'static str,
        msg: &KafkaMessage,
        info: &Republish,
        reference: bool,
    ) -> Result<(), SinkError> {
        let result = if reference {
            self.send_reference(msg, info).await
        } else {
            self.send(msg, info).await
        };
        let label = match &result {
            Ok(()) => "ok",
            Err(SinkError::Rejected(_)) => "rejected",
            Err(SinkError::Unavailable(_)) => "unavailable",
            Err(_) => "not_confirmed",
        };
        metrics::published(destination, label);
        result
    }
}

fn record_size(
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    headers: &[(String, Option<Vec<u8>>)],
) -> usize {
    key.map_or(0, <[u8]>::len)
        + payload.map_or(0, <[u8]>::len)
        + headers
            .iter()
            .map(|(n, v)| n.len() + v.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
}

/// Sorts a producer error into the runtime's two classes ([`SinkError::is_permanent`]).
///
/// Permanent ([`SinkError::Rejected`]): the record itself can never be accepted there, so
/// publishing it again is pointless: too large for the producer or the topic, an invalid
/// record or timestamp, a topic or partition that does not exist once librdkafka's
/// `topic.metadata.propagation.max.ms` has passed (default 30 s; while it runs, or if
/// `message.timeout.ms` ends first, the record times out instead, which is transient), an
/// invalid topic name, or an authorization refusal (the same client is refused again until
/// an operator changes the ACLs, as for a topic created later; the runtime retries held dead
/// letters rarely for that reason). Everything else (timeouts, brokers down, a full local
/// queue, leader changes) is a transport problem: [`SinkError::Unavailable`] when the record
/// never left the client, [`SinkError::NotConfirmed`] otherwise.
fn classify_error(err: KafkaError) -> SinkError {
    match err.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTimestamp
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownPartition
            | RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
        ) => SinkError::Rejected(err.to_string()),
        Some(
            RDKafkaErrorCode::QueueFull
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure,
        ) => SinkError::Unavailable(err.to_string()),
        _ => SinkError::NotConfirmed(err.to_string()),
    }
}

impl DeferSink<KafkaMessage> for KafkaDeferSink {
    fn publish<'a>(
        &'a self,
        payload: &'a KafkaMessage,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        self.publish_to("defer", payload, info, false).boxed()
    }
}

impl DeadLetterSink<KafkaMessage> for KafkaDeferSink {
    fn publish<'a>(
        &'a self,
        payload: &'a KafkaMessage,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        self.publish_to("dead_letter", payload, info, false).boxed()
    }

    /// A reference copy ([`KafkaDeferSink::send_reference`]): key, first
    /// [`REFERENCE_PAYLOAD_BYTES`] of the payload, origin coordinates and why the full copy
    /// was refused.
    fn publish_reference<'a>(
        &'a self,
        payload: &'a KafkaMessage,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        self.publish_to("dead_letter_reference", payload, info, true)
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_for_good_are_permanent_transport_problems_are_not() {
        let class = |code| classify_error(KafkaError::MessageProduction(code)).is_permanent();
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::UnknownPartition,
            RDKafkaErrorCode::InvalidRecord,
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ] {
            assert!(class(code), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::RequestTimedOut,
        ] {
            assert!(!class(code), "{code:?}");
        }
    }
}
