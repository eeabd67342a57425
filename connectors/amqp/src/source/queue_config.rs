//! The consumed queues' configuration: a queue-per-tier layout's queues ([`TierQueue`]), how
//! the source declares its queues ([`QueueDeclareConfig`]), and where a queue's rejected
//! deliveries go (`DeadLetter`, derived from both).

use serde::{Deserialize, Serialize};
use triage::Criticality;

/// Where a consumed queue's rejected deliveries go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DeadLetter {
    /// Declared with these `x-dead-letter-*` arguments.
    Declared {
        exchange: String,
        routing_key: Option<String>,
    },
    /// The queue is not declared by triage and has one (the configuration says so).
    Existing,
    /// Triage's default: `queue`, through the default exchange.
    OwnQueue { queue: String },
    /// None: nothing may be rejected (only with `dead_letter_via_sink`).
    None,
}

impl DeadLetter {
    /// Whether a `basic.reject(requeue = false)` keeps the message somewhere.
    pub(crate) fn can_reject(&self) -> bool {
        !matches!(self, DeadLetter::None)
    }
}

/// One queue of a queue-per-tier layout: every delivery on it has `tier`.
///
/// # Examples
///
/// ```
/// use triage::Criticality;
/// use triage_amqp::AmqpSourceConfig;
///
/// let config: AmqpSourceConfig = toml::from_str(r#"
///     [[tier_queues]]
///     queue = "orders.critical"
///     tier = "critical"
///     [[tier_queues]]
///     queue = "orders.sheddable"
///     tier = "sheddable"
/// "#)?;
/// assert_eq!(config.tier_queues[1].tier, Criticality::Sheddable);
/// config.validate(1_000)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierQueue {
    /// The queue's name.
    pub queue: String,
    /// The tier of every delivery on it.
    pub tier: Criticality,
}

impl TierQueue {
    /// `queue`, whose deliveries all have `tier`.
    pub fn new(queue: impl Into<String>, tier: Criticality) -> Self {
        TierQueue {
            queue: queue.into(),
            tier,
        }
    }
}

/// Whether and how the source declares its queue.
///
/// A declare with arguments different from the existing queue's fails with
/// `PRECONDITION_FAILED`; turn `enabled` off to consume a queue managed elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueDeclareConfig {
    /// Declare the queue before consuming. Default `true`.
    pub enabled: bool,
    /// Survives a broker restart. Default `true`.
    pub durable: bool,
    /// `x-max-priority`: makes it a priority queue with levels `0..=max_priority`. Default
    /// none (a plain FIFO queue).
    pub max_priority: Option<u8>,
    /// `x-dead-letter-exchange`: where rejected deliveries go (failed ones unless
    /// `dead_letter_via_sink`, and those above `max_payload_bytes`). With `enabled = false`,
    /// the exchange the queue already has (declared elsewhere or set by a policy): triage
    /// cannot set it then, and refuses to start without it unless `dead_letter_via_sink`.
    ///
    /// Default none: with `enabled` and without `dead_letter_via_sink`, triage gives each
    /// consumed queue a dead-letter queue of its own, `<queue>.dead` (durable, declared
    /// beside it), through the default exchange (`x-dead-letter-exchange = ""`,
    /// `x-dead-letter-routing-key = "<queue>.dead"`), so that nothing it rejects is
    /// discarded. An existing queue declared without those arguments then fails the declare
    /// with `PRECONDITION_FAILED` (inequivalent arg `x-dead-letter-exchange`): name its
    /// dead-letter exchange here, or set `dead_letter_via_sink`.
    pub dead_letter_exchange: Option<String>,
    /// `x-dead-letter-routing-key`, with `dead_letter_exchange`. Default none (the message's
    /// own routing key).
    pub dead_letter_routing_key: Option<String>,
    /// `x-consumer-timeout`, in milliseconds: the queue's own delivery acknowledgement timeout
    /// (RabbitMQ 3.12 and later; an older broker keeps the argument but applies its global
    /// `consumer_timeout`). The source then takes it as the timeout it runs under, in place of
    /// [`AmqpSourceConfig::consumer_timeout_ms`]. Allowed `1000..=2147483647`, and only with
    /// `enabled`. Default none.
    ///
    /// [`AmqpSourceConfig::consumer_timeout_ms`]: super::AmqpSourceConfig::consumer_timeout_ms
    pub consumer_timeout_ms: Option<u64>,
}

impl Default for QueueDeclareConfig {
    fn default() -> Self {
        QueueDeclareConfig {
            enabled: true,
            durable: true,
            max_priority: None,
            dead_letter_exchange: None,
            dead_letter_routing_key: None,
            consumer_timeout_ms: None,
        }
    }
}
