//! [`KafkaSource`]: a consumer-group member that classifies cheaply and commits only what
//! is settled.
//!
//! - Classification (`classify.rs`): from headers (on trusted topics), topic and timestamp,
//!   never the payload; bad labels fall back to a default and are counted.
//! - Offsets (`offsets.rs`): auto commit off; every record is tracked in triage's
//!   [`AckTracker`](triage::ledger::AckTracker) and only the contiguous watermark is committed:
//!   every `commit_interval_ms` from a committer thread (`commit.rs`), on revocation, and
//!   (bounded) on shutdown.
//! - Flow (`poll.rs`): a dedicated thread polls the consumer at all times, so pausing never
//!   costs the group membership, and hands records over through a bounded channel. Kafka has
//!   no limit on how long a record may wait unacknowledged (RabbitMQ's `consumer_timeout`
//!   has one, so the AMQP source states a
//!   [`patience`](triage::runtime::Source::patience) and this one does not):
//!   `max.poll.interval.ms` bounds the time between two polls, and the thread never goes
//!   longer than about a second without one (`PAUSE_AFTER` while the hand-off channel stays
//!   full), however long the runtime holds records or keeps the source paused: a long hold
//!   keeps the committed watermark below the held record, and never the consumer out of its
//!   group (`tests/poll_interval.rs` holds one for 2.5 poll intervals).
//! - Lag (`lag.rs`): the records waiting in the broker for this consumer, measured every
//!   `lag_interval_ms` on a thread of its own, so `Source::lag` never blocks.
//! - A topic per tier: with `criticality.topic_tiers` mapping the subscribed topics to tiers,
//!   `Source::pause_tiers` pauses the partitions of the tiers being shed, so their records
//!   wait in the broker and a Critical topic never waits behind them. This is the layout for
//!   strict protection; in one mixed topic a Critical record is reached only by consuming
//!   everything in front of it.
//!
//! - Ordering: with `ordering.mode = "key"` (or `"partition"`) each record carries an ordering
//!   key computed from its topic, partition and key, and the runtime's key gate keeps one
//!   record per key inside at a time (see [`triage::ordering`]); the watermark commit is
//!   unchanged.
//! - Revocation (`link.rs`, `offsets.rs`): attached to a runtime, the source hands back the
//!   records of revoked partitions that the runtime holds (through the runtime's
//!   [`Recall`](triage::runtime::Recall)), never serving them, and waits for the handlers still
//!   running some (at most `revoke_wait_ms`) before it commits and lets the partitions go: so
//!   across the members of a group a key still runs one record at a time, in order.
//!
//! After rdkafka's `examples/at_least_once.rs`, with the offset store replaced by the
//! watermark.

mod acks;
mod classify;
mod classify_config;
mod client;
mod commit;
mod config;
mod context;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod headers;
mod lag;
mod link;
mod offsets;
mod poll;
mod stats;

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use tokio::sync::{mpsc, oneshot};
use triage::quanta::Clock;
use triage::runtime::{Envelope, Source};
use triage::Criticality;

use crate::{Error, KafkaMessage};

pub use classify::{ClassifyFn, MessageMeta, UnclassifiedReason};
pub use classify_config::{CriticalityConfig, DeadlineConfig};
pub use config::KafkaSourceConfig;
pub use stats::{SourceStats, StatsHandle};

use acks::KafkaAcks;
use client::ClientFactory;
use offsets::Offsets;
use poll::{Batch, Control, Delivery, PollLoop};

/// A [`Source`] over a Kafka consumer group.
///
/// Each record becomes an [`Envelope`] whose [`Ack`](triage::runtime::Ack) reports to this
/// source: resolving it settles the offset, and the committed position per partition only
/// ever moves to the contiguous watermark of settled offsets. A record whose ack is dropped
/// unresolved is never committed past, so it is redelivered after a restart or a rebalance.
///
/// # Examples
///
/// ```no_run
/// use triage::ledger::Disposition;
/// use triage::runtime::Source;
/// use triage_kafka::{KafkaSource, KafkaSourceConfig};
///
/// # async fn run() -> Result<(), triage_kafka::Error> {
/// let config = KafkaSourceConfig::new("127.0.0.1:9092", "billing", ["orders"]);
/// let mut source = KafkaSource::builder(config).build()?;
/// while let Some(envelope) = source.next().await {
///     // ... serve envelope.payload ...
///     envelope.ack.resolve(Disposition::Completed);
/// #   break;
/// }
/// source.shutdown().await;
/// # Ok(())
/// # }
/// # let _ = run;
/// ```
pub struct KafkaSource {
    rx: mpsc::Receiver<Batch>,
    /// The batch being handed out, received whole from the poll thread.
    batch: VecDeque<Delivery>,
    offsets: Arc<Offsets>,
    control: Arc<Control>,
    done: Option<oneshot::Receiver<()>>,
    shutdown_bound: Duration,
    topics: Vec<String>,
    lag: Arc<lag::Lag>,
    /// The subscribed topics that `criticality.topic_tiers` maps to a tier.
    topic_tiers: Vec<(String, Criticality)>,
    /// The runtime this source is attached to, for the revocation callback.
    link: Arc<link::RuntimeLink>,
    /// The tiers last passed to `pause_tiers`, as a bit per rank.
    shed_tiers: u8,
}

