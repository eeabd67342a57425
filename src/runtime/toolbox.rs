//! The runtime's side of the admission toolbox: token buckets, the memory budget and the
//! decision breakdown (`src/admission/` holds the state machines; this file wires them in).

use crate::admission::{Decision, DecisionCounts, MemoryBudget, TierBuckets};
use crate::runtime::engine::Inner;
use crate::runtime::item::Item;
use crate::runtime::{Runtime, RuntimeConfig};
use crate::{Criticality, PerTier};

impl<T: Send + Sync + 'static> Inner<T> {
    /// Counts `decision` as `item`'s first admission decision, unless one is counted already.
    #[inline]
    pub(crate) fn decide(&self, item: &Item<T>, decision: Decision) {
        if !item.standing.decided() {
            self.record_decision(item.original, decision);
        }
    }

    /// Counts one first decision about a message of (original) tier `tier`: the count behind
    /// [`Runtime::decisions`] and, from the next sampler tick, `triage_admission_decisions_total`.
    /// For a refusal outside `Inner::offer` (a circuit found open before the offer, say), call
    /// [`decide`](Inner::decide) with
    /// [`Decision::ShedCircuit`] instead, so the message is counted once.
    #[inline]
    pub(crate) fn record_decision(&self, tier: Criticality, decision: Decision) {
        self.accounts.decisions.record(tier, decision);
    }

    /// Applies the toolbox's settings of `config` (buckets, memory budget) to the running
    /// state, for live reconfiguration (phase 2 of `Inner::reconfigure`): each bucket keeps its
    /// fill ratio, the bytes held are kept. `config` must be validated first.
    pub(crate) fn apply_toolbox(&self, config: &RuntimeConfig) {
        self.buckets.apply(&config.buckets);
        self.accounts.memory.apply(&config.memory_config());
    }

    /// The toolbox's gauges, on the sampler's tick.
    pub(crate) fn sample_toolbox(&self) {
        let m = &self.accounts.metrics;
        for tier in Criticality::ALL {
            m.tiers[tier].bucket_fill.set(self.buckets.fill(tier));
        }
        let memory = &self.accounts.memory;
        m.memory_held.set(memory.held() as f64);
        m.memory_budget.set(memory.budget().unwrap_or(0) as f64);
    }
}

impl<T: Send + Sync + 'static> Runtime<T> {
    /// Each tier's first admission decisions so far (by the tier the source classified): once
    /// every message has left the runtime they add up, per tier, to the messages consumed
    /// (minus any released at shutdown before a decision). The same counts as the metric
    /// `triage_admission_decisions_total{tier,decision}`.
    pub fn decisions(&self) -> PerTier<DecisionCounts> {
        self.inner.accounts.decisions.snapshot()
    }

    /// The memory budget and the payload bytes held now (`held`, `peak`, `working`, the
    /// order of the tiers' first refusals).
    pub fn memory(&self) -> &MemoryBudget {
        &self.inner.accounts.memory
    }

    /// The per-tier token buckets (fill ratios, tokens).
    pub fn buckets(&self) -> &TierBuckets {
        &self.inner.buckets
    }
}
