//! Watermark offsets: what the source tracks, what it commits, and the rebalance callbacks.
//!
//! Every consumed record is tracked in an [`AckTracker`] keyed by a partition index (a `u64`
//! that fits in an [`AckRef`], never reused within a source). The runtime resolves each
//! record once; only the contiguous watermark is ever committed, so a record without a
//! disposition is never skipped by a restart or a new owner (at-least-once).
//!
//! Partition ownership has epochs. On revocation the watermark of the revoked partitions is
//! committed synchronously from the rebalance callback, *then* they are revoked from the
//! tracker: dispositions arriving later carry an old epoch and are ignored (counted as stale),
//! never stored. On assignment the tracker starts a new epoch with no position; the client
//! starts from the group's committed offset, never a stale local one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use triage::ledger::{AckToken, AckTracker, Disposition, ResolveError};
use triage::runtime::{AckRef, AckSink};

use crate::metrics::{self, CommitTrigger};

use super::stats::Stats;

/// What [`Offsets::commit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Committed {
    /// Every watermark was already committed.
    Nothing,
    /// Committed.
    Done,
    /// The client or the broker refused it; counted.
    Failed,
}

/// Offsets state shared by the poll thread, the rebalance callbacks and the ack sink.
#[derive(Debug, Default)]
pub(crate) struct Offsets {
    state: Mutex<State>,
    /// Bumped on every revocation: a queued envelope stamped with an older value may belong to
    /// a revoked partition and is checked before it is handed out.
    revocations: AtomicU64,
    /// Set before the final close: the revoke callback then only revokes (the final commit
    /// was already made, bounded).
    closing: AtomicBool,
    /// Whether the poll thread has the assignment paused (newly assigned partitions follow).
    paused: AtomicBool,
    /// Generation of the current consumer client, bumped when a client is replaced after a
    /// fatal error: callbacks of a retired client (its close still runs them) are ignored.
    client: AtomicU64,
    pub(crate) stats: Stats,
}

#[derive(Debug, Default)]
struct State {
    tracker: AckTracker<u64>,
    index: HashMap<String, HashMap<i32, u64>>,
    names: Vec<(String, i32)>,
}

impl State {
    fn index_of(&mut self, topic: &str, partition: i32) -> u64 {
        if let Some(idx) = self.index.get(topic).and_then(|m| m.get(&partition)) {
            return *idx;
        }
        let idx = self.names.len() as u64;
        self.names.push((topic.to_owned(), partition));
        self.index
            .entry(topic.to_owned())
            .or_default()
            .insert(partition, idx);
        idx
    }

    fn lookup(&self, topic: &str, partition: i32) -> Option<u64> {
        self.index.get(topic)?.get(&partition).copied()
    }

    fn name(&self, idx: u64) -> Option<&(String, i32)> {
        self.names.get(usize::try_from(idx).ok()?)
    }

    /// The committable positions as a commit list, with their indices.
    fn committable(&self) -> (TopicPartitionList, Vec<(u64, u64)>) {
        self.committable_where(|_| true)
    }

    /// The committable positions of the partitions `keep` selects.
    fn committable_where(
        &self,
        keep: impl Fn(u64) -> bool,
    ) -> (TopicPartitionList, Vec<(u64, u64)>) {
        let mut tpl = TopicPartitionList::new();
        let mut list = Vec::new();
        for (idx, pos) in self.tracker.committable().filter(|(idx, _)| keep(**idx)) {
            if let (Some((topic, partition)), Ok(off)) = (self.name(*idx), i64::try_from(pos)) {
                // Only fails for an offset that does not fit in i64, which the tracker never gives.
                if tpl
                    .add_partition_offset(topic, *partition, Offset::Offset(off))
                    .is_ok()
                {
                    list.push((*idx, pos));
                }
            }
        }
        (tpl, list)
    }
}

