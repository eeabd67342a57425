//! Configuration of [`KafkaSource`](super::KafkaSource).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use triage::ordering::OrderingConfig;
use triage::ConfigError;

use super::classify_config::{CriticalityConfig, DeadlineConfig};

/// librdkafka's default `max.poll.interval.ms`.
const DEFAULT_MAX_POLL_INTERVAL_MS: u64 = 300_000;

/// How long a revocation waits for running handlers, unless `revoke_wait_ms` says otherwise or
/// `max.poll.interval.ms` leaves less room.
const DEFAULT_REVOKE_WAIT_MS: u64 = 10_000;

/// librdkafka properties the source sets itself; `properties` may not override them.
const MANAGED_PROPERTIES: [&str; 5] = [
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "queued.max.messages.kbytes",
];

/// Configuration of a [`KafkaSource`](super::KafkaSource), e.g. a `[kafka]` table in a TOML
/// file. Every field has a default; `topics` must be set.
///
/// # Examples
///
/// ```
/// use triage_kafka::KafkaSourceConfig;
///
/// let config: KafkaSourceConfig = toml::from_str(r#"
///     bootstrap_servers = "127.0.0.1:9092"
///     group_id = "billing"
///     topics = ["orders", "audit"]
///     commit_interval_ms = 500
///     [criticality]
///     trusted_topics = ["orders"]
///     topic_tiers = { audit = "sheddable" }
///     [ordering]
///     mode = "key"
/// "#)?;
/// config.validate()?;
/// assert_eq!(config.criticality.default_tier, triage::Criticality::Medium);
/// assert_eq!(config.ordering.mode, triage::ordering::OrderingMode::Key);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// Comma-separated `host:port` list. Default `127.0.0.1:9092`.
    pub bootstrap_servers: String,
    /// Consumer group; the group's committed position is where consumption starts. Default
    /// `triage`.
    pub group_id: String,
    /// Topics to subscribe to. Default empty, which [`validate`](Self::validate) refuses.
    pub topics: Vec<String>,
    /// How a message's tier is chosen.
    pub criticality: CriticalityConfig,
    /// How a message's deadline is chosen.
    pub deadline: DeadlineConfig,
    /// Ordering (an `[ordering]` table): `mode = "unordered"` (the default: a partition's
    /// records run concurrently, only the contiguous watermark is committed), `"key"` (at most
    /// one record per key of a partition inside the runtime at a time, in offset order; keys
    /// run in parallel) or `"partition"` (one record at a time per partition); `null_key =
    /// "unordered"` (default: a record with a null key is its own key) or `"partition"` (the
    /// null-key records of a partition are one key). See [`triage::ordering`] for what each
    /// disposition does to a key.
    pub ordering: OrderingConfig,
    /// Period of the watermark commit (one synchronous commit at a time, on a thread of its
    /// own), in milliseconds. Default 1000; allowed `1..=3_600_000`. Commits also happen on
    /// revocation and at shutdown.
    pub commit_interval_ms: u64,
    /// How long shutdown waits for the final commit to be confirmed, in milliseconds (the
    /// commit itself may still complete later, on the committer thread). Default 5000;
    /// allowed `1..=600_000`.
    pub commit_timeout_ms: u64,
    /// Bound on leaving the group and closing the client at shutdown, in milliseconds
    /// (after it the client is abandoned to a background thread). Default 5000; allowed
    /// `1..=600_000`.
    pub close_timeout_ms: u64,
    /// How long a revocation waits for the handlers still running records of the revoked
    /// partitions before it commits and lets them go, in milliseconds. Default none: 10000, or
    /// less where librdkafka's `max.poll.interval.ms` (a `properties` entry, default 300000)
    /// is small, at most half of it minus `commit_timeout_ms` (0 when that is negative). A
    /// value given is allowed `0..=` that same bound.
    ///
    /// When the source is attached to a runtime, the records of revoked partitions that the
    /// runtime holds (queued, held, parked behind a key) are handed back unprocessed, for the
    /// next owner to deliver again, and the handlers already running some are waited for: so
    /// the next owner never runs a key while this member still runs it (in `key` and
    /// `partition` ordering), and their completions are in the revocation's commit. A
    /// handler still running when the wait runs out is left to finish, counted in
    /// `triage_kafka_revoke_wait_exceeded_total`: the next owner may then run its key at the
    /// same time. Keep it above the slowest handler call you expect.
    ///
    /// The wait runs in the rebalance callback, on the thread that polls the consumer, which
    /// polls nothing meanwhile; librdkafka counts `max.poll.interval.ms` from the poll that
    /// delivered the callback (rdkafka runs the callback after librdkafka's poll returned), so
    /// the wait and the commit after it must end well inside it, or the member is taken out
    /// of the group. Heartbeats go on from librdkafka's own thread. The other members wait for
    /// this one to rejoin meanwhile: the whole group's rebalance lasts as long.
    pub revoke_wait_ms: Option<u64>,
    /// Period of the lag measurement (`Source::lag`: the high watermark minus the position,
    /// summed over the assigned partitions, queried from the broker on a thread of its own),
    /// in milliseconds. Default 250; allowed `10..=3_600_000`. Each measurement costs one
    /// `ListOffsets` request per assigned partition. Keep it well below the runtime's
    /// `expert.admission.window_ms` (1000): pull-based admission infers the arrival rate from the
    /// lag's trend over that window.
    pub lag_interval_ms: u64,
    /// Messages consumed ahead of the runtime: the hand-off buffer's capacity. Default 1000;
    /// allowed `1..=1_000_000`. Records are handed over in batches of at most 64, so the
    /// buffer holds up to this many rounded up to whole batches, plus the batch the source is
    /// handing out. librdkafka's own prefetch is bounded in bytes by
    /// `queued_max_messages_kbytes`; its `queued.min.messages` keeps librdkafka's default
    /// (100,000), because tying it to this small buffer made the client fetch in tiny rounds
    /// (measured: 5,000 records/s instead of 39,000 on the consume bench).
    pub max_prefetch_messages: usize,
    /// librdkafka's `queued.max.messages.kbytes`: the client's prefetch bound in KiB (it also
    /// caps `fetch.max.bytes`). Default 16384 (16 MiB); allowed `1..=2_097_151`.
    pub queued_max_messages_kbytes: usize,
    /// Largest record the source can receive, in bytes (sets `receive.message.max.bytes`
    /// with room for the protocol overhead). Default 33554432 (32 MiB); allowed
    /// `1024..=1_000_000_000`. Every record the source reads may have to be re-published
    /// (deferred or dead-lettered), so it must agree with the sinks' limit:
    /// `max_payload_bytes + KafkaSinkConfig::HEADROOM_BYTES <= max_message_bytes` of each
    /// [`KafkaSinkConfig`](crate::KafkaSinkConfig), checked by
    /// [`validate_republish`](Self::validate_republish) and at
    /// [`build`](crate::KafkaSourceBuilder::build) for every sink given to
    /// [`republish_to`](crate::KafkaSourceBuilder::republish_to).
    pub max_payload_bytes: usize,
    /// Extra librdkafka consumer properties (e.g. `session.timeout.ms`,
    /// `auto.offset.reset`). Default: `auto.offset.reset = earliest` only. The properties the
    /// source manages (`bootstrap.servers`, `group.id`, `enable.auto.commit`,
    /// `enable.auto.offset.store`, `queued.max.messages.kbytes`) are refused.
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaSourceConfig {
    fn default() -> Self {
        KafkaSourceConfig {
            bootstrap_servers: "127.0.0.1:9092".into(),
            group_id: "triage".into(),
            topics: Vec::new(),
            criticality: CriticalityConfig::default(),
            deadline: DeadlineConfig::default(),
            ordering: OrderingConfig::default(),
            commit_interval_ms: 1000,
            commit_timeout_ms: 5000,
            close_timeout_ms: 5000,
            revoke_wait_ms: None,
            lag_interval_ms: 250,
            max_prefetch_messages: 1000,
            queued_max_messages_kbytes: 16384,
            max_payload_bytes: 32 * 1024 * 1024,
            properties: BTreeMap::from([("auto.offset.reset".into(), "earliest".into())]),
        }
    }
}

