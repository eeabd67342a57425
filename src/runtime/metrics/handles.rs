//! The handles of every metric the runtime records, registered once when a runtime is built,
//! so that recording a value looks nothing up. The names, their help and their buckets are
//! in the module above.

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

use super::*;
use crate::runtime::refusal::Refusal;
use crate::{Criticality, PerTier};

/// `waited` label values of `triage_handed_back_total`: where a message handed back waited.
pub(crate) const WAITED: [&str; 3] = ["queued", "held", "parked"];

/// `outcome` label values of `triage_handed_back_total`.
pub(crate) const HAND_BACK_OUTCOMES: [&str; 2] = ["deferred", "released"];

/// Index of `deferred` in [`HAND_BACK_OUTCOMES`].
pub(crate) const HANDED_BACK_DEFERRED: usize = 0;

/// Index of `released` in [`HAND_BACK_OUTCOMES`].
pub(crate) const HANDED_BACK_RELEASED: usize = 1;

pub(crate) struct TierMetrics {
    pub(crate) consumed: Counter,
    pub(crate) admitted: Counter,
    pub(crate) refused: [Counter; Refusal::COUNT],
    pub(crate) shed: [Counter; Refusal::COUNT],
    pub(crate) decisions: [Counter; 6],
    pub(crate) bucket_fill: Gauge,
    pub(crate) deferred: Counter,
    pub(crate) too_late_to_defer: Counter,
    pub(crate) expired: Counter,
    pub(crate) expired_at_intake: Counter,
    pub(crate) completed: Counter,
    pub(crate) goodput: Counter,
    pub(crate) failed: Counter,
    pub(crate) retries: Counter,
    pub(crate) released: Counter,
    /// Indexed by where it waited ([`WAITED`]) and outcome ([`HAND_BACK_OUTCOMES`]).
    pub(crate) handed_back: [[Counter; HAND_BACK_OUTCOMES.len()]; WAITED.len()],
    pub(crate) backpressure: Counter,
    pub(crate) withdrawn: Counter,
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
    pub(crate) cohorts_admitted: Gauge,
    pub(crate) config_generation: Gauge,
    pub(crate) config_refused: Counter,
    pub(crate) forced_shed_level: Gauge,
    pub(crate) brownout_level: Gauge,
    pub(crate) arrival_rate: Gauge,
    pub(crate) capacity: Gauge,
    pub(crate) lag: Gauge,
    pub(crate) in_flight: Gauge,
    pub(crate) limit: Gauge,
    pub(crate) held: Gauge,
    pub(crate) ordering_keys: Gauge,
    pub(crate) ordering_parked: Gauge,
    pub(crate) ordering_longest_wait: Gauge,
    pub(crate) ordering_wait: Histogram,
    pub(crate) circuits_open: Gauge,
    pub(crate) circuits_opened: Counter,
    pub(crate) breaker_untracked: Counter,
    pub(crate) memory_held: Gauge,
    pub(crate) memory_budget: Gauge,
    pub(crate) reject_cost: Histogram,
}

impl Metrics {
    pub(crate) fn register() -> Self {
        describe();
        let tiers = PerTier::from_fn(|tier: Criticality| {
            let t = tier.as_str();
            TierMetrics {
                consumed: counter!(CONSUMED.name, "tier" => t),
                admitted: counter!(ADMITTED.name, "tier" => t),
                refused: Refusal::ALL
                    .map(|r| counter!(REFUSED.name, "tier" => t, "reason" => r.label())),
                shed: Refusal::ALL.map(|r| counter!(SHED.name, "tier" => t, "reason" => r.label())),
                decisions: crate::admission::Decision::ALL
                    .map(|d| counter!(DECISIONS.name, "tier" => t, "decision" => d.as_str())),
                bucket_fill: gauge!(BUCKET_FILL.name, "tier" => t),
                deferred: counter!(DEFERRED.name, "tier" => t),
                too_late_to_defer: counter!(TOO_LATE_TO_DEFER.name, "tier" => t),
                expired: counter!(EXPIRED.name, "tier" => t),
                expired_at_intake: counter!(EXPIRED_AT_INTAKE.name, "tier" => t),
                completed: counter!(COMPLETED.name, "tier" => t),
                goodput: counter!(GOODPUT.name, "tier" => t),
                failed: counter!(FAILED.name, "tier" => t),
                retries: counter!(RETRIES.name, "tier" => t),
                released: counter!(RELEASED.name, "tier" => t),
                handed_back: WAITED.map(|w| {
                    HAND_BACK_OUTCOMES.map(
                        |o| counter!(HANDED_BACK.name, "tier" => t, "waited" => w, "outcome" => o),
                    )
                }),
                backpressure: counter!(BACKPRESSURE.name, "tier" => t),
                withdrawn: counter!(CIRCUIT_WITHDRAWN.name, "tier" => t),
                depth: gauge!(QUEUE_DEPTH.name, "tier" => t),
                age: gauge!(QUEUE_AGE.name, "tier" => t),
                sojourn: histogram!(SOJOURN.name, "tier" => t),
                latency: histogram!(HANDLER_LATENCY.name, "tier" => t),
            }
        });
        Metrics {
            tiers,
            defer_failures: counter!(DEFER_FAILURES.name),
            defer_rejected: counter!(DEFER_REJECTED.name),
            dead_letter_retries: counter!(DEAD_LETTER_RETRIES.name),
            dead_letter_references: counter!(DEAD_LETTER_REFERENCES.name),
            dead_letter_rejected: counter!(DEAD_LETTER_REJECTED.name),
            dead_letters_held: gauge!(DEAD_LETTERS_HELD.name),
            panics: counter!(PANICS.name),
            shed_level: gauge!(SHED_LEVEL.name),
            cohorts_admitted: gauge!(COHORTS_ADMITTED.name),
            config_generation: gauge!(CONFIG_GENERATION.name),
            config_refused: counter!(CONFIG_REFUSED.name),
            forced_shed_level: gauge!(FORCED_SHED_LEVEL.name),
            brownout_level: gauge!(BROWNOUT_LEVEL.name),
            arrival_rate: gauge!(ARRIVAL_RATE.name),
            capacity: gauge!(CAPACITY.name),
            lag: gauge!(LAG.name),
            in_flight: gauge!(IN_FLIGHT.name),
            limit: gauge!(CONCURRENCY_LIMIT.name),
            held: gauge!(HELD.name),
            ordering_keys: gauge!(ORDERING_KEYS.name),
            ordering_parked: gauge!(ORDERING_PARKED.name),
            ordering_longest_wait: gauge!(ORDERING_LONGEST_WAIT.name),
            ordering_wait: histogram!(ORDERING_WAIT.name),
            circuits_open: gauge!(CIRCUITS_OPEN.name),
            circuits_opened: counter!(CIRCUITS_OPENED.name),
            breaker_untracked: counter!(BREAKER_UNTRACKED.name),
            memory_held: gauge!(MEMORY_HELD.name),
            memory_budget: gauge!(MEMORY_BUDGET.name),
            reject_cost: histogram!(REJECT_COST.name),
        }
    }
}
