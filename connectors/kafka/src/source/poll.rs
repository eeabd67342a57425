//! The poll thread: the only place the consumer is polled.
//!
//! A dedicated thread polls the consumer all the time, whether or not the runtime pulls, so
//! the group protocol (heartbeats, rebalance callbacks, `max.poll.interval.ms`) is served
//! even while the source is paused: a paused source never leaves its group. Records go to the
//! runtime through a bounded channel, in batches: after a poll that returned a record, the
//! thread polls on without waiting while librdkafka has records ready, up to a batch (at most
//! [`MAX_BATCH`]), and hands the batch over at once. One hand-off then costs one channel
//! operation and at most one wake-up of the runtime's intake per batch rather than per record
//! (the wake-ups were the larger part of the hand-off's CPU), and the per-record counters and
//! the clock readings for deadlines are paid per batch. A batch never waits for records: it
//! goes as soon as librdkafka has none ready. Each record is still tracked as it is polled,
//! before the next poll, because a rebalance callback may run inside any poll (a record
//! tracked after a revocation and a new assignment of its partition would be tracked under
//! the new epoch, in front of the redelivered records).
//! When the runtime paused the source, or the channel has
//! stayed full for a second, the thread pauses the assignment (librdkafka then stops fetching
//! and drops what it prefetched, to re-fetch it on resume) and keeps polling for events only.
//! A channel full for less than that is the normal state of a busy worker: the thread just
//! retries the hand-off, since each pause/resume cycle costs a re-fetch. Memory is
//! therefore bounded by the channel (`max_prefetch_messages`, rounded up to whole batches),
//! the batch the source is handing out, and librdkafka's queue (`queued.max.messages.kbytes`),
//! however large the backlog.
//!
//! To avoid pausing and re-fetching for every record under sustained backpressure, a pause
//! caused by a full channel lasts until the channel is at least half empty.
//!
//! Besides pausing everything, the thread pauses the partitions of the topics whose tier the
//! runtime is shedding (`Source::pause_tiers`, a topic per tier): those stay paused while the
//! rest of the assignment is consumed, and are resumed when their tier leaves the set.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant as WallInstant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use triage::admission;
use triage::quanta::Clock;
use triage::runtime::{Ack, AckSink, Envelope};

use crate::metrics;
use crate::KafkaMessage;

use super::classify::{Anchor, Classifier, MessageMeta, UnclassifiedReason};
use super::client::ClientFactory;
use super::client::SharedClient;
use super::commit::Request;
use super::context::SourceContext;
use super::headers::read_headers;
use super::link::RuntimeLink;
use super::offsets::{LastStream, Offsets};
use super::stats::Stats;

/// How long one poll waits for a record while consuming.
const POLL_WAIT: Duration = Duration::from_millis(100);
/// How long one poll waits while paused: also how quickly a freed channel is noticed.
const PAUSED_POLL_WAIT: Duration = Duration::from_millis(20);
/// How long the hand-off channel may stay full before the assignment is paused. A full channel
/// is the normal state of a busy worker; pausing at once would make librdkafka drop its
/// prefetch and re-fetch on every resume (measured: about 300 ms per cycle, which held a
/// consumer to 1,500 records/s). Meanwhile the thread retries the hand-off every
/// `FULL_RETRY` without polling, so memory stays bounded by the channel and librdkafka's queue.
const PAUSE_AFTER: Duration = Duration::from_millis(1000);
/// How often a full channel is retried before the assignment is paused.
const FULL_RETRY: Duration = Duration::from_millis(1);
/// The most records handed over in one batch.
pub(crate) const MAX_BATCH: usize = 64;

/// An envelope with the revocation generation it was tracked under.
pub(crate) type Delivery = (u64, Envelope<KafkaMessage>);
/// Records handed over together, in offset order per partition.
pub(crate) type Batch = Vec<Delivery>;

/// The hand-off channel's capacity in batches and the batch size for a buffer of `capacity`
/// records: batches of at most [`MAX_BATCH`], and as many as it takes to hold `capacity`
/// records (at most `batches - 1` more, from rounding up).
pub(crate) fn handoff_shape(capacity: usize) -> (usize, usize) {
    let batches = capacity.div_ceil(MAX_BATCH).max(1);
    (batches, capacity.div_ceil(batches).max(1))
}

