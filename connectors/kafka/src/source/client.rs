//! Creating the consumer client: once at build, and again after a fatal error.
//!
//! librdkafka raises a fatal error on a consumer only for a fenced static member
//! (`FENCED_INSTANCE_ID`, KIP-345); the client is unusable from then on. Besides a second
//! process with the same `group.instance.id`, librdkafka itself causes it: an offset commit
//! queued while the coordinator was unreachable is sent after the client's session timed out
//! and reset its member id, and the broker fences it (librdkafka#3437, fixed upstream in
//! librdkafka#5585, later than the version this crate builds). A source that stopped there
//! would stop consuming for good after a broker restart, so the poll thread replaces the
//! client, with a growing pause between replacements in case another process really holds
//! the same instance id.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::Error;

use super::context::SourceContext;
use super::link::RuntimeLink;
use super::offsets::Offsets;

/// Shortest pause before a replacement that follows another one within [`CALM`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause between replacements.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A replacement this long after the previous one starts the backoff again.
const CALM: Duration = Duration::from_secs(60);

/// The consumer client in use, shared by the poll thread (which replaces it after a fatal
/// error), the committer and the lag probe.
pub(crate) type SharedClient = Arc<Mutex<Arc<BaseConsumer<SourceContext>>>>;

/// Drops `consumer` on a thread of its own: dropping the last reference closes the client,
/// which polls until the group is left, and may take long with the broker away.
pub(crate) fn close_elsewhere(consumer: Arc<BaseConsumer<SourceContext>>) {
    let closed = std::thread::Builder::new()
        .name("triage-kafka-close".into())
        .spawn(move || drop(consumer));
    if let Err(err) = closed {
        // The closure, and with it the client, was dropped here instead.
        tracing::warn!(%err, "kafka source: no thread to close the old client");
    }
}

/// Creates the consumer clients of one source, all with the same properties and topics.
pub(crate) struct ClientFactory {
    pub(crate) config: ClientConfig,
    pub(crate) topics: Vec<String>,
    pub(crate) offsets: Arc<Offsets>,
    pub(crate) link: Arc<RuntimeLink>,
    last_replaced: Option<Instant>,
    backoff: Duration,
}

impl ClientFactory {
    pub(crate) fn new(
        config: ClientConfig,
        topics: Vec<String>,
        offsets: Arc<Offsets>,
        link: Arc<RuntimeLink>,
    ) -> Self {
        ClientFactory {
            config,
            topics,
            offsets,
            link,
            last_replaced: None,
            backoff: Duration::ZERO,
        }
    }

    /// A subscribed client whose callbacks belong to the current client generation.
    ///
    /// # Errors
    ///
    /// [`Error::Client`] if librdkafka refuses the properties, [`Error::Subscribe`].
    pub(crate) fn create(&self) -> Result<BaseConsumer<SourceContext>, Error> {
        let consumer: BaseConsumer<SourceContext> = self
            .config
            .create_with_context(SourceContext {
                offsets: Arc::clone(&self.offsets),
                link: Arc::clone(&self.link),
                client: self.offsets.client(),
            })
            .map_err(Error::Client)?;
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).map_err(Error::Subscribe)?;
        Ok(consumer)
    }

    /// How long to wait before the next replacement: nothing for the first one in a while,
    /// then 1 s doubling up to 30 s while replacements keep coming within a minute.
    pub(crate) fn next_backoff(&mut self) -> Duration {
        let now = Instant::now();
        self.backoff = match self.last_replaced {
            Some(at) if now.duration_since(at) < CALM => {
                (self.backoff * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF)
            }
            _ => Duration::ZERO,
        };
        self.last_replaced = Some(now);
        self.backoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_while_replacements_keep_coming() {
        let offsets: Arc<Offsets> = Arc::default();
        let acks = Arc::new(super::super::acks::KafkaAcks {
            offsets: Arc::clone(&offsets),
        });
        let link = Arc::new(RuntimeLink::new(acks, Duration::ZERO));
        let mut f = ClientFactory::new(ClientConfig::new(), vec![], offsets, link);
        assert_eq!(f.next_backoff(), Duration::ZERO);
        assert_eq!(f.next_backoff(), Duration::from_secs(1));
        assert_eq!(f.next_backoff(), Duration::from_secs(2));
        assert_eq!(f.next_backoff(), Duration::from_secs(4));
        for _ in 0..10 {
            f.next_backoff();
        }
        assert_eq!(f.next_backoff(), MAX_BACKOFF);
        // A calm minute starts over.
        f.last_replaced = Some(Instant::now() - CALM);
        assert_eq!(f.next_backoff(), Duration::ZERO);
    }
}
