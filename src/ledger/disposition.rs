//! The final outcome of a consumed message.

use std::fmt;

use serde::Serialize;

/// How a consumed message left the worker. Every message ends in exactly one.
///
/// Only after its disposition may the message's source offset (Kafka) or
/// delivery tag (RabbitMQ) be acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Disposition {
    /// The handler succeeded.
    Completed,
    /// Dead-lettered after its retries, or rejected to the broker's
    /// dead-letter exchange.
    Failed,
    /// Durably re-published for later; the broker acknowledged the publish.
    Deferred,
    /// Its deadline passed while queued; discarded at dequeue.
    Expired,
    /// Evicted or refused and dropped by the overload policy.
    Shed,
}

impl Disposition {
    /// Every disposition, in declaration order.
    pub const ALL: [Disposition; 5] = [
        Disposition::Completed,
        Disposition::Failed,
        Disposition::Deferred,
        Disposition::Expired,
        Disposition::Shed,
    ];

    /// Number of dispositions, for per-disposition arrays.
    pub(crate) const COUNT: usize = Self::ALL.len();

    /// Lowercase name, stable, suitable as a metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Disposition::Completed => "completed",
            Disposition::Failed => "failed",
            Disposition::Deferred => "deferred",
            Disposition::Expired => "expired",
            Disposition::Shed => "shed",
        }
    }

    /// Position in [`Disposition::ALL`], for per-disposition arrays.
    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Disposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
