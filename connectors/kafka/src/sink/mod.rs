//! [`KafkaDeferSink`]: durable re-publishing for deferred and dead-lettered records.
//!
//! A deferral is only safe if the copy is durable before the original's offset is settled,
//! so the producer runs with `acks=all` and idempotence, and `publish` resolves `Ok` only
//! from a successful delivery report. Anything else (timeout, broker down, refused) is an
//! error; the runtime then leaves the original unacknowledged and falls back to
//! backpressure.

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
    /// [`SinkError::Rejected`] if the record exceeds `max_message_bytes` (or the broker's
    /// limit), [`SinkError::NotConfirmed`] if the delivery failed or timed out,
    /// [`SinkError::Unavailable`] if the producer could not enqueue it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not recall the record: it may still be delivered, so a
    /// cancelled publish must be treated as failed (the original stays unacknowledged;
    /// at-least-once).
    pub async fn send(&self, msg: &KafkaMessage, info: &Republish) -> Result<(), SinkError> {
        let headers = headers::republish_headers(msg, info);
        let size = msg.key.as_ref().map_or(0, Vec::len)
            + msg.payload.as_ref().map_or(0, Vec::len)
            + headers
                .iter()
                .map(|(n, v)| n.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>();
        if size + OVERHEAD_BYTES > self.max_message_bytes {
            return Err(SinkError::Rejected(format!(
                "record of {size} bytes exceeds max_message_bytes {}",
                self.max_message_bytes
            )));
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.topic).headers(headers::to_owned_headers(&headers));
        if let Some(key) = msg.key.as_deref() {
            record = record.key(key);
        }
        if let Some(payload) = msg.payload.as_deref() {
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
    ) -> Result<(), SinkError> {
        let result = self.send(msg, info).await;
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

fn classify_error(err: KafkaError) -> SinkError {
    match err.rdkafka_error_code() {
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize) => {
            SinkError::Rejected(err.to_string())
        }
        Some(RDKafkaErrorCode::QueueFull) => SinkError::Unavailable(err.to_string()),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            SinkError::Unavailable(err.to_string())
        }
        _ => SinkError::NotConfirmed(err.to_string()),
    }
}

impl DeferSink<KafkaMessage> for KafkaDeferSink {
    fn publish<'a>(
        &'a self,
        payload: &'a KafkaMessage,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        self.publish_to("defer", payload, info).boxed()
    }
}

impl DeadLetterSink<KafkaMessage> for KafkaDeferSink {
    fn publish<'a>(
        &'a self,
        payload: &'a KafkaMessage,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        self.publish_to("dead_letter", payload, info).boxed()
    }
}