/// Flags the source handle sets for the poll thread.
#[derive(Debug, Default)]
pub(crate) struct Control {
    pub(crate) stop: AtomicBool,
    pub(crate) runtime_paused: AtomicBool,
    /// The set of paused topics (`Offsets::shed_topics`) changed: apply it.
    pub(crate) tiers_changed: AtomicBool,
    /// Records the poll thread consumed and could not hand over yet (for the lag).
    pub(crate) held: AtomicUsize,
    /// Records in the hand-off channel (for the lag): added before a batch is sent, taken
    /// off when the source receives it, so it never counts below the truth.
    pub(crate) queued: AtomicUsize,
}

pub(crate) struct PollLoop {
    pub(crate) consumer: Arc<BaseConsumer<SourceContext>>,
    /// The client the committer uses: replaced together with `consumer`.
    pub(crate) client: SharedClient,
    pub(crate) commits: std::sync::mpsc::Sender<Request>,
    pub(crate) factory: ClientFactory,
    pub(crate) offsets: Arc<Offsets>,
    pub(crate) acks: Arc<dyn AckSink>,
    /// The runtime the source is attached to, to hand back what a replaced client lost.
    pub(crate) link: Arc<RuntimeLink>,
    pub(crate) classifier: Classifier,
    pub(crate) ordering: triage::ordering::OrderingConfig,
    pub(crate) clock: Clock,
    pub(crate) control: Arc<Control>,
    pub(crate) tx: mpsc::Sender<Batch>,
    /// The hand-off channel's capacity, in batches.
    pub(crate) batches: usize,
    /// Records per batch, at most.
    pub(crate) batch: usize,
    /// The partition tracked last (see `Offsets::track_cached`).
    pub(crate) last_stream: LastStream,
    pub(crate) commit_timeout: Duration,
    pub(crate) done: oneshot::Sender<()>,
}

