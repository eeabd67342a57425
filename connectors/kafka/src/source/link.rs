//! The runtime the source is attached to, as the rebalance callback reaches it.
//!
//! When partitions are revoked, the records of theirs that the runtime holds belong to the
//! partitions' next owner: served here, they would run while the next owner runs the same
//! keys from the committed position. So the revocation callback hands them back through the
//! runtime's [`Recall`] (released, never served: the next owner redelivers them), then waits
//! for the handlers still running them, at most `revoke_wait_ms`, before it commits and lets
//! the partitions go. See `offsets.rs` for the callback and `config.rs` for the bound.
//!
//! A source used without a runtime (its records taken with `Source::next` directly) has no
//! recall: its revocation hands nothing back and waits for nothing, as before.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use triage::runtime::{AckSink, Recall};

/// What a revocation handed back and left running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HandBack {
    /// Records released at once (queued or parked in the runtime).
    pub(crate) released: usize,
    /// Handlers of the revoked partitions still running when the wait ran out.
    pub(crate) still_running: usize,
}

/// The runtime's [`Recall`], once attached, and what the source's records report to.
pub(crate) struct RuntimeLink {
    recall: OnceLock<Recall>,
    /// The source's ack sink: the runtime's records of this source report to it.
    acks: Arc<dyn AckSink>,
    /// How long a revocation waits for the handlers of its partitions (`revoke_wait_ms`).
    wait: Duration,
}

impl std::fmt::Debug for RuntimeLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeLink")
            .field("attached", &self.recall.get().is_some())
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl RuntimeLink {
    pub(crate) fn new(acks: Arc<dyn AckSink>, wait: Duration) -> Self {
        RuntimeLink {
            recall: OnceLock::new(),
            acks,
            wait,
        }
    }

    /// The source was attached to a runtime (once: a source is attached to one runtime).
    pub(crate) fn attach(&self, recall: Recall) {
        if self.recall.set(recall).is_err() {
            tracing::warn!("kafka source: attached twice; the first runtime keeps its recall");
        }
    }

    /// Hands back the runtime's records of the partitions `streams` (indices), which the
    /// source already answers as not current, and, if `wait`, waits for the handlers still
    /// running them, at most `revoke_wait_ms`. Blocks the calling (poll) thread meanwhile.
    pub(crate) fn hand_back(&self, streams: &[u64], wait: bool) -> HandBack {
        let Some(recall) = self.recall.get() else {
            return HandBack::default();
        };
        if streams.is_empty() {
            return HandBack::default();
        }
        let revoked = |token: triage::runtime::AckRef| streams.contains(&token.stream);
        let released = recall.release_where(&self.acks, revoked);
        let still_running = if wait {
            recall.wait_running(&self.acks, revoked, self.wait)
        } else {
            0
        };
        HandBack {
            released,
            still_running,
        }
    }
}
