//! Draining deferred work: the defer topic consumed back as a source.
//!
//! Each copy keeps the tier it was deferred with: the defer sink wrote it in
//! `triage-criticality` (the tier as classified at the source, before retry demotion), with
//! the retries so far in `triage-attempt` and the deferrals so far in `triage-deferrals`, and
//! the drain reads all three (the defer topics are trusted for them), so a Medium record
//! deferred once comes back as Medium with one deferral, and a record deferred after two
//! retries keeps its demotion and the rest of its retry budget. The deadline the sink wrote
//! (`triage-deadline-ms`) is honoured too, so work that is no longer useful expires rather than
//! being served. A record on a defer topic without a label (not written by triage) gets the
//! configuration's topic tier or default tier, counted as `missing`.
//!
//! Pulling the drain only while the load allows, and never deferring its records again
//! beyond the configured maximum, is the runtime's job (`Runtime::attach_drain`); this module
//! only builds the source. The header names are the core's wire contract, [`triage::wire`].

use crate::source::{KafkaSourceBuilder, KafkaSourceConfig};
use crate::KafkaSource;

/// A builder for a source over the defer topics in `config.topics`, which it marks trusted
/// so that the tier, retry count, deferral count and deadline written by the defer sink are
/// read back.
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
    KafkaSource::builder(config)
}
