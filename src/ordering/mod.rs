//! Ordering where it matters: per-key sequential processing, parallel across keys.
//!
//! A stream of state changes (an order's events, an account's postings, a device's readings)
//! must be handled in offset order per key, while different keys may run in parallel. After
//! Confluent's parallel consumer, a source chooses one of three modes ([`OrderingMode`]):
//!
//! - `unordered` (the default): every message is independent; a partition's messages run
//!   concurrently and the source commits only the contiguous watermark.
//! - `key`: at most one message per key is inside the runtime past the key gate; the next
//!   message of a key is admitted only once the previous one has its disposition. Keys run in
//!   parallel, so a partition with many keys keeps every worker busy.
//! - `partition`: one message at a time per partition (the key is the partition).
//!
//! The source computes each message's ordering key ([`OrderingConfig::key_of`]) and puts it on
//! the envelope ([`Envelope::ordering_key`](crate::runtime::Envelope::ordering_key)); the
//! runtime's [`KeyGate`] does the rest. A message without a key (a Kafka record with a null key,
//! unless [`NullKeyOrdering::Partition`] is set) is unordered.
//!
//! # What the gate guarantees, and what each disposition does to a key
//!
//! The gate admits a message of a key into the runtime (admission, the weighted-fair queue,
//! the workers, retries, the dead-letter path) only while no earlier message of that key is
//! inside it; later ones are *parked* in arrival order. Each disposition then decides the key's
//! next step, so that **a later message of a key never completes before an earlier one that
//! will still be processed**:
//!
//! | the key's current message | what happens to the key |
//! |---|---|
//! | `Completed` | the next parked message is released into admission |
//! | failed and retried (backoff, demoted one tier) | the key stays busy: the retry is the key's message until its final disposition |
//! | `Failed` (dead-lettered after its retries) | released once the dead letter is confirmed |
//! | `Expired` (in the queue, held, or while parked) | released: an expired message will never be processed |
//! | `Shed` (evicted or refused under the `drop` policy) | released: a dropped message will never be processed |
//! | refused or evicted under `defer` | **not deferred**: held in place as under `backpressure`, so the key's later messages wait behind it (see below) |
//! | refused under `backpressure` | held; the key's later messages wait behind it |
//! | released unprocessed (shutdown) | the key's parked messages are released with it, unacknowledged |
//! | taken back by its source (its Kafka partition revoked: [`Recall`](crate::runtime::Recall)) | released, never served, with the key's parked messages (all of the same partition); if it is running, the revocation waits for it (bounded) before the partition goes to its next owner |
//!
//! A deferred copy is served later, from the defer topic, after the key's later messages
//! would have been served from the source: deferral counts as "will still be processed", so
//! a keyed message is never deferred. Its tier's `defer` policy holds it instead (it waits in
//! the intake's held buffer and is offered again as capacity returns; the source is paused
//! when that buffer fills, as for any backpressure), which defers the rest of its key behind
//! it. A `drop` policy sheds it and releases the next message of its key.
//!
//! Across the consumers of a group the promise holds too: when a partition is revoked, the
//! runtime hands back what it holds of it, unprocessed, and the source lets the partition go
//! only once the handlers still running its records are done (at most the Kafka source's
//! `revoke_wait_ms`), so the next owner never runs a key while this one still does.
//!
//! Priorities across keys are unchanged: the weighted-fair queue chooses among the messages
//! whose keys are free. Within a key, order wins over priority: a Critical message parked
//! behind a Sheddable one of its key waits for it (and for its retries). Expiry applies per
//! message: a message whose deadline passes while parked is settled `Expired` when its turn
//! comes, without a handler call.
//!
//! # Memory
//!
//! Parked messages are bounded apart from the queue, by the runtime's
//! [`max_parked`](crate::runtime::ExpertConfig::max_parked) (default 10,000): when the gate
//! parks that many, every intake pauses its source (as a full held buffer does) until keys
//! complete. So memory stays within `capacity + max_held + max_parked +` in flight.
//!
//! Against a [memory budget](crate::admission::MemoryBudget), parked messages count in the
//! bytes held (the intake stops pulling as for any) but not in the working set a message is
//! admitted against: they wait for their key, in memory either way, so a key's message is
//! never refused for the bytes of the messages parked behind it.
//!
//! # When to use which mode
//!
//! - `unordered`: independent messages (notifications, idempotent upserts of whole
//!   documents). The most parallel, and shedding and deferral work per message.
//! - `key`: state changes per entity (an account's postings). As parallel as the number of
//!   keys with work waiting; keyed messages are held rather than deferred.
//! - `partition`: the whole partition is one sequence (a changelog replayed in order). At most
//!   one handler per partition, so throughput is `partitions / service time`.

mod gate;

use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

pub use gate::{Arrival, KeyGate};

/// How a source orders its messages. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderingMode {
    /// No ordering: messages run concurrently (the default).
    #[default]
    Unordered,
    /// At most one message per key (within its partition) inside the runtime at a time.
    Key,
    /// At most one message per partition inside the runtime at a time.
    Partition,
}

