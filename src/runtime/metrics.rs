//! Every metric the runtime records, named and registered in one place. This module has no
//! public items: it is the reference of the metric names.
//!
//! Names are under `triage_`; labels are from small fixed sets (`tier`, `reason`), never from
//! message content. Handles are registered once at start, so recording is an atomic add on a
//! handle: no lookup, no allocation, no formatting on the hot path. Without a recorder installed
//! (see `metrics::set_global_recorder`, or the `prometheus` feature) every handle is a no-op.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `triage_consumed_total` | counter | tier | messages taken from sources |
//! | `triage_admitted_total` | counter | tier | messages accepted into the queue |
//! | `triage_refused_total` | counter | tier, reason | admission decisions against a message: `overloaded`, `full`, `too_large`, `evicted` |
//! | `triage_shed_total` | counter | tier, reason | messages ending `Shed` (acknowledged, dropped by policy) |
//! | `triage_deferred_total` | counter | tier | messages ending `Deferred` (broker confirmed) |
//! | `triage_defer_failures_total` | counter | | defer publishes that failed in transport (message fell back to backpressure, sink marked unhealthy) |
//! | `triage_defer_rejected_total` | counter | | deferrals the sink refused for good (message sent to the dead-letter path) |
//! | `triage_dead_letter_retries_total` | counter | | dead-letter publishes that failed in transport and were retried |
//! | `triage_dead_letter_references_total` | counter | | reference copies published in place of a dead letter refused for good |
//! | `triage_dead_letter_rejected_total` | counter | | messages whose dead letter and reference copy were both refused for good (held unacknowledged) |
//! | `triage_dead_letters_held` | gauge | | messages held unacknowledged because their dead letter was refused for good |
//! | `triage_expired_total` | counter | tier | messages discarded at dequeue past their deadline |
//! | `triage_completed_total` | counter | tier | handler successes |
//! | `triage_goodput_total` | counter | tier | handler successes inside the deadline |
//! | `triage_failed_total` | counter | tier | messages ending `Failed` (dead-lettered) |
//! | `triage_retries_total` | counter | tier | retries scheduled (each demoted one level) |
//! | `triage_handler_panics_total` | counter | | handler panics caught |
//! | `triage_released_total` | counter | tier | messages handed back unacknowledged (shutdown) |
//! | `triage_backpressure_total` | counter | tier | messages held because their tier's policy is backpressure |
//! | `triage_queue_depth` | gauge | tier | items queued |
//! | `triage_queue_age_seconds` | gauge | tier | queue age the tier sees (oldest item at or above it) |
//! | `triage_shed_level` | gauge | | tiers refused by queue-age admission, 0..=4 |
//! | `triage_in_flight` | gauge | | handlers running |
//! | `triage_concurrency_limit` | gauge | | current concurrency limit |
//! | `triage_held` | gauge | | messages held by backpressure |
//! | `triage_sojourn_seconds` | histogram | tier | time from enqueue to dequeue |
//! | `triage_handler_latency_seconds` | histogram | tier | handler run time |
//! | `triage_reject_cost_seconds` | histogram | | cost of the admit-or-refuse decision for refused messages, sampled 1 in 1024 |

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use crate::queue::RefuseReason;
use crate::{Criticality, PerTier};

/// `reason` label values of `triage_refused_total` and `triage_shed_total`.
pub(crate) const REASONS: [&str; 4] = ["overloaded", "full", "too_large", "evicted"];

pub(crate) fn reason_index(reason: RefuseReason) -> usize {
    match reason {
        RefuseReason::Overloaded => 0,
        RefuseReason::Full => 1,
        RefuseReason::TooLarge => 2,
        _ => 0,
    }
}

pub(crate) const EVICTED: usize = 3;

pub(crate) struct TierMetrics {
    pub(crate) consumed: Counter,
    pub(crate) admitted: Counter,
    pub(crate) refused: [Counter; 4],
    pub(crate) shed: [Counter; 4],
    pub(crate) deferred: Counter,
    pub(crate) expired: Counter,
    pub(crate) completed: Counter,
    pub(crate) goodput: Counter,
    pub(crate) failed: Counter,
    pub(crate) retries: Counter,
    pub(crate) released: Counter,
    pub(crate) backpressure: Counter,
    pub(crate) depth: Gauge,
    pub(crate) age: Gauge,
    pub(crate) sojourn: Histogram,
    pub(crate) latency: Histogram,
}

pub(crate) struct Metrics {
    pub(crate) tiers: PerTier<TierMetrics>,
    pub(crate) defer_failures: Counter,
    pub(crate) defer_rejected: Counter,
    pub(crate) dead_letter_retries: Counter,
    pub(crate) dead_letter_references: Counter,
    pub(crate) dead_letter_rejected: Counter,
    pub(crate) dead_letters_held: Gauge,
    pub(crate) panics: Counter,
    pub(crate) shed_level: Gauge,
    pub(crate) in_flight: Gauge,
    pub(crate) limit: Gauge,
    pub(crate) held: Gauge,
    pub(crate) reject_cost: Histogram,
}

impl Metrics {
    pub(crate) fn register() -> Self {
        let tiers = PerTier::from_fn(|tier: Criticality| {
            let t = tier.as_str();
            TierMetrics {
                consumed: counter!("triage_consumed_total", "tier" => t),
                admitted: counter!("triage_admitted_total", "tier" => t),
                refused: REASONS
                    .map(|r| counter!("triage_refused_total", "tier" => t, "reason" => r)),
                shed: REASONS.map(|r| counter!("triage_shed_total", "tier" => t, "reason" => r)),
                deferred: counter!("triage_deferred_total", "tier" => t),
                expired: counter!("triage_expired_total", "tier" => t),
                completed: counter!("triage_completed_total", "tier" => t),
                goodput: counter!("triage_goodput_total", "tier" => t),
                failed: counter!("triage_failed_total", "tier" => t),
                retries: counter!("triage_retries_total", "tier" => t),
                released: counter!("triage_released_total", "tier" => t),
                backpressure: counter!("triage_backpressure_total", "tier" => t),
                depth: gauge!("triage_queue_depth", "tier" => t),
                age: gauge!("triage_queue_age_seconds", "tier" => t),
                sojourn: histogram!("triage_sojourn_seconds", "tier" => t),
                latency: histogram!("triage_handler_latency_seconds", "tier" => t),
            }
        });
        Metrics {
            tiers,
            defer_failures: counter!("triage_defer_failures_total"),
            defer_rejected: counter!("triage_defer_rejected_total"),
            dead_letter_retries: counter!("triage_dead_letter_retries_total"),
            dead_letter_references: counter!("triage_dead_letter_references_total"),
            dead_letter_rejected: counter!("triage_dead_letter_rejected_total"),
            dead_letters_held: gauge!("triage_dead_letters_held"),
            panics: counter!("triage_handler_panics_total"),
            shed_level: gauge!("triage_shed_level"),
            in_flight: gauge!("triage_in_flight"),
            limit: gauge!("triage_concurrency_limit"),
            held: gauge!("triage_held"),
            reject_cost: histogram!("triage_reject_cost_seconds"),
        }
    }
}