fn check_range<T: PartialOrd + std::fmt::Display>(
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(field, value, format!("{min}..={max}")));
    }
    Ok(())
}

impl KafkaSourceConfig {
    /// A configuration for `topics` with every other field at its default.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        group_id: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        KafkaSourceConfig {
            bootstrap_servers: bootstrap_servers.into(),
            group_id: group_id.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            ..KafkaSourceConfig::default()
        }
    }

    /// Checks every field against its documented range.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first field out of range, e.g.
    /// `commit_interval_ms = 0 is out of range: allowed 1..=3600000`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.bootstrap_servers.trim().is_empty() {
            return Err(ConfigError::new(
                "bootstrap_servers",
                "\"\"",
                "a non-empty host:port list",
            ));
        }
        if self.group_id.trim().is_empty() {
            return Err(ConfigError::new(
                "group_id",
                "\"\"",
                "a non-empty group name",
            ));
        }
        if self.topics.is_empty() {
            return Err(ConfigError::new("topics", "[]", "at least one topic"));
        }
        if let Some(t) = self.topics.iter().find(|t| t.trim().is_empty()) {
            return Err(ConfigError::new(
                "topics",
                format!("{t:?}"),
                "non-empty topic names",
            ));
        }
        if self.criticality.header.is_empty() {
            return Err(ConfigError::new(
                "criticality.header",
                "\"\"",
                "a non-empty header name",
            ));
        }
        if self.deadline.header.is_empty() {
            return Err(ConfigError::new(
                "deadline.header",
                "\"\"",
                "a non-empty header name",
            ));
        }
        for (tier, window) in self.deadline.window_ms.iter() {
            if let Some(w) = *window {
                check_range(&format!("deadline.window_ms.{tier}"), w, 1, 31_536_000_000)?;
            }
        }
        check_range("commit_interval_ms", self.commit_interval_ms, 1, 3_600_000)?;
        check_range("commit_timeout_ms", self.commit_timeout_ms, 1, 600_000)?;
        check_range("close_timeout_ms", self.close_timeout_ms, 1, 600_000)?;
        self.check_revoke_wait()?;
        check_range("lag_interval_ms", self.lag_interval_ms, 10, 3_600_000)?;
        check_range(
            "max_prefetch_messages",
            self.max_prefetch_messages,
            1,
            1_000_000,
        )?;
        check_range(
            "queued_max_messages_kbytes",
            self.queued_max_messages_kbytes,
            1,
            2_097_151,
        )?;
        check_range(
            "max_payload_bytes",
            self.max_payload_bytes,
            1024,
            1_000_000_000,
        )?;
        if let Some(key) = self
            .properties
            .keys()
            .find(|k| MANAGED_PROPERTIES.contains(&k.as_str()))
        {
            return Err(ConfigError::new(
                format!("properties.{key}"),
                &self.properties[key],
                "unset: the source manages this property",
            ));
        }
        Ok(())
    }

    /// The longest `revoke_wait_ms`, and `max.poll.interval.ms`: half of it minus
    /// `commit_timeout_ms`, since the rebalance callback waits and commits without polling
    /// (see `revoke_wait_ms`).
    fn revoke_wait_bound(&self) -> (u64, u64) {
        let max_poll = self
            .properties
            .get("max.poll.interval.ms")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_MAX_POLL_INTERVAL_MS);
        (
            (max_poll / 2).saturating_sub(self.commit_timeout_ms),
            max_poll,
        )
    }

    /// A `revoke_wait_ms` given stays within [`revoke_wait_bound`](Self::revoke_wait_bound).
    fn check_revoke_wait(&self) -> Result<(), ConfigError> {
        let (most, max_poll) = self.revoke_wait_bound();
        let Some(wait) = self.revoke_wait_ms else {
            return Ok(());
        };
        if wait > most {
            return Err(ConfigError::new(
                "revoke_wait_ms",
                wait,
                format!(
                    "0..={most} (half of max.poll.interval.ms = {max_poll}, minus \
                     commit_timeout_ms = {}: the rebalance callback waits and commits \
                     without polling)",
                    self.commit_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    /// Checks that every record this source may read can be re-published through a sink
    /// configured as `sink` (a defer or dead-letter topic): `max_payload_bytes +`
    /// [`KafkaSinkConfig::HEADROOM_BYTES`](crate::KafkaSinkConfig::HEADROOM_BYTES) at most
    /// the sink's `max_message_bytes`. Otherwise a record the source accepts could be refused
    /// by the producer when it has to be deferred or dead-lettered.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `max_payload_bytes` and the sink's `max_message_bytes`, e.g.
    /// `max_payload_bytes = 33554432 is out of range: allowed at most 995904 (the sink's
    /// max_message_bytes = 1000000 for topic "orders.deferred", minus 4096 bytes for triage's
    /// headers)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage_kafka::{KafkaSinkConfig, KafkaSourceConfig};
    ///
    /// let source = KafkaSourceConfig::new("127.0.0.1:9092", "billing", ["orders"]);
    /// let mut sink = KafkaSinkConfig::new("127.0.0.1:9092", "orders.deferred");
    /// source.validate_republish(&sink)?; // the defaults agree
    /// sink.max_message_bytes = 1_000_000;
    /// let err = source.validate_republish(&sink).unwrap_err();
    /// assert_eq!(err.field(), "max_payload_bytes");
    /// assert!(err.to_string().contains("max_message_bytes = 1000000"));
    /// # Ok::<(), triage::ConfigError>(())
    /// ```
    pub fn validate_republish(&self, sink: &crate::KafkaSinkConfig) -> Result<(), ConfigError> {
        self.fits_republish(&sink.topic, sink.max_message_bytes)
    }

    /// [`validate_republish`](Self::validate_republish) against a sink's topic and limit.
    pub(crate) fn fits_republish(
        &self,
        sink_topic: &str,
        sink_max_message_bytes: usize,
    ) -> Result<(), ConfigError> {
        let headroom = crate::KafkaSinkConfig::HEADROOM_BYTES;
        if self.max_payload_bytes.saturating_add(headroom) <= sink_max_message_bytes {
            return Ok(());
        }
        Err(ConfigError::new(
            "max_payload_bytes",
            self.max_payload_bytes,
            format!(
                "at most {} (the sink's max_message_bytes = {sink_max_message_bytes} for topic \
                 {sink_topic:?}, minus {headroom} bytes for triage's headers): lower \
                 max_payload_bytes or raise the sink's max_message_bytes",
                sink_max_message_bytes.saturating_sub(headroom),
            ),
        ))
    }

    /// [`commit_interval_ms`](Self::commit_interval_ms) as a duration.
    pub fn commit_interval(&self) -> Duration {
        Duration::from_millis(self.commit_interval_ms)
    }

    /// [`commit_timeout_ms`](Self::commit_timeout_ms) as a duration.
    pub fn commit_timeout(&self) -> Duration {
        Duration::from_millis(self.commit_timeout_ms)
    }

    /// [`close_timeout_ms`](Self::close_timeout_ms) as a duration.
    pub fn close_timeout(&self) -> Duration {
        Duration::from_millis(self.close_timeout_ms)
    }

    /// How long a revocation waits for running handlers: [`revoke_wait_ms`](Self::revoke_wait_ms),
    /// or its default (10 s, less where `max.poll.interval.ms` is small).
    pub fn revoke_wait(&self) -> Duration {
        let ms = self
            .revoke_wait_ms
            .unwrap_or_else(|| DEFAULT_REVOKE_WAIT_MS.min(self.revoke_wait_bound().0));
        Duration::from_millis(ms)
    }

    /// [`lag_interval_ms`](Self::lag_interval_ms) as a duration.
    pub fn lag_interval(&self) -> Duration {
        Duration::from_millis(self.lag_interval_ms)
    }

    /// Whether a partition without a committed offset starts at its earliest record
    /// (`auto.offset.reset` is `earliest`, `smallest` or `beginning`; librdkafka's default is
    /// `latest`).
    pub(crate) fn starts_from_earliest(&self) -> bool {
        matches!(
            self.properties.get("auto.offset.reset").map(String::as_str),
            Some("earliest" | "smallest" | "beginning")
        )
    }

    /// The librdkafka consumer properties the source's client is created with: the managed
    /// ones (auto commit and offset store off, the prefetch bound in KiB and the fetch sizes
    /// derived from it in bytes, `fetch.queue.backoff.ms = 10`) overlaid with
    /// [`properties`](Self::properties). For comparing with a plain consumer on the same
    /// settings, as the consume bench does.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage_kafka::KafkaSourceConfig;
    ///
    /// let config = KafkaSourceConfig::new("127.0.0.1:9092", "billing", ["orders"]);
    /// let props = config.client_properties();
    /// assert_eq!(props["enable.auto.commit"], "false");
    /// assert_eq!(props["fetch.max.bytes"], (16 * 1024 * 1024).to_string());
    /// ```
    pub fn client_properties(&self) -> BTreeMap<String, String> {
        let queued_bytes = self.queued_max_messages_kbytes.saturating_mul(1024);
        // librdkafka's default fetch.max.bytes is 50 MiB; a smaller prefetch bound must cap it
        // or memory would follow the fetch size rather than the configured bound.
        let fetch_max = queued_bytes.clamp(1024, 52_428_800);
        let partition_fetch = fetch_max.min(1_048_576);
        // A record larger than fetch.max.bytes is still returned alone (KIP-74), so the
        // response limit must fit the largest record plus the protocol overhead.
        let receive_max = fetch_max.max(self.max_payload_bytes.saturating_add(65_536)) + 512;
        let mut props = BTreeMap::from([
            (
                "bootstrap.servers".to_owned(),
                self.bootstrap_servers.clone(),
            ),
            ("group.id".to_owned(), self.group_id.clone()),
            // Offsets are committed by the source, only up to the settled watermark.
            ("enable.auto.commit".to_owned(), "false".to_owned()),
            ("enable.auto.offset.store".to_owned(), "false".to_owned()),
            (
                "queued.max.messages.kbytes".to_owned(),
                self.queued_max_messages_kbytes.to_string(),
            ),
            ("fetch.max.bytes".to_owned(), fetch_max.to_string()),
            (
                "max.partition.fetch.bytes".to_owned(),
                partition_fetch.to_string(),
            ),
            (
                "receive.message.max.bytes".to_owned(),
                receive_max.to_string(),
            ),
            // librdkafka waits this long (default 1000 ms) before fetching again once its
            // queue bound was reached: after every backpressure episode the source would then
            // starve for a second. A user-given value in `properties` wins.
            ("fetch.queue.backoff.ms".to_owned(), "10".to_owned()),
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
    fn defaults_need_topics_only() {
        let mut c = KafkaSourceConfig::default();
        assert_eq!(c.validate().unwrap_err().field(), "topics");
        c.topics = vec!["t".into()];
        c.validate().unwrap();
    }

    /// The revocation's wait and commit stay inside half of `max.poll.interval.ms`, whether
    /// librdkafka's default or the one given in `properties`; the default wait shrinks to fit,
    /// a wait given out of range is refused.
    #[test]
    fn revoke_wait_stays_well_inside_the_poll_interval() {
        let mut c = KafkaSourceConfig::new("b:1", "g", ["t"]);
        assert_eq!(c.revoke_wait(), Duration::from_secs(10));
        c.revoke_wait_ms = Some(145_000);
        c.validate().unwrap();
        assert_eq!(c.revoke_wait(), Duration::from_secs(145));
        c.revoke_wait_ms = Some(145_001);
        let e = c.validate().unwrap_err();
        assert_eq!(e.field(), "revoke_wait_ms");
        assert!(
            e.to_string().contains(
                "0..=145000 (half of max.poll.interval.ms = 300000, minus commit_timeout_ms = 5000"
            ),
            "{e}"
        );
        c.properties
            .insert("max.poll.interval.ms".into(), "20000".into());
        c.revoke_wait_ms = Some(5_000);
        c.validate().unwrap();
        c.revoke_wait_ms = Some(5_001);
        assert_eq!(c.validate().unwrap_err().field(), "revoke_wait_ms");
        c.revoke_wait_ms = Some(0);
        c.validate().unwrap();
        // Unset: 10 s where it fits, less where it does not, nothing where nothing fits.
        c.revoke_wait_ms = None;
        c.validate().unwrap();
        assert_eq!(c.revoke_wait(), Duration::from_secs(5));
        c.properties
            .insert("max.poll.interval.ms".into(), "6000".into());
        c.validate().unwrap();
        assert_eq!(c.revoke_wait(), Duration::ZERO);
    }

    #[test]
    fn errors_name_field_and_range() {
        let mut c = KafkaSourceConfig::new("b:1", "g", ["t"]);
        c.commit_interval_ms = 0;
        let e = c.validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "commit_interval_ms = 0 is out of range: allowed 1..=3600000"
        );
        c.commit_interval_ms = 10;
        c.deadline.window_ms.high = Some(0);
        assert_eq!(c.validate().unwrap_err().field(), "deadline.window_ms.high");
        c.deadline.window_ms.high = None;
        c.properties
            .insert("enable.auto.commit".into(), "true".into());
        assert_eq!(
            c.validate().unwrap_err().field(),
            "properties.enable.auto.commit"
        );
    }

    #[test]
    fn republish_limits_must_agree() {
        let source = KafkaSourceConfig::new("b:1", "g", ["t"]);
        let mut sink = crate::KafkaSinkConfig::new("b:1", "t.deferred");
        source.validate_republish(&sink).unwrap();
        sink.max_message_bytes = 1_000_000;
        let err = source.validate_republish(&sink).unwrap_err();
        assert_eq!(
            err.to_string(),
            "max_payload_bytes = 33554432 is out of range: allowed at most 995904 (the sink's \
             max_message_bytes = 1000000 for topic \"t.deferred\", minus 4096 bytes for \
             triage's headers): lower max_payload_bytes or raise the sink's max_message_bytes"
        );
        let mut small = source.clone();
        small.max_payload_bytes = 995_904;
        small.validate_republish(&sink).unwrap();
        small.max_payload_bytes += 1;
        assert_eq!(
            small.validate_republish(&sink).unwrap_err().field(),
            "max_payload_bytes"
        );
    }

    #[test]
    fn client_properties_bound_the_prefetch() {
        let mut c = KafkaSourceConfig::new("b:1", "g", ["t"]);
        c.queued_max_messages_kbytes = 1024;
        c.max_payload_bytes = 20 * 1024 * 1024;
        let p = c.client_properties();
        assert_eq!(p["fetch.max.bytes"], "1048576");
        assert_eq!(p["enable.auto.commit"], "false");
        assert_eq!(
            p["receive.message.max.bytes"],
            (20 * 1024 * 1024 + 65_536 + 512).to_string()
        );
        assert_eq!(p["auto.offset.reset"], "earliest");
    }
}