impl fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topics", &self.topics)
            .field("stats", &self.offsets.stats.snapshot())
            .finish_non_exhaustive()
    }
}

/// Builds a [`KafkaSource`]: the configuration, plus optionally a classifier closure and a
/// clock.
#[must_use = "a builder does nothing until `build` is called"]
pub struct KafkaSourceBuilder {
    config: KafkaSourceConfig,
    classifier: Option<ClassifyFn>,
    clock: Option<Clock>,
    /// Topic and `max_message_bytes` of each sink its records may be re-published through.
    republish: Vec<(String, usize)>,
}

impl fmt::Debug for KafkaSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSourceBuilder")
            .field("config", &self.config)
            .field("classifier", &self.classifier.is_some())
            .finish_non_exhaustive()
    }
}

impl KafkaSourceBuilder {
    /// A classifier consulted before the configured rules: `Some(tier)` decides, `None` falls
    /// through to the header, topic and default rules. It sees no payload, by design.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use triage::Criticality;
    /// use triage_kafka::{KafkaSource, KafkaSourceConfig};
    ///
    /// let config = KafkaSourceConfig::new("127.0.0.1:9092", "billing", ["orders"]);
    /// let source = KafkaSource::builder(config)
    ///     .classifier(|meta| meta.key.is_some_and(|k| k.starts_with(b"vip-")).then_some(Criticality::High))
    ///     .build()?;
    /// # let _ = source;
    /// # Ok::<(), triage_kafka::Error>(())
    /// ```
    pub fn classifier(
        mut self,
        classify: impl Fn(&MessageMeta<'_>) -> Option<Criticality> + Send + Sync + 'static,
    ) -> Self {
        self.classifier = Some(Arc::new(classify));
        self
    }

    /// The ordering mode: sets [`KafkaSourceConfig::ordering`]'s `mode` (keyless records keep
    /// the configured `null_key` rule). `Key`: at most one record per key of a partition inside
    /// the runtime at a time, in offset order, keys in parallel; `Partition`: one record at a
    /// time per partition; `Unordered` (the default): no ordering.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use triage::ordering::OrderingMode;
    /// use triage_kafka::{KafkaSource, KafkaSourceConfig};
    ///
    /// let config = KafkaSourceConfig::new("127.0.0.1:9092", "ledger", ["postings"]);
    /// let source = KafkaSource::builder(config).ordering(OrderingMode::Key).build()?;
    /// # let _ = source;
    /// # Ok::<(), triage_kafka::Error>(())
    /// ```
    pub fn ordering(mut self, mode: triage::ordering::OrderingMode) -> Self {
        self.config.ordering.mode = mode;
        self
    }

    /// The clock deadlines are expressed on; use the runtime's clock. Default
    /// `Clock::new()`.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// A sink this source's records may be re-published through (the runtime's defer or
    /// dead-letter sink): [`build`](Self::build) then refuses to start unless the largest
    /// record the source reads, plus triage's headers, fits the sink's limit (see
    /// [`KafkaSourceConfig::validate_republish`]). Call it once per sink.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use triage_kafka::{KafkaDeferSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
    ///
    /// let defer = KafkaDeferSink::new(KafkaSinkConfig::new("127.0.0.1:9092", "orders.deferred"))?;
    /// let config = KafkaSourceConfig::new("127.0.0.1:9092", "billing", ["orders"]);
    /// let source = KafkaSource::builder(config).republish_to(&defer).build()?;
    /// # let _ = source;
    /// # Ok::<(), triage_kafka::Error>(())
    /// ```
    pub fn republish_to(mut self, sink: &crate::KafkaDeferSink) -> Self {
        self.republish
            .push((sink.topic().to_owned(), sink.max_message_bytes()));
        self
    }

    /// Validates the configuration, creates the consumer, subscribes and starts polling.
    /// Needs no async runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a value out of range, or a `max_payload_bytes` larger than a
    /// [`republish_to`](Self::republish_to) sink can send (the error names both fields);
    /// [`Error::Client`] if librdkafka refuses the properties, [`Error::Subscribe`],
    /// [`Error::Spawn`].
    pub fn build(self) -> Result<KafkaSource, Error> {
        let config = self.config;
        config.validate()?;
        crate::metrics::describe();
        for (topic, max_message_bytes) in &self.republish {
            config.fits_republish(topic, *max_message_bytes)?;
        }
        let mut client = ClientConfig::new();
        for (k, v) in config.client_properties() {
            client.set(k, v);
        }
        let offsets = Arc::new(Offsets::default());
        offsets.set_commit_wait(config.commit_timeout());
        let acks: Arc<dyn triage::runtime::AckSink> = Arc::new(KafkaAcks {
            offsets: Arc::clone(&offsets),
        });
        let link = Arc::new(link::RuntimeLink::new(
            Arc::clone(&acks),
            config.revoke_wait(),
        ));
        let factory = ClientFactory::new(
            client,
            config.topics.clone(),
            Arc::clone(&offsets),
            Arc::clone(&link),
        );
        let consumer = Arc::new(factory.create()?);
        let shared: client::SharedClient = Arc::new(parking_lot::Mutex::new(Arc::clone(&consumer)));
        let (commits, requests) = std::sync::mpsc::channel();
        let committer = commit::Committer {
            client: Arc::clone(&shared),
            offsets: Arc::clone(&offsets),
            interval: config.commit_interval(),
            requests,
        };
        let (batches, batch) = poll::handoff_shape(config.max_prefetch_messages);
        let (tx, rx) = mpsc::channel(batches);
        let (done_tx, done) = oneshot::channel();
        let control = Arc::new(Control::default());
        let lag = Arc::new(lag::Lag::default());
        let probe = lag::LagProbe {
            client: Arc::clone(&shared),
            control: Arc::clone(&control),
            lag: Arc::clone(&lag),
            interval: config.lag_interval(),
            timeout: config.commit_timeout(),
            from_earliest: config.starts_from_earliest(),
        };
        let poll = PollLoop {
            consumer,
            client: shared,
            commits,
            factory,
            offsets: Arc::clone(&offsets),
            acks,
            link: Arc::clone(&link),
            classifier: classify::Classifier::new(&config, self.classifier),
            ordering: config.ordering,
            clock: self.clock.unwrap_or_default(),
            control: Arc::clone(&control),
            tx,
            batches,
            batch,
            last_stream: offsets::LastStream::default(),
            commit_timeout: config.commit_timeout(),
            done: done_tx,
        };
        std::thread::Builder::new()
            .name("triage-kafka-commit".into())
            .spawn(move || committer.run())
            .map_err(Error::Spawn)?;
        std::thread::Builder::new()
            .name("triage-kafka-lag".into())
            .spawn(move || probe.run())
            .map_err(Error::Spawn)?;
        std::thread::Builder::new()
            .name("triage-kafka-poll".into())
            .spawn(move || poll.run())
            .map_err(Error::Spawn)?;
        let topic_tiers = config
            .topics
            .iter()
            .filter_map(|t| {
                let tier = config.criticality.topic_tiers.get(t)?;
                Some((t.clone(), *tier))
            })
            .collect();
        Ok(KafkaSource {
            rx,
            batch: VecDeque::new(),
            offsets,
            control,
            done: Some(done),
            // One extra second over the two bounds for the thread to notice the stop flag.
            shutdown_bound: config.commit_timeout()
                + config.close_timeout()
                + Duration::from_secs(1),
            topics: config.topics,
            lag,
            topic_tiers,
            shed_tiers: 0,
            link,
        })
    }
}

impl KafkaSource {
    /// A builder for `config`.
    pub fn builder(config: KafkaSourceConfig) -> KafkaSourceBuilder {
        KafkaSourceBuilder {
            config,
            classifier: None,
            clock: None,
            republish: Vec::new(),
        }
    }

