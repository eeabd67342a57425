//! The owned message handed to handlers and sinks.

use std::sync::Arc;

/// One Kafka record, owned: it outlives the consumer's buffers, so the runtime can queue it.
///
/// Headers keep their order and duplicates exactly as produced. Header names that are not
/// UTF-8 (only a non-Java producer can write them) are converted lossily (U+FFFD).
///
/// # Examples
///
/// ```
/// use triage_kafka::KafkaMessage;
///
/// let msg = KafkaMessage {
///     topic: "orders".into(),
///     partition: 0,
///     offset: 17,
///     key: Some(b"customer-4".to_vec()),
///     payload: Some(b"{}".to_vec()),
///     headers: vec![("trace".into(), Some(b"a".to_vec())), ("trace".into(), None)],
///     timestamp_ms: Some(1_700_000_000_000),
/// };
/// assert_eq!(msg.header("trace"), Some(&b"a"[..]));
/// // key + payload + each header's name and value
/// assert_eq!(msg.size_bytes(), 10 + 2 + (5 + 1) + 5);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaMessage {
    /// Topic it was consumed from; the source shares one allocation per partition with every
    /// record of it (none per record, whatever the order the topics' records come in).
    pub topic: Arc<str>,
    /// Partition within the topic.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
    /// Record key, if any (arbitrary bytes, not necessarily UTF-8).
    pub key: Option<Vec<u8>>,
    /// Record value, if any (`None` for a tombstone).
    pub payload: Option<Vec<u8>>,
    /// Headers in record order, duplicates kept; a `None` value is a null header value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Record timestamp (create or log-append time), Unix milliseconds.
    pub timestamp_ms: Option<i64>,
}

impl KafkaMessage {
    /// Value of the first header named `name` with a non-null value.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, v)| n == name && v.is_some())
            .and_then(|(_, v)| v.as_deref())
    }

    /// Value of the first header named `name` with a non-null value, if it is UTF-8: for a
    /// downstream key (`.downstream(|m: &KafkaMessage| m.header_str(triage::wire::DOWNSTREAM))`
    /// on the runtime's builder). Borrowed, never allocated.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Bytes of key, payload and header names and values: what the queue's byte budget
    /// counts, and roughly what re-publishing it costs.
    pub fn size_bytes(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        self.key.as_ref().map_or(0, Vec::len) + self.payload.as_ref().map_or(0, Vec::len) + headers
    }
}
