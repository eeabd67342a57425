//! [`AmqpDeferSink`]: durable re-publishing with publisher confirms.
//!
//! The copy is safe only once the broker says so: the channel is in confirm mode
//! (`confirm.select`), the message persistent (`delivery_mode = 2`) on a durable queue, and
//! published `mandatory`, so that a message no queue would take comes back as a
//! `basic.return` instead of vanishing. [`publish`](DeferSink::publish) is `Ok` only for an
//! ack confirm with no return; a nack, a return, a lost channel or no confirm within
//! `confirm_timeout_ms` is an error, and the runtime leaves the source delivery unacked.
//!
//! `confirm_timeout_ms` bounds the whole publish, not only the wait for the confirm: under a
//! broker resource alarm (`connection.blocked`, memory or disk) RabbitMQ stops reading the
//! publishing connection, so even writing the frame never finishes. Such a publish fails at
//! the bound, and while the broker says the connection is blocked, publishes fail at once
//! ([`SinkError::Unavailable`]) and [`AmqpDeferSink::is_healthy`] is false: the runtime falls
//! back to backpressure instead of holding a deferring permit per message.

mod config;
mod headers;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::sync::Mutex;
use triage::runtime::{DeadLetterSink, DeferSink, Republish, SinkError};

pub use config::AmqpSinkConfig;

use crate::connection;
use crate::metrics::published;
use crate::{AmqpError, AmqpMessage};

/// Publishes deferred and dead-lettered [`AmqpMessage`]s to a durable queue, confirmed.
///
/// One type for both roles: use one instance on the defer queue as the runtime's
/// [`DeferSink`], another on the dead-letter queue as its [`DeadLetterSink`] (then set
/// [`dead_letter_via_sink`](crate::AmqpSourceConfig::dead_letter_via_sink) on the source).
/// Clones share the connection.
///
/// The copy keeps the body, the properties (persistent, without `expiration` and
/// `user_id`) and every original header once, plus the [`triage::wire`] headers as text:
/// `triage-criticality`, `triage-attempt`, `triage-deferrals`, `triage-deadline-ms`,
/// `triage-reason`, `triage-origin-queue`, and for dead letters `triage-error` (at most
/// [`MAX_ERROR_BYTES`](triage::wire::MAX_ERROR_BYTES) bytes).
///
/// # Examples
///
/// ```no_run
/// use triage::runtime::{DeferSink, Republish};
/// use triage::Criticality;
/// use triage_amqp::{AmqpDeferSink, AmqpMessage, AmqpSinkConfig};
///
/// # #[allow(dead_code)]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let sink = AmqpDeferSink::connect(AmqpSinkConfig::new(
///     "amqp://127.0.0.1:5672/%2f",
///     "orders.deferred",
/// ))
/// .await?;
/// let info = Republish {
///     criticality: Criticality::Medium,
///     attempt: 0,
///     deferrals: 0,
///     deadline: None,
///     reason: "overloaded",
///     error: None,
/// };
/// DeferSink::publish(&sink, &AmqpMessage::new(b"order-17".to_vec()), &info).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct AmqpDeferSink {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: AmqpSinkConfig,
    link: Mutex<LinkState>,
    /// See [`AmqpDeferSink::is_healthy`].
    healthy: AtomicBool,
}

#[derive(Debug)]
struct LinkState {
    live: Option<(Connection, Channel)>,
    /// Failed connection attempts in a row, for the backoff.
    failures: u32,
    retry_at: Option<tokio::time::Instant>,
}