impl PollLoop {
    pub(crate) fn run(mut self) {
        let mut held: VecDeque<Batch> = VecDeque::new();
        let mut held_records = 0;
        let mut paused = false;
        let mut full_since: Option<WallInstant> = None;
        'poll: while !self.control.stop.load(Ordering::Acquire) {
            while let Some(batch) = held.pop_front() {
                let n = batch.len();
                self.control.queued.fetch_add(n, Ordering::Relaxed);
                match self.tx.try_send(batch) {
                    Ok(()) => held_records -= n,
                    Err(TrySendError::Full(batch)) => {
                        self.control.queued.fetch_sub(n, Ordering::Relaxed);
                        held.push_front(batch);
                        break;
                    }
                    // The source handle is gone: nobody will resolve anything more.
                    Err(TrySendError::Closed(_)) => break 'poll,
                }
            }
            self.control.held.store(held_records, Ordering::Relaxed);
            if self.control.tiers_changed.swap(false, Ordering::AcqRel) && !paused {
                self.apply_pauses(false);
            }
            let by_runtime = self.control.runtime_paused.load(Ordering::Acquire);
            if held.is_empty() {
                full_since = None;
            } else if !paused && !by_runtime {
                let now = WallInstant::now();
                let since = *full_since.get_or_insert(now);
                if now.duration_since(since) < PAUSE_AFTER {
                    std::thread::sleep(FULL_RETRY);
                    continue;
                }
            }
            let by_buffer = !held.is_empty() || (paused && self.tx.capacity() * 2 < self.batches);
            let want = by_runtime || by_buffer;
            if want != paused {
                self.set_paused(want, if by_runtime { "runtime" } else { "buffer" });
                paused = want;
            }
            let wait = if paused { PAUSED_POLL_WAIT } else { POLL_WAIT };
            match self.poll_batch(wait) {
                Polled::Batch(batch) => {
                    if !batch.is_empty() {
                        held_records += batch.len();
                        held.push_back(batch);
                    }
                }
                Polled::Fatal(reason) => {
                    // Every record of the old client is withdrawn (`replace_client`).
                    held.clear();
                    held_records = 0;
                    paused = false;
                    full_since = None;
                    if !self.replace_client(&reason) {
                        break 'poll;
                    }
                }
            }
        }
        // Records never handed out are dropped unresolved: their offsets stay uncommitted.
        drop(held);
        self.finish();
    }

    /// Polls once, waiting up to `wait`; after a record, polls on without waiting while
    /// librdkafka has records ready, up to a batch. Each record is tracked as it is polled.
    fn poll_batch(&mut self, wait: Duration) -> Polled {
        let mut batch = Batch::new();
        let mut tally = Tally::default();
        let mut anchor = None;
        // The cohorts' rotation period, read once per batch (a wall-clock read per keyed
        // record cost more than the rest of its cohort): it turns once an hour.
        let mut period = None;
        // Records borrow the client; `deliver` borrows the loop.
        let consumer = Arc::clone(&self.consumer);
        let mut next = consumer.poll(wait);
        loop {
            match next {
                // Nothing ready, or an event (a rebalance) was served.
                None => break,
                Some(Ok(msg)) => {
                    if let Some(delivery) = self.deliver(&msg, &mut tally, &mut anchor, &mut period)
                    {
                        if batch.capacity() == 0 {
                            batch.reserve_exact(self.batch);
                        }
                        batch.push(delivery);
                    }
                    if batch.len() >= self.batch {
                        break;
                    }
                }
                Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                    tally.count(&self.offsets.stats);
                    // The event carries only `_FATAL`; the client knows the cause.
                    let reason = consumer
                        .client()
                        .fatal_error()
                        .map_or_else(|| code.to_string(), |(c, text)| format!("{c:?}: {text}"));
                    return Polled::Fatal(reason);
                }
                // Transport errors repeat on every poll while a broker is down; librdkafka
                // reconnects by itself, so they are not worth more than a debug line.
                Some(Err(err)) => {
                    tracing::debug!(%err, "kafka source: poll error");
                    break;
                }
            }
            next = consumer.poll(Duration::ZERO);
        }
        tally.count(&self.offsets.stats);
        Polled::Batch(batch)
    }

    /// Replaces the client after a fatal error (see [`super::client`]): what was consumed and
    /// not settled is withdrawn (the held records were dropped by the caller; queued ones are
    /// stale), the old client is closed on a thread of its own, and a new one joins the group
    /// and resumes from the committed watermark. Returns `false` if the source stopped
    /// meanwhile.
    fn replace_client(&mut self, reason: &str) -> bool {
        let lost = self.offsets.lose_all();
        // The group has given them to someone else by now: released, not waited for.
        let back = self.link.hand_back(&lost, false);
        self.offsets.count_hand_back(back);
        self.offsets
            .stats
            .client_restarts
            .fetch_add(1, Ordering::Relaxed);
        metrics::client_restart("fatal");
        let mut wait = self.factory.next_backoff();
        tracing::error!(
            %reason,
            wait_ms = wait.as_millis() as u64,
            "kafka source: fatal consumer error; unsettled records withdrawn, replacing the client"
        );
        loop {
            let until = WallInstant::now() + wait;
            while WallInstant::now() < until {
                if self.control.stop.load(Ordering::Acquire) {
                    return false;
                }
                std::thread::sleep(PAUSED_POLL_WAIT);
            }
            match self.factory.create() {
                Ok(fresh) => {
                    let fresh = Arc::new(fresh);
                    *self.client.lock() = Arc::clone(&fresh);
                    let old = std::mem::replace(&mut self.consumer, fresh);
                    // Closing a fenced client may take a while; its callbacks are ignored. (The
                    // committer may still hold it for a moment: then it closes it the same way.)
                    super::client::close_elsewhere(old);
                    return true;
                }
                Err(err) => {
                    tracing::warn!(%err, "kafka source: could not create a new client");
                    wait = self.factory.next_backoff();
                }
            }
        }
    }

    fn set_paused(&self, pause: bool, cause: &'static str) {
        self.offsets.set_paused(pause);
        if pause {
            self.offsets.stats.pauses.fetch_add(1, Ordering::Relaxed);
            metrics::pause(cause);
        }
        self.apply_pauses(pause);
    }

    /// Pauses the whole assignment (`all`), or only the partitions of the shed tiers' topics
    /// and resumes the rest.
    fn apply_pauses(&self, all: bool) {
        let assignment = match self.consumer.assignment() {
            Ok(a) => a,
            Err(err) => {
                tracing::warn!(%err, "kafka source: could not read the assignment");
                return;
            }
        };
        if let Err(err) = self.offsets.apply_pauses(&*self.consumer, &assignment, all) {
            tracing::warn!(%err, all, "kafka source: could not pause or resume");
        }
    }

    /// Tracks, classifies and wraps one record; `None` if its partition is no longer assigned.
    /// Counts into `tally`; reads the clocks into `anchor` for the first record with a
    /// deadline, and the cohorts' rotation period into `period` for the first with a key.
    fn deliver(
        &mut self,
        msg: &BorrowedMessage<'_>,
        tally: &mut Tally,
        anchor: &mut Option<Anchor>,
        period: &mut Option<u64>,
    ) -> Option<Delivery> {
        let topic = msg.topic();
        let partition = msg.partition();
        let (token, generation, shared_topic) =
            self.offsets
                .track_cached(&mut self.last_stream, topic, partition, msg.offset())?;
        let headers = read_headers(msg);
        let key = msg.key().map(<[u8]>::to_vec);
        let timestamp_ms = msg.timestamp().to_millis();
        let classified = self.classifier.classify(&MessageMeta {
            topic,
            partition,
            offset: msg.offset(),
            key: key.as_deref(),
            headers: &headers,
            timestamp_ms,
        });
        for reason in [
            classified.tier_problem,
            classified.deadline_problem,
            classified.count_problem,
        ]
        .into_iter()
        .flatten()
        {
            tally.unclassified[reason.index()] += 1;
        }
        tally.consumed += 1;
        let ordering_key = self.ordering.key_of((topic, partition), key.as_deref());
        // The record key stands for the user: when its tier is admitted in part, the records
        // of the same keys are served (see `triage::admission::cohort`).
        let cohort = key.as_deref().map(|k| {
            let period = *period.get_or_insert_with(admission::rotation_period);
            admission::cohort(admission::user_hash(k), period)
        });
        let message = KafkaMessage {
            topic: shared_topic,
            partition,
            offset: msg.offset(),
            key,
            payload: msg.payload().map(<[u8]>::to_vec),
            headers,
            timestamp_ms,
        };
        let size = message.size_bytes();
        let deadline = classified.deadline_ms.map(|ms| {
            anchor
                .get_or_insert_with(|| Anchor::read(&self.clock))
                .deadline(ms)
        });
        let mut envelope = Envelope::new(
            message,
            classified.criticality,
            Ack::new(Arc::clone(&self.acks), token),
        )
        .with_attempt(classified.attempt)
        .with_deferrals(classified.deferrals)
        .with_deadline_opt(deadline)
        .with_size_bytes(size)
        .with_ordering_key_opt(ordering_key);
        envelope.cohort = cohort;
        Some((generation, envelope))
    }

    /// Final commit (bounded), then leave the group and close the client.
    fn finish(self) {
        // Stop fetching so that waiting for the commit consumes nothing.
        if let Ok(assignment) = self.consumer.assignment() {
            let _ = self.consumer.pause(&assignment);
        }
        // From here the revoke callback of the close does not commit again: this commit
        // already covers everything settled, and the broker may be unreachable.
        self.offsets.set_closing();
        let (reply, confirmed) = std::sync::mpsc::sync_channel(1);
        // The committer counts the commit's result whenever it comes; waiting is bounded.
        let done = match self.commits.send(Request::Final(reply)) {
            Ok(()) => confirmed.recv_timeout(self.commit_timeout).ok(),
            Err(_) => None,
        };
        match done {
            Some(true) => {}
            Some(false) => tracing::warn!("kafka source: final commit failed"),
            None => tracing::warn!(
                timeout_ms = self.commit_timeout.as_millis() as u64,
                "kafka source: final commit not confirmed in time"
            ),
        }
        self.consumer.unsubscribe();
        // Dropping the consumer leaves the group and destroys the client (once the committer
        // let go of it too); with the broker down this can take long, which the handle's
        // shutdown bounds by not waiting for it.
        drop(self.client);
        drop(self.consumer);
        let _ = self.done.send(());
    }
}

