//! Configuration of [`AmqpDeferSink`](super::AmqpDeferSink).

use serde::{Deserialize, Serialize};
use triage::ConfigError;

use crate::ReconnectConfig;

/// Where and how an [`AmqpDeferSink`](crate::AmqpDeferSink) re-publishes.
///
/// # Examples
///
/// ```
/// use triage_amqp::AmqpSinkConfig;
///
/// let config: AmqpSinkConfig = toml::from_str(r#"queue = "orders.deferred""#)?;
/// assert_eq!(config.confirm_timeout_ms, 10_000);
/// assert_eq!(config.routing_key(), "orders.deferred");
/// config.validate()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpSinkConfig {
    /// AMQP URI of the broker. Default `amqp://127.0.0.1:5672/%2f`.
    pub uri: String,
    /// The durable queue that receives the copies (declared unless `declare` is off).
    /// Default empty, which [`validate`](Self::validate) refuses.
    pub queue: String,
    /// Declare `queue` durable at connect. Default `true`.
    pub declare: bool,
    /// Exchange to publish to. Default `""`, the default exchange, which routes by queue
    /// name.
    pub exchange: String,
    /// Routing key. Default none: the queue name (right for the default exchange).
    pub routing_key: Option<String>,
    /// Time to wait for the broker's confirm of one publish, in milliseconds. Default
    /// 10,000. Past it the publish is an error and the source delivery stays unacked.
    pub confirm_timeout_ms: u64,
    /// Connection name shown by the broker. Default `triage-amqp-sink/<queue>`.
    pub connection_name: Option<String>,
    /// Retry schedule after a lost connection. While waiting to retry, publishes fail at
    /// once with `SinkError::Unavailable` (the runtime falls back to backpressure).
    pub reconnect: ReconnectConfig,
    /// Largest copy published, body plus [`HEADROOM_BYTES`](Self::HEADROOM_BYTES), in bytes:
    /// a larger one is refused before it is sent (`SinkError::Rejected`, a per-message
    /// rejection, not an outage). Keep it at most the broker's `max_message_size` (RabbitMQ
    /// 3.10's default is 128 MiB), and at least the sources' `max_payload_bytes` plus the
    /// headroom: [`AmqpSource::connect_republishing`](crate::AmqpSource::connect_republishing)
    /// refuses to start otherwise. Default 16 MiB + 64 KiB (the source's default
    /// `max_payload_bytes` plus room); allowed `4096..=536870912` (RabbitMQ's hard limit,
    /// 512 MiB).
    pub max_message_bytes: usize,
}

impl Default for AmqpSinkConfig {
    fn default() -> Self {
        AmqpSinkConfig {
            uri: "amqp://127.0.0.1:5672/%2f".to_owned(),
            queue: String::new(),
            declare: true,
            exchange: String::new(),
            routing_key: None,
            confirm_timeout_ms: 10_000,
            connection_name: None,
            reconnect: ReconnectConfig::default(),
            max_message_bytes: 16 * 1024 * 1024 + 64 * 1024,
        }
    }
}

impl AmqpSinkConfig {
    /// Room a copy needs beyond the original body, in bytes: triage's headers (the error text
    /// bounded by [`triage::wire::MAX_ERROR_BYTES`], the origin queue's name by AMQP's 255)
    /// and the frame overhead. The original headers and properties are copied as they are
    /// and come on top.
    pub const HEADROOM_BYTES: usize = 4096;

    /// A default configuration publishing to `queue` at `uri` through the default exchange.
    pub fn new(uri: impl Into<String>, queue: impl Into<String>) -> Self {
        AmqpSinkConfig {
            uri: uri.into(),
            queue: queue.into(),
            ..AmqpSinkConfig::default()
        }
    }

    /// The routing key used: `routing_key`, or the queue name.
    pub fn routing_key(&self) -> &str {
        self.routing_key.as_deref().unwrap_or(&self.queue)
    }

    /// Checks the ranges.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first field out of range: `queue` (empty),
    /// `confirm_timeout_ms` (outside `1..=600000`), `max_message_bytes` (outside
    /// `4096..=536870912`), `reconnect.*`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.queue.is_empty() {
            return Err(ConfigError::new("queue", "\"\"", "a non-empty queue name"));
        }
        if self.confirm_timeout_ms == 0 || self.confirm_timeout_ms > 600_000 {
            return Err(ConfigError::new(
                "confirm_timeout_ms",
                self.confirm_timeout_ms,
                "1..=600000",
            ));
        }
        if !(Self::HEADROOM_BYTES..=536_870_912).contains(&self.max_message_bytes) {
            return Err(ConfigError::new(
                "max_message_bytes",
                self.max_message_bytes,
                "4096..=536870912",
            ));
        }
        self.reconnect.validate().map_err(|e| e.within("reconnect"))
    }

    pub(crate) fn connection_name(&self) -> String {
        self.connection_name
            .clone()
            .unwrap_or_else(|| format!("triage-amqp-sink/{}", self.queue))
    }
}
