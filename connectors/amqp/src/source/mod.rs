//! [`AmqpSource`]: a RabbitMQ consumer as a triage [`Source`].
//!
//! # Flow control
//!
//! `basic.qos` sets a per-consumer prefetch (validated to be at most the runtime queue's
//! capacity): the broker sends at most that many unacknowledged deliveries, and keeps the
//! rest, a backlog of any size, on its side, where RabbitMQ's own priority queues still order
//! it. lapin buffers what the broker pushed in an unbounded channel, but since nothing is
//! acked before the runtime resolves it, that buffer never holds more than the prefetch.
//! [`pause`](Source::pause) stops pulling from it; with nothing acked, the broker stops at
//! the prefetch.
//!
//! # Settling
//!
//! Each delivery is settled once, individually, after its disposition (see the `settle`
//! module): `basic.ack` for `Completed`, `Deferred`, `Expired` and `Shed`;
//! `basic.reject(requeue = false)` for `Failed` (to the queue's dead-letter exchange) unless
//! [`dead_letter_via_sink`](AmqpSourceConfig::dead_letter_via_sink) says the runtime already
//! published it to a dead-letter sink, then `basic.ack`; `basic.nack(requeue = true)` when
//! the runtime releases it unprocessed. `Ack::resolve` is synchronous; the frames are sent by
//! a task.
//!
//! # Connection loss
//!
//! A lost connection or channel is reopened from [`next`](Source::next) with exponential
//! backoff and full jitter. Deliveries of the lost channel are requeued by the broker and
//! come back with the `redelivered` flag; their old handles are stale and settle nothing.

mod classify;
mod config;
mod settle;

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, Consumer};
use triage::quanta::Clock;
use triage::runtime::{Ack, AckSink, Envelope, Source};

pub use config::{
    AmqpSourceConfig, ClassifyConfig, DeadlineConfig, PriorityMapping, QueueDeclareConfig,
};

use self::classify::Classifier;
use self::settle::{Settle, Settler};
use crate::connection::{self, Backoff};
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
    config: AmqpSourceConfig,
    queue: Arc<str>,
    classifier: Classifier,
    clock: Clock,
    settler: Arc<Settler>,
    metrics: Arc<SourceMetrics>,
    link: Option<Link>,
    epoch: u64,
    backoff: Backoff,
    /// Earliest moment of the next connection attempt; kept across cancelled `next` calls.
    retry_at: Option<tokio::time::Instant>,
    paused: bool,
    closed: bool,
}

/// A live connection, its channel and consumer.
struct Link {
    connection: Connection,
    channel: Channel,
    consumer: Consumer,
}

