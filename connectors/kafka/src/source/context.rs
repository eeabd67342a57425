//! The consumer's context: the rebalance callbacks, which mark, hand back, commit and revoke
//! the partitions a rebalance takes (see `offsets.rs` for the order and why).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::ClientContext;

use crate::metrics::{self, CommitTrigger};

use super::link::RuntimeLink;
use super::offsets::Offsets;

/// The consumer's context: the rebalance callbacks, run on the poll thread (and, for a client
/// being closed after a fatal error, on the thread closing it: ignored by generation).
#[derive(Debug)]
pub(crate) struct SourceContext {
    pub(crate) offsets: Arc<Offsets>,
    /// The runtime the source is attached to, to hand back the records of revoked partitions.
    pub(crate) link: Arc<RuntimeLink>,
    /// The client generation this context belongs to (see [`Offsets::lose_all`]).
    pub(crate) client: u64,
}

impl SourceContext {
    /// Whether this context's client is the source's current one.
    fn current(&self) -> bool {
        self.offsets.client() == self.client
    }
}

impl ClientContext for SourceContext {}

impl ConsumerContext for SourceContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if !self.current() {
            return;
        }
        let offsets = &self.offsets;
        let tpl = match rebalance {
            Rebalance::Assign(_) => return,
            Rebalance::Error(err) => {
                // rdkafka unassigns everything after this callback: a lost assignment.
                metrics::rebalance("error");
                offsets.stats.revocations.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%err, "kafka source: rebalance error; every partition given up");
                let lost = offsets.revoke_all();
                // Someone else may own them already: hand back what the runtime holds, but
                // waiting would only delay the rejoin.
                let back = self.link.hand_back(&lost, false);
                offsets.count_hand_back(back);
                return;
            }
            Rebalance::Revoke(tpl) => tpl,
        };
        metrics::rebalance("revoke");
        offsets.stats.revocations.fetch_add(1, Ordering::Relaxed);
        let elements = tpl.elements();
        let revoked: Vec<(&str, i32)> = elements
            .iter()
            .map(|e| (e.topic(), e.partition()))
            .collect();
        // From here no record of theirs reaches a handler, here or in the runtime.
        let indices = offsets.leave(revoked.iter().copied());
        let closing = offsets.closing();
        if !closing {
            // What the runtime holds of them goes back to the next owner; what runs here
            // finishes first (at most `revoke_wait_ms`), so that the next owner never runs a
            // key while this member does, and its completions are in the commit below. The
            // poll thread blocks meanwhile: the configuration keeps the wait and the commit
            // well inside `max.poll.interval.ms`, which counts from the poll that delivered
            // this callback (rdkafka runs it after librdkafka's poll returned).
            let back = self.link.hand_back(&indices, true);
            offsets.count_hand_back(back);
        }
        // A lost assignment (session timed out) already belongs to someone else: committing
        // would fail, or worse overwrite the new owner's position.
        if !closing && !consumer.assignment_lost() {
            // Commit what is settled before giving the partitions up, so the next owner starts
            // exactly after it. A synchronous commit here is what librdkafka documents for
            // this callback; on failure the next owner redelivers from the older position.
            let wait = offsets.commit_wait();
            offsets.commit_with(
                CommitTrigger::Revoke,
                |idx| indices.contains(&idx),
                Some(wait),
                |commit| consumer.commit(commit, CommitMode::Sync),
            );
        }
        offsets.revoke(revoked);
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if !self.current() {
            return;
        }
        match rebalance {
            Rebalance::Assign(tpl) => {
                metrics::rebalance("assign");
                self.offsets
                    .stats
                    .assignments
                    .fetch_add(1, Ordering::Relaxed);
                self.offsets
                    .assign(tpl.elements().iter().map(|e| (e.topic(), e.partition())));
                // Set the pause flag the source wants on every assignment, both ways. Without
                // the resume, a source that was paused when its assignment was lost (a broker
                // restart outlasting the session) and resumed while it had no partitions never
                // fetched again once they came back.
                let all = self.offsets.paused();
                if let Err(err) = self.offsets.apply_pauses(consumer, tpl, all) {
                    tracing::warn!(%err, "kafka source: could not set the new assignment's pause flag");
                }
            }
            // Handled before rdkafka unassigned (`pre_rebalance`).
            Rebalance::Revoke(_) | Rebalance::Error(_) => {}
        }
    }
}
