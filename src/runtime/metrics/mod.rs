//! Every metric the runtime records, named, described (`# HELP`) and registered in one place.
//! This module has no public items: it is the reference of the metric names. The histograms'
//! bucket bounds are set here too, beside their names, and applied by `observe::serve`.
//!
//! Names are under `triage_`; labels are from small fixed sets (`tier`, `reason`, `decision`), never from
//! message content. Handles are registered once at start, so recording is an atomic add on a
//! handle: no lookup, no allocation, no formatting on the hot path. What every message records
//! is not recorded on its handle per message: `triage_consumed_total`,
//! `triage_admitted_total`, `triage_completed_total`, `triage_goodput_total`, the expiries at
//! dequeue in `triage_expired_total`, `triage_sojourn_seconds` and
//! `triage_handler_latency_seconds` are counted per thread (`metric_counts.rs`), and
//! `triage_refused_total` and `triage_admission_decisions_total` in the runtime's own counters;
//! the sampler adds them to the metrics every `expert.admission.tick_ms` (100 ms) and at shutdown, so
//! a scrape lags them by one tick at most (see `accounts::RefusalCounts` and `crate::sync` for
//! why). Without a recorder installed
//! (see `metrics::set_global_recorder`, or the `prometheus` feature) every handle is a no-op.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `triage_consumed_total` | counter | tier | messages taken from sources |
//! | `triage_admitted_total` | counter | tier | messages accepted into the queue |
//! | `triage_refused_total` | counter | tier, reason | admission decisions against a message: `overloaded`, `full`, `too_large`, `evicted`, `circuit` (its downstream's circuit open), `rate` (token bucket empty), `memory` (memory budget), `forced` (the operator's `forced_shed_level`) |
//! | `triage_admission_decisions_total` | counter | tier, decision | each consumed message's first admission decision: `admitted`, `shed-capacity`, `shed-rate`, `shed-circuit`, `shed-expired`, `shed-memory`; they add up to the messages consumed |
//! | `triage_shed_total` | counter | tier, reason | messages ending `Shed` (acknowledged, dropped by policy) |
//! | `triage_deferred_total` | counter | tier | messages ending `Deferred` (broker confirmed) |
//! | `triage_too_late_to_defer_total` | counter | tier | of the shed, refused messages of a Defer tier shed rather than deferred: their deadline is closer than the soonest a drain is expected to bring a copy back: `expert.admission.recover_ms` plus the time shedding has lasted (an overload that has lasted `T` taken to last `T` more), the time the operator's forced level has been up, or the backlog (lag, queued and held) over the estimated capacity |
//! | `triage_defer_failures_total` | counter | | defer publishes that failed in transport (message fell back to backpressure, sink marked unhealthy) |
//! | `triage_defer_rejected_total` | counter | | deferrals the sink refused for good (message sent to the dead-letter path) |
//! | `triage_dead_letter_retries_total` | counter | | dead-letter publishes that failed in transport and were retried |
//! | `triage_dead_letter_references_total` | counter | | reference copies published in place of a dead letter refused for good |
//! | `triage_dead_letter_rejected_total` | counter | | messages whose dead letter and reference copy were both refused for good (held unacknowledged) |
//! | `triage_dead_letters_held` | gauge | | messages held unacknowledged because their dead letter was refused for good |
//! | `triage_expired_total` | counter | tier | messages ending `Expired` (past their deadline: at intake, held, or at dequeue) |
//! | `triage_expired_at_intake_total` | counter | tier | of those, expired at intake from headers alone, before any queueing |
//! | `triage_completed_total` | counter | tier | handler successes |
//! | `triage_goodput_total` | counter | tier | handler successes inside the deadline |
//! | `triage_failed_total` | counter | tier | messages ending `Failed` (dead-lettered) |
//! | `triage_retries_total` | counter | tier | retries scheduled (each demoted one level) |
//! | `triage_handler_panics_total` | counter | | handler panics caught |
//! | `triage_released_total` | counter | tier | messages handed back unacknowledged (shutdown, or before their source's patience ran out) |
//! | `triage_handed_back_total` | counter | tier, waited, outcome | messages handed back before their source's patience ran out (RabbitMQ's `consumer_timeout`), by where they waited (`queued`, `held`, `parked`) and what became of them (`deferred`, `released`) |
//! | `triage_backpressure_total` | counter | tier | messages held because their tier's policy is backpressure |
//! | `triage_queue_depth` | gauge | tier | items queued |
//! | `triage_queue_age_seconds` | gauge | tier | queue age the tier sees (oldest item at or above it) |
//! | `triage_shed_level` | gauge | | tiers refused by pull-based admission, 0..=3 (bottom prefix of the ladder) |
//! | `triage_cohorts_admitted` | gauge | | of the highest tier pull-based admission refuses, the cohorts (slices of its users, 0..=128) admitted all the same |
//! | `triage_config_generation` | gauge | | configuration in force: 1 at start, one more per applied reconfiguration |
//! | `triage_config_refused_total` | counter | | reconfigurations and reloads refused (invalid value, unreadable or unparsable file): the configuration in force stayed |
//! | `triage_forced_shed_level` | gauge | | tiers refused by the operator's switch (`forced_shed_level`), 0..=3 |
//! | `triage_brownout_level` | gauge | | the operator's brownout level handlers read (`brownout_level`), 0 for full service |
//! | `triage_arrival_rate` | gauge | | arrival rate pull-based admission infers (pulling + lag trend), messages/s |
//! | `triage_capacity` | gauge | | capacity it measures (limit / mean handler time), messages/s |
//! | `triage_lag` | gauge | | messages waiting in the brokers for the attached sources (-1: unknown) |
//! | `triage_in_flight` | gauge | | handlers running |
//! | `triage_concurrency_limit` | gauge | | current concurrency limit |
//! | `triage_held` | gauge | | messages held by backpressure |
//! | `triage_ordering_keys_in_flight` | gauge | | ordering keys with a message inside the runtime (queued, held, running, retrying) |
//! | `triage_ordering_parked` | gauge | | messages waiting behind a busy key in the key gate |
//! | `triage_ordering_longest_wait_seconds` | gauge | | how long the longest-waiting parked message has waited behind its key |
//! | `triage_ordering_wait_seconds` | histogram | | time a message waited behind its key before the gate let it through |
//! | `triage_circuit_withdrawn_total` | counter | tier | admitted messages taken back before a handler call because their downstream's circuit opened while they were queued |
//! | `triage_circuits_open` | gauge | | downstream circuits not closed (open or half-open) |
//! | `triage_circuits_opened_total` | counter | | times a downstream circuit opened (from closed, or again after a failed probe) |
//! | `triage_breaker_untracked_total` | counter | | messages whose downstream key was not tracked because `expert.breaker.max_keys` keys already were |
//! | `triage_bucket_fill_ratio` | gauge | tier | tokens in the tier's bucket over its burst, 0 to 1 (1 for a tier without a bucket) |
//! | `triage_memory_held_bytes` | gauge | | payload bytes held by the process: queued, held, deferring, waiting to retry, in a handler |
//! | `triage_memory_budget_bytes` | gauge | | the memory budget, bytes (0: none) |
//! | `triage_sojourn_seconds` | histogram | tier | time from enqueue to dequeue |
//! | `triage_handler_latency_seconds` | histogram | tier | handler run time |
//! | `triage_reject_cost_seconds` | histogram | | cost of the admit-or-refuse decision for refused messages, sampled 1 in 64, moved into the histogram once per admission tick (the refuse path allocates nothing) |