impl AmqpDeferSink {
    /// Validates `config`, connects, declares the queue (durable) and enables publisher
    /// confirms.
    ///
    /// # Errors
    ///
    /// [`AmqpError::Config`] for a field out of range, [`AmqpError::Connect`] when the broker
    /// cannot be reached, [`AmqpError::Setup`] when `queue.declare` or `confirm.select` fails.
    /// Later losses are retried on the next publish.
    pub async fn connect(config: AmqpSinkConfig) -> Result<Self, AmqpError> {
        config.validate()?;
        crate::metrics::describe();
        let live = open(&config).await?;
        Ok(AmqpDeferSink {
            inner: Arc::new(Inner {
                link: Mutex::new(LinkState {
                    live: Some(live),
                    failures: 0,
                    retry_at: None,
                }),
                config,
                healthy: AtomicBool::new(true),
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &AmqpSinkConfig {
        &self.inner.config
    }

    /// Whether the last publish reached the broker: `false` after one that found no
    /// connection, was blocked by a resource alarm (`connection.blocked`) or got no confirm
    /// within `confirm_timeout_ms`; `true` again after one the broker answered (confirmed,
    /// nacked or returned), and before the first.
    pub fn is_healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }

    fn outcome(&self, outcome: &'static str) {
        published(&self.inner.config.queue, outcome);
        let reached = !matches!(outcome, "timeout" | "unavailable");
        self.inner.healthy.store(reached, Ordering::Relaxed);
    }

    fn blocked(&self) -> bool {
        self.inner.link.try_lock().is_ok_and(|state| {
            state
                .live
                .as_ref()
                .is_some_and(|(connection, _)| connection.status().blocked())
        })
    }

    /// Re-publishes `message` with the triage headers of `info` and waits for the confirm,
    /// all of it within `confirm_timeout_ms`.
    ///
    /// # Errors
    ///
    /// [`SinkError::NotConfirmed`] when the broker nacked or returned the message or the
    /// publish and its confirm did not finish within `confirm_timeout_ms`;
    /// [`SinkError::Unavailable`] when there is no channel (connection lost, waiting to
    /// reconnect) or the broker blocks the connection (resource alarm);
    /// [`SinkError::Rejected`] when the body plus headroom exceeds `max_message_bytes`
    /// (nothing is sent).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the outcome unknown: the copy may or may not be stored.
    /// Treat it like an error (leave the source delivery unacked; a duplicate copy is
    /// possible, never a loss).
    pub async fn publish_confirmed(
        &self,
        message: &AmqpMessage,
        info: &Republish,
    ) -> Result<(), SinkError> {
        let config = &self.inner.config;
        let size = message
            .body()
            .len()
            .saturating_add(AmqpSinkConfig::HEADROOM_BYTES);
        if size > config.max_message_bytes {
            // This message, not the destination: no outcome that would mark the sink down.
            published(&config.queue, "too_large");
            return Err(SinkError::Rejected(format!(
                "{} bytes of body plus {} of headroom exceed max_message_bytes = {}",
                message.body().len(),
                AmqpSinkConfig::HEADROOM_BYTES,
                config.max_message_bytes
            )));
        }
        let bound = Duration::from_millis(config.confirm_timeout_ms);
        match tokio::time::timeout(bound, self.publish_unbounded(message, info)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                self.outcome("timeout");
                let blocked = if self.blocked() {
                    " (the broker blocks the connection: resource alarm)"
                } else {
                    ""
                };
                Err(SinkError::NotConfirmed(format!(
                    "publish not confirmed within {} ms{blocked}",
                    config.confirm_timeout_ms
                )))
            }
        }
    }

    async fn publish_unbounded(
        &self,
        message: &AmqpMessage,
        info: &Republish,
    ) -> Result<(), SinkError> {
        let config = &self.inner.config;
        let channel = self.channel().await.inspect_err(|_| {
            self.outcome("unavailable");
        })?;
        let properties = headers::republish_properties(message, info);
        let confirm = match channel
            .basic_publish(
                &config.exchange,
                config.routing_key(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                message.body(),
                properties,
            )
            .await
        {
            Ok(confirm) => confirm,
            Err(e) => {
                self.broken(&channel).await;
                self.outcome("unavailable");
                return Err(SinkError::Unavailable(format!("basic.publish failed: {e}")));
            }
        };
        match confirm.await {
            Ok(Confirmation::Ack(None)) => {
                self.outcome("confirmed");
                Ok(())
            }
            Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => {
                self.outcome("returned");
                Err(SinkError::NotConfirmed(format!(
                    "returned by the broker: {} {}",
                    returned.reply_code, returned.reply_text
                )))
            }
            Ok(Confirmation::Nack(None)) => {
                self.outcome("nacked");
                Err(SinkError::NotConfirmed("nacked by the broker".to_owned()))
            }
            Ok(Confirmation::NotRequested) => {
                self.outcome("nacked");
                Err(SinkError::NotConfirmed(
                    "channel is not in confirm mode".to_owned(),
                ))
            }
            Err(e) => {
                self.broken(&channel).await;
                self.outcome("unavailable");
                Err(SinkError::Unavailable(format!("confirm lost: {e}")))
            }
        }
    }

    /// The live channel, reconnecting if the backoff allows it now.
    async fn channel(&self) -> Result<Channel, SinkError> {
        let mut state = self.inner.link.lock().await;
        if let Some((connection, channel)) = &state.live {
            if connection.status().blocked() {
                // Publishing now would wait for the alarm to clear, holding the caller.
                return Err(SinkError::Unavailable(
                    "the broker blocks the connection (resource alarm)".to_owned(),
                ));
            }
            if channel.status().connected() && connection.status().connected() {
                return Ok(channel.clone());
            }
            state.live = None;
        }
        if state
            .retry_at
            .is_some_and(|at| at > tokio::time::Instant::now())
        {
            return Err(SinkError::Unavailable(
                "not connected; waiting to reconnect".to_owned(),
            ));
        }
        match open(&self.inner.config).await {
            Ok((connection, channel)) => {
                state.failures = 0;
                state.retry_at = None;
                state.live = Some((connection, channel.clone()));
                Ok(channel)
            }
            Err(e) => {
                let delay = self.inner.config.reconnect.backoff(state.failures);
                state.failures = state.failures.saturating_add(1);
                state.retry_at = Some(tokio::time::Instant::now() + delay);
                Err(SinkError::Unavailable(error_chain(&e)))
            }
        }
    }

    /// Drops `channel` if it is still the live one, so the next publish reconnects.
    async fn broken(&self, channel: &Channel) {
        let mut state = self.inner.link.lock().await;
        if state
            .live
            .as_ref()
            .is_some_and(|(_, live)| live.id() == channel.id() && !live.status().connected())
        {
            state.live = None;
        }
    }
}

async fn open(config: &AmqpSinkConfig) -> Result<(Connection, Channel), AmqpError> {
    let connection = connection::connect(&config.uri, &config.connection_name(), &config.reconnect)
        .await
        .map_err(AmqpError::Connect)?;
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::setup("channel.open"))?;
    if config.declare {
        channel
            .queue_declare(
                &config.queue,
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(AmqpError::setup("queue.declare"))?;
    }
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(AmqpError::setup("confirm.select"))?;
    Ok((connection, channel))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl DeferSink<AmqpMessage> for AmqpDeferSink {
    fn publish<'a>(
        &'a self,
        payload: &'a AmqpMessage,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(self.publish_confirmed(payload, info))
    }
}

impl DeadLetterSink<AmqpMessage> for AmqpDeferSink {
    fn publish<'a>(
        &'a self,
        payload: &'a AmqpMessage,
        info: &'a Republish,
    ) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(self.publish_confirmed(payload, info))
    }
}