impl std::fmt::Debug for AmqpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSource")
            .field("queue", &self.queue)
            .field("epoch", &self.epoch)
            .field("connected", &self.link.is_some())
            .field("paused", &self.paused)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl AmqpSource {
    /// Validates `config` against the runtime queue's capacity (in envelopes), connects,
    /// declares the queue if configured, sets the prefetch and starts consuming.
    ///
    /// Must be called within a tokio runtime: the settle task and lapin's I/O run on it.
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
        let queue: Arc<str> = Arc::from(config.queue.as_str());
        let metrics = SourceMetrics::new(&config.queue);
        let settler = Settler::spawn(Arc::clone(&metrics), config.dead_letter_via_sink);
        let mut source = AmqpSource {
            classifier: Classifier::new(
                config.classify.clone(),
                config.deadline.clone(),
                &config.queue,
            ),
            backoff: Backoff::new(&config.reconnect),
            config,
            queue,
            clock: Clock::new(),
            settler,
            metrics,
            link: None,
            epoch: 0,
            retry_at: None,
            paused: false,
            closed: false,
        };
        source.open().await?;
        Ok(source)
    }

    /// Reads deadlines against `clock` instead of the real one; use the runtime's clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Counters since the source was created (see the [`metrics`](crate::metrics) table).
    pub fn stats(&self) -> AmqpSourceStats {
        self.metrics.snapshot()
    }

    /// Deliveries handed out on the current channel and not settled yet.
    pub fn outstanding(&self) -> usize {
        self.settler.outstanding()
    }

    /// The current channel's epoch: 1 for the first channel, one more per reconnection, 0
    /// while disconnected.
    pub fn epoch(&self) -> u64 {
        if self.link.is_some() {
            self.epoch
        } else {
            0
        }
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

    /// One attempt at connection, channel, declare, qos and consume.
    async fn open(&mut self) -> Result<(), AmqpError> {
        let name = self.config.connection_name();
        let connection = connection::connect(&self.config.uri, &name, &self.config.reconnect)
            .await
            .map_err(AmqpError::Connect)?;
        match self.setup(&connection).await {
            Ok((channel, consumer)) => {
                self.epoch += 1;
                if self.epoch > 1 {
                    self.metrics.reconnects.incr();
                }
                self.settler
                    .begin(self.epoch, u64::from(channel.id()), channel.clone());
                self.link = Some(Link {
                    connection,
                    channel,
                    consumer,
                });
                self.backoff.reset();
                self.retry_at = None;
                Ok(())
            }
            Err(e) => {
                close_in_background(connection);
                Err(e)
            }
        }
    }

    async fn setup(&self, connection: &Connection) -> Result<(Channel, Consumer), AmqpError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(AmqpError::setup("channel.open"))?;
        let declare = &self.config.declare;
        if declare.enabled {
            let mut args = FieldTable::default();
            if let Some(p) = declare.max_priority {
                args.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(p));
            }
            if let Some(dlx) = &declare.dead_letter_exchange {
                args.insert(
                    "x-dead-letter-exchange".into(),
                    AMQPValue::LongString(LongString::from(dlx.as_str())),
                );
            }
            if let Some(key) = &declare.dead_letter_routing_key {
                args.insert(
                    "x-dead-letter-routing-key".into(),
                    AMQPValue::LongString(LongString::from(key.as_str())),
                );
            }
            channel
                .queue_declare(
                    &self.config.queue,
                    QueueDeclareOptions {
                        durable: declare.durable,
                        ..QueueDeclareOptions::default()
                    },
                    args,
                )
                .await
                .map_err(AmqpError::setup("queue.declare"))?;
        }
        // Per consumer (global = false), set before consuming so the bound applies from the
        // first delivery.
        channel
            .basic_qos(self.config.prefetch, BasicQosOptions { global: false })
            .await
            .map_err(AmqpError::setup("basic.qos"))?;
        let consumer = channel
            .basic_consume(
                &self.config.queue,
                "",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(AmqpError::setup("basic.consume"))?;
        Ok((channel, consumer))
    }

    /// Forgets the current channel: its deliveries' handles become stale.
    fn lose(&mut self) {
        self.settler.lose();
        if let Some(link) = self.link.take() {
            close_in_background(link.connection);
        }
    }

    /// Reconnects until it works; cancel safe (the backoff deadline lives in `self`).
    async fn reconnect(&mut self) {
        loop {
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at).await;
            }
            match self.open().await {
                Ok(()) => {
                    tracing::info!(queue = %self.queue, epoch = self.epoch, "amqp consumer reconnected");
                    return;
                }
                Err(e) => {
                    self.metrics.connect_failures.incr();
                    let delay = self.backoff.next_delay();
                    tracing::warn!(queue = %self.queue, error = %e, retry_in_ms = delay.as_millis() as u64, "amqp consumer cannot reconnect");
                    self.retry_at = Some(tokio::time::Instant::now() + delay);
                }
            }
        }
    }

    /// Turns a delivery into an envelope, or settles it at once when it is unacceptable.
    fn envelope(&mut self, delivery: lapin::message::Delivery) -> Option<Envelope<AmqpMessage>> {
        self.metrics.deliveries.incr();
        if delivery.redelivered {
            self.metrics.redelivered.incr();
        }
        let token = self.settler.track(delivery.delivery_tag);
        let size = delivery.data.len();
        if size > self.config.max_payload_bytes {
            self.metrics.oversize.incr();
            self.settler.settle(token, Settle::Reject);
            return None;
        }
        let now_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let class = self.classifier.classify(&delivery.properties, now_unix_ms);
        if let Some(reason) = class.unclassified {
            self.metrics.unclassified(reason);
        }
        let deadline = class.deadline_unix_ms.map(|at| {
            // A deadline already past becomes "now": expired at the first look.
            self.clock.now() + Duration::from_millis(at.saturating_sub(now_unix_ms))
        });
        let ack = Ack::new(Arc::clone(&self.settler) as Arc<dyn AckSink>, token);
        let message = AmqpMessage::from_delivery(delivery, Arc::clone(&self.queue));
        Some(
            Envelope::new(message, class.criticality, ack)
                .with_attempt(class.attempt)
                .with_deferrals(class.deferrals)
                .with_deadline_opt(deadline)
                .with_size_bytes(size),
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
            let Some(link) = self.link.as_mut() else {
                self.reconnect().await;
                continue;
            };
            match link.consumer.next().await {
                Some(Ok(delivery)) => {
                    if !link.channel.status().connected() {
                        // Buffered by lapin before the channel died: the broker has requeued
                        // it already, so processing it now would only be duplicate work.
                        self.metrics.dropped_buffered.incr();
                        continue;
                    }
                    if let Some(envelope) = self.envelope(delivery) {
                        return Some(envelope);
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(queue = %self.queue, error = %e, "amqp consumer lost its channel");
                    self.lose();
                }
                None => {
                    // Cancelled by the broker (queue deleted) or by a closing channel.
                    tracing::warn!(queue = %self.queue, "amqp consumer cancelled");
                    self.lose();
                }
            }
        }
    }

    async fn close(&mut self) {
        self.closed = true;
        let timeout = Duration::from_millis(self.config.shutdown_timeout_ms);
        let link = self.link.take();
        let settler = Arc::clone(&self.settler);
        let queue = Arc::clone(&self.queue);
        let graceful = async move {
            if let Some(link) = &link {
                // No more deliveries; those lapin already buffered are requeued by the close.
                let tag = link.consumer.tag();
                let _ = link
                    .channel
                    .basic_cancel(tag.as_str(), BasicCancelOptions::default())
                    .await;
            }
            // Everything resolved before this point goes out before the close.
            settler.flush().await;
            if let Some(link) = &link {
                let _ = link.channel.close(200, "shutdown").await;
                let _ = link.connection.close(200, "shutdown").await;
            }
        };
        if tokio::time::timeout(timeout, graceful).await.is_err() {
            tracing::warn!(queue = %queue, timeout_ms = timeout.as_millis() as u64, "amqp consumer shutdown timed out");
        }
        self.settler.lose();
    }
}

fn close_in_background(connection: Connection) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            connection.close(200, "reconnecting"),
        )
        .await;
    });
}

impl Source for AmqpSource {
    type Payload = AmqpMessage;

    /// The next classified delivery, reconnecting as needed; `None` after
    /// [`shutdown`](Source::shutdown). While [paused](Source::pause) it waits without pulling.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a delivery is only taken from lapin's buffer when it is returned, and the
    /// reconnection backoff survives a dropped call.
    fn next(&mut self) -> impl Future<Output = Option<Envelope<AmqpMessage>>> + Send {
        self.next_envelope()
    }

    fn pause(&mut self) {
        self.paused = true;
    }

    fn resume(&mut self) {
        self.paused = false;
    }

    /// Cancels the consumer, sends every settlement already resolved, then closes the
    /// channel and the connection; bounded by `shutdown_timeout_ms` even with the broker
    /// down. Deliveries not settled by then are redelivered by the broker.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send {
        self.close()
    }
}
