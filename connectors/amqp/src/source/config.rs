//! Configuration of [`AmqpSource`](super::AmqpSource).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use triage::{ConfigError, Criticality};

use crate::ReconnectConfig;

use super::classify_config::{ClassifyConfig, DeadlineConfig};
use super::queue_config::{DeadLetter, QueueDeclareConfig, TierQueue};

/// The longest timestamp window, in milliseconds: a year, as on the Kafka source.
const YEAR_MS: u64 = 31_536_000_000;

/// Configuration of an [`AmqpSource`](crate::AmqpSource): where to consume, how to classify,
/// how much to prefetch.
///
/// Every field has a default, so a config file names only what it changes; only `queue` has
/// no usable default.
///
/// # Examples
///
/// ```
/// use triage::Criticality;
/// use triage_amqp::AmqpSourceConfig;
///
/// let config: AmqpSourceConfig = toml::from_str(r#"
///     queue = "orders"
///     prefetch = 200
///     [classify]
///     trusted_queues = ["orders"]
/// "#)?;
/// assert_eq!(config.prefetch, 200);
/// assert_eq!(config.classify.default_tier, Criticality::Medium);
/// config.validate(1_000)?;
/// // The runtime's queue holds 100 envelopes: a prefetch of 200 could not be taken in.
/// let err = config.validate(100).unwrap_err();
/// assert_eq!(err.field(), "prefetch");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpSourceConfig {
    /// AMQP URI of the broker. Default `amqp://127.0.0.1:5672/%2f` (guest on the default
    /// vhost).
    pub uri: String,
    /// Queue to consume, its deliveries classified by [`classify`](Self::classify). Default
    /// empty: then `tier_queues` must name at least one queue.
    pub queue: String,
    /// Queues of one tier each, consumed beside `queue` on the same channel: the layout for
    /// strict protection (DESIGN.md §3a). Every delivery of such a queue has the queue's tier;
    /// while the runtime sheds that tier ([`Source::pause_tiers`]) the queue is not read, so
    /// its messages wait in the broker (at most `prefetch` of them in the process) instead of
    /// being consumed only to be deferred, and nothing of a higher tier waits behind them.
    /// Default none.
    ///
    /// [`Source::pause_tiers`]: triage::runtime::Source::pause_tiers
    pub tier_queues: Vec<TierQueue>,
    /// Whether and how to declare the queue before consuming. Default: declare it durable,
    /// no arguments.
    pub declare: QueueDeclareConfig,
    /// `basic.qos` prefetch count: deliveries the broker sends before waiting for an ack.
    /// Default 100. Must be in `1..=queue_capacity` (the runtime queue's capacity), so that a
    /// broker backlog never floods the process and RabbitMQ keeps applying its own
    /// priorities to what is still in the queue.
    pub prefetch: u16,
    /// How deliveries are given a criticality.
    pub classify: ClassifyConfig,
    /// How deliveries are given a deadline.
    pub deadline: DeadlineConfig,
    /// Largest body accepted, in bytes. Default 16 MiB. Larger deliveries are rejected
    /// (`basic.reject`, `requeue = false`, to the queue's dead-letter exchange) without
    /// reaching the runtime, and counted in `triage_amqp_oversize_total`. A queue without a
    /// known dead-letter exchange (possible only with `dead_letter_via_sink`, see
    /// [`QueueDeclareConfig::dead_letter_exchange`]) rejects nothing: its large deliveries
    /// are counted and handed to the runtime like the others, never discarded.
    pub max_payload_bytes: usize,
    /// Whether the runtime dead-letters failed messages itself through a
    /// [`DeadLetterSink`](triage::runtime::DeadLetterSink). Default `false`.
    ///
    /// `false`: a `Failed` disposition is settled with `basic.reject(requeue = false)`, which
    /// RabbitMQ routes to the queue's dead-letter exchange (`x-dead-letter-exchange`), so the
    /// queue must have one: see [`QueueDeclareConfig::dead_letter_exchange`] (by default
    /// triage gives it one; a queue it does not declare must name its own, or the
    /// configuration is refused, since RabbitMQ discards what it rejects without one).
    /// `true`: the runtime resolves `Failed` only after the sink's publish was confirmed, so
    /// the delivery is simply acked (a reject would dead-letter it twice); a runtime without
    /// a dead-letter sink refuses to attach such a source
    /// ([`Source::needs_dead_letter_sink`](triage::runtime::Source::needs_dead_letter_sink)).
    pub dead_letter_via_sink: bool,
    /// Connection name shown by the broker (`rabbitmqctl list_connections
    /// client_properties`). Default `triage-amqp/<queue>`.
    pub connection_name: Option<String>,
    /// Retry schedule after a lost connection or channel.
    pub reconnect: ReconnectConfig,
    /// How often the ready-message count of the consumed queues is measured for
    /// [`Source::lag`](triage::runtime::Source::lag) (a passive `queue.declare` per queue on a
    /// channel of its own), in milliseconds. Default 250; allowed `10..=600000`. Keep it well
    /// below the runtime's `expert.admission.window_ms` (1000): pull-based admission infers the
    /// arrival rate from the lag's trend over each half of that window.
    pub lag_refresh_ms: u64,
    /// Bound on [`shutdown`](triage::runtime::Source::shutdown): time to send the pending
    /// settlements and close the channel, in milliseconds. Default 5,000. Past it the
    /// connection is dropped; whatever was not acked is redelivered.
    pub shutdown_timeout_ms: u64,
    /// The broker's consumer timeout (RabbitMQ's `consumer_timeout`, its delivery
    /// acknowledgement timeout), in milliseconds: how long a delivery may stay unacknowledged
    /// before the broker closes the channel it came on. Default 1,800,000 (30 minutes,
    /// RabbitMQ's default); `0` for a broker with the timeout turned off. Allowed `0` or
    /// `1000..=2147483647`. A queue declared with
    /// [`declare.consumer_timeout_ms`](QueueDeclareConfig::consumer_timeout_ms) has that
    /// timeout instead.
    ///
    /// Set it to what the broker applies (its `consumer_timeout`, or the `consumer-timeout` of a
    /// policy on the queue, which a client cannot read): the source states it as its
    /// [`patience`](triage::runtime::Source::patience), and the runtime hands back every
    /// delivery that has waited [`patience_share`](triage::runtime::ExpertConfig::patience_share)
    /// of it (80% by default) without reaching a handler: deferred where its tier defers and a
    /// copy comes back in time, otherwise released (`basic.nack` with `requeue`), so that the
    /// broker delivers it again rather than close the channel. A closed channel would
    /// redeliver every unsettled delivery on it, those whose handlers had finished included,
    /// and their work would be done twice. The deliveries this source holds in its own buffer
    /// (while the runtime does not pull: paused, or a tier queue not read while its tier is
    /// shed) are released the same way, counted in `triage_amqp_handed_back_total`. A handler
    /// run itself must fit in the rest of the timeout.
    pub consumer_timeout_ms: u64,
}

