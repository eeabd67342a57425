//! What one run of one consumer on one scenario measured.

use std::time::Duration;

use triage::runtime::RuntimeStats;

use crate::goodput::Goodput;
use crate::recovery::Recovery;
use crate::users::Offered;

/// The figures of a run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Per-tier goodput, judged from the producer's side.
    pub goodput: Goodput,
    /// The runtime's final accounting (triage only).
    pub stats: Option<RuntimeStats>,
    /// Whether the runtime's ledger balanced at the end, every consumed message settled
    /// exactly once (always `true` for the FIFO, which acknowledges at pull).
    pub balances: bool,
    /// The shed level sampled every 10 ms (triage only): time since start, tiers refused.
    pub shed_series: Vec<(Duration, u8)>,
    /// Of the highest refused tier, the cohorts admitted all the same
    /// (`Runtime::admitted_cohorts`), sampled with `shed_series` (triage only).
    pub cohort_series: Vec<u8>,
    /// Recovery around the scenario's step (triage on a scenario with one).
    pub recovery: Option<Recovery>,
    /// Re-publications by producers of shed work (the retry storm).
    pub resubmitted: u64,
    /// Most messages inside the runtime at once (sampled every 10 ms; triage only).
    pub max_alive: u64,
    /// Every message offered: its tier, user, when, and whether it was served in time.
    pub offers: Vec<Offered>,
    /// Real time the run took.
    pub wall: Duration,
}

impl Outcome {
    /// Samples of the shed level above 0 (10 ms each).
    pub fn shed_samples(&self) -> usize {
        self.shed_series.iter().filter(|(_, l)| *l > 0).count()
    }
}