mod handles;

use metrics::Unit;

pub(crate) use handles::{Metrics, HANDED_BACK_DEFERRED, HANDED_BACK_RELEASED};

/// What a metric is, for its `# TYPE` and `# HELP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric: its name, kind, unit, `# HELP` text and, for a histogram, its bucket bounds.
/// Each metric is written exactly once, as one of the constants below.
#[derive(Debug)]
pub(crate) struct Def {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    unit: Option<Unit>,
    help: &'static str,
    /// Upper bounds of the histogram's buckets, in the metric's unit (empty unless a histogram).
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) buckets: &'static [f64],
}

const fn counter_def(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        kind: Kind::Counter,
        unit: Some(Unit::Count),
        help,
        buckets: &[],
    }
}

const fn gauge_def(name: &'static str, unit: Option<Unit>, help: &'static str) -> Def {
    Def {
        name,
        kind: Kind::Gauge,
        unit,
        help,
        buckets: &[],
    }
}

const fn seconds_histogram(name: &'static str, buckets: &'static [f64], help: &'static str) -> Def {
    Def {
        name,
        kind: Kind::Histogram,
        unit: Some(Unit::Seconds),
        help,
        buckets,
    }
}

/// Buckets for time spent waiting or working, in seconds: 0.5 ms to 10 s, with bounds at the
/// default queue-age cut-offs (20, 80, 200, 400 ms) and around the usual deadline windows
/// (100 ms to 3 s), so `histogram_quantile` resolves what admission and deadlines act on.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.2, 0.4, 0.8, 1.0, 1.5, 3.0, 5.0,
    10.0,
];

