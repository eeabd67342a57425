//! [`AmqpSource`]: a RabbitMQ consumer as a triage [`Source`].
//!
//! # Flow control
//!
//! `basic.qos` sets a per-consumer prefetch (validated to be at most the runtime queue's
//! capacity): the broker sends at most that many unacknowledged deliveries, and keeps the
//! rest, a backlog of any size, on its side, where RabbitMQ's own priority queues still order
//! it. The link task moves what the broker pushed into a buffer per queue, but since nothing
//! is acked before the runtime resolves it, each buffer holds at most the prefetch (per
//! consumed queue). [`pause`](Source::pause) stops taking from it; with nothing acked, the
//! broker stops at the prefetch.
//!
//! # Settling
//!
//! Each delivery is settled once, after its disposition, as soon as it is decided (see the
//! `settle` module: runs of acks already decided in delivery order go out as one `multiple`
//! ack, never waited for): `basic.ack` for `Completed`, `Deferred`, `Expired` and `Shed`;
//! `basic.reject(requeue = false)` for `Failed` (to the queue's dead-letter exchange) unless
//! [`dead_letter_via_sink`](AmqpSourceConfig::dead_letter_via_sink) says the runtime already
//! published it to a dead-letter sink, then `basic.ack`; `basic.nack(requeue = true)` when
//! the runtime releases it unprocessed. `Ack::resolve` is synchronous; the frames are sent by
//! a task.
//!
//! # Connection loss
//!
//! The connection, its channel and consumers belong to a task of their own (the `link`
//! module), which moves deliveries into a buffer that [`next`](Source::next) only reads, and
//! reopens a lost connection by itself: one attempt at a time, each counted
//! (`connect_attempts`), with exponential backoff and full jitter between failures. A dropped
//! `next` call never abandons a connection, and a paused source still notices a closed
//! channel. Deliveries of the lost channel are requeued by the broker and come back with the
//! `redelivered` flag; their old handles are stale and settle nothing.
//!
//! # Lag and a queue per tier
//!
//! [`lag`](Source::lag) is the consumed queues' ready-message count, measured every
//! `lag_refresh_ms` by passive declares on a channel of their own. With
//! [`tier_queues`](AmqpSourceConfig::tier_queues), [`pause_tiers`](Source::pause_tiers) stops
//! reading the queues of the tiers being shed.

mod classify;
mod classify_config;
mod coalesce;
mod config;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod inbox;
mod link;
mod queue_config;
mod settle;

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use triage::quanta::Clock;
use triage::queue::TierMask;
use triage::runtime::{Ack, AckSink, Envelope, Source};
use triage::Criticality;

pub use classify_config::{ClassifyConfig, DeadlineConfig, PriorityMapping};
pub use config::AmqpSourceConfig;
pub use queue_config::{QueueDeclareConfig, TierQueue};

use self::classify::Classifier;
use self::inbox::{Inbox, Received};
use self::link::{Link, Stop};
use self::settle::{Settle, Settler};
use crate::metrics::SourceMetrics;
use crate::{AmqpError, AmqpMessage, AmqpSourceStats};

/// A RabbitMQ queue consumer feeding the triage runtime.
///
/// Classifies each delivery from its properties and headers (never the body), hands it out as
/// an [`Envelope`] whose [`Ack`] settles the delivery exactly once, keeps the prefetch
/// bounded, and reconnects by itself.
///
/// # Examples
///
/// ```no_run
/// use std::num::NonZeroUsize;
/// use triage::ledger::Disposition;
/// use triage::runtime::Source;
/// use triage_amqp::{AmqpSource, AmqpSourceConfig};
///
/// # #[allow(dead_code)]
/// # async fn run() -> Result<(), triage_amqp::AmqpError> {
/// let config = AmqpSourceConfig::new("amqp://127.0.0.1:5672/%2f", "orders");
/// let mut source = AmqpSource::connect(config, NonZeroUsize::new(1_000).unwrap()).await?;
/// while let Some(envelope) = source.next().await {
///     println!("{:?}: {} bytes", envelope.criticality, envelope.payload.body().len());
///     envelope.ack.resolve(Disposition::Completed);
/// }
/// source.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct AmqpSource {
    config: Arc<AmqpSourceConfig>,
    /// Per consumed queue, in read order: its name and classification rules.
    consumed: Vec<ConsumedQueue>,
    clock: Clock,
    settler: Arc<Settler>,
    metrics: Arc<SourceMetrics>,
    inbox: Arc<Inbox>,
    stop: watch::Sender<Stop>,
    link: Option<JoinHandle<()>>,
    paused: bool,
    closed: bool,
}