/// What one [`PollLoop::poll_batch`] gave.
enum Polled {
    /// The records polled (possibly none).
    Batch(Batch),
    /// The client raised a fatal error (the reason): it must be replaced.
    Fatal(String),
}

/// The counters of one batch, added to the source's stats and metrics at once.
#[derive(Default)]
struct Tally {
    consumed: u64,
    unclassified: [u64; UnclassifiedReason::ALL.len()],
}

impl Tally {
    fn count(&mut self, stats: &Stats) {
        if self.consumed > 0 {
            stats.consumed.fetch_add(self.consumed, Ordering::Relaxed);
        }
        for reason in UnclassifiedReason::ALL {
            let n = std::mem::take(&mut self.unclassified[reason.index()]);
            if n > 0 {
                stats.unclassified[reason.index()].fetch_add(n, Ordering::Relaxed);
                metrics::unclassified(reason.as_str(), n);
            }
        }
        self.consumed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handoff_holds_the_capacity_in_whole_batches() {
        for capacity in [1, 2, 63, 64, 65, 100, 1000, 1001, 4096, 1_000_000] {
            let (batches, batch) = handoff_shape(capacity);
            assert!(
                (1..=MAX_BATCH).contains(&batch),
                "{capacity}: batch {batch}"
            );
            assert!(
                batches * batch >= capacity,
                "{capacity}: {batches} x {batch}"
            );
            assert!(
                batches * batch < capacity + batches,
                "{capacity}: {batches} x {batch}"
            );
        }
        assert_eq!(handoff_shape(1000), (16, 63));
        assert_eq!(handoff_shape(1), (1, 1));
    }
}
