//! Watermark offsets: what the source tracks and what it commits, in the order the rebalance
//! callbacks (`context.rs`) follow.
//!
//! Every consumed record is tracked in an [`AckTracker`] keyed by a partition index (a `u64`
//! that fits in an [`AckRef`], never reused within a source). The runtime resolves each
//! record once; only the contiguous watermark is ever committed, so a record without a
//! disposition is never skipped by a restart or a new owner (at-least-once).
//!
//! Partition ownership has epochs. On revocation the revoked partitions are first marked
//! *leaving*: their records are no longer current, so neither the source nor the runtime
//! hands one to a handler from then on, and the runtime releases those it holds (see
//! `link.rs`) and waits, at most `revoke_wait_ms`, for the handlers still running them, whose
//! dispositions the tracker still takes. Then the watermark of the revoked partitions is
//! committed synchronously from the rebalance callback, *then* they are revoked from the
//! tracker: dispositions arriving later carry an old epoch and are ignored (counted as stale),
//! never stored. So the next owner starts after everything this member finished, and never
//! runs a key while this member still runs it (unless the wait ran out, which is counted). On
//! assignment the tracker starts a new epoch with no position; the client starts from the
//! group's committed offset, never a stale local one.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};
use triage::ledger::{AckToken, AckTracker, Epoch, ResolveError};
use triage::runtime::AckRef;

use crate::metrics::{self, CommitTrigger};

use super::link::HandBack;
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
    /// Held from the snapshot of the watermarks to the commit's result: one commit at a time,
    /// so they land in the order their snapshots were taken (see the module docs).
    commit_lock: Mutex<()>,
    /// How long the revocation's commit waits for one in flight.
    commit_wait: Mutex<Option<Duration>>,
    /// Bumped on every revocation: a queued envelope stamped with an older value may belong to
    /// a revoked partition and is checked before it is handed out.
    revocations: AtomicU64,
    /// Set before the final close: the revoke callback then only revokes (the final commit
    /// was already made, bounded).
    closing: AtomicBool,
    /// Whether the poll thread has the assignment paused (newly assigned partitions follow).
    paused: AtomicBool,
    /// Topics whose partitions stay paused even while the assignment is consumed: those of the
    /// tiers the runtime sheds (`Source::pause_tiers`). Newly assigned partitions follow.
    shed_topics: Mutex<HashSet<String>>,
    /// Generation of the current consumer client, bumped when a client is replaced after a
    /// fatal error: callbacks of a retired client (its close still runs them) are ignored.
    client: AtomicU64,
    /// Shared with the source's stats handle, which outlives the source's move into a runtime.
    pub(crate) stats: Arc<Stats>,
}

/// The partition the poll thread tracked last and its index (see [`Offsets::track_cached`]).
#[derive(Debug, Default)]
pub(crate) struct LastStream(Option<(Arc<str>, i32, u64)>);

impl LastStream {
    fn get(&self, topic: &str, partition: i32) -> Option<u64> {
        match &self.0 {
            Some((t, p, idx)) if *p == partition && &**t == topic => Some(*idx),
            _ => None,
        }
    }

    fn set(&mut self, topic: &str, partition: i32, idx: u64) {
        let topic = match self.0.take() {
            Some((t, _, _)) if &*t == topic => t,
            _ => Arc::from(topic),
        };
        self.0 = Some((topic, partition, idx));
    }
}

#[derive(Debug, Default)]
struct State {
    tracker: AckTracker<u64>,
    index: HashMap<String, HashMap<i32, u64>>,
    /// Each index's partition; the topic shared by every record of it.
    names: Vec<(Arc<str>, i32)>,
    /// Partitions being revoked (see [`Offsets::leave`]): their records are not current,
    /// though the tracker still takes their dispositions.
    leaving: HashSet<u64>,
}

impl State {
    /// Whether a record of `token` is still this member's to process.
    fn current(&self, token: AckRef) -> bool {
        !self.leaving.contains(&token.stream)
            && self.tracker.epoch(&token.stream).map(|e| e.get()) == Some(token.epoch)
    }

    fn index_of(&mut self, topic: &str, partition: i32) -> u64 {
        if let Some(idx) = self.index.get(topic).and_then(|m| m.get(&partition)) {
            return *idx;
        }
        let idx = self.names.len() as u64;
        self.names.push((Arc::from(topic), partition));
        self.index
            .entry(topic.to_owned())
            .or_default()
            .insert(partition, idx);
        idx
    }

    fn lookup(&self, topic: &str, partition: i32) -> Option<u64> {
        self.index.get(topic)?.get(&partition).copied()
    }

