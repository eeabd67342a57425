//! The classifier's configuration: how a record's criticality and deadline are chosen (see
//! `classify.rs`), the `criticality` and `deadline` sections of [`KafkaSourceConfig`].
//!
//! [`KafkaSourceConfig`]: super::KafkaSourceConfig

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use triage::{wire, Criticality, PerTier};

/// How a message's criticality is chosen, first match wins: the builder's classifier
/// closure (if it returns `Some`), the [`header`](Self::header) on a trusted topic, the
/// topic's entry in [`topic_tiers`](Self::topic_tiers), then [`default_tier`](Self::default_tier).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriticalityConfig {
    /// Header carrying the label (`critical`, `high`, `medium`, `sheddable`, any ASCII case).
    /// Default `triage-criticality`.
    pub header: String,
    /// Topics whose producers are trusted to set the criticality and deadline headers; on any
    /// other topic those headers are ignored. Default empty (headers never honoured).
    pub trusted_topics: Vec<String>,
    /// Tier of every message of a topic, when no trusted header decides. Default empty.
    pub topic_tiers: BTreeMap<String, Criticality>,
    /// Tier for messages with a missing, unknown, malformed or duplicated label and no topic
    /// tier (each counted in `triage_kafka_unclassified_total`). Default `medium`.
    pub default_tier: Criticality,
}

impl Default for CriticalityConfig {
    fn default() -> Self {
        CriticalityConfig {
            header: wire::CRITICALITY.into(),
            trusted_topics: Vec::new(),
            topic_tiers: BTreeMap::new(),
            default_tier: Criticality::Medium,
        }
    }
}

/// How a message's deadline is chosen: the [`header`](Self::header) (on a trusted topic),
/// else the record timestamp plus the tier's [`window_ms`](Self::window_ms), else none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadlineConfig {
    /// Header carrying an absolute deadline as decimal Unix milliseconds. Default
    /// `triage-deadline-ms`.
    pub header: String,
    /// Per tier, how long after its timestamp a message stays useful, in milliseconds;
    /// `None` never expires. Default: critical `None`, high 300000 (5 min), medium 900000
    /// (15 min), sheddable 3600000 (1 h). Allowed `1..=31_536_000_000` (a year).
    pub window_ms: PerTier<Option<u64>>,
}

impl Default for DeadlineConfig {
    fn default() -> Self {
        DeadlineConfig {
            header: wire::DEADLINE_MS.into(),
            window_ms: PerTier::new(None, Some(300_000), Some(900_000), Some(3_600_000)),
        }
    }
}
