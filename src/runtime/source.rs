//! The source side: where messages come from.

use std::future::Future;
use std::time::Duration;

use crate::runtime::Envelope;

/// A pull-based stream of messages: a Kafka consumer, a RabbitMQ consumer, an in-memory
/// channel.
///
/// The runtime pulls with [`next`](Source::next) only while it can take the message; when a
/// message is refused with the `Backpressure` policy the runtime holds it, calls
/// [`pause`](Source::pause), retries it as capacity returns, and calls
/// [`resume`](Source::resume) once it is in. A source must keep its own prefetch bounded so that
/// not pulling really does stop the flow (Kafka: pause the partitions and keep serving the group
/// protocol; RabbitMQ: a bounded `basic.qos` prefetch).
pub trait Source: Send + 'static {
    /// The message type handed to the handler and to the defer and dead-letter sinks.
    type Payload: Send + 'static;

    /// The next message, or `None` once the source is finished (closed, shut down).
    ///
    /// Must be cancel safe: the runtime drops this future when it stops pulling.
    fn next(&mut self) -> impl Future<Output = Option<Envelope<Self::Payload>>> + Send;

    /// The runtime holds a refused message and stops pulling until [`resume`](Source::resume).
    fn pause(&mut self) {}

    /// The held message was admitted; pulling resumes.
    fn resume(&mut self) {}

    /// Messages waiting in the broker for this consumer, not yet pulled: for Kafka the sum over
    /// the assigned partitions of the high watermark minus the position, for RabbitMQ the
    /// queue's ready-message count. `None` when unknown (not yet measured, or the source cannot
    /// tell). Read by the runtime's sampler a few times a second to estimate the arrival rate
    /// (the lag's trend plus the rate of pulling), so it must be cheap and never block:
    /// return a value the source refreshes on its own schedule. While any source's lag is
    /// `None`, pull admission sees no arrival and refuses nothing (pulls alone show how fast
    /// the runtime reads, not how fast work arrives); expiry at intake still applies.
    fn lag(&self) -> Option<u64> {
        None
    }

    /// The tiers whose work the runtime is shedding right now (a bottom prefix of the ladder,
    /// possibly empty). A source that reads tiers from separate topics or queues (a topic per
    /// tier) stops pulling those tiers' topics while they are in the set, so their records wait
    /// in the broker rather than being consumed only to be deferred, and resumes them when they
    /// leave it. A source over one mixed topic ignores it (the default).
    fn pause_tiers(&mut self, tiers: crate::queue::TierMask) {
        let _ = tiers;
    }

    /// The name of this source's setting that makes it rely on the runtime's dead-letter sink
    /// (for example an AMQP source that acknowledges `Failed` deliveries rather than
    /// rejecting them to the queue's dead-letter exchange, because the sink keeps the copy),
    /// or `None` (the default) when it keeps failed messages by itself or needs not. A runtime
    /// without a dead-letter sink refuses to attach a source that names one
    /// ([`Runtime::try_attach`](crate::runtime::Runtime::try_attach)), with an error naming
    /// the setting: its `Failed` messages would be acknowledged with no copy kept anywhere.
    fn needs_dead_letter_sink(&self) -> Option<&'static str> {
        None
    }

    /// How long the broker lets a message it delivered stay unacknowledged before it takes it
    /// back by force, or `None` (the default) when it never does. RabbitMQ closes the channel
    /// of a delivery unacknowledged past its `consumer_timeout` (30 minutes by default): every
    /// unsettled delivery on that channel is then redelivered, those whose handlers already
    /// finished included (their acks fail), so their work is done twice. A source that states
    /// its patience has each of its messages that waits in the runtime (queued, held under
    /// backpressure, parked behind its ordering key) for
    /// [`patience_share`](crate::runtime::ExpertConfig::patience_share) of it handed back in
    /// time: deferred where its tier defers and a copy can still come back in time, otherwise
    /// released ([`AckSink::release`](crate::runtime::AckSink::release)) for the broker to
    /// deliver again. The time a message waited in the source before [`next`](Source::next)
    /// returned it counts ([`Envelope::waited`]). Read when the source is attached and each
    /// time a message is received, so it must be cheap. Kafka has no such limit on a message
    /// (`max.poll.interval.ms` bounds the time between polls, which the Kafka source keeps
    /// short on a thread of its own).
    fn patience(&self) -> Option<Duration> {
        None
    }

    /// Hands back every message this source holds in a buffer of its own (taken from the
    /// broker, not yet returned by [`next`](Source::next)) that has waited `waited` or longer
    /// since the broker delivered it, without acknowledging it: the broker delivers it again.
    /// Returns how many. Called by the runtime for a source with a [`patience`](Source::patience),
    /// on a timer (every `admission.tick_ms`), paused or not: a paused source, or one whose
    /// tier is not read ([`pause_tiers`](Source::pause_tiers)), keeps what it buffered. Must be
    /// cheap (look at the oldest of each buffer) and never block. The default holds nothing.
    fn release_waiting(&mut self, waited: Duration) -> usize {
        let _ = waited;
        0
    }

    /// Called once, when a runtime attaches this source, before its first
    /// [`next`](Source::next): the handle through which the source takes back messages the
    /// runtime holds when its broker takes them back (a Kafka partition revoked and given to
    /// another consumer): see [`Recall`](crate::runtime::Recall). A source whose broker never
    /// does ignores it (the default).
    fn attached(&mut self, recall: crate::runtime::Recall) {
        let _ = recall;
    }

    /// The runtime is stopping: every message it took has been resolved or released. Make the
    /// final synchronous acknowledgement (Kafka: commit the watermark) and return. Must return
    /// even when the broker is unreachable; the runtime also bounds it by its grace period.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}