/// Buckets for the reject path's cost, in seconds: 100 ns to 1 ms. A refusal is meant to cost
/// well under a microsecond (the seeds' "cost of rejection"); the upper buckets show it
/// growing toward the cost of serving, where shedding stops helping.
const REJECT_COST_BUCKETS: &[f64] = &[
    1e-7, 2.5e-7, 5e-7, 1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 1e-3,
];

pub(crate) const CONSUMED: Def = counter_def(
    "triage_consumed_total",
    "Messages taken from sources, by tier as classified.",
);
pub(crate) const ADMITTED: Def = counter_def(
    "triage_admitted_total",
    "Messages accepted into the queue, by tier.",
);
pub(crate) const REFUSED: Def = counter_def(
    "triage_refused_total",
    "Admission decisions against a message, by tier and reason (overloaded, full, too_large, evicted, circuit, rate, memory, forced); a held message refused again counts again.",
);
pub(crate) const DECISIONS: Def = counter_def(
    "triage_admission_decisions_total",
    "Each consumed message's first admission decision, by tier and decision (admitted, shed-capacity, shed-rate, shed-circuit, shed-expired, shed-memory); the decisions add up to the messages consumed.",
);
pub(crate) const SHED: Def = counter_def(
    "triage_shed_total",
    "Messages ending Shed: acknowledged and dropped by policy, by tier and reason.",
);
pub(crate) const DEFERRED: Def = counter_def(
    "triage_deferred_total",
    "Messages ending Deferred: published to the defer store and confirmed by the broker, by tier.",
);
pub(crate) const DEFER_FAILURES: Def = counter_def(
    "triage_defer_failures_total",
    "Defer publishes that failed in transport; the message fell back to backpressure and the sink is marked unhealthy.",
);
pub(crate) const DEFER_REJECTED: Def = counter_def(
    "triage_defer_rejected_total",
    "Deferrals the defer sink refused for good; the message went to the dead-letter path.",
);
pub(crate) const DEAD_LETTER_RETRIES: Def = counter_def(
    "triage_dead_letter_retries_total",
    "Dead-letter publishes that failed in transport and were retried.",
);
pub(crate) const DEAD_LETTER_REFERENCES: Def = counter_def(
    "triage_dead_letter_references_total",
    "Reference copies published in place of a dead letter the sink refused for good.",
);
pub(crate) const DEAD_LETTER_REJECTED: Def = counter_def(
    "triage_dead_letter_rejected_total",
    "Messages whose dead letter and reference copy were both refused for good (held unacknowledged).",
);
pub(crate) const DEAD_LETTERS_HELD: Def = gauge_def(
    "triage_dead_letters_held",
    Some(Unit::Count),
    "Messages held unacknowledged because their dead letter was refused for good.",
);
pub(crate) const TOO_LATE_TO_DEFER: Def = counter_def(
    "triage_too_late_to_defer_total",
    "Of the shed messages, those of a Defer tier shed rather than deferred: deadline closer than the soonest a drain is expected to bring a copy back (recover_ms plus the time shedding has lasted, the time the forced level has been up, or the backlog over the capacity), by tier.",
);
pub(crate) const EXPIRED: Def = counter_def(
    "triage_expired_total",
    "Messages discarded past their deadline without being served (at intake, held or at dequeue), by tier.",
);
pub(crate) const EXPIRED_AT_INTAKE: Def = counter_def(
    "triage_expired_at_intake_total",
    "Of the expired messages, those pulled already past their deadline and expired from their headers alone, by tier.",
);
pub(crate) const COMPLETED: Def = counter_def(
    "triage_completed_total",
    "Handler successes, by tier (inside the deadline or not).",
);
pub(crate) const GOODPUT: Def = counter_def(
    "triage_goodput_total",
    "Handler successes inside the message's deadline (goodput), by tier.",
);
pub(crate) const FAILED: Def = counter_def(
    "triage_failed_total",
    "Messages ending Failed (dead-lettered), by tier.",
);
pub(crate) const RETRIES: Def = counter_def(
    "triage_retries_total",
    "Retries scheduled after a retryable handler error, by tier before demotion (each retry is demoted one tier).",
);
pub(crate) const PANICS: Def = counter_def(
    "triage_handler_panics_total",
    "Handler panics caught (the message is treated as a failure).",
);
pub(crate) const RELEASED: Def = counter_def(
    "triage_released_total",
    "Messages handed back to the source unacknowledged (shutdown, or before the source's patience ran out), by tier.",
);
pub(crate) const HANDED_BACK: Def = counter_def(
    "triage_handed_back_total",
    "Messages handed back before their source's patience ran out (RabbitMQ's consumer_timeout), by tier, where they waited (queued, held, parked) and outcome (deferred, released).",
);
pub(crate) const BACKPRESSURE: Def = counter_def(
    "triage_backpressure_total",
    "Messages held because their tier's refusal policy is backpressure, by tier.",
);
pub(crate) const QUEUE_DEPTH: Def = gauge_def(
    "triage_queue_depth",
    Some(Unit::Count),
    "Messages in the queue, by tier.",
);
pub(crate) const QUEUE_AGE: Def = gauge_def(
    "triage_queue_age_seconds",
    Some(Unit::Seconds),
    "Queue age each tier sees: sojourn of the oldest queued message at or above the tier, seconds.",
);
pub(crate) const SHED_LEVEL: Def = gauge_def(
    "triage_shed_level",
    None,
    "Tiers refused by pull-based admission (arrival beyond capacity), 0 (all admitted) to 3 (Critical only), lowest tiers first.",
);
pub(crate) const COHORTS_ADMITTED: Def = gauge_def(
    "triage_cohorts_admitted",
    None,
    "Of the highest tier refused by pull-based admission, the cohorts (slices of its users by a stable hash, 0 to 128) admitted all the same: the capacity left.",
);
pub(crate) const CONFIG_GENERATION: Def = gauge_def(
    "triage_config_generation",
    None,
    "Generation of the configuration in force: 1 at start, one more per reconfiguration applied live (a refused one changes nothing).",
);
pub(crate) const CONFIG_REFUSED: Def = counter_def(
    "triage_config_refused_total",
    "Reconfigurations and configuration reloads refused (a value out of range, a file that could not be read or parsed); the configuration in force stayed.",
);
pub(crate) const FORCED_SHED_LEVEL: Def = gauge_def(
    "triage_forced_shed_level",
    None,
    "Tiers refused by the operator's switch (forced_shed_level) whatever the signals, 0 (none) to 3 (Critical only), lowest tiers first.",
);
pub(crate) const BROWNOUT_LEVEL: Def = gauge_def(
    "triage_brownout_level",
    None,
    "The operator's brownout level (brownout_level) that handlers read to do less work, 0 for full service.",
);
pub(crate) const ARRIVAL_RATE: Def = gauge_def(
    "triage_arrival_rate",
    None,
    "Arrival rate inferred by pull-based admission (pulling rate plus lag trend), messages per second.",
);
pub(crate) const CAPACITY: Def = gauge_def(
    "triage_capacity",
    None,
    "Capacity measured by pull-based admission (concurrency limit / mean handler time), messages per second.",
);
pub(crate) const LAG: Def = gauge_def(
    "triage_lag",
    Some(Unit::Count),
    "Messages waiting in the brokers for the attached sources (-1 when a source cannot tell).",
);
pub(crate) const IN_FLIGHT: Def = gauge_def(
    "triage_in_flight",
    Some(Unit::Count),
    "Handlers running now.",
);
pub(crate) const CONCURRENCY_LIMIT: Def = gauge_def(
    "triage_concurrency_limit",
    Some(Unit::Count),
    "Current concurrency limit (fixed, AIMD or Gradient2).",
);
pub(crate) const HELD: Def = gauge_def(
    "triage_held",
    Some(Unit::Count),
    "Messages held by backpressure, waiting to be admitted.",
);
pub(crate) const ORDERING_KEYS: Def = gauge_def(
    "triage_ordering_keys_in_flight",
    Some(Unit::Count),
    "Ordering keys with a message inside the runtime (queued, held, running or retrying).",
);
pub(crate) const ORDERING_PARKED: Def = gauge_def(
    "triage_ordering_parked",
    Some(Unit::Count),
    "Messages waiting behind a busy key in the key gate.",
);
pub(crate) const ORDERING_LONGEST_WAIT: Def = gauge_def(
    "triage_ordering_longest_wait_seconds",
    Some(Unit::Seconds),
    "How long the longest-waiting parked message has waited behind its key, seconds.",
);
pub(crate) const ORDERING_WAIT: Def = seconds_histogram(
    "triage_ordering_wait_seconds",
    LATENCY_BUCKETS,
    "Time a message waited behind its key before the key gate let it through, seconds.",
);
pub(crate) const CIRCUIT_WITHDRAWN: Def = counter_def(
    "triage_circuit_withdrawn_total",
    "Admitted messages taken back before a handler call because their downstream's circuit opened while they were queued, by tier; they went to the tier's refusal policy.",
);
pub(crate) const CIRCUITS_OPEN: Def = gauge_def(
    "triage_circuits_open",
    Some(Unit::Count),
    "Downstream circuits not closed (open or half-open): their messages are refused with reason circuit.",
);
pub(crate) const CIRCUITS_OPENED: Def = counter_def(
    "triage_circuits_opened_total",
    "Times a downstream circuit opened (from closed, or again after a failed half-open probe).",
);
pub(crate) const BREAKER_UNTRACKED: Def = counter_def(
    "triage_breaker_untracked_total",
    "Messages whose downstream key was not tracked (admitted without a breaker) because breaker.max_keys keys already were.",
);
pub(crate) const BUCKET_FILL: Def = gauge_def(
    "triage_bucket_fill_ratio",
    None,
    "Tokens in the tier's token bucket over its burst, 0 (empty: refusing with reason rate) to 1 (full); 1 for a tier without a bucket.",
);
pub(crate) const MEMORY_HELD: Def = gauge_def(
    "triage_memory_held_bytes",
    Some(Unit::Bytes),
    "Payload bytes held by the process (queued, held by backpressure, deferring, waiting to retry, in a handler), bytes.",
);
pub(crate) const MEMORY_BUDGET: Def = gauge_def(
    "triage_memory_budget_bytes",
    Some(Unit::Bytes),
    "The memory budget the bytes held are admitted against, bytes (0: no budget).",
);
pub(crate) const SOJOURN: Def = seconds_histogram(
    "triage_sojourn_seconds",
    LATENCY_BUCKETS,
    "Time from enqueue to dequeue (sojourn), by tier, seconds.",
);
pub(crate) const HANDLER_LATENCY: Def = seconds_histogram(
    "triage_handler_latency_seconds",
    LATENCY_BUCKETS,
    "Handler run time, by tier, seconds.",
);
pub(crate) const REJECT_COST: Def = seconds_histogram(
    "triage_reject_cost_seconds",
    REJECT_COST_BUCKETS,
    "Cost of the admit-or-refuse decision for refused messages, sampled 1 in 64, seconds.",
);