    /// This source's counters.
    pub fn stats(&self) -> SourceStats {
        self.offsets.stats.snapshot()
    }

    /// A handle on this source's counters that stays readable once the source is moved into
    /// a runtime ([`Runtime::attach`](triage::runtime::Runtime::attach)): revocations,
    /// assignments, stale acknowledgements, records handed back at revocations, commits...
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(Arc::clone(&self.offsets.stats))
    }

    /// Records consumed on the current assignment and not yet resolved.
    pub fn pending(&self) -> usize {
        self.offsets.pending_total()
    }

    /// The subscribed topics.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }
}

impl Source for KafkaSource {
    type Payload = KafkaMessage;

    /// The next record, or `None` after [`shutdown`](Source::shutdown).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the only await is the receipt of a whole batch from the hand-off
    /// channel, which is kept before anything else; a record leaves the batch only when
    /// returned.
    async fn next(&mut self) -> Option<Envelope<KafkaMessage>> {
        loop {
            let Some((generation, envelope)) = self.batch.pop_front() else {
                let batch = self.rx.recv().await?;
                self.control
                    .queued
                    .fetch_sub(batch.len(), Ordering::Relaxed);
                self.batch = batch.into();
                continue;
            };
            if self.offsets.is_current(envelope.ack.token(), generation) {
                return Some(envelope);
            }
            // Its partition was revoked while it waited: withdrawn without acknowledgement
            // (dropping the ack releases it); the partition's new owner redelivers it.
        }
    }

