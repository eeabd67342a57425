//! Settling deliveries: the synchronous [`AckSink`] the runtime calls, and the task that turns
//! its decisions into `basic.ack` / `basic.reject` / `basic.nack` frames.
//!
//! # Acks are coalesced, never waited for
//!
//! Waiting for a contiguous watermark before a `multiple` ack (the ledger's
//! [`AckTracker`](triage::ledger::AckTracker)) would let one slow message at the bottom of the
//! window hold every later ack back; the broker counts them all against the prefetch and stops
//! delivering: head-of-line blocking of the whole consumer by one message. So every settle is
//! written as soon as it is decided, as a plain consumer's would be, and only *coalesced* when
//! that is free: within one batch of decisions, an ack whose tag and every tag below it were
//! already decided (settled, or queued to be, in this batch or before it) replaces the
//! batch's earlier individual acks of tags below it with one `multiple` ack. Under load the
//! runtime settles nearly in delivery order (shed and expired messages at once), so one frame
//! settles up to a batch; each `basic.ack` costs the broker's channel and queue processes a
//! message of their own, and on a persistent queue an index write. A tag counts as decided
//! only once the source has tracked it *and* settled it; deliveries still in lapin's buffer
//! (another consumer of the channel, in the per-tier layout) are below no coalesced ack,
//! because every tag under the tracked contiguous prefix is required to have been seen.
//! Rejects and requeues keep their own frames, written before any `multiple` ack that follows
//! them in the batch. RabbitMQ refuses a `multiple` ack whose own tag was already settled
//! (`PRECONDITION_FAILED - unknown delivery tag`): a coalesced ack's tag is always one of the
//! batch's own acks, sent by nothing else.
//!
//! # Exactly once, on the right channel
//!
//! Delivery tags are per channel, and a channel that closed has already handed its unacked
//! deliveries back to the queue: acking tag 7 of a dead channel on its successor would settle
//! a *different* message. So every channel gets an epoch; an [`AckRef`] carries it, and only
//! tags outstanding in the current epoch can be settled: a second settle of a tag, or a settle
//! from an older epoch, is ignored and counted. The set of outstanding tags is bounded by the
//! prefetch.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::future::join_all;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::Channel;
use tokio::sync::{mpsc, oneshot};
use triage::ledger::Disposition;
use triage::runtime::{AckRef, AckSink};

use crate::metrics::SourceMetrics;

pub(crate) use super::coalesce::Settle;
use super::coalesce::{Coalescer, Out};

#[derive(Debug)]
pub(crate) enum Command {
    /// The channel of a new epoch; settles of older epochs are dropped from now on.
    Channel { epoch: u64, channel: Channel },
    /// No channel for now (it was lost).
    Lost,
    Settle {
        epoch: u64,
        tag: u64,
        how: Settle,
        /// Every tag of the epoch below this was tracked and settled when this was decided
        /// (the settle task may coalesce an ack of a tag below it with the acks before it).
        floor: u64,
    },
    /// Answers once every command sent before it has been written out.
    Flush(oneshot::Sender<()>),
}

#[derive(Debug)]
struct Outstanding {
    /// Current epoch; 0 before the first channel and while disconnected.
    epoch: u64,
    stream: u64,
    /// Tracked and not settled yet (bounded by the prefetch).
    tags: BTreeSet<u64>,
    /// Every tag below this was tracked (delivery tags start at 1 on each channel and count up
    /// by one per delivery); tags tracked above a gap wait in `ahead`, at most `MAX_AHEAD`.
    tracked_below: u64,
    ahead: BTreeSet<u64>,
    /// `ahead` overflowed: a tag stayed untracked for long (a paused tier's deliveries wait in
    /// the inbox while the others flow). No ack is coalesced for the rest of the epoch, rather
    /// than keep every later tag.
    gave_up: bool,
}

/// Tags tracked above an untracked one that [`Outstanding`] remembers before it stops
/// coalescing for the epoch.
const MAX_AHEAD: usize = 65_536;

impl Outstanding {
    fn new(epoch: u64, stream: u64) -> Self {
        Outstanding {
            epoch,
            stream,
            tags: BTreeSet::new(),
            tracked_below: 1,
            ahead: BTreeSet::new(),
            gave_up: false,
        }
    }

    fn track(&mut self, tag: u64) {
        self.tags.insert(tag);
        if self.gave_up {
            return;
        }
        if tag == self.tracked_below {
            self.tracked_below += 1;
            while self.ahead.remove(&self.tracked_below) {
                self.tracked_below += 1;
            }
        } else if tag > self.tracked_below {
            self.ahead.insert(tag);
            if self.ahead.len() > MAX_AHEAD {
                self.gave_up = true;
                self.ahead = BTreeSet::new();
            }
        }
    }

