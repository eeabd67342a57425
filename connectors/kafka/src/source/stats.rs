//! Per-source counters, readable without a metrics recorder.

use std::sync::atomic::{AtomicU64, Ordering};

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
        }
    }
}