/// One consumed queue.
struct ConsumedQueue {
    queue: Arc<str>,
    tier: Option<Criticality>,
    /// Whether a rejected delivery of this queue reaches a dead-letter exchange.
    can_reject: bool,
    classifier: Classifier,
}

impl std::fmt::Debug for AmqpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSource")
            .field(
                "queues",
                &self.consumed.iter().map(|c| &*c.queue).collect::<Vec<_>>(),
            )
            .field("epoch", &self.epoch())
            .field("paused", &self.paused)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl AmqpSource {
    /// Validates `config` against the runtime queue's capacity (in envelopes), connects,
    /// declares the queues if configured, sets the prefetch and starts consuming.
    ///
    /// Must be called within a tokio runtime: the link and settle tasks and lapin's I/O run
    /// on it.
    ///
    /// # Errors
    ///
    /// [`AmqpError::Config`] when a field is out of range (the prefetch above
    /// `queue_capacity`), [`AmqpError::Connect`] when the broker cannot be reached,
    /// [`AmqpError::Setup`] when declaring, `basic.qos` or `basic.consume` fails. After a
    /// successful start, connection loss is retried, not reported.
    pub async fn connect(
        config: AmqpSourceConfig,
        queue_capacity: NonZeroUsize,
    ) -> Result<Self, AmqpError> {
        config.validate(queue_capacity.get())?;
        let config = Arc::new(config);
        let consumed: Vec<ConsumedQueue> = config
            .consumed_queues()
            .into_iter()
            .map(|(queue, tier)| ConsumedQueue {
                classifier: Classifier::new(
                    config.classify.clone(),
                    config.deadline.clone(),
                    &queue,
                    tier,
                ),
                can_reject: config.dead_letter(&queue).can_reject(),
                queue: Arc::from(queue),
                tier,
            })
            .collect();
        let metrics = SourceMetrics::new(&consumed[0].queue);
        let settler = Settler::spawn(Arc::clone(&metrics), config.dead_letter_via_sink);
        let inbox = Arc::new(Inbox::new(consumed.len()));
        let mut link = Link {
            config: Arc::clone(&config),
            queues: consumed.iter().map(|c| Arc::clone(&c.queue)).collect(),
            settler: Arc::clone(&settler),
            metrics: Arc::clone(&metrics),
            inbox: Arc::clone(&inbox),
            epoch: 0,
        };
        let live = match link.open().await {
            Ok(live) => live,
            Err(e) => {
                metrics.connect_failures.incr();
                return Err(e);
            }
        };
        let (stop, stop_rx) = watch::channel(Stop::Run);
        let task = tokio::spawn(link.run(live, stop_rx));
        Ok(AmqpSource {
            config,
            consumed,
            clock: Clock::new(),
            settler,
            metrics,
            inbox,
            stop,
            link: Some(task),
            paused: false,
            closed: false,
        })
    }

    /// [`connect`](Self::connect), after checking that every delivery the source accepts can
    /// be re-published through each of `sinks` (the runtime's defer and dead-letter sinks):
    /// see [`AmqpSourceConfig::validate_republish`].
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect), and [`AmqpError::Config`] naming `max_payload_bytes`
    /// and the sink's `max_message_bytes` when they disagree (before connecting).
    pub async fn connect_republishing(
        config: AmqpSourceConfig,
        queue_capacity: NonZeroUsize,
        sinks: &[&crate::AmqpDeferSink],
    ) -> Result<Self, AmqpError> {
        for sink in sinks {
            config.validate_republish(sink.config())?;
        }
        Self::connect(config, queue_capacity).await
    }

    /// Reads deadlines against `clock` instead of the real one; use the runtime's clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The (first) queue consumed: `queue`, or the highest tier queue without one.
    pub fn queue(&self) -> &str {
        &self.consumed[0].queue
    }

    /// Counters since the source was created (see the [`metrics`](crate::metrics) table).
    pub fn stats(&self) -> AmqpSourceStats {
        self.metrics.snapshot()
    }

    /// A handle that reads the same counters as [`stats`](Self::stats), for when the source
    /// itself has been moved into a runtime.
    pub fn stats_handle(&self) -> AmqpStatsHandle {
        AmqpStatsHandle(Arc::clone(&self.metrics))
    }

    /// Deliveries handed out on the current channel and not settled yet.
    pub fn outstanding(&self) -> usize {
        self.settler.outstanding()
    }

    /// The current channel's epoch: 1 for the first channel, one more per reconnection, 0
    /// while disconnected.
    pub fn epoch(&self) -> u64 {
        self.settler.epoch()
    }

    /// The sink behind every delivery's [`Ack`], to rebuild a handle from an
    /// [`AckRef`](triage::runtime::AckRef) (replaying a settlement is ignored and counted in
    /// `duplicate_settles`, one from an older channel in `stale_settles`).
    pub fn ack_sink(&self) -> Arc<dyn AckSink> {
        Arc::clone(&self.settler) as Arc<dyn AckSink>
    }

    /// Whether [`pause`](Source::pause) is in force.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Turns a delivery into an envelope, or settles it at once when it is unacceptable;
    /// `None` also for a delivery of a channel that is gone (the broker requeued it).
    fn envelope(&mut self, received: Received) -> Option<Envelope<AmqpMessage>> {
        let Received {
            queue,
            epoch,
            at,
            delivery,
        } = received;
        let Some(token) = self.settler.track(epoch, delivery.delivery_tag) else {
            self.metrics.dropped_buffered.incr();
            return None;
        };
        self.metrics.deliveries.incr();
        if delivery.redelivered {
            self.metrics.redelivered.incr();
        }
        let size = delivery.data.len();
        let consumed = &self.consumed[queue];
        if size > self.config.max_payload_bytes {
            self.metrics.oversize.incr();
            if consumed.can_reject {
                self.settler.settle(token, Settle::Reject);
                return None;
            }
            // No dead-letter exchange: a reject would discard it. The runtime's dead-letter
            // sink (dead_letter_via_sink) keeps it if the handler fails it.
        }
        let now_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let class = consumed
            .classifier
            .classify(&delivery.properties, now_unix_ms);
        if let Some(reason) = class.unclassified {
            self.metrics.unclassified(reason);
        }
        let deadline = class
            .deadline_unix_ms
            .map(|at| classify::deadline_at(self.clock.now(), now_unix_ms, at));
        let ack = Ack::new(Arc::clone(&self.settler) as Arc<dyn AckSink>, token);
        let message = AmqpMessage::from_delivery(delivery, Arc::clone(&consumed.queue));
        Some(
            Envelope::new(message, class.criticality, ack)
                .with_attempt(class.attempt)
                .with_deferrals(class.deferrals)
                .with_deadline_opt(deadline)
                .with_size_bytes(size)
                .with_waited(at.elapsed()),
        )
    }

    async fn next_envelope(&mut self) -> Option<Envelope<AmqpMessage>> {
        if self.paused {
            // Cancel safe: the runtime drops this future and calls `resume` first.
            std::future::pending::<()>().await;
        }
        loop {
            if self.closed {
                return None;
            }
            // No await between taking a delivery and returning it: cancel safe.
            if let Some(received) = self.inbox.pop() {
                if let Some(envelope) = self.envelope(received) {
                    return Some(envelope);
                }
                continue;
            }
            if self.inbox.is_finished() {
                return None;
            }
            self.inbox.wait().await;
        }
    }

    async fn close(&mut self) {
        self.closed = true;
        let _ = self.stop.send(Stop::Shutdown);
        let timeout = Duration::from_millis(self.config.shutdown_timeout_ms);
        if let Some(mut task) = self.link.take() {
            if tokio::time::timeout(timeout, &mut task).await.is_err() {
                tracing::warn!(queue = %self.queue(), timeout_ms = timeout.as_millis() as u64, "amqp consumer shutdown timed out");
                // Dropping the connection requeues whatever was not settled.
                task.abort();
            }
        }
        self.settler.lose();
    }
}