impl Default for AmqpSourceConfig {
    fn default() -> Self {
        AmqpSourceConfig {
            uri: "amqp://127.0.0.1:5672/%2f".to_owned(),
            queue: String::new(),
            tier_queues: Vec::new(),
            declare: QueueDeclareConfig::default(),
            prefetch: 100,
            classify: ClassifyConfig::default(),
            deadline: DeadlineConfig::default(),
            max_payload_bytes: 16 * 1024 * 1024,
            dead_letter_via_sink: false,
            connection_name: None,
            reconnect: ReconnectConfig::default(),
            lag_refresh_ms: 250,
            shutdown_timeout_ms: 5_000,
            consumer_timeout_ms: 1_800_000,
        }
    }
}

impl AmqpSourceConfig {
    /// A default configuration consuming `queue` at `uri`.
    pub fn new(uri: impl Into<String>, queue: impl Into<String>) -> Self {
        AmqpSourceConfig {
            uri: uri.into(),
            queue: queue.into(),
            ..AmqpSourceConfig::default()
        }
    }

    /// A configuration draining the defer queue `queue` at `uri`: each copy keeps the tier it
    /// was deferred with (its [`triage-criticality`](triage::wire::CRITICALITY) header,
    /// written by the sink; the queue is trusted for it), and its deferral count
    /// ([`triage-deferrals`](triage::wire::DEFERRALS)), deadline and attempt headers are
    /// honoured. A copy without a usable label is Sheddable. Failed copies are dead-lettered
    /// through the runtime's dead-letter sink (`dead_letter_via_sink = true`: the defer queue
    /// is the sink's, declared without a dead-letter exchange, and a runtime without a
    /// dead-letter sink refuses the drain). Attach it with `Runtime::attach_drain`, which
    /// pulls only while load allows. The Kafka counterpart is `triage_kafka::drain::builder`.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::Criticality;
    /// use triage_amqp::AmqpSourceConfig;
    ///
    /// let drain = AmqpSourceConfig::drain("amqp://127.0.0.1:5672/%2f", "orders.deferred");
    /// assert_eq!(drain.classify.trusted_queues, ["orders.deferred"]);
    /// assert_eq!(drain.classify.default_tier, Criticality::Sheddable);
    /// assert_eq!(drain.classify.fixed_tier, None);
    /// assert!(drain.dead_letter_via_sink);
    /// ```
    pub fn drain(uri: impl Into<String>, queue: impl Into<String>) -> Self {
        let mut config = AmqpSourceConfig::new(uri, queue);
        config.classify.trusted_queues = vec![config.queue.clone()];
        config.classify.default_tier = Criticality::Sheddable;
        config.dead_letter_via_sink = true;
        config
    }

