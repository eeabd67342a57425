//! Draining deferred work: the defer topic consumed back as a Sheddable source.
//!
//! Deferred records are the first to give up under load, so the drain classifies every
//! record as [`Criticality::Sheddable`] whatever its headers say; the deadline written by the
//! sink (`triage-deadline-ms`) is honoured, so work that is no longer useful expires at
//! dequeue. Pulling it only while the Sheddable tier is admitted is the runtime's job
//! (`Runtime::attach_drain`); this module only builds the source.

use triage::Criticality;

use crate::source::{KafkaSourceBuilder, KafkaSourceConfig};
use crate::KafkaSource;

/// A builder for a source over the defer topics in `config.topics`: every record is
/// Sheddable, and the topics are trusted for the deadline header the sink wrote.
///
/// # Examples
///
/// ```no_run
/// use triage_kafka::{drain, KafkaSourceConfig};
///
/// let config = KafkaSourceConfig::new("127.0.0.1:9092", "billing-drain", ["orders.deferred"]);
/// let drain = drain::builder(config).build()?;
/// # let _ = drain;
/// # Ok::<(), triage_kafka::Error>(())
/// ```
pub fn builder(mut config: KafkaSourceConfig) -> KafkaSourceBuilder {
    for topic in &config.topics {
        if !config.criticality.trusted_topics.contains(topic) {
            config.criticality.trusted_topics.push(topic.clone());
        }
    }
    KafkaSource::builder(config).classifier(|_| Some(Criticality::Sheddable))
}
