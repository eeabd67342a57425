//! Admission: deciding, before any expensive work, whether a message may enter.
//!
//! Circuit breakers per downstream key ([`Breakers`]) refuse, before any handler call, the
//! messages bound for a dependency that is failing: see its docs.
//!
//! Two load signals, for two kinds of entry:
//!
//! - **Pulled messages** (Kafka, RabbitMQ, the in-memory broker) are admitted by
//!   [`PullAdmission`]: overload is arrival beyond capacity, inferred from the broker's lag
//!   trend, not a deep internal queue. A backlog with time left on its deadlines is served in
//!   order; what is past its deadline is expired at intake, from headers alone; lower tiers are
//!   refused (deferred, dropped or held, per their policy) only while the arrival rate exceeds
//!   the capacity and either the backlog would make the lowest admitted tier miss its
//!   deadlines or the excess is sustained: to reach the more important work behind them in
//!   time, or to absorb arrival the workers cannot serve. A burst that clears in time is not an
//!   overload. See its docs for the why.
//! - **Pushed messages** (`Runtime::try_submit`, an HTTP entry) are admitted by queue age,
//!   below: there the queue's age is the wait of callers at the door.
//!
//! # Queue age
//!
//! The signal is **queue age**, the wait of the oldest item, because it says whether anyone is
//! still waiting and it leads the collapse instead of trailing it as CPU does (the
//! load-shedding literature this design started from; CoDel makes the same argument for
//! sojourn time). Each tier has a cut-off: Critical
//! 400 ms, High 200 ms, Medium 80 ms, Sheddable 20 ms by default.
//!
//! # Why a queue age per tier
//!
//! In a FIFO every item waits behind the oldest one, so one age serves every tier. In a
//! weighted-fair queue that is false: a Sheddable backlog served at 1/15 of the rate can be
//! seconds old while Critical items leave within milliseconds. Using the global oldest age would
//! shed Critical work because Sheddable work is slow, the opposite of the intent. So the age a
//! tier sees is the age of the oldest item waiting at its level **or above**, which is what a
//! new item of that tier would queue behind. These ages are non-increasing up the ladder and the
//! cut-offs are too, so the shed tiers always form a bottom prefix and the decision fits in one
//! number (see [`QueueAgeAdmission`]).
//!
//! # The rest of the toolbox
//!
//! Checked for every message, pulled or pushed, at intake before the queue (one file each):
//!
//! - **Per-tier token buckets** ([`TierBuckets`], seed 003): steady-state admission at a rate
//!   and burst per tier, with borrowing along a configured chain (default: Critical may borrow
//!   from High). Refusal reason `rate`.
//! - **A memory budget** ([`MemoryBudget`], seeds 001/002, Envoy's overload manager): the
//!   payload bytes the process holds against a budget, with a threshold per tier. Refusal
//!   reason `memory`; the intake stops pulling while the next message might not fit.
//! - **The decision breakdown** ([`Decision`]): one counter per tier and first decision
//!   (admitted, shed-capacity, shed-rate, shed-circuit, shed-expired, shed-memory).
//!
//! Each refusal goes to the tier's refusal policy (backpressure, defer, drop) like any other
//! and ends in one disposition.

mod breaker;
mod breaker_config;
mod breakers;
mod bucket;
mod bucket_config;
mod buckets;
mod cohort;
mod cohort_arrival;
mod cohort_set;
mod config;
mod decision;
mod lookahead;
mod memory;
mod memory_config;
mod pull;
mod pull_config;
mod queue_age;

pub use breaker::{CircuitBreaker, CircuitState};
pub use breaker_config::BreakerConfig;
pub use breakers::{Breakers, Call, Outcome};
pub use bucket::TokenBucket;
pub use bucket_config::{BorrowChain, BucketConfig, BucketsConfig, MAX_BURST, MAX_RATE};
pub use buckets::{Grant, TierBuckets};
pub(crate) use cohort::admits as admits_cohort;
pub use cohort::{cohort, rotation_period, user_hash, COHORTS, ROTATION};
pub use cohort_arrival::{CohortPulls, PARTIAL_TIERS};
pub use cohort_set::CohortSet;
pub use config::{QueueAgeConfig, MAX_CUTOFF_MS};
pub use decision::{Decision, DecisionCounts, Decisions};
pub use lookahead::derived_lookahead;
pub use memory::MemoryBudget;
pub use memory_config::{MemoryConfig, MAX_BUDGET_BYTES};
pub use pull::{PullAdmission, PullSample};
pub use pull_config::PullAdmissionConfig;
pub(crate) use queue_age::admits_at;
pub use queue_age::QueueAgeAdmission;