    /// Checks every range, with the prefetch bounded by the capacity of the runtime queue the
    /// source feeds (in envelopes).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first field out of range: `queue` (empty), `prefetch`
    /// (outside `1..=min(queue_capacity, 65535)`), `max_payload_bytes` (0),
    /// `classify.priority.*` (not increasing), `deadline.timestamp_window_ms.<tier>` (0 or
    /// above a year), `shutdown_timeout_ms` (0 or above 10 min),
    /// `reconnect.*`.
    pub fn validate(&self, queue_capacity: usize) -> Result<(), ConfigError> {
        if self.queue.is_empty() && self.tier_queues.is_empty() {
            return Err(ConfigError::new(
                "queue",
                "\"\"",
                "a non-empty queue name (or tier_queues)",
            ));
        }
        if let Some(i) = self.tier_queues.iter().position(|t| t.queue.is_empty()) {
            return Err(ConfigError::new(
                format!("tier_queues[{i}].queue"),
                "\"\"",
                "a non-empty queue name",
            ));
        }
        let names = self.queues();
        if let Some((i, dup)) = names
            .iter()
            .enumerate()
            .find(|(i, q)| names[..*i].contains(q))
        {
            return Err(ConfigError::new(
                format!(
                    "tier_queues[{}].queue",
                    i - usize::from(!self.queue.is_empty())
                ),
                format!("{dup:?}"),
                "a queue consumed once (not repeated in queue or tier_queues)",
            ));
        }
        let max_prefetch = queue_capacity.min(usize::from(u16::MAX));
        if self.prefetch == 0 || usize::from(self.prefetch) > max_prefetch {
            return Err(ConfigError::new(
                "prefetch",
                self.prefetch,
                format!("1..={max_prefetch} (the runtime queue's capacity)"),
            ));
        }
        if self.max_payload_bytes == 0 {
            return Err(ConfigError::new("max_payload_bytes", 0, "1.."));
        }
        if !self.dead_letter_via_sink
            && !self.declare.enabled
            && self.declare.dead_letter_exchange.is_none()
        {
            // A failed delivery would be rejected, and RabbitMQ discards a rejected message
            // of a queue without a dead-letter exchange.
            return Err(ConfigError::new(
                "declare.dead_letter_exchange",
                "none",
                "the dead-letter exchange the queue has (declare.enabled = false: triage \
                 cannot give it one), or dead_letter_via_sink = true with a dead-letter sink",
            ));
        }
        self.classify
            .priority
            .validate()
            .map_err(|e| e.within("classify.priority"))?;
        for (tier, window) in self.deadline.timestamp_window_ms.iter() {
            if window.is_some_and(|w| !(1..=YEAR_MS).contains(&w)) {
                return Err(ConfigError::new(
                    format!("deadline.timestamp_window_ms.{tier}"),
                    window.unwrap_or_default(),
                    format!("1..={YEAR_MS} (a year)"),
                ));
            }
        }
        if !(10..=600_000).contains(&self.lag_refresh_ms) {
            return Err(ConfigError::new(
                "lag_refresh_ms",
                self.lag_refresh_ms,
                "10..=600000",
            ));
        }
        if self.shutdown_timeout_ms == 0 || self.shutdown_timeout_ms > 600_000 {
            return Err(ConfigError::new(
                "shutdown_timeout_ms",
                self.shutdown_timeout_ms,
                "1..=600000",
            ));
        }
        if self.consumer_timeout_ms != 0 && !CONSUMER_TIMEOUT_MS.contains(&self.consumer_timeout_ms)
        {
            return Err(ConfigError::new(
                "consumer_timeout_ms",
                self.consumer_timeout_ms,
                "0 (no timeout) or 1000..=2147483647",
            ));
        }
        if let Some(timeout) = self.declare.consumer_timeout_ms {
            if !self.declare.enabled {
                return Err(ConfigError::new(
                    "declare.consumer_timeout_ms",
                    timeout,
                    "none with declare.enabled = false (triage does not declare the queue, so \
                     it cannot give it x-consumer-timeout: set consumer_timeout_ms to the \
                     queue's timeout instead)",
                ));
            }
            if !CONSUMER_TIMEOUT_MS.contains(&timeout) {
                return Err(ConfigError::new(
                    "declare.consumer_timeout_ms",
                    timeout,
                    "1000..=2147483647",
                ));
            }
        }
        self.reconnect.validate().map_err(|e| e.within("reconnect"))
    }