    /// Settles `tag` once: the floor after it (see [`floor`](Self::floor)), or `None` if it
    /// is not outstanding (settled already, or never tracked).
    fn settle(&mut self, tag: u64) -> Option<u64> {
        self.tags.remove(&tag).then(|| self.floor())
    }

    /// Every tag below this is tracked and settled.
    fn floor(&self) -> u64 {
        if self.gave_up {
            return 0;
        }
        self.tags
            .first()
            .map_or(self.tracked_below, |&t| t.min(self.tracked_below))
    }
}

/// The source's [`AckSink`]: decides synchronously, sends asynchronously.
#[derive(Debug)]
pub(crate) struct Settler {
    state: Mutex<Outstanding>,
    tx: mpsc::UnboundedSender<Command>,
    metrics: Arc<SourceMetrics>,
    dead_letter_via_sink: bool,
}

impl Settler {
    /// The settler and its task, spawned on the current tokio runtime.
    pub(crate) fn spawn(metrics: Arc<SourceMetrics>, dead_letter_via_sink: bool) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, Arc::clone(&metrics)));
        Arc::new(Settler {
            state: Mutex::new(Outstanding::new(0, 0)),
            tx,
            metrics,
            dead_letter_via_sink,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Outstanding> {
        // A panic while holding the lock cannot leave the set inconsistent (each step is a
        // single insert or remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a new epoch on `channel` (id `stream`): earlier tokens become stale.
    pub(crate) fn begin(&self, epoch: u64, stream: u64, channel: Channel) {
        let mut state = self.lock();
        // Sent under the lock, so no settle of `epoch` can be queued before its channel.
        let _ = self.tx.send(Command::Channel { epoch, channel });
        *state = Outstanding::new(epoch, stream);
    }

    /// The channel is gone: every outstanding token is now stale (the broker requeued them).
    pub(crate) fn lose(&self) {
        let mut state = self.lock();
        let _ = self.tx.send(Command::Lost);
        let stream = state.stream;
        *state = Outstanding::new(0, stream);
    }

    /// Registers a delivery received on the channel of `epoch`; its token, or `None` when
    /// that channel is gone (the broker has requeued the delivery).
    pub(crate) fn track(&self, epoch: u64, tag: u64) -> Option<AckRef> {
        let mut state = self.lock();
        if epoch != state.epoch || epoch == 0 {
            return None;
        }
        state.track(tag);
        Some(AckRef {
            stream: state.stream,
            position: tag,
            epoch,
        })
    }

    /// The current epoch; 0 while disconnected.
    pub(crate) fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Deliveries handed out and not settled yet, in the current epoch.
    pub(crate) fn outstanding(&self) -> usize {
        self.lock().tags.len()
    }

    /// Settles `token` with `how`, once; false if it was stale or already settled.
    pub(crate) fn settle(&self, token: AckRef, how: Settle) -> bool {
        self.settle_all(&[token], how) == 1
    }

    /// Settles every token with `how` under one lock (a worker's batch); returns how many were
    /// settled (the others were stale or settled already, and are counted as such).
    pub(crate) fn settle_all(&self, tokens: &[AckRef], how: Settle) -> u64 {
        let mut settled = 0;
        let mut state = self.lock();
        for token in tokens {
            if token.epoch != state.epoch || token.stream != state.stream || state.epoch == 0 {
                self.metrics.stale_settles.incr();
                continue;
            }
            let Some(floor) = state.settle(token.position) else {
                self.metrics.duplicate_settles.incr();
                continue;
            };
            // Sent under the lock: every settle of a tag below `floor` is queued before this
            // one.
            let _ = self.tx.send(Command::Settle {
                epoch: token.epoch,
                tag: token.position,
                how,
                floor,
            });
            settled += 1;
        }
        settled
    }

    /// Waits until every settle decided so far has been written to the socket (or failed).
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

impl AckSink for Settler {
    fn resolve(&self, token: AckRef, disposition: Disposition) {
        let reject = disposition == Disposition::Failed && !self.dead_letter_via_sink;
        let how = if reject { Settle::Reject } else { Settle::Ack };
        if self.settle(token, how) {
            if reject {
                self.metrics.rejected.incr();
            } else {
                self.metrics.acked(disposition, 1);
            }
        }
    }

    fn resolve_all(&self, tokens: &[AckRef], disposition: Disposition) {
        let reject = disposition == Disposition::Failed && !self.dead_letter_via_sink;
        let how = if reject { Settle::Reject } else { Settle::Ack };
        let n = self.settle_all(tokens, how);
        if n > 0 {
            if reject {
                self.metrics.rejected.add(n);
            } else {
                self.metrics.acked(disposition, n);
            }
        }
    }

    fn release(&self, token: AckRef) {
        // Requeue at once rather than wait for the channel to close: at shutdown another
        // consumer gets it straight away, and in flight it is not stuck behind this one.
        if self.settle(token, Settle::Requeue) {
            self.metrics.requeued.incr();
        }
    }
}

/// Largest batch of commands turned into frames at once.
const BATCH: usize = 512;

async fn run(mut rx: mpsc::UnboundedReceiver<Command>, metrics: Arc<SourceMetrics>) {
    let mut current: Option<(u64, Channel)> = None;
    let mut batch = Vec::with_capacity(BATCH);
    let mut plan = Coalescer::default();
    let mut outs = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let mut frames = Vec::with_capacity(batch.len());
        let mut flushed = Vec::new();
        for command in batch.drain(..) {
            match command {
                Command::Channel { epoch, channel } => {
                    // Frames of the old channel go out first: they may still succeed.
                    flush_plan(&mut plan, &mut outs, &current, &mut frames);
                    send(&mut frames, &metrics).await;
                    current = Some((epoch, channel));
                }
                Command::Lost => {
                    flush_plan(&mut plan, &mut outs, &current, &mut frames);
                    send(&mut frames, &metrics).await;
                    current = None;
                }
                Command::Settle {
                    epoch,
                    tag,
                    how,
                    floor,
                } => match &current {
                    Some((e, _)) if *e == epoch => plan.settle(tag, how, floor, &mut outs),
                    // Its channel closed between the decision and now: the broker has
                    // requeued it already.
                    _ => metrics.stale_settles.incr(),
                },
                Command::Flush(done) => flushed.push(done),
            }
        }
        flush_plan(&mut plan, &mut outs, &current, &mut frames);
        send(&mut frames, &metrics).await;
        for done in flushed {
            let _ = done.send(());
        }
    }
}

/// Ends the batch's plan and turns it into frames on `current`'s channel.
fn flush_plan(
    plan: &mut Coalescer,
    outs: &mut Vec<Out>,
    current: &Option<(u64, Channel)>,
    frames: &mut Vec<Frame>,
) {
    plan.finish(outs);
    if let Some((_, channel)) = current {
        frames.extend(outs.drain(..).map(|out| settle_frame(channel.clone(), out)));
    }
    outs.clear();
}

type Frame = futures_util::future::BoxFuture<'static, Result<Settle, lapin::Error>>;

fn settle_frame(channel: Channel, out: Out) -> Frame {
    Box::pin(async move {
        match out {
            Out::Ack { tag, multiple } => channel
                .basic_ack(tag, BasicAckOptions { multiple })
                .await
                .map(|()| Settle::Ack),
            Out::Reject(tag) => channel
                .basic_reject(tag, BasicRejectOptions { requeue: false })
                .await
                .map(|()| Settle::Reject),
            Out::Requeue(tag) => channel
                .basic_nack(
                    tag,
                    BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    },
                )
                .await
                .map(|()| Settle::Requeue),
        }
    })
}

/// Sends the frames, pipelined: each future queues its frame on first poll, in order.
async fn send(frames: &mut Vec<Frame>, metrics: &SourceMetrics) {
    if frames.is_empty() {
        return;
    }
    for result in join_all(frames.drain(..)).await {
        match result {
            Ok(Settle::Ack) => metrics.ack_frames.incr(),
            Ok(_) => {}
            // The channel is closing; the broker requeues what was not settled.
            Err(_) => metrics.settle_errors.incr(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// The broker's side of one channel: unsettled tags, and how each was settled. Panics
    /// where RabbitMQ would close the channel (`unknown delivery tag`).
    #[derive(Default)]
    struct Broker {
        unacked: BTreeSet<u64>,
        settled: BTreeMap<u64, Settle>,
    }

    impl Broker {
        fn apply(&mut self, out: Out) {
            let (tag, how) = match out {
                Out::Ack { tag, .. } => (tag, Settle::Ack),
                Out::Reject(tag) => (tag, Settle::Reject),
                Out::Requeue(tag) => (tag, Settle::Requeue),
            };
            assert!(self.unacked.remove(&tag), "unknown delivery tag {tag}");
            self.settled.insert(tag, how);
            if let Out::Ack { multiple: true, .. } = out {
                let below: Vec<u64> = self.unacked.range(..tag).copied().collect();
                for t in below {
                    self.unacked.remove(&t);
                    self.settled.insert(t, Settle::Ack);
                }
            }
        }
    }

    fn how(n: u8) -> Settle {
        match n % 8 {
            0 => Settle::Reject,
            1 => Settle::Requeue,
            _ => Settle::Ack,
        }
    }

    proptest! {
        /// Whatever the order deliveries are tracked in (several consumers share a channel's
        /// tags), the order they are settled in and where batches are cut: every tag ends
        /// settled the way it was decided, none settled that was not decided, no frame names a
        /// tag the broker no longer holds.
        #[test]
        fn coalesced_frames_settle_each_tag_as_decided(
            n in 1u64..60,
            track_keys in proptest::collection::vec(any::<u16>(), 60),
            steps in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 0..200),
        ) {
            let mut broker = Broker { unacked: (1..=n).collect(), ..Broker::default() };
            let mut order: Vec<u64> = (1..=n).collect();
            order.sort_by_key(|&t| track_keys[(t - 1) as usize]);
            let mut untracked = order.into_iter();
            let mut state = Outstanding::new(1, 1);
            let mut decided = BTreeMap::new();
            let mut plan = Coalescer::default();
            let mut outs = Vec::new();
            for (pick, kind, cut) in steps {
                // Track one more delivery, or settle one tracked at random.
                if pick % 3 == 0 || state.tags.is_empty() {
                    if let Some(t) = untracked.next() {
                        state.track(t);
                    }
                } else {
                    let tags: Vec<u64> = state.tags.iter().copied().collect();
                    let tag = tags[usize::from(pick) % tags.len()];
                    let floor = state.settle(tag).expect("tracked");
                    decided.insert(tag, how(kind));
                    plan.settle(tag, how(kind), floor, &mut outs);
                }
                if cut {
                    plan.finish(&mut outs);
                    for out in outs.drain(..) {
                        broker.apply(out);
                    }
                }
            }
            plan.finish(&mut outs);
            for out in outs.drain(..) {
                broker.apply(out);
            }
            prop_assert_eq!(&broker.settled, &decided);
        }
    }

    /// Acks decided in delivery order, in one batch, go out as one `multiple` frame; a reject
    /// among them keeps its own frame, written first.
    #[test]
    fn in_order_acks_become_one_multiple_ack() {
        let mut state = Outstanding::new(1, 1);
        for t in 1..=5 {
            state.track(t);
        }
        let mut plan = Coalescer::default();
        let mut outs = Vec::new();
        for (t, how) in [
            (1, Settle::Ack),
            (2, Settle::Ack),
            (3, Settle::Reject),
            (4, Settle::Ack),
        ] {
            let floor = state.settle(t).unwrap();
            plan.settle(t, how, floor, &mut outs);
        }
        plan.finish(&mut outs);
        assert_eq!(
            outs,
            [
                Out::Reject(3),
                Out::Ack {
                    tag: 4,
                    multiple: true
                }
            ]
        );
    }

    /// A tag left untracked for long (a paused tier's delivery) does not make the set of tags
    /// tracked above it grow without bound: past `MAX_AHEAD` coalescing stops for the epoch,
    /// and nothing is coalesced over the gap.
    #[test]
    fn a_long_gap_stops_coalescing_instead_of_growing() {
        let mut state = Outstanding::new(1, 1);
        for t in 2..=(MAX_AHEAD as u64 + 2) {
            state.track(t);
            state.settle(t).unwrap();
        }
        assert!(state.gave_up);
        assert!(state.ahead.is_empty());
        state.track(1);
        assert_eq!(state.settle(1), Some(0));
    }

    /// Tag 2 not tracked yet (in another consumer's buffer): acks of 1 and 3 stay single, so
    /// that no `multiple` ack of 3 settles 2.
    #[test]
    fn an_untracked_tag_below_is_never_covered() {
        let mut state = Outstanding::new(1, 1);
        state.track(1);
        state.track(3);
        let mut plan = Coalescer::default();
        let mut outs = Vec::new();
        for t in [1, 3] {
            let floor = state.settle(t).unwrap();
            plan.settle(t, Settle::Ack, floor, &mut outs);
        }
        plan.finish(&mut outs);
        assert_eq!(
            outs,
            [
                Out::Ack {
                    tag: 1,
                    multiple: false
                },
                Out::Ack {
                    tag: 3,
                    multiple: false
                }
            ]
        );
    }
}
