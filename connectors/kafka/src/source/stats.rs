//! Per-source counters, readable without a metrics recorder.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::classify::UnclassifiedReason;

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) consumed: AtomicU64,
    pub(crate) unclassified: [AtomicU64; UnclassifiedReason::ALL.len()],
    pub(crate) commits: AtomicU64,
    pub(crate) commits_failed: AtomicU64,
    pub(crate) stale_acks: AtomicU64,
    pub(crate) revocations: AtomicU64,
    pub(crate) assignments: AtomicU64,
    pub(crate) pauses: AtomicU64,
    pub(crate) client_restarts: AtomicU64,
    pub(crate) revoke_released: AtomicU64,
    pub(crate) revoke_wait_exceeded: AtomicU64,
}

/// A snapshot of one source's counters (the same events as its [metrics](crate::metrics),
/// but for this source only).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceStats {
    /// Records consumed and tracked.
    pub consumed: u64,
    /// Records that fell back to a default, by reason, in [`UnclassifiedReason::ALL`] order.
    pub unclassified: [u64; UnclassifiedReason::ALL.len()],
    /// Successful offset commits.
    pub commits: u64,
    /// Failed or timed-out offset commits.
    pub commits_failed: u64,
    /// Dispositions ignored because their partition had been revoked.
    pub stale_acks: u64,
    /// Revocations: revocation callbacks, and rebalance errors (which give up every
    /// partition).
    pub revocations: u64,
    /// Assignment callbacks.
    pub assignments: u64,
    /// Times the assignment was paused.
    pub pauses: u64,
    /// Times the consumer client was replaced after a fatal error (a static member fenced:
    /// `FENCED_INSTANCE_ID`). Each one withdraws what was consumed and not yet settled; the
    /// new client resumes from the committed watermark.
    pub client_restarts: u64,
    /// Records of revoked (or lost) partitions the runtime held, queued or parked, and handed
    /// back unprocessed at the revocation (released: the partition's next owner delivers them
    /// again). Those held elsewhere in the runtime are released where they move next and are
    /// not counted here; the runtime's ledger counts every release.
    pub revoke_released: u64,
    /// Revocations that let their partitions go while handlers of theirs still ran, because
    /// `revoke_wait_ms` ran out: the next owner may then run a key while this member still
    /// does.
    pub revoke_wait_exceeded: u64,
}

impl SourceStats {
    /// Records that fell back for `reason`.
    pub fn unclassified(&self, reason: UnclassifiedReason) -> u64 {
        self.unclassified[reason.index()]
    }
}

impl Stats {
    pub(crate) fn snapshot(&self) -> SourceStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SourceStats {
            consumed: get(&self.consumed),
            unclassified: std::array::from_fn(|i| get(&self.unclassified[i])),
            commits: get(&self.commits),
            commits_failed: get(&self.commits_failed),
            stale_acks: get(&self.stale_acks),
            revocations: get(&self.revocations),
            assignments: get(&self.assignments),
            pauses: get(&self.pauses),
            client_restarts: get(&self.client_restarts),
            revoke_released: get(&self.revoke_released),
            revoke_wait_exceeded: get(&self.revoke_wait_exceeded),
        }
    }
}

/// A handle on one [`KafkaSource`](crate::KafkaSource)'s counters that stays readable once
/// the source is moved into a runtime ([`KafkaSource::stats_handle`](crate::KafkaSource::stats_handle)).
/// Cloning it is cheap; it reads the same counters as the source.
///
/// # Examples
///
/// ```no_run
/// use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
/// use triage_kafka::{KafkaMessage, KafkaSource, KafkaSourceConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let source = KafkaSource::builder(KafkaSourceConfig::new("127.0.0.1:9092", "billing", ["orders"]))
///     .build()?;
/// let stats = source.stats_handle();
/// let mut runtime = Runtime::builder(RuntimeConfig::default())
///     .start(|_job: Job<KafkaMessage>| async { Ok::<(), HandlerError>(()) })?;
/// runtime.attach(source);
/// // ... later, from anywhere:
/// println!("revocations so far: {}", stats.snapshot().revocations);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct StatsHandle(pub(crate) Arc<Stats>);

impl StatsHandle {
    /// The counters now.
    pub fn snapshot(&self) -> SourceStats {
        self.0.snapshot()
    }
}