    /// The consumer timeout the broker applies to this source's deliveries: the queues'
    /// `x-consumer-timeout` where the source declares them with one
    /// ([`declare.consumer_timeout_ms`](QueueDeclareConfig::consumer_timeout_ms)), else
    /// [`consumer_timeout_ms`](Self::consumer_timeout_ms); `None` when it is `0` (no timeout).
    /// What the source states as its [`patience`](triage::runtime::Source::patience).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use triage_amqp::AmqpSourceConfig;
    ///
    /// let mut config = AmqpSourceConfig::new("amqp://127.0.0.1:5672/%2f", "orders");
    /// assert_eq!(config.consumer_timeout(), Some(Duration::from_secs(1_800)));
    /// config.declare.consumer_timeout_ms = Some(600_000);
    /// assert_eq!(config.consumer_timeout(), Some(Duration::from_secs(600)));
    /// ```
    pub fn consumer_timeout(&self) -> Option<Duration> {
        let ms = match self.declare.consumer_timeout_ms {
            Some(ms) if self.declare.enabled => ms,
            _ => self.consumer_timeout_ms,
        };
        (ms != 0).then(|| Duration::from_millis(ms))
    }

    pub(crate) fn connection_name(&self) -> String {
        self.connection_name
            .clone()
            .unwrap_or_else(|| format!("triage-amqp/{}", self.queues()[0]))
    }

    /// Every consumed queue with its fixed tier, in the order `next` reads them: `queue`
    /// first (it may hold any tier), then the tier queues from Critical down.
    pub(crate) fn consumed_queues(&self) -> Vec<(String, Option<Criticality>)> {
        let mut consumed = Vec::with_capacity(1 + self.tier_queues.len());
        if !self.queue.is_empty() {
            consumed.push((self.queue.clone(), None));
        }
        let mut tiers: Vec<&TierQueue> = self.tier_queues.iter().collect();
        // Stable: queues of one tier keep their configured order.
        tiers.sort_by_key(|t| std::cmp::Reverse(t.tier.rank()));
        consumed.extend(tiers.into_iter().map(|t| (t.queue.clone(), Some(t.tier))));
        consumed
    }

