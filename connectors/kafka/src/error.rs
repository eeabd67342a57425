//! Errors of building a source or a sink.

use rdkafka::error::KafkaError;
use thiserror::Error;

/// Why a [`KafkaSource`](crate::KafkaSource) or [`KafkaDeferSink`](crate::KafkaDeferSink)
/// could not be built.
///
/// Runtime failures are not here: a failed commit is retried and counted
/// ([`metrics`](crate::metrics)), a failed publish is a [`triage::runtime::SinkError`].
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is out of range; the source names the field.
    #[error("invalid kafka connector configuration")]
    Config(#[from] triage::ConfigError),
    /// librdkafka refused the client configuration or could not create the client.
    #[error("could not create the kafka client")]
    Client(#[source] KafkaError),
    /// The consumer could not subscribe to its topics.
    #[error("could not subscribe to the topics")]
    Subscribe(#[source] KafkaError),
    /// The consumer's poll thread could not be started.
    #[error("could not start the consumer poll thread")]
    Spawn(#[source] std::io::Error),
}
