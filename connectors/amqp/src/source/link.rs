//! The link task: owns the connection, its channel and consumers, moves deliveries into the
//! [`Inbox`], measures the lag, and reconnects on its own.
//!
//! # Why a task of its own
//!
//! The runtime calls [`next`](triage::runtime::Source::next) under a short timeout while it
//! holds messages, and drops the call when the timeout fires. A reconnection run inside
//! `next` was abandoned at each drop, half open, and started over at the next call with no
//! backoff: dozens of connections a second against a broker that had just closed one. Here a
//! reconnection belongs to this task alone: one attempt at a time, each counted, with the
//! core's full-jitter backoff between failures ([`ReconnectConfig::backoff`]), whatever the
//! callers of `next` do. The task also reads the consumers while the source is paused, so a
//! channel the broker closes (a `consumer_timeout`, a forced close) is noticed at once: its
//! handles become stale (settles counted, not sent) and the source reconnects while paused.
//!
//! [`ReconnectConfig::backoff`]: crate::ReconnectConfig::backoff

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use futures_util::FutureExt;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::AmqpSourceConfig;
use super::inbox::Inbox;
use super::queue_config::DeadLetter;
use super::settle::Settler;
use crate::connection;
use crate::metrics::SourceMetrics;
use crate::AmqpError;

/// Most deliveries moved into the inbox at once.
const BATCH: usize = 256;

/// What the source asks of the link task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Keep consuming.
    Run,
    /// Cancel the consumers, send the pending settlements, close.
    Shutdown,
}

/// A live connection: its channel, its consumers' tags, the lag task.
pub(crate) struct Live {
    connection: Connection,
    channel: Channel,
    consumers: Vec<lapin::Consumer>,
    lag: JoinHandle<()>,
}

/// How a live link ended.
enum Ended {
    /// The broker or the network closed the channel or a consumer.
    Lost,
    /// The source shut down (gracefully) or was dropped (not).
    Stopped { graceful: bool },
}

/// Everything the task needs, moved into it.
pub(crate) struct Link {
    pub(crate) config: Arc<AmqpSourceConfig>,
    /// Consumed queues, in read order.
    pub(crate) queues: Vec<Arc<str>>,
    pub(crate) settler: Arc<Settler>,
    pub(crate) metrics: Arc<SourceMetrics>,
    pub(crate) inbox: Arc<Inbox>,
    /// Epoch of the last channel opened (1 for the first).
    pub(crate) epoch: u64,
}

impl Link {
    /// One attempt at connection, channel, declares, qos and consumers, counted; on success a
    /// new epoch starts.
    pub(crate) async fn open(&mut self) -> Result<Live, AmqpError> {
        self.metrics.connect_attempts.incr();
        let name = self.config.connection_name();
        let connection = connection::connect(&self.config.uri, &name, &self.config.reconnect)
            .await
            .map_err(AmqpError::Connect)?;
        match self.setup(&connection).await {
            Ok((channel, consumers, lag_channel)) => {
                self.epoch += 1;
                self.settler
                    .begin(self.epoch, u64::from(channel.id()), channel.clone());
                let lag = tokio::spawn(measure_lag(
                    lag_channel,
                    self.queues.clone(),
                    Arc::clone(&self.inbox),
                    Duration::from_millis(self.config.lag_refresh_ms),
                ));
                Ok(Live {
                    connection,
                    channel,
                    consumers,
                    lag,
                })
            }
            Err(e) => {
                close_in_background(connection);
                Err(e)
            }
        }
    }

    async fn setup(
        &self,
        connection: &Connection,
    ) -> Result<(Channel, Vec<lapin::Consumer>, Channel), AmqpError> {
        let channel = connection
            .create_channel()
            .await
            .map_err(AmqpError::setup("channel.open"))?;
        let declare = &self.config.declare;
        if declare.enabled {
            let durable = QueueDeclareOptions {
                durable: declare.durable,
                ..QueueDeclareOptions::default()
            };
            for queue in &self.queues {
                let mut args = FieldTable::default();
                if let Some(p) = declare.max_priority {
                    args.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(p));
                }
                if let Some(ms) = declare.consumer_timeout_ms {
                    // Validated to fit: at most 2^31 - 1.
                    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
                    args.insert("x-consumer-timeout".into(), AMQPValue::LongLongInt(ms));
                }
                let text = |s: &str| AMQPValue::LongString(LongString::from(s));
                match self.config.dead_letter(queue) {
                    DeadLetter::Declared {
                        exchange,
                        routing_key,
                    } => {
                        args.insert("x-dead-letter-exchange".into(), text(&exchange));
                        if let Some(key) = routing_key {
                            args.insert("x-dead-letter-routing-key".into(), text(&key));
                        }
                    }
                    DeadLetter::OwnQueue { queue: dead } => {
                        channel
                            .queue_declare(&dead, durable, FieldTable::default())
                            .await
                            .map_err(AmqpError::setup("queue.declare"))?;
                        args.insert("x-dead-letter-exchange".into(), text(""));
                        args.insert("x-dead-letter-routing-key".into(), text(&dead));
                    }
                    DeadLetter::Existing | DeadLetter::None => {}
                }
                channel
                    .queue_declare(queue, durable, args)
                    .await
                    .map_err(AmqpError::setup("queue.declare"))?;
            }
        }
        // Per consumer (global = false), set before consuming so the bound applies from the
        // first delivery, to each queue's consumer on its own.
        channel
            .basic_qos(self.config.prefetch, BasicQosOptions { global: false })
            .await
            .map_err(AmqpError::setup("basic.qos"))?;
        let mut consumers = Vec::with_capacity(self.queues.len());
        for queue in &self.queues {
            consumers.push(
                channel
                    .basic_consume(
                        queue,
                        "",
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(AmqpError::setup("basic.consume"))?,
            );
        }
        // Its own channel: a passive declare of a missing queue closes the channel it runs on.
        let lag_channel = connection
            .create_channel()
            .await
            .map_err(AmqpError::setup("channel.open"))?;
        Ok((channel, consumers, lag_channel))
    }