    /// Checks that every delivery this source accepts can be re-published through a sink
    /// configured as `sink` (the runtime's defer or dead-letter queue): `max_payload_bytes +`
    /// [`AmqpSinkConfig::HEADROOM_BYTES`](crate::AmqpSinkConfig::HEADROOM_BYTES) at most the
    /// sink's `max_message_bytes`. Otherwise a message the source takes could be refused when
    /// it has to be deferred or dead-lettered.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `max_payload_bytes` and the sink's `max_message_bytes`.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage_amqp::{AmqpSinkConfig, AmqpSourceConfig};
    ///
    /// let source = AmqpSourceConfig::new("amqp://127.0.0.1:5672/%2f", "orders");
    /// let mut sink = AmqpSinkConfig::new("amqp://127.0.0.1:5672/%2f", "orders.deferred");
    /// source.validate_republish(&sink)?; // the defaults agree
    /// sink.max_message_bytes = 1_000_000;
    /// let err = source.validate_republish(&sink).unwrap_err();
    /// assert_eq!(err.field(), "max_payload_bytes");
    /// assert!(err.to_string().contains("max_message_bytes = 1000000"), "{err}");
    /// # Ok::<(), triage::ConfigError>(())
    /// ```
    pub fn validate_republish(&self, sink: &crate::AmqpSinkConfig) -> Result<(), ConfigError> {
        let headroom = crate::AmqpSinkConfig::HEADROOM_BYTES;
        if self.max_payload_bytes.saturating_add(headroom) <= sink.max_message_bytes {
            return Ok(());
        }
        Err(ConfigError::new(
            "max_payload_bytes",
            self.max_payload_bytes,
            format!(
                "at most {} (the sink's max_message_bytes = {} for queue {:?}, minus {headroom} \
                 bytes for triage's headers): lower max_payload_bytes or raise the sink's \
                 max_message_bytes",
                sink.max_message_bytes.saturating_sub(headroom),
                sink.max_message_bytes,
                sink.queue,
            ),
        ))
    }

    /// Where `queue`'s rejected deliveries go, if anywhere.
    pub(crate) fn dead_letter(&self, queue: &str) -> DeadLetter {
        match (&self.declare.dead_letter_exchange, self.declare.enabled) {
            (Some(exchange), true) => DeadLetter::Declared {
                exchange: exchange.clone(),
                routing_key: self.declare.dead_letter_routing_key.clone(),
            },
            (Some(_), false) => DeadLetter::Existing,
            (None, true) if !self.dead_letter_via_sink => DeadLetter::OwnQueue {
                queue: format!("{queue}.dead"),
            },
            (None, _) => DeadLetter::None,
        }
    }

    fn queues(&self) -> Vec<&str> {
        std::iter::once(self.queue.as_str())
            .filter(|q| !q.is_empty())
            .chain(self.tier_queues.iter().map(|t| t.queue.as_str()))
            .collect()
    }
}