    fn name(&self, idx: u64) -> Option<&(Arc<str>, i32)> {
        self.names.get(usize::try_from(idx).ok()?)
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
    #[cfg(test)]
    pub(crate) fn track(&self, topic: &str, partition: i32, offset: i64) -> Option<(AckRef, u64)> {
        self.track_cached(&mut LastStream::default(), topic, partition, offset)
            .map(|(token, gen, _)| (token, gen))
    }

    /// [`track`](Self::track) for the poll thread, which remembers in `last` the index of the
    /// partition it tracked last: records come in runs of one partition, and an index, once
    /// given, names its partition for the life of the source, so a hit skips the two hash
    /// lookups of the name.
    pub(crate) fn track_cached(
        &self,
        last: &mut LastStream,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Option<(AckRef, u64, Arc<str>)> {
        let offset = u64::try_from(offset).ok()?;
        let mut state = self.state.lock();
        let idx = match last.get(topic, partition) {
            Some(idx) => idx,
            None => {
                let idx = state.lookup(topic, partition)?;
                last.set(topic, partition, idx);
                idx
            }
        };
        let token = state.tracker.track(&idx, offset).ok()?;
        let epoch = token.epoch().get();
        let topic = Arc::clone(&state.name(idx)?.0);
        drop(state);
        let gen = self.revocations.load(Ordering::Acquire);
        Some((
            AckRef {
                stream: idx,
                position: offset,
                epoch,
            },
            gen,
            topic,
        ))
    }

    /// Whether an envelope stamped at revocation generation `gen` still belongs to a current
    /// assignment (and not to a partition being revoked). Cheap unless a revocation happened
    /// since it was stamped.
    pub(crate) fn is_current(&self, token: AckRef, gen: u64) -> bool {
        if self.revocations.load(Ordering::Acquire) == gen {
            return true;
        }
        self.token_current(token)
    }

    /// Whether the record of `token` is still this member's to process: its partition assigned
    /// in the same epoch, and not being revoked.
    pub(crate) fn token_current(&self, token: AckRef) -> bool {
        self.state.lock().current(token)
    }

    pub(crate) fn resolve(&self, token: AckRef) {
        self.resolve_all(&[token]);
    }

    /// Resolves every token under one lock (a worker's batch). A token of an earlier epoch
    /// (the partition revoked, or revoked and assigned again) resolves to `Stale`, as does one
    /// of a partition no longer assigned.
    pub(crate) fn resolve_all(&self, tokens: &[AckRef]) {
        let mut stale = 0u64;
        let mut refused = None;
        {
            let mut state = self.state.lock();
            for token in tokens {
                let ack = AckToken::from_parts(
                    token.stream,
                    token.position,
                    Epoch::from_raw(token.epoch),
                );
                match state.tracker.resolve(&ack) {
                    Ok(_) => {}
                    Err(ResolveError::Stale { .. }) => stale += 1,
                    Err(err) => refused = Some(err),
                }
            }
        }
        if stale > 0 {
            self.stats.stale_acks.fetch_add(stale, Ordering::Relaxed);
            metrics::stale_ack_n(stale);
        }
        if let Some(err) = refused {
            // A runtime bug (double resolve), not a message problem: worth a log line (the
            // batch's last, outside the lock).
            tracing::warn!(%err, "kafka source: disposition refused");
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
    /// Returns the indices of the partitions given up, for the runtime to release their
    /// records.
    pub(crate) fn lose_all(&self) -> Vec<u64> {
        self.client.fetch_add(1, Ordering::AcqRel);
        let lost = self.revoke_all();
        self.paused.store(false, Ordering::Release);
        lost
    }

    /// Commits every changed watermark, synchronously (see [`super::commit`] for why), and
    /// records the result.
    pub(crate) fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        trigger: CommitTrigger,
    ) -> Committed {
        self.commit_with(
            trigger,
            |_| true,
            None,
            |tpl| consumer.commit(tpl, CommitMode::Sync),
        )
    }

    /// Commits the changed watermarks of the partitions `keep` selects through `send`, one
    /// commit at a time: waits for a commit in flight (at most `wait`, when given; past it
    /// nothing is committed and the attempt counts as failed), then takes the snapshot and
    /// commits it, holding the lock until `send` returns. Records the result.
    pub(crate) fn commit_with(
        &self,
        trigger: CommitTrigger,
        keep: impl Fn(u64) -> bool,
        wait: Option<Duration>,
        send: impl FnOnce(&TopicPartitionList) -> KafkaResult<()>,
    ) -> Committed {
        let serial = match wait {
            None => Some(self.commit_lock.lock()),
            Some(wait) => self.commit_lock.try_lock_for(wait),
        };
        let Some(_serial) = serial else {
            self.commit_failed(trigger, "a commit in flight did not finish in time");
            return Committed::Failed;
        };
        let (tpl, list) = self.state.lock().committable_where(keep);
        if list.is_empty() {
            return Committed::Nothing;
        }
        match send(&tpl) {
            Ok(()) => {
                self.mark_committed(&list, trigger);
                Committed::Done
            }
            Err(err) => {
                self.commit_failed(trigger, &err.to_string());
                Committed::Failed
            }
        }
    }

    fn commit_failed(&self, trigger: CommitTrigger, why: &str) {
        self.stats.commits_failed.fetch_add(1, Ordering::Relaxed);
        metrics::commit(trigger, false);
        if trigger == CommitTrigger::Interval {
            // Expected while the coordinator is away; the next interval retries.
            tracing::debug!(%why, "kafka source: offset commit failed");
        } else {
            tracing::warn!(%why, trigger = ?trigger, "kafka source: offset commit failed");
        }
    }

    /// How long a revocation's commit waits for an interval commit in flight.
    pub(crate) fn set_commit_wait(&self, wait: Duration) {
        *self.commit_wait.lock() = Some(wait);
    }

    /// How long a revocation's commit waits for an interval commit in flight (5 s until set).
    pub(crate) fn commit_wait(&self) -> Duration {
        self.commit_wait.lock().unwrap_or(Duration::from_secs(5))
    }

    /// Registers newly assigned partitions: each starts a new epoch with no position.
    pub(crate) fn assign<'a>(&self, partitions: impl IntoIterator<Item = (&'a str, i32)>) {
        let mut state = self.state.lock();
        for (topic, partition) in partitions {
            let idx = state.index_of(topic, partition);
            state.leaving.remove(&idx);
            state.tracker.assign(idx);
        }
    }

    /// Marks the given partitions as being revoked: from now on their records are not
    /// current ([`is_current`](Self::is_current), [`token_current`](Self::token_current)), so
    /// the source withdraws those it still hands out and the runtime releases those it holds,
    /// while the tracker still takes the dispositions of the records already in a handler, for
    /// the revocation's commit. Returns their indices.
    pub(crate) fn leave<'a>(
        &self,
        partitions: impl IntoIterator<Item = (&'a str, i32)>,
    ) -> Vec<u64> {
        let mut state = self.state.lock();
        let mut leaving = Vec::new();
        for (topic, partition) in partitions {
            if let Some(idx) = state.lookup(topic, partition) {
                state.leaving.insert(idx);
                leaving.push(idx);
            }
        }
        drop(state);
        self.revocations.fetch_add(1, Ordering::AcqRel);
        leaving
    }

    /// Stops tracking the given partitions: later dispositions of their records are stale,
    /// and queued records of theirs are withdrawn.
    pub(crate) fn revoke<'a>(&self, partitions: impl IntoIterator<Item = (&'a str, i32)>) {
        let mut state = self.state.lock();
        for (topic, partition) in partitions {
            if let Some(idx) = state.lookup(topic, partition) {
                state.leaving.remove(&idx);
                state.tracker.revoke(&idx);
            }
        }
        drop(state);
        self.revocations.fetch_add(1, Ordering::AcqRel);
    }

    /// Every partition is lost (a rebalance error): revoked without a commit.
    /// Returns the indices of the partitions given up.
    pub(crate) fn revoke_all(&self) -> Vec<u64> {
        let mut state = self.state.lock();
        let assigned: Vec<u64> = state.tracker.partitions().copied().collect();
        for idx in &assigned {
            state.tracker.revoke(idx);
        }
        state.leaving.clear();
        drop(state);
        self.revocations.fetch_add(1, Ordering::AcqRel);
        assigned
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

    /// Whether the final close began (see `closing`).
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }

    /// Whether the poll thread has the assignment paused.
    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Replaces the set of shed topics; returns whether it changed.
    pub(crate) fn set_shed_topics(&self, topics: HashSet<String>) -> bool {
        let mut shed = self.shed_topics.lock();
        if *shed == topics {
            return false;
        }
        *shed = topics;
        true
    }

    /// Pauses the partitions of `tpl` that must not be fetched (all of them when `all`, else
    /// those of the shed topics) and resumes the others. librdkafka keeps a partition's pause
    /// flag across an unassign and a later assign (confluent-kafka-go#193, librdkafka#1849), so
    /// the flag is set both ways every time.
    pub(crate) fn apply_pauses<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        tpl: &TopicPartitionList,
        all: bool,
    ) -> KafkaResult<()> {
        let (mut pause, mut resume) = (TopicPartitionList::new(), TopicPartitionList::new());
        {
            let shed = self.shed_topics.lock();
            for e in tpl.elements() {
                let list = if all || shed.contains(e.topic()) {
                    &mut pause
                } else {
                    &mut resume
                };
                list.add_partition(e.topic(), e.partition());
            }
        }
        if pause.count() > 0 {
            consumer.pause(&pause)?;
        }
        if resume.count() > 0 {
            consumer.resume(&resume)?;
        }
        Ok(())
    }

    pub(crate) fn pending_total(&self) -> usize {
        self.state.lock().tracker.pending_total()
    }

    /// Counts what a revocation handed back to the runtime and left running.
    pub(crate) fn count_hand_back(&self, back: HandBack) {
        if back.released > 0 {
            let n = back.released as u64;
            self.stats.revoke_released.fetch_add(n, Ordering::Relaxed);
            metrics::revoke_released(n);
        }
        if back.still_running > 0 {
            self.stats
                .revoke_wait_exceeded
                .fetch_add(1, Ordering::Relaxed);
            metrics::revoke_wait_exceeded();
            tracing::warn!(
                still_running = back.still_running,
                "kafka source: partitions revoked while handlers of theirs still ran \
                 (revoke_wait_ms ran out): the next owner may run the same keys meanwhile"
            );
        }
    }
}

#[cfg(test)]
#[path = "offsets_tests.rs"]
mod tests;