impl Offsets {
    /// Registers a consumed record: returns its ack reference, or `None` if its partition is
    /// not (or no longer) assigned or the offset is not above the last one tracked.
    pub(crate) fn track(&self, topic: &str, partition: i32, offset: i64) -> Option<(AckRef, u64)> {
        let offset = u64::try_from(offset).ok()?;
        let mut state = self.state.lock();
        let idx = state.lookup(topic, partition)?;
        let token = state.tracker.track(&idx, offset).ok()?;
        let epoch = token.epoch().get();
        drop(state);
        let gen = self.revocations.load(Ordering::Acquire);
        Some((
            AckRef {
                stream: idx,
                position: offset,
                epoch,
            },
            gen,
        ))
    }

    /// Whether an envelope stamped at revocation generation `gen` still belongs to a current
    /// assignment. Cheap unless a revocation happened since it was stamped.
    pub(crate) fn is_current(&self, token: AckRef, gen: u64) -> bool {
        if self.revocations.load(Ordering::Acquire) == gen {
            return true;
        }
        let state = self.state.lock();
        state.tracker.epoch(&token.stream).map(|e| e.get()) == Some(token.epoch)
    }

    fn resolve(&self, token: AckRef) {
        let mut state = self.state.lock();
        // `Epoch` has no public constructor from its number, so the token is rebuilt from the
        // partition's current epoch after checking that the numbers match.
        let Some(epoch) = state
            .tracker
            .epoch(&token.stream)
            .filter(|e| e.get() == token.epoch)
        else {
            drop(state);
            self.stats.stale_acks.fetch_add(1, Ordering::Relaxed);
            metrics::stale_ack();
            return;
        };
        let ack = AckToken::from_parts(token.stream, token.position, epoch);
        match state.tracker.resolve(&ack) {
            Ok(_) => {}
            Err(ResolveError::Stale { .. }) => {
                drop(state);
                self.stats.stale_acks.fetch_add(1, Ordering::Relaxed);
                metrics::stale_ack();
            }
            Err(err) => {
                drop(state);
                // A runtime bug (double resolve), not a message problem: worth a log line.
                tracing::warn!(%err, "kafka source: disposition refused");
            }
        }
    }

    /// The current client generation, for the context of a new client.
    pub(crate) fn client(&self) -> u64 {
        self.client.load(Ordering::Acquire)
    }

    /// The client is being replaced: every partition is given up as lost (no commit: the
    /// client is unusable, and the position may belong to someone else by now), envelopes
    /// still queued are withdrawn, later dispositions of them are stale, and callbacks of the
    /// old client are ignored from here on.
    pub(crate) fn lose_all(&self) {
        self.client.fetch_add(1, Ordering::AcqRel);
        let mut state = self.state.lock();
        let assigned: Vec<u64> = state.tracker.partitions().copied().collect();
        for idx in &assigned {
            state.tracker.revoke(idx);
        }
        drop(state);
        self.revocations.fetch_add(1, Ordering::AcqRel);
        self.paused.store(false, Ordering::Release);
    }

    /// Commits every changed watermark, synchronously (see [`super::commit`] for why), and
    /// records the result.
    pub(crate) fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        trigger: CommitTrigger,
    ) -> Committed {
        let (tpl, list) = self.state.lock().committable();
        if list.is_empty() {
            return Committed::Nothing;
        }
        match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => {
                self.mark_committed(&list, trigger);
                Committed::Done
            }
            Err(err) => {
                self.stats.commits_failed.fetch_add(1, Ordering::Relaxed);
                metrics::commit(trigger, false);
                // Expected while the coordinator is away; the next interval retries.
                tracing::debug!(%err, trigger = ?trigger, "kafka source: offset commit failed");
                Committed::Failed
            }
        }
    }

    fn mark_committed(&self, list: &[(u64, u64)], trigger: CommitTrigger) {
        let mut state = self.state.lock();
        for (idx, pos) in list {
            if state.tracker.mark_committed(idx, *pos) {
                if let Some((topic, partition)) = state.name(*idx) {
                    metrics::committed(topic, *partition, *pos);
                }
            }
        }
        drop(state);
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        metrics::commit(trigger, true);
    }

    pub(crate) fn set_closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }

    pub(crate) fn pending_total(&self) -> usize {
        self.state.lock().tracker.pending_total()
    }
}

