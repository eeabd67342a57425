//! The admission decision breakdown: one decision per consumed message.

use crate::sync::{Count, Ordering, PerThread};

use crate::{Criticality, PerTier};

/// The first admission decision about a message (seed 003, "Observability for Shedding
/// Decisions": accepted, shed-capacity, shed-circuit, shed-timeout), so an operator can tell a
/// capacity problem from a dependency problem. Each consumed message is counted once, at its
/// first decision: a message refused and held (backpressure) that is admitted later counts as
/// refused, with the reason that first held it. So, once every message has left the runtime,
/// the decisions of a run add up to the messages consumed, per tier, minus those released
/// unacknowledged (shutdown) before any decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decision {
    /// Queued for a worker.
    Admitted,
    /// Refused because the worker is overloaded: the pull-based shed level (arrival beyond
    /// capacity), queue-age admission, a full queue with nothing lower to evict, or the
    /// operator's forced shed level.
    ShedCapacity,
    /// Refused by its tier's token bucket (and its lenders').
    ShedRate,
    /// Refused because the circuit of its downstream is open.
    ShedCircuit,
    /// Pulled already past its deadline and expired at intake.
    ShedExpired,
    /// Refused because the bytes held passed its tier's share of the memory budget.
    ShedMemory,
}

impl Decision {
    /// Every decision, in label order.
    pub const ALL: [Decision; 6] = [
        Decision::Admitted,
        Decision::ShedCapacity,
        Decision::ShedRate,
        Decision::ShedCircuit,
        Decision::ShedExpired,
        Decision::ShedMemory,
    ];

    /// The `decision` label of `triage_admission_decisions_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Decision::Admitted => "admitted",
            Decision::ShedCapacity => "shed-capacity",
            Decision::ShedRate => "shed-rate",
            Decision::ShedCircuit => "shed-circuit",
            Decision::ShedExpired => "shed-expired",
            Decision::ShedMemory => "shed-memory",
        }
    }

    /// Position in [`Decision::ALL`].
    pub const fn index(self) -> usize {
        match self {
            Decision::Admitted => 0,
            Decision::ShedCapacity => 1,
            Decision::ShedRate => 2,
            Decision::ShedCircuit => 3,
            Decision::ShedExpired => 4,
            Decision::ShedMemory => 5,
        }
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tier's decision counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecisionCounts {
    /// Messages queued at their first decision.
    pub admitted: u64,
    /// Refused for capacity (shed level, queue age, full queue, the operator's forced shed
    /// level).
    pub shed_capacity: u64,
    /// Refused by the token buckets.
    pub shed_rate: u64,
    /// Refused for an open circuit.
    pub shed_circuit: u64,
    /// Expired at intake.
    pub shed_expired: u64,
    /// Refused for memory.
    pub shed_memory: u64,
}

impl DecisionCounts {
    /// The count of `decision`.
    pub fn get(&self, decision: Decision) -> u64 {
        match decision {
            Decision::Admitted => self.admitted,
            Decision::ShedCapacity => self.shed_capacity,
            Decision::ShedRate => self.shed_rate,
            Decision::ShedCircuit => self.shed_circuit,
            Decision::ShedExpired => self.shed_expired,
            Decision::ShedMemory => self.shed_memory,
        }
    }

    /// Every decision summed: the messages decided about.
    pub fn total(&self) -> u64 {
        Decision::ALL.iter().map(|&d| self.get(d)).sum()
    }
}

/// Decision counts per tier, lock-free: what [`Runtime::decisions`](crate::runtime::Runtime::decisions)
/// reads. The metric `triage_admission_decisions_total` is recorded beside it by the runtime.
#[derive(Debug, Default)]
pub struct Decisions {
    /// One copy per thread, summed by [`snapshot`](Self::snapshot) (see `crate::sync`).
    counts: PerThread<[[Count; 6]; 4]>,
}

impl Decisions {
    /// Counts one `decision` about a message of `tier`.
    #[inline]
    pub fn record(&self, tier: Criticality, decision: Decision) {
        self.counts.local()[tier.rank()][decision.index()].add(1, Ordering::Relaxed);
    }

    /// The counts now, per tier.
    pub fn snapshot(&self) -> PerTier<DecisionCounts> {
        PerTier::from_fn(|t| {
            let get = |d: Decision| self.counts.sum(|c| &c[t.rank()][d.index()]);
            DecisionCounts {
                admitted: get(Decision::Admitted),
                shed_capacity: get(Decision::ShedCapacity),
                shed_rate: get(Decision::ShedRate),
                shed_circuit: get(Decision::ShedCircuit),
                shed_expired: get(Decision::ShedExpired),
                shed_memory: get(Decision::ShedMemory),
            }
        })
    }
}