impl OrderingMode {
    /// The name used in configuration files (`unordered`, `key`, `partition`).
    pub fn as_str(self) -> &'static str {
        match self {
            OrderingMode::Unordered => "unordered",
            OrderingMode::Key => "key",
            OrderingMode::Partition => "partition",
        }
    }
}

impl std::fmt::Display for OrderingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for OrderingMode {
    type Err = crate::ConfigError;

    /// Parses `unordered`, `key` or `partition` (ASCII case ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "unordered" => Ok(OrderingMode::Unordered),
            "key" => Ok(OrderingMode::Key),
            "partition" => Ok(OrderingMode::Partition),
            _ => Err(crate::ConfigError::new(
                "ordering.mode",
                s,
                "unordered, key or partition",
            )),
        }
    }
}

/// What `key` mode does with a message that has no key (a Kafka record with a null key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NullKeyOrdering {
    /// Each keyless message is its own key: unordered (the default).
    #[default]
    Unordered,
    /// The keyless messages of a partition form one key: ordered among themselves.
    Partition,
}

/// A source's ordering: the mode and what to do with keyless messages, e.g. an `[ordering]`
/// table in a source's TOML configuration.
///
/// # Examples
///
/// ```
/// use triage::ordering::{OrderingConfig, OrderingMode};
///
/// let config: OrderingConfig = toml::from_str(r#"mode = "key""#)?;
/// assert_eq!(config.mode, OrderingMode::Key);
/// // Same partition and key: same ordering key; another key: another one.
/// assert_eq!(config.key_of(("orders", 3), Some(b"acct-1")), config.key_of(("orders", 3), Some(b"acct-1")));
/// assert_ne!(config.key_of(("orders", 3), Some(b"acct-1")), config.key_of(("orders", 3), Some(b"acct-2")));
/// // A null key is unordered by default.
/// assert_eq!(config.key_of(("orders", 3), None), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrderingConfig {
    /// `unordered`, `key` or `partition`. Default `unordered`.
    pub mode: OrderingMode,
    /// In `key` mode, what a message without a key does: `unordered` (each its own key) or
    /// `partition` (the keyless messages of a partition are one key). Default `unordered`.
    pub null_key: NullKeyOrdering,
}

impl OrderingConfig {
    /// The given mode, keyless messages unordered.
    pub fn new(mode: OrderingMode) -> Self {
        OrderingConfig {
            mode,
            null_key: NullKeyOrdering::Unordered,
        }
    }

    /// The ordering key of a message from `stream` (a partition: e.g. `(topic, partition)`)
    /// with message key `key`: `None` for an unordered message. Two messages share an ordering
    /// key when they come from the same stream and (in `key` mode) have the same key. The key
    /// is a 64-bit hash: two different keys that collide are merely ordered together (never
    /// run at once), which costs parallelism, not correctness.
    pub fn key_of(&self, stream: impl Hash, key: Option<&[u8]>) -> Option<u64> {
        // Unordered (the default) hashes nothing: this runs for every consumed message.
        if self.mode == OrderingMode::Unordered {
            return None;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        stream.hash(&mut h);
        match (self.mode, key, self.null_key) {
            (OrderingMode::Unordered, _, _) => return None,
            (OrderingMode::Partition, _, _) => 0u8.hash(&mut h),
            (OrderingMode::Key, Some(k), _) => {
                1u8.hash(&mut h);
                k.hash(&mut h);
            }
            (OrderingMode::Key, None, NullKeyOrdering::Partition) => 2u8.hash(&mut h),
            (OrderingMode::Key, None, NullKeyOrdering::Unordered) => return None,
        }
        Some(h.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_mode_keys_by_stream_only() {
        let c = OrderingConfig::new(OrderingMode::Partition);
        assert_eq!(
            c.key_of(("t", 0), Some(b"a")),
            c.key_of(("t", 0), Some(b"b"))
        );
        assert_eq!(c.key_of(("t", 0), None), c.key_of(("t", 0), Some(b"b")));
        assert_ne!(c.key_of(("t", 0), None), c.key_of(("t", 1), None));
    }

    #[test]
    fn null_keys_are_unordered_unless_configured() {
        let mut c = OrderingConfig::new(OrderingMode::Key);
        assert_eq!(c.key_of(("t", 0), None), None);
        c.null_key = NullKeyOrdering::Partition;
        assert!(c.key_of(("t", 0), None).is_some());
        assert_ne!(c.key_of(("t", 0), None), c.key_of(("t", 0), Some(b"")));
        assert_eq!(OrderingConfig::default().key_of(("t", 0), Some(b"a")), None);
    }

    #[test]
    fn modes_parse_and_refuse_with_the_field() {
        assert_eq!("KEY".parse::<OrderingMode>().ok(), Some(OrderingMode::Key));
        let err = "keys".parse::<OrderingMode>().unwrap_err().to_string();
        assert!(err.contains("ordering.mode"), "{err}");
        let bad = toml::from_str::<OrderingConfig>(r#"mode = "keys""#);
        assert!(bad.is_err());
    }
}