/// Every metric the runtime records.
// A slice, not an array: its length is no line for parallel changes to conflict on.
pub(crate) const ALL: &[&Def] = &[
    &CONSUMED,
    &ADMITTED,
    &REFUSED,
    &DECISIONS,
    &SHED,
    &DEFERRED,
    &DEFER_FAILURES,
    &DEFER_REJECTED,
    &DEAD_LETTER_RETRIES,
    &DEAD_LETTER_REFERENCES,
    &DEAD_LETTER_REJECTED,
    &DEAD_LETTERS_HELD,
    &TOO_LATE_TO_DEFER,
    &EXPIRED,
    &EXPIRED_AT_INTAKE,
    &COMPLETED,
    &GOODPUT,
    &FAILED,
    &RETRIES,
    &PANICS,
    &RELEASED,
    &HANDED_BACK,
    &BACKPRESSURE,
    &QUEUE_DEPTH,
    &QUEUE_AGE,
    &SHED_LEVEL,
    &COHORTS_ADMITTED,
    &CONFIG_GENERATION,
    &CONFIG_REFUSED,
    &FORCED_SHED_LEVEL,
    &BROWNOUT_LEVEL,
    &ARRIVAL_RATE,
    &CAPACITY,
    &LAG,
    &IN_FLIGHT,
    &CONCURRENCY_LIMIT,
    &HELD,
    &ORDERING_KEYS,
    &ORDERING_PARKED,
    &ORDERING_LONGEST_WAIT,
    &ORDERING_WAIT,
    &CIRCUIT_WITHDRAWN,
    &CIRCUITS_OPEN,
    &CIRCUITS_OPENED,
    &BREAKER_UNTRACKED,
    &BUCKET_FILL,
    &MEMORY_HELD,
    &MEMORY_BUDGET,
    &SOJOURN,
    &HANDLER_LATENCY,
    &REJECT_COST,
];

