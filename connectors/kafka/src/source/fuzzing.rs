//! The source's classification of one record, reachable from outside the crate for the fuzz
//! targets (`fuzz/`) only: feature `fuzzing`, hidden from the docs, no stability promise.
//!
//! It runs what the poll loop runs for each record, minus the broker: the configured
//! classifier on the record's metadata, and the mapping of its wall-clock deadline onto the
//! monotonic clock.

use std::time::SystemTime;

use triage::quanta::Instant;
use triage::Criticality;

use super::classify::{Anchor, Classifier, MessageMeta, UnclassifiedReason};
use super::config::KafkaSourceConfig;
use super::ClassifyFn;

/// What the source decided about one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classification {
    /// The tier, before any retry demotion.
    pub criticality: Criticality,
    /// The absolute deadline, Unix milliseconds.
    pub deadline_ms: Option<i64>,
    /// That deadline on the clock of `now` (see [`classify`]).
    pub deadline: Option<Instant>,
    /// The label problem counted, if any.
    pub tier_problem: Option<UnclassifiedReason>,
    /// The deadline problem counted, if any.
    pub deadline_problem: Option<UnclassifiedReason>,
    /// The count problem counted, if any.
    pub count_problem: Option<UnclassifiedReason>,
    /// `triage-attempt` as read.
    pub attempt: u32,
    /// `triage-deferrals` as read.
    pub deferrals: u32,
}

/// The record's metadata, as the poll loop builds it.
pub fn meta<'a>(
    topic: &'a str,
    partition: i32,
    offset: i64,
    key: Option<&'a [u8]>,
    headers: &'a [(String, Option<Vec<u8>>)],
    timestamp_ms: Option<i64>,
) -> MessageMeta<'a> {
    MessageMeta {
        topic,
        partition,
        offset,
        key,
        headers,
        timestamp_ms,
    }
}

/// Classifies `meta` under `config` (and the user's closure, if any), mapping its deadline
/// onto the clock that read `now` while the wall clock read `wall`.
pub fn classify(
    config: &KafkaSourceConfig,
    user: Option<ClassifyFn>,
    meta: &MessageMeta<'_>,
    now: Instant,
    wall: SystemTime,
) -> Classification {
    let c = Classifier::new(config, user).classify(meta);
    let anchor = Anchor::at(now, wall);
    Classification {
        criticality: c.criticality,
        deadline_ms: c.deadline_ms,
        deadline: c.deadline_ms.map(|ms| anchor.deadline(ms)),
        tier_problem: c.tier_problem,
        deadline_problem: c.deadline_problem,
        count_problem: c.count_problem,
        attempt: c.attempt,
        deferrals: c.deferrals,
    }
}