    /// Runs until the source shuts down or is dropped: consumes, and reconnects after a loss.
    pub(crate) async fn run(mut self, first: Live, mut stop: watch::Receiver<Stop>) {
        let mut live = Some(first);
        // Failed attempts in a row since the last success.
        let mut failures = 0u32;
        loop {
            if let Some(link) = live.take() {
                match self.pump(link, &mut stop).await {
                    Ended::Lost => continue,
                    Ended::Stopped { .. } => break,
                }
            }
            let delay = self.config.reconnect.backoff(failures);
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                () = tokio::time::sleep(delay) => {}
            }
            let attempt = tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                attempt = self.open() => attempt,
            };
            match attempt {
                Ok(link) => {
                    failures = 0;
                    self.metrics.reconnects.incr();
                    tracing::info!(queue = %self.queues[0], epoch = self.epoch, "amqp consumer reconnected");
                    live = Some(link);
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    self.metrics.connect_failures.incr();
                    tracing::warn!(queue = %self.queues[0], error = %e, failures, "amqp consumer cannot reconnect");
                }
            }
        }
        self.settler.lose();
        self.inbox.finish();
    }

    /// Moves deliveries into the inbox until the link is lost or the source stops.
    async fn pump(&mut self, link: Live, stop: &mut watch::Receiver<Stop>) -> Ended {
        let Live {
            connection,
            channel,
            consumers,
            lag,
        } = link;
        let tags: Vec<ShortString> = consumers.iter().map(lapin::Consumer::tag).collect();
        // Each consumer's stream ends with a `None` marker, so one cancelled consumer (its
        // queue deleted) is noticed even while the others go on.
        let mut deliveries =
            stream::select_all(consumers.into_iter().enumerate().map(|(queue, consumer)| {
                consumer
                    .map(move |delivery| Some((queue, delivery)))
                    .chain(stream::once(futures_util::future::ready(None)))
                    .boxed()
            }));
        let stopping = stopped(stop);
        tokio::pin!(stopping);
        let mut batch = Vec::new();
        let ended = loop {
            let mut item = tokio::select! {
                biased;
                how = &mut stopping => break Ended::Stopped { graceful: how == Some(Stop::Shutdown) },
                item = deliveries.next() => item,
            };
            // Whatever lapin already holds goes into the inbox in one step: one lock and one
            // wake-up for a burst instead of one per delivery.
            let lost = loop {
                match item {
                    Some(Some((queue, Ok(delivery)))) => batch.push((queue, delivery)),
                    Some(Some((_, Err(e)))) => {
                        tracing::warn!(queue = %self.queues[0], error = %e, "amqp consumer lost its channel");
                        break true;
                    }
                    Some(None) | None => {
                        tracing::warn!(queue = %self.queues[0], "amqp consumer cancelled");
                        break true;
                    }
                }
                if batch.len() >= BATCH {
                    break false;
                }
                match deliveries.next().now_or_never() {
                    Some(next) => item = next,
                    None => break false,
                }
            };
            self.inbox.push_all(self.epoch, batch.drain(..));
            if lost {
                break Ended::Lost;
            }
        };
        lag.abort();
        self.inbox.set_lag(None);
        match ended {
            Ended::Lost => {
                // Handles of this channel are stale from now on, paused or not.
                self.settler.lose();
                let dropped = self.inbox.clear();
                self.metrics.dropped_buffered.add(dropped as u64);
                close_in_background(connection);
            }
            Ended::Stopped { graceful: true } => {
                // No more deliveries; those already buffered are requeued by the close.
                for tag in &tags {
                    let _ = channel
                        .basic_cancel(tag.as_str(), BasicCancelOptions::default())
                        .await;
                }
                // Everything resolved before this point goes out before the close.
                self.settler.flush().await;
                let _ = channel.close(200, "shutdown").await;
                let _ = connection.close(200, "shutdown").await;
            }
            Ended::Stopped { graceful: false } => close_in_background(connection),
        }
        ended
    }
}

/// Resolves once the source asks to stop: `Some(Shutdown)`, or `None` when the source was
/// dropped. Cancel safe.
async fn stopped(stop: &mut watch::Receiver<Stop>) -> Option<Stop> {
    loop {
        let now = *stop.borrow_and_update();
        if now != Stop::Run {
            return Some(now);
        }
        if stop.changed().await.is_err() {
            return None;
        }
    }
}

/// Refreshes the inbox's lag: the sum of the queues' ready counts, by passive declares on a
/// channel of its own, every `every`. Ends (lag unknown) when that channel fails.
async fn measure_lag(channel: Channel, queues: Vec<Arc<str>>, inbox: Arc<Inbox>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    'ticks: loop {
        tick.tick().await;
        let mut ready = 0u64;
        for queue in &queues {
            let declared = tokio::time::timeout(
                every.max(Duration::from_secs(1)),
                channel.queue_declare(
                    queue,
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                ),
            )
            .await;
            match declared {
                Ok(Ok(q)) => ready += u64::from(q.message_count()),
                Ok(Err(_)) => {
                    inbox.set_lag(None);
                    return;
                }
                // The broker is slow to answer: keep the last value, try again next tick.
                Err(_) => continue 'ticks,
            }
        }
        inbox.set_lag(Some(ready));
    }
}

pub(crate) fn close_in_background(connection: Connection) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            connection.close(200, "reconnecting"),
        )
        .await;
    });
}
