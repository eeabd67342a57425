//! Configuration of [`KafkaDeferSink`](super::KafkaDeferSink).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use triage::ConfigError;

/// Producer properties the sink sets itself; `properties` may not override them.
const MANAGED_PROPERTIES: [&str; 5] = [
    "bootstrap.servers",
    "acks",
    "enable.idempotence",
    "message.timeout.ms",
    "message.max.bytes",
];

/// Configuration of a [`KafkaDeferSink`](super::KafkaDeferSink): one destination topic.
///
/// # Examples
///
/// ```
/// use triage_kafka::KafkaSinkConfig;
///
/// let config = KafkaSinkConfig::new("127.0.0.1:9092", "orders.deferred");
/// config.validate()?;
/// assert_eq!(config.message_timeout_ms, 10_000);
/// # Ok::<(), triage::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Comma-separated `host:port` list. Default `127.0.0.1:9092`.
    pub bootstrap_servers: String,
    /// Destination topic (create it beforehand, with the retention deferred work needs).
    /// Default empty, which [`validate`](Self::validate) refuses.
    pub topic: String,
    /// librdkafka's `message.timeout.ms`: how long a publish may take, retries included,
    /// before it fails, in milliseconds. Default 10000; allowed `1..=900_000`.
    ///
    /// It also sets librdkafka's `topic.metadata.propagation.max.ms` (how long a topic the
    /// cluster does not know is waited for before its records fail as an unknown topic) to
    /// half of it, at most 30000 (librdkafka's default), unless `properties` sets it: with
    /// librdkafka's own default the record would time out first, and a timeout is transient,
    /// so a missing destination topic would be retried for ever instead of being refused for
    /// good (`SinkError::Rejected`).
    pub message_timeout_ms: u64,
    /// librdkafka's `message.max.bytes`: the largest record the producer sends (key,
    /// payload and headers); bigger ones are refused as `SinkError::Rejected`, and so are
    /// records the destination topic's own `max.message.bytes` refuses. It must cover the
    /// largest record the source reads plus triage's headers: a
    /// [`KafkaSource`](crate::KafkaSource) built with
    /// [`republish_to`](crate::KafkaSourceBuilder::republish_to) this sink refuses to start
    /// unless `max_message_bytes >= max_payload_bytes +`
    /// [`HEADROOM_BYTES`](Self::HEADROOM_BYTES). Create the destination topic with a
    /// `max.message.bytes` at least this large. Default 33619968 (32 MiB + 64 KiB: the source's
    /// default `max_payload_bytes` plus room); allowed `1000..=1_000_000_000`.
    pub max_message_bytes: usize,
    /// Extra librdkafka producer properties (e.g. `linger.ms`, `compression.type`). Default
    /// empty. `bootstrap.servers`, `acks`, `enable.idempotence`, `message.timeout.ms` and
    /// `message.max.bytes` are refused: they are fields or fixed (acks=all, idempotence on).
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaSinkConfig {
    fn default() -> Self {
        KafkaSinkConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            topic: String::new(),
            message_timeout_ms: 10_000,
            max_message_bytes: 32 * 1024 * 1024 + 64 * 1024,
            properties: BTreeMap::new(),
        }
    }
}

impl KafkaSinkConfig {
    /// Room a copy needs beyond the original record, in bytes: triage's headers (at most
    /// about 1,600 bytes, the error text bounded by [`triage::wire::MAX_ERROR_BYTES`] and the
    /// origin topic's name by Kafka's 249 characters) and the record's framing.
    pub const HEADROOM_BYTES: usize = 4096;

    /// A configuration publishing to `topic`, every other field at its default.
    pub fn new(bootstrap_servers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSinkConfig {
            bootstrap_servers: bootstrap_servers.into(),
            topic: topic.into(),
            ..KafkaSinkConfig::default()
        }
    }

    /// Checks every field against its documented range.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first field out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::new(
                "bootstrap_servers",
                "\"\"",
                "a non-empty host:port list",
            ));
        }
        if self.topic.trim().is_empty() {
            return Err(ConfigError::new("topic", "\"\"", "a non-empty topic name"));
        }
        if !(1..=900_000).contains(&self.message_timeout_ms) {
            return Err(ConfigError::new(
                "message_timeout_ms",
                self.message_timeout_ms,
                "1..=900000",
            ));
        }
        if !(1000..=1_000_000_000).contains(&self.max_message_bytes) {
            return Err(ConfigError::new(
                "max_message_bytes",
                self.max_message_bytes,
                "1000..=1000000000",
            ));
        }
        if let Some(key) = self
            .properties
            .keys()
            .find(|k| MANAGED_PROPERTIES.contains(&k.as_str()))
        {
            return Err(ConfigError::new(
                format!("properties.{key}"),
                &self.properties[key],
                "unset: the sink manages this property",
            ));
        }
        Ok(())
    }

    /// [`message_timeout_ms`](Self::message_timeout_ms) as a duration.
    pub fn message_timeout(&self) -> Duration {
        Duration::from_millis(self.message_timeout_ms)
    }

    pub(crate) fn client_properties(&self) -> BTreeMap<String, String> {
        let mut props = BTreeMap::from([
            (
                "bootstrap.servers".to_owned(),
                self.bootstrap_servers.clone(),
            ),
            // Durable before Ok: every in-sync replica has it, and retries do not duplicate.
            ("acks".to_owned(), "all".to_owned()),
            ("enable.idempotence".to_owned(), "true".to_owned()),
            (
                "message.timeout.ms".to_owned(),
                self.message_timeout_ms.to_string(),
            ),
            (
                "message.max.bytes".to_owned(),
                self.max_message_bytes.to_string(),
            ),
            // A missing topic must fail as one (permanent) before the record times out
            // (transient); `properties` may still set it.
            (
                "topic.metadata.propagation.max.ms".to_owned(),
                (self.message_timeout_ms / 2).min(30_000).to_string(),
            ),
        ]);
        for (k, v) in &self.properties {
            props.insert(k.clone(), v.clone());
        }
        props
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_fields() {
        assert_eq!(
            KafkaSinkConfig::default().validate().unwrap_err().field(),
            "topic"
        );
        let mut c = KafkaSinkConfig::new("b:1", "t");
        c.validate().unwrap();
        c.message_timeout_ms = 0;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "message_timeout_ms = 0 is out of range: allowed 1..=900000"
        );
        c.message_timeout_ms = 1;
        c.properties.insert("acks".into(), "1".into());
        assert_eq!(c.validate().unwrap_err().field(), "properties.acks");
    }

    #[test]
    fn a_missing_topic_fails_before_the_record_times_out() {
        let mut c = KafkaSinkConfig::new("b:1", "t");
        let propagation = |c: &KafkaSinkConfig| {
            c.client_properties()["topic.metadata.propagation.max.ms"].clone()
        };
        assert_eq!(propagation(&c), "5000");
        c.message_timeout_ms = 900_000;
        assert_eq!(propagation(&c), "30000");
        c.properties
            .insert("topic.metadata.propagation.max.ms".into(), "100".into());
        assert_eq!(propagation(&c), "100");
    }
}