/// Bucket bounds of every histogram, by name, for the exporter (`observe::serve`).
#[cfg(feature = "prometheus")]
pub(crate) fn histogram_buckets() -> impl Iterator<Item = (&'static str, &'static [f64])> {
    ALL.iter()
        .filter(|d| d.kind == Kind::Histogram)
        .map(|d| (d.name, d.buckets))
}

/// Gives every metric its `# HELP` text and unit on the installed recorder (a no-op without
/// one). Called when a runtime registers its handles, so a recorder installed before the
/// runtime starts (as `observe::serve` requires) has the descriptions.
pub(crate) fn describe() {
    metrics::with_recorder(|recorder| {
        for def in ALL {
            let (name, unit, help) = (def.name.into(), def.unit, def.help.into());
            match def.kind {
                Kind::Counter => recorder.describe_counter(name, unit, help),
                Kind::Gauge => recorder.describe_gauge(name, unit, help),
                Kind::Histogram => recorder.describe_histogram(name, unit, help),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The table in the module docs and the definitions name the same metrics, each once.
    #[test]
    fn docs_table_and_definitions_agree() {
        let defined: Vec<&str> = ALL.iter().map(|d| d.name).collect();
        let unique: BTreeSet<&str> = defined.iter().copied().collect();
        assert_eq!(unique.len(), defined.len(), "a metric defined twice");
        let documented: BTreeSet<&str> = include_str!("mod.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        assert_eq!(documented, unique);
    }

    #[test]
    fn histograms_have_increasing_buckets_and_others_none() {
        for def in ALL {
            if def.kind == Kind::Histogram {
                assert!(def.name.ends_with("_seconds"), "{}", def.name);
                assert!(!def.buckets.is_empty(), "{}", def.name);
                assert!(
                    def.buckets.windows(2).all(|w| w[0] < w[1]),
                    "{}: {:?}",
                    def.name,
                    def.buckets
                );
            } else {
                assert!(def.buckets.is_empty(), "{}", def.name);
            }
            assert!(!def.help.is_empty(), "{}", def.name);
        }
    }
}