    /// Keeps the runtime's recall for the revocation callback (see `revoke_wait_ms`).
    fn attached(&mut self, recall: triage::runtime::Recall) {
        self.link.attach(recall);
    }

    /// Pauses the assignment; the poll thread keeps serving the group protocol.
    fn pause(&mut self) {
        self.control.runtime_paused.store(true, Ordering::Release);
    }

    /// Resumes the assignment (unless the hand-off buffer is still full).
    fn resume(&mut self) {
        self.control.runtime_paused.store(false, Ordering::Release);
    }

    /// Records waiting for this consumer and not yet pulled by the runtime: the high watermark
    /// minus the position, summed over the assigned partitions (measured every
    /// `lag_interval_ms` on a thread of its own, see `lag_interval_ms`), plus the records
    /// already consumed into the hand-off buffer. `None` until the first measurement. Never
    /// blocks: three atomic loads.
    fn lag(&self) -> Option<u64> {
        let broker = self.lag.broker()?;
        let buffered = self.batch.len()
            + self.control.queued.load(Ordering::Relaxed)
            + self.control.held.load(Ordering::Relaxed);
        Some(broker.saturating_add(buffered as u64))
    }

    /// A topic per tier: pauses the partitions of the subscribed topics that
    /// `criticality.topic_tiers` maps to a tier in `tiers`, and resumes those whose tier left
    /// the set, while the rest of the assignment is consumed as usual. Their records wait in
    /// the broker rather than being consumed only to be deferred, so a Critical topic never
    /// waits behind them. Topics without a topic tier are never paused here. Cheap when the set
    /// did not change; otherwise applied by the poll thread within one poll (about 100 ms).
    fn pause_tiers(&mut self, tiers: triage::queue::TierMask) {
        let bits = Criticality::ALL
            .iter()
            .filter(|t| tiers.contains(**t))
            .fold(0u8, |acc, t| acc | 1 << t.rank());
        if bits == self.shed_tiers {
            return;
        }
        self.shed_tiers = bits;
        let topics = self
            .topic_tiers
            .iter()
            .filter(|(_, tier)| tiers.contains(*tier))
            .map(|(topic, _)| topic.clone())
            .collect();
        if self.offsets.set_shed_topics(topics) {
            self.control.tiers_changed.store(true, Ordering::Release);
        }
    }

    /// Commits the watermark (bounded by `commit_timeout_ms`), leaves the group and closes
    /// the client (bounded by `close_timeout_ms`). Returns within about the sum of the two
    /// even with the broker unreachable; a client that has not closed by then is left to
    /// finish on its thread.
    async fn shutdown(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        if let Some(done) = self.done.take() {
            if tokio::time::timeout(self.shutdown_bound, done)
                .await
                .is_err()
            {
                tracing::warn!("kafka source: client did not close in time; abandoned");
            }
        }
        self.rx.close();
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        // The poll thread commits what is settled and closes the client on its own.
        self.control.stop.store(true, Ordering::Release);
    }
}
