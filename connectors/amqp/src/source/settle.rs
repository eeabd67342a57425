//! Settling deliveries: the synchronous [`AckSink`] the runtime calls, and the task that turns
//! its decisions into `basic.ack` / `basic.reject` / `basic.nack` frames.
//!
//! # Why every delivery is settled on its own
//!
//! A `multiple` ack up to a contiguous watermark (the ledger's
//! [`AckTracker`](triage::ledger::AckTracker)) sends fewer frames, but one slow message at
//! the bottom of the window then holds every later ack back; the broker counts them all
//! against the prefetch and stops delivering: head-of-line blocking of the whole consumer
//! by one message. RabbitMQ also refuses a `multiple` ack whose own tag was already settled
//! (`PRECONDITION_FAILED - unknown delivery tag`), so mixing individual and multiple acks is
//! fragile. Individual settlement has neither problem and costs one small frame per message,
//! exactly what a plain consumer pays; the frames are pipelined, not awaited one by one.
//!
//! # Exactly once, on the right channel
//!
//! Delivery tags are per channel, and a channel that closed has already handed its unacked
//! deliveries back to the queue: acking tag 7 of a dead channel on its successor would settle
//! a *different* message. So every channel gets an epoch; an [`AckRef`] carries it, and only
//! tags outstanding in the current epoch can be settled: a second settle of a tag, or a settle
//! from an older epoch, is ignored and counted. The set of outstanding tags is bounded by the
//! prefetch.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::future::join_all;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::Channel;
use tokio::sync::{mpsc, oneshot};
use triage::ledger::Disposition;
use triage::runtime::{AckRef, AckSink};

use crate::metrics::SourceMetrics;

/// What the settle task sends for one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// `basic.ack`: completed, deferred, expired, shed (and failed when a sink dead-lettered it).
    Ack,
    /// `basic.reject(requeue = false)`: to the queue's dead-letter exchange.
    Reject,
    /// `basic.nack(requeue = true)`: not processed, back to the queue.
    Requeue,
}

#[derive(Debug)]
pub(crate) enum Command {
    /// The channel of a new epoch; settles of older epochs are dropped from now on.
    Channel {
        epoch: u64,
        channel: Channel,
    },
    /// No channel for now (it was lost).
    Lost,
    Settle {
        epoch: u64,
        tag: u64,
        how: Settle,
    },
    /// Answers once every command sent before it has been written out.
    Flush(oneshot::Sender<()>),
}

#[derive(Debug, Default)]
struct Outstanding {
    /// Current epoch; 0 before the first channel and while disconnected.
    epoch: u64,
    stream: u64,
    tags: HashSet<u64>,
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
            state: Mutex::new(Outstanding::default()),
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
        *state = Outstanding {
            epoch,
            stream,
            tags: HashSet::new(),
        };
    }

    /// The channel is gone: every outstanding token is now stale (the broker requeued them).
    pub(crate) fn lose(&self) {
        let mut state = self.lock();
        let _ = self.tx.send(Command::Lost);
        state.epoch = 0;
        state.tags = HashSet::new();
    }

    /// Registers a delivery received on the channel of `epoch`; its token, or `None` when
    /// that channel is gone (the broker has requeued the delivery).
    pub(crate) fn track(&self, epoch: u64, tag: u64) -> Option<AckRef> {
        let mut state = self.lock();
        if epoch != state.epoch || epoch == 0 {
            return None;
        }
        state.tags.insert(tag);
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
        let mut state = self.lock();
        if token.epoch != state.epoch || token.stream != state.stream || state.epoch == 0 {
            self.metrics.stale_settles.incr();
            return false;
        }
        if !state.tags.remove(&token.position) {
            self.metrics.duplicate_settles.incr();
            return false;
        }
        let _ = self.tx.send(Command::Settle {
            epoch: token.epoch,
            tag: token.position,
            how,
        });
        true
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
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let mut frames = Vec::with_capacity(batch.len());
        let mut flushed = Vec::new();
        for command in batch.drain(..) {
            match command {
                Command::Channel { epoch, channel } => {
                    // Frames of the old channel go out first: they may still succeed.
                    send(&mut frames, &metrics).await;
                    current = Some((epoch, channel));
                }
                Command::Lost => {
                    send(&mut frames, &metrics).await;
                    current = None;
                }
                Command::Settle { epoch, tag, how } => match &current {
                    Some((e, channel)) if *e == epoch => {
                        frames.push(settle_frame(channel.clone(), tag, how));
                    }
                    // Its channel closed between the decision and now: the broker has
                    // requeued it already.
                    _ => metrics.stale_settles.incr(),
                },
                Command::Flush(done) => flushed.push(done),
            }
        }
        send(&mut frames, &metrics).await;
        for done in flushed {
            let _ = done.send(());
        }
    }
}

type Frame = futures_util::future::BoxFuture<'static, Result<Settle, lapin::Error>>;

fn settle_frame(channel: Channel, tag: u64, how: Settle) -> Frame {
    Box::pin(async move {
        match how {
            Settle::Ack => {
                channel
                    .basic_ack(tag, BasicAckOptions { multiple: false })
                    .await
            }
            Settle::Reject => {
                channel
                    .basic_reject(tag, BasicRejectOptions { requeue: false })
                    .await
            }
            Settle::Requeue => {
                channel
                    .basic_nack(
                        tag,
                        BasicNackOptions {
                            multiple: false,
                            requeue: true,
                        },
                    )
                    .await
            }
        }
        .map(|()| how)
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
