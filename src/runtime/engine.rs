//! The runtime's shared state: [`Inner`] holds the parts of the per-message pipeline, each of
//! which owns its state and lives in a file named after it:
//!
//! ```text
//! source -> intake -> gate (gate.rs) -> queue -> dispatch (dispatch.rs) -> worker -> handler
//!                        \-> policy (policy.rs): drop | defer (deferral.rs) | hold
//! every end of a message -> settle (settle.rs): one disposition, ack, the key's next message
//! failures -> retries and dead letters (dead_letter.rs)
//! on a timer -> sampler (sampler.rs) over the signals (signals.rs)
//! ```
//!
//! Pacing (`pacing.rs`), the live levels (`live.rs`), the lifecycle (`lifecycle.rs`), the
//! broker's patience (`patience.rs`), the recall generation and what each worker runs
//! (`recalls.rs`) and the configuration in force (swapped whole by `reconfigure.rs`) are parts
//! too. Each part knows nothing of `Inner`: the steps that need the whole runtime live above
//! it, in files that import this one (`gate.rs`, `policy.rs`, `settle.rs`, `dispatch.rs`,
//! `hand_back.rs`, `recall.rs`, ...).

use crate::sync::Ordering;
use std::sync::Arc;
use std::time::Duration;

use quanta::{Clock, Instant};

use crate::admission::{Breakers, TierBuckets};
use crate::ledger::Disposition;
use crate::limit::ConcurrencyLimit;
use crate::ordering::KeyGate;
use crate::queue::WfqQueue;
use crate::runtime::accounts::Accounts;
use crate::runtime::dead_letter::DeadLetters;
use crate::runtime::deferral::Deferrals;
use crate::runtime::item::Item;
use crate::runtime::lifecycle::Lifecycle;
use crate::runtime::live::Live;
use crate::runtime::pacing::Pacing;
use crate::runtime::recalls::Recalls;
use crate::runtime::signals::Signals;
use crate::runtime::RuntimeConfig;
use crate::Criticality;

/// Called with each message's disposition, just before its acknowledgement.
pub(crate) type Observer<T> = Arc<dyn Fn(&T, Criticality, Disposition) + Send + Sync>;

/// Maps a message to its downstream key, borrowed from the message (no allocation).
pub(crate) type DownstreamFn<T> = Arc<dyn for<'a> Fn(&'a T) -> Option<&'a str> + Send + Sync>;

/// The runtime's parts, shared by its tasks (intakes, workers, the sampler, the tasks that own
/// messages outside the queue).
pub(crate) struct Inner<T> {
    pub(crate) queue: WfqQueue<Item<T>>,
    pub(crate) limit: ConcurrencyLimit,
    pub(crate) accounts: Arc<Accounts>,
    /// The configuration in force, swapped whole by a live reconfiguration (see
    /// `reconfigure.rs`): read it through [`Inner::config`], once per decision.
    pub(crate) config: arc_swap::ArcSwap<RuntimeConfig>,
    /// What a live reconfiguration changes besides `config`: the generation, the operator's
    /// forced shed and brownout levels.
    pub(crate) live: Live,
    /// The gate's checks of their own: circuit breakers per downstream key, and token buckets
    /// per tier.
    pub(crate) breakers: Arc<Breakers>,
    pub(crate) downstream: Option<DownstreamFn<T>>,
    pub(crate) buckets: TierBuckets,
    /// The reject path's sampled costs, moved into the histogram by the sampler.
    pub(crate) reject_costs: super::cost::CostSamples,
    pub(crate) deferrals: Deferrals<T>,
    pub(crate) dead_letters: DeadLetters<T>,
    pub(crate) observer: Option<Observer<T>>,
    /// The key gate of ordered sources: keyed messages past it are inside the runtime, the
    /// later ones of a busy key wait in it (see `crate::ordering`).
    pub(crate) keys: KeyGate<Item<T>>,
    pub(crate) signals: Signals,
    pub(crate) pacing: Pacing<Inner<T>>,
    pub(crate) lifecycle: Lifecycle,
    /// Hand-backs before a source's broker loses patience (see `patience.rs`).
    pub(crate) patience: crate::runtime::patience::Patience,
    /// Messages taken back by their source (a revoked partition): the recall generation and
    /// what each worker runs (see `recall.rs`).
    pub(crate) recalls: Arc<Recalls>,
    pub(crate) clock: Clock,
    pub(crate) origin: Instant,
}

/// What became of an offered item.
pub(crate) enum Offer<T> {
    /// Queued, or settled by policy (shed, deferring): the caller is done with it.
    Taken,
    /// Refused under Backpressure: the caller holds it and offers it again later.
    Hold(Item<T>),
    /// The offered item was queued, and evicted this one, whose tier's policy is
    /// Backpressure: the caller holds the victim and offers it again later.
    Evicted(Item<T>),
    /// Refused because its downstream's circuit is open, under Backpressure: the caller holds
    /// it apart from the items refused for load (other messages of its tier are not refused)
    /// and offers it again when a circuit changes state.
    CircuitHold(Item<T>),
}

impl<T> Inner<T> {
    /// The configuration in force (one lock-free load): a reconfiguration swaps it whole, so
    /// one guard gives one consistent configuration.
    #[inline]
    pub(crate) fn config(&self) -> arc_swap::Guard<Arc<RuntimeConfig>> {
        self.config.load()
    }
}

impl<T: Send + Sync + 'static> Inner<T> {
    /// How many queued messages keep every worker busy until the intake pulls again:
    /// `admission.prefetch_per_slot ×` the concurrency limit.
    pub(crate) fn prefetch(&self) -> usize {
        self.config().expert.admission.prefetch_per_slot * self.limit.limit().max(1)
    }

    /// Looks up the breaker of the item's downstream key, once per consumed message: a hash of
    /// a key borrowed from the message, no allocation (but for a key never seen before).
    #[inline]
    pub(crate) fn map_downstream(&self, item: &mut Item<T>) {
        if let Some(key_of) = &self.downstream {
            if self.breakers.enabled() {
                item.circuit = key_of(item.payload()).and_then(|k| self.breakers.breaker(k));
            }
        }
    }

    pub(crate) fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.config().expert.poll_interval_ms)
    }

    /// The level pulled work is shed at: pull-based admission's, or the operator's forced
    /// level where it is higher.
    #[inline]
    pub(crate) fn pulled_level(&self) -> u8 {
        self.signals.shed_level().max(self.live.forced_level())
    }

    /// The load level handlers see and held messages are re-offered on: the pull-based shed
    /// level, and the queue-age one too once work has been pushed in-process (`try_submit`):
    /// for pulled work alone the queue's age is no overload signal.
    pub(crate) fn load_level(&self) -> u8 {
        let pulled = self.pulled_level();
        if self.signals.pushed_seen.load(Ordering::Relaxed) {
            pulled.max(self.queue.shed_level())
        } else {
            pulled
        }
    }

    /// Recent time (one atomic load), ns since `origin`.
    pub(crate) fn recent_ns(&self) -> u64 {
        crate::queue::time::recent(&self.clock)
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.clock
            .now()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }

    /// Spawns a task that owns messages (see [`Lifecycle::spawn`]).
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.lifecycle.spawn(task);
    }
}
