//! The source's classification of one delivery, reachable from outside the crate for the fuzz
//! targets (`fuzz/`) only: feature `fuzzing`, hidden from the docs, no stability promise.
//!
//! It runs what the source runs for each delivery, minus the broker: the configured
//! classifier on the delivery's properties, and the mapping of its wall-clock deadline onto the
//! monotonic clock.

use lapin::BasicProperties;
use triage::quanta::Instant;
use triage::Criticality;

use super::classify::{deadline_at, Classifier};
use super::classify_config::{ClassifyConfig, DeadlineConfig};
use crate::metrics::Unclassified;

/// What the source decided about one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classification {
    /// The tier, before any retry demotion.
    pub criticality: Criticality,
    /// Why the tier is the default one (`missing`, `unknown`, `malformed`), if it is.
    pub unclassified: Option<&'static str>,
    /// `triage-attempt` as read.
    pub attempt: u32,
    /// `triage-deferrals` as read.
    pub deferrals: u32,
    /// The absolute deadline, Unix milliseconds.
    pub deadline_unix_ms: Option<u64>,
    /// That deadline on the clock of `now` (see [`classify`]).
    pub deadline: Option<Instant>,
}

/// Classifies a delivery of `queue` (of `tier` when the source reads a queue per tier) with
/// `props`, received when the clock read `now` and the wall clock `now_unix_ms`.
pub fn classify(
    classify: ClassifyConfig,
    deadline: DeadlineConfig,
    queue: &str,
    tier: Option<Criticality>,
    props: &BasicProperties,
    now: Instant,
    now_unix_ms: u64,
) -> Classification {
    let c = Classifier::new(classify, deadline, queue, tier).classify(props, now_unix_ms);
    Classification {
        criticality: c.criticality,
        unclassified: c.unclassified.map(|u| match u {
            Unclassified::Missing => "missing",
            Unclassified::Unknown => "unknown",
            Unclassified::Malformed => "malformed",
        }),
        attempt: c.attempt,
        deferrals: c.deferrals,
        deadline_unix_ms: c.deadline_unix_ms,
        deadline: c
            .deadline_unix_ms
            .map(|at| deadline_at(now, now_unix_ms, at)),
    }
}