/// The [`AckSink`] the source's envelopes report to.
#[derive(Debug)]
pub(crate) struct KafkaAcks {
    pub(crate) offsets: Arc<Offsets>,
}

impl AckSink for KafkaAcks {
    fn resolve(&self, token: AckRef, disposition: Disposition) {
        // Every disposition settles the offset: Failed means dead-lettered, Deferred means the
        // copy is confirmed, Expired and Shed were decided by policy. Only a release does not.
        let _ = disposition;
        self.offsets.resolve(token);
    }
}

/// The consumer's context: the rebalance callbacks, run on the poll thread (and, for a client
/// being closed after a fatal error, on the thread closing it: ignored by generation).
#[derive(Debug)]
pub(crate) struct SourceContext {
    pub(crate) offsets: Arc<Offsets>,
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
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        if !self.current() {
            return;
        }
        metrics::rebalance("revoke");
        self.offsets
            .stats
            .revocations
            .fetch_add(1, Ordering::Relaxed);
        let offsets = &self.offsets;
        // A lost assignment (session timed out) already belongs to someone else: committing
        // would fail, or worse overwrite the new owner's position.
        if !offsets.closing.load(Ordering::Acquire) && !consumer.assignment_lost() {
            // Commit what is settled before giving the partitions up, so the next owner starts
            // exactly after it. A synchronous commit here is what librdkafka documents for
            // this callback; on failure the next owner redelivers from the older position.
            let (commit_tpl, list) = {
                let state = offsets.state.lock();
                let revoked: Vec<u64> = tpl
                    .elements()
                    .iter()
                    .filter_map(|e| state.lookup(e.topic(), e.partition()))
                    .collect();
                state.committable_where(|idx| revoked.contains(&idx))
            };
            if !list.is_empty() {
                match consumer.commit(&commit_tpl, CommitMode::Sync) {
                    Ok(()) => offsets.mark_committed(&list, CommitTrigger::Revoke),
                    Err(err) => {
                        offsets.stats.commits_failed.fetch_add(1, Ordering::Relaxed);
                        metrics::commit(CommitTrigger::Revoke, false);
                        tracing::warn!(%err, "kafka source: commit on revocation failed");
                    }
                }
            }
        }
        let mut state = offsets.state.lock();
        for e in tpl.elements() {
            if let Some(idx) = state.lookup(e.topic(), e.partition()) {
                state.tracker.revoke(&idx);
            }
        }
        drop(state);
        offsets.revocations.fetch_add(1, Ordering::AcqRel);
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
                let mut state = self.offsets.state.lock();
                for e in tpl.elements() {
                    let idx = state.index_of(e.topic(), e.partition());
                    state.tracker.assign(idx);
                }
                drop(state);
                // librdkafka keeps a partition's pause flag across an unassign and a later
                // assign (confluent-kafka-go#193, librdkafka#1849): set the flag the source wants
                // on every assignment, both ways. Without the resume, a source that was paused
                // when its assignment was lost (a broker restart outlasting the session) and
                // resumed while it had no partitions never fetched again once they came back.
                let result = if self.offsets.paused.load(Ordering::Acquire) {
                    consumer.pause(tpl)
                } else {
                    consumer.resume(tpl)
                };
                if let Err(err) = result {
                    tracing::warn!(%err, "kafka source: could not set the new assignment's pause flag");
                }
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(err) => {
                metrics::rebalance("error");
                tracing::warn!(%err, "kafka source: rebalance error");
            }
        }
    }
}