/// Reads an [`AmqpSource`]'s counters after the source was moved (into a runtime).
#[derive(Clone, Debug)]
pub struct AmqpStatsHandle(Arc<SourceMetrics>);

impl AmqpStatsHandle {
    /// The counters now, as [`AmqpSource::stats`] returns them.
    pub fn stats(&self) -> AmqpSourceStats {
        self.0.snapshot()
    }
}

impl Source for AmqpSource {
    type Payload = AmqpMessage;

    /// The next classified delivery; `None` after [`shutdown`](Source::shutdown). While
    /// [paused](Source::pause) it waits without pulling. Reconnecting is the link task's
    /// business: this only waits for what it receives.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a delivery is only taken from the buffer when it is returned, and a
    /// dropped call leaves no work behind (the connection belongs to the link task).
    fn next(&mut self) -> impl Future<Output = Option<Envelope<AmqpMessage>>> + Send {
        self.next_envelope()
    }

    fn pause(&mut self) {
        self.paused = true;
    }

    fn resume(&mut self) {
        self.paused = false;
    }

    /// The ready messages of the consumed queues at the last measurement (every
    /// `lag_refresh_ms`); `None` before the first one and while disconnected.
    fn lag(&self) -> Option<u64> {
        self.inbox.lag()
    }

    /// Stops reading the [`tier_queues`](AmqpSourceConfig::tier_queues) of the tiers in
    /// `tiers`, resumes the others. The mixed `queue` is always read.
    fn pause_tiers(&mut self, tiers: TierMask) {
        let paused: Vec<bool> = self
            .consumed
            .iter()
            .map(|c| c.tier.is_some_and(|t| tiers.contains(t)))
            .collect();
        self.inbox.set_paused(|queue| paused[queue]);
    }

