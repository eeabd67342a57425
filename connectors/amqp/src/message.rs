//! The owned message handed to handlers and to the defer and dead-letter sinks.

use std::sync::Arc;

use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;

/// One RabbitMQ delivery, owned: the body and everything needed to re-publish it.
///
/// The connector never reads the body; classification uses [`properties`](Self::properties)
/// only. Cheap to move (the body is a `Vec<u8>`, the queue name shared).
///
/// # Examples
///
/// ```
/// use triage_amqp::lapin::BasicProperties;
/// use triage_amqp::AmqpMessage;
///
/// let msg = AmqpMessage::new(b"order-17".to_vec())
///     .with_properties(BasicProperties::default().with_priority(9));
/// assert_eq!(msg.body(), b"order-17");
/// assert_eq!(msg.properties().priority(), &Some(9));
/// assert!(!msg.redelivered());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct AmqpMessage {
    body: Vec<u8>,
    properties: BasicProperties,
    exchange: String,
    routing_key: String,
    queue: Arc<str>,
    redelivered: bool,
    delivery_tag: u64,
}

impl AmqpMessage {
    /// A message with `body`, default properties and no origin (for tests and producers).
    pub fn new(body: Vec<u8>) -> Self {
        AmqpMessage {
            body,
            properties: BasicProperties::default(),
            exchange: String::new(),
            routing_key: String::new(),
            queue: Arc::from(""),
            redelivered: false,
            delivery_tag: 0,
        }
    }

    /// Sets the AMQP properties (headers included).
    #[must_use]
    pub fn with_properties(mut self, properties: BasicProperties) -> Self {
        self.properties = properties;
        self
    }

    /// Sets the queue it was consumed from (written as `triage-origin-queue` on re-publish).
    #[must_use]
    pub fn with_queue(mut self, queue: impl Into<Arc<str>>) -> Self {
        self.queue = queue.into();
        self
    }

    pub(crate) fn from_delivery(delivery: lapin::message::Delivery, queue: Arc<str>) -> Self {
        AmqpMessage {
            body: delivery.data,
            properties: delivery.properties,
            exchange: delivery.exchange.to_string(),
            routing_key: delivery.routing_key.to_string(),
            queue,
            redelivered: delivery.redelivered,
            delivery_tag: delivery.delivery_tag,
        }
    }

    /// The body, as published.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Takes the body out, leaving the message's metadata.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }

    /// All AMQP properties: headers, content type and encoding, priority, timestamp (Unix
    /// seconds), message and correlation ids, expiration, reply-to and the rest.
    pub fn properties(&self) -> &BasicProperties {
        &self.properties
    }

    /// The headers table, if the message has one.
    pub fn headers(&self) -> Option<&FieldTable> {
        self.properties.headers().as_ref()
    }

    /// One header's value.
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        self.headers()?.inner().get(name)
    }

    /// One header's value as text, if it is a short or long string in UTF-8: for a downstream
    /// key (`.downstream(|m: &AmqpMessage| m.header_str(triage::wire::DOWNSTREAM))` on the
    /// runtime's builder). Borrowed, never allocated.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        match self.header(name)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    /// The `message_id` property, if set.
    pub fn message_id(&self) -> Option<&str> {
        self.properties.message_id().as_ref().map(|s| s.as_str())
    }

    /// The exchange it was published to (`""` for the default exchange).
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// The routing key it was published with.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// The queue it was consumed from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Whether the broker delivered it before (to this or another consumer) without a
    /// settlement. Such deliveries are processed normally: at-least-once means handlers must
    /// be idempotent.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }

    /// The delivery tag on the channel it arrived on (informational: settling goes through
    /// the message's [`Ack`](triage::runtime::Ack)).
    pub fn delivery_tag(&self) -> u64 {
        self.delivery_tag
    }
}
