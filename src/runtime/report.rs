//! What the runtime reports: live stats and the final report.

use std::fmt;
use std::time::Duration;

use crate::ledger::LedgerSnapshot;
use crate::queue::QueueStats;

/// A snapshot of the runtime's accounting.
///
/// The invariant
/// `consumed = completed + failed + deferred + expired + shed + released + queued + in_flight`
/// is checked by [`balances`](RuntimeStats::balances), where `queued + in_flight` is counted
/// independently of the ledger (by the life of each message inside the runtime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Dispositions and consumption per tier (by the criticality the source classified).
    pub ledger: LedgerSnapshot,
    /// The queue's own counters per tier (by the tier the message was queued at).
    pub queue: QueueStats,
    /// Messages inside the runtime: queued, held by backpressure, deferring, in a handler, or
    /// waiting to retry.
    pub alive: u64,
    /// Of `alive`, those queued.
    pub queued: u64,
    /// Messages held by backpressure.
    pub held: u64,
    /// Messages parked behind a busy ordering key (see [`crate::ordering`]); part of `alive`.
    pub parked: u64,
    /// Messages held unacknowledged because the dead-letter sink refused both their dead
    /// letter and its reference copy for good (see
    /// [`DeadLetterSink`](crate::runtime::DeadLetterSink)); part of `alive`.
    pub dead_letters_held: u64,
    /// Handlers running.
    pub running: u64,
    /// Current concurrency limit.
    pub limit: u64,
    /// Messages refused at admission at least once, per tier offered at (counted once per
    /// message however often a held message is offered again).
    pub refused: crate::PerTier<u64>,
    /// Messages admitted into the queue, per tier queued at (counted once per message).
    pub admitted: crate::PerTier<u64>,
    /// Admitted messages taken back before a handler call because the circuit of their
    /// downstream opened while they were queued (or was half-open with every probe under
    /// way), per tier: they went to their tier's refusal policy like a refusal with reason
    /// `circuit`, but are counted here and not in `refused`, so that `admitted + refused`
    /// counts each consumed message's admission decision once.
    pub withdrawn: crate::PerTier<u64>,
    /// Messages handed back before their source's patience ran out (see
    /// [`ExpertConfig::patience_share`](crate::runtime::ExpertConfig::patience_share)), per
    /// tier classified: deferred (in the ledger's `deferred` once confirmed) or released (in
    /// its `released`). One whose deadline had passed by then is expired instead, and counted
    /// there only.
    pub handed_back: crate::PerTier<u64>,
}

impl RuntimeStats {
    /// Messages inside the runtime but not queued: held, deferring, running or waiting to
    /// retry.
    pub fn in_flight(&self) -> u64 {
        self.alive.saturating_sub(self.queued)
    }

    /// Whether every consumed message is accounted for exactly once: settled, released, or
    /// still inside the runtime.
    pub fn balances(&self) -> bool {
        let t = self.ledger.total();
        t.consumed == t.settled() + t.released + self.alive
    }
}

impl fmt::Display for RuntimeStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ledger)?;
        writeln!(
            f,
            "queued {}, in flight {}, held {}, running {}, limit {}: ledger {}",
            self.queued,
            self.in_flight(),
            self.held,
            self.running,
            self.limit,
            if self.balances() {
                "balances"
            } else {
                "DOES NOT BALANCE"
            }
        )
    }
}

/// What [`Runtime::shutdown`](crate::runtime::Runtime::shutdown) returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// The accounting after shutdown: nothing should be alive.
    pub stats: RuntimeStats,
    /// Whether the grace period ran out with handlers still running (they were cancelled and
    /// their messages released).
    pub grace_exceeded: bool,
    /// How long shutdown took.
    pub elapsed: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.stats)?;
        writeln!(
            f,
            "shutdown took {:?}{}",
            self.elapsed,
            if self.grace_exceeded {
                " (grace period exceeded)"
            } else {
                ""
            }
        )
    }
}