    /// The consumer timeout the broker applies ([`AmqpSourceConfig::consumer_timeout`]): the
    /// runtime hands back every delivery that waits a share of it without reaching a handler.
    fn patience(&self) -> Option<Duration> {
        self.config.consumer_timeout()
    }

    /// Releases (`basic.nack` with `requeue`) the deliveries buffered `waited` or longer ago
    /// and not handed out: those of a paused source, or of a tier queue not read while its
    /// tier is shed. The broker delivers them again, with a timeout of their own.
    fn release_waiting(&mut self, waited: Duration) -> usize {
        let mut released = 0;
        for received in self.inbox.take_waited(waited) {
            let tag = received.delivery.delivery_tag;
            match self.settler.track(received.epoch, tag) {
                Some(token) if self.settler.settle(token, Settle::Requeue) => {
                    self.metrics.requeued.incr();
                    self.metrics.handed_back.incr();
                    released += 1;
                }
                // Its channel is gone: the broker has requeued it already.
                _ => self.metrics.dropped_buffered.incr(),
            }
        }
        released
    }

    /// `dead_letter_via_sink` when it is set: `Failed` deliveries are then acknowledged, so
    /// the runtime must keep their copy.
    fn needs_dead_letter_sink(&self) -> Option<&'static str> {
        self.config
            .dead_letter_via_sink
            .then_some("dead_letter_via_sink")
    }

    /// Cancels the consumers, sends every settlement already resolved, then closes the
    /// channel and the connection; bounded by `shutdown_timeout_ms` even with the broker
    /// down. Deliveries not settled by then are redelivered by the broker.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send {
        self.close()
    }
}