/// The consumer timeouts RabbitMQ accepts (an Erlang timer's range), in milliseconds; below a
/// second the broker's check (once per channel tick) could not keep to it anyway.
const CONSUMER_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 1_000..=2_147_483_647;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_prefetch_is_bounded_by_capacity() {
        let c = AmqpSourceConfig::new("amqp://x", "q");
        assert!(c.validate(100).is_ok());
        let err = c.validate(99).unwrap_err();
        assert_eq!(err.field(), "prefetch");
        assert_eq!(err.value(), "100");
        assert!(err.allowed().starts_with("1..=99"), "{err}");
        let zero = AmqpSourceConfig {
            prefetch: 0,
            ..c.clone()
        };
        assert_eq!(zero.validate(100).unwrap_err().field(), "prefetch");
        assert_eq!(
            AmqpSourceConfig::default()
                .validate(100)
                .unwrap_err()
                .field(),
            "queue"
        );
    }

    #[test]
    fn nothing_is_rejected_into_the_void() {
        let c = AmqpSourceConfig::new("amqp://x", "q");
        // Declared by triage: a dead-letter queue of its own by default.
        assert_eq!(
            c.dead_letter("q"),
            DeadLetter::OwnQueue {
                queue: "q.dead".into()
            }
        );
        // Not declared by triage, no dead-letter exchange named, failed ones rejected: refused.
        let mut managed = c.clone();
        managed.declare.enabled = false;
        let err = managed.validate(100).unwrap_err();
        assert_eq!(err.field(), "declare.dead_letter_exchange");
        assert!(err.to_string().contains("dead_letter_via_sink"), "{err}");
        managed.declare.dead_letter_exchange = Some("dlx".into());
        assert!(managed.validate(100).is_ok());
        assert_eq!(managed.dead_letter("q"), DeadLetter::Existing);
        // Through a sink: nothing to reject, so nothing declared either.
        let mut via_sink = c.clone();
        via_sink.dead_letter_via_sink = true;
        via_sink.declare.enabled = false;
        assert!(via_sink.validate(100).is_ok());
        assert!(!via_sink.dead_letter("q").can_reject());
    }

    #[test]
    fn the_consumer_timeout_is_the_queues_where_declared_and_is_validated() {
        let mut c = AmqpSourceConfig::new("amqp://x", "q");
        assert_eq!(c.consumer_timeout(), Some(Duration::from_secs(1_800)));
        c.consumer_timeout_ms = 0;
        assert_eq!(c.consumer_timeout(), None);
        assert!(c.validate(100).is_ok());
        c.declare.consumer_timeout_ms = Some(5_000);
        assert_eq!(c.consumer_timeout(), Some(Duration::from_secs(5)));
        assert!(c.validate(100).is_ok());
        for (field, bad) in [
            ("consumer_timeout_ms", (999, None)),
            ("consumer_timeout_ms", (2_147_483_648, None)),
            ("declare.consumer_timeout_ms", (0, Some(999))),
            ("declare.consumer_timeout_ms", (0, Some(2_147_483_648))),
        ] {
            let mut c = AmqpSourceConfig::new("amqp://x", "q");
            (c.consumer_timeout_ms, c.declare.consumer_timeout_ms) = bad;
            let err = c.validate(100).unwrap_err();
            assert_eq!(err.field(), field);
            assert!(err.allowed().contains("1000..=2147483647"), "{err}");
        }
        // Not declared by triage: the queue's own timeout cannot be set from here.
        let mut c = AmqpSourceConfig::new("amqp://x", "q");
        c.dead_letter_via_sink = true;
        c.declare.enabled = false;
        c.declare.consumer_timeout_ms = Some(5_000);
        assert_eq!(
            c.validate(100).unwrap_err().field(),
            "declare.consumer_timeout_ms"
        );
        assert_eq!(c.consumer_timeout(), Some(Duration::from_secs(1_800)));
        let c: AmqpSourceConfig = toml::from_str(
            "queue = \"q\"\nconsumer_timeout_ms = 60000\n[declare]\nconsumer_timeout_ms = 30000",
        )
        .unwrap();
        assert_eq!(c.consumer_timeout(), Some(Duration::from_secs(30)));
    }

    #[test]
    fn priority_bands_must_increase() {
        let mut c = AmqpSourceConfig::new("amqp://x", "q");
        c.classify.priority.high_max = 4;
        assert_eq!(
            c.validate(100).unwrap_err().field(),
            "classify.priority.high_max"
        );
    }

    #[test]
    fn parses_from_toml_with_tier_windows() {
        let c: AmqpSourceConfig = toml::from_str(
            r#"
            queue = "q"
            dead_letter_via_sink = true
            [deadline.timestamp_window_ms]
            critical = 400
            "#,
        )
        .unwrap();
        assert_eq!(c.deadline.timestamp_window_ms.critical, Some(400));
        assert_eq!(c.deadline.timestamp_window_ms.high, None);
        assert!(c.dead_letter_via_sink);
        assert!(toml::from_str::<AmqpSourceConfig>("quue = 1").is_err());
    }

    #[test]
    fn timestamp_windows_are_bounded_like_the_kafka_sources() {
        for (window, ok) in [(1, true), (YEAR_MS, true), (0, false), (YEAR_MS + 1, false)] {
            let mut c = AmqpSourceConfig::new("amqp://x", "q");
            c.deadline.timestamp_window_ms.high = Some(window);
            match c.validate(100) {
                Ok(()) => assert!(ok, "{window} accepted"),
                Err(e) => {
                    assert!(!ok, "{window} refused: {e}");
                    assert_eq!(e.field(), "deadline.timestamp_window_ms.high");
                    assert_eq!(e.allowed(), "1..=31536000000 (a year)");
                }
            }
        }
        // From a file, out of range: refused by name.
        let c: AmqpSourceConfig = toml::from_str(
            "queue = \"q\"\n[deadline.timestamp_window_ms]\ncritical = 9223372036854775807\n",
        )
        .unwrap();
        assert_eq!(
            c.validate(100).unwrap_err().field(),
            "deadline.timestamp_window_ms.critical"
        );
    }
}
