//! The worker runtime: sources -> admission -> weighted-fair queue -> workers -> handler, with
//! every message ending in exactly one recorded disposition.
//!
//! ```text
//!  source (Kafka / RabbitMQ / memory)   pulls, classifies from headers; tracks acks
//!        |  Envelope { payload, criticality, deadline, attempt, ack }
//!  admission                            queue-age cut-offs (one atomic load)
//!        |  refused or evicted -> the tier's policy: Backpressure | Defer | Drop
//!  WfqQueue                             weighted-fair, evicts newest of lowest tier, expires
//!        |  masked by each tier's share of the concurrency limit (priority-scaled concurrency shares)
//!  workers (tokio)                      handler; panics caught; retries demoted one level
//!        |
//!  disposition -> ledger + ack          Completed | Failed | Deferred | Expired | Shed
//! ```
//!
//! The promise: a message's ack is resolved once, after its disposition is final (a deferral
//! after the defer sink's broker confirmed it, a failure after the dead-letter sink did), and a
//! message dropped unresolved is *released* (redelivered), never acknowledged. At any instant
//! `consumed = completed + failed + deferred + expired + shed + released + queued + in_flight`
//! ([`RuntimeStats::balances`]).
//!
//! Nothing waits in the runtime until its broker takes it back by force: a message of a source
//! with a [`patience`](Source::patience) (RabbitMQ's `consumer_timeout`) that has waited
//! [`patience_share`](ExpertConfig::patience_share) of it, queued, held or parked, is handed
//! back: deferred where its tier defers and a copy comes back in time, otherwise released for
//! the broker to deliver again (see `patience.rs`).

mod accounts;
mod ack;
mod builder;
mod config;
mod cost;
mod dead_letter;
mod deferral;
mod dispatch;
mod engine;
mod envelope;
mod failure;
mod gate;
mod hand_back;
mod intake;
mod item;
mod job;
mod lifecycle;
mod live;
mod memory_broker;
mod metric_counts;
pub mod metrics;
mod pacing;
mod patience;
mod policy;
mod propagation;
mod recall;
mod recalls;
mod reconfigure;
mod refusal;
mod report;
mod sampler;
mod settle;
#[cfg(test)]
mod shared_writes;
mod signals;
mod sink;
mod source;
mod submit;
mod toolbox;
mod worker;

use crate::sync::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use ack::{Ack, AckRef, AckSink};
pub use config::{
    BackoffConfig, ExpertConfig, LoadConfigError, MemoryBudgetConfig, MemoryThresholdsConfig,
    RefusalPolicy, RetryConfig, RuntimeConfig, MOVED,
};
pub use envelope::Envelope;
pub use job::{HandlerError, Job, LoadLevel};
pub use memory_broker::{AckCounts, MemoryBroker, MemorySink, MemorySource};
pub use propagation::{Propagation, RaiseCriticalityError};
pub use recall::Recall;
pub use reconfigure::{ConfigHandle, ReconfigureError, Reconfigured, FIXED};
pub use report::{Report, RuntimeStats};
pub use sink::{DeadLetterSink, DeferReason, DeferSink, Republish, SinkError};
pub use source::Source;
pub use submit::SubmitError;

use crate::limit::ConcurrencyLimit;
use crate::ConfigError;
pub use builder::RuntimeBuilder;
use builder::SpawnWorker;
use engine::Inner;
use refusal::Refusal;

/// A running worker runtime. Build it with [`Runtime::builder`], feed it with
/// [`attach`](Runtime::attach), stop it with [`shutdown`](Runtime::shutdown). Dropped without
/// `shutdown`, it stops everything it started and releases every message inside it
/// unacknowledged (see its `Drop` implementation).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::runtime::{HandlerError, Job, MemoryBroker, Runtime, RuntimeConfig};
/// use triage::Criticality;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// for i in 0..100u32 {
///     let tier = if i % 10 == 0 { Criticality::Critical } else { Criticality::Sheddable };
///     broker.publish(i, tier, None);
/// }
/// broker.close();
///
/// let mut runtime = Runtime::builder(RuntimeConfig::default())
///     .start(|job: Job<u32>| async move {
///         let _ = job.payload();
///         Ok::<(), HandlerError>(())
///     })?;
/// runtime.attach(broker.source());
/// runtime.wait_idle().await;
/// let report = runtime.shutdown(Duration::from_secs(5)).await;
///
/// assert!(report.stats.balances());
/// assert_eq!(broker.acks().completed, 100);
/// # Ok(())
/// # }
/// ```
pub struct Runtime<T> {
    inner: Arc<Inner<T>>,
    workers: tokio::task::JoinSet<()>,
    /// Builds one more worker task (the handler's type is known only in `start`).
    #[allow(dead_code)]
    spawn_worker: SpawnWorker<T>,
    intakes: Vec<JoinHandle<()>>,
    sampler: JoinHandle<()>,
    drained: CancellationToken,
    final_ack: Arc<parking_lot::Mutex<Option<tokio::time::Instant>>>,
}

impl<T: Send + Sync + 'static> Runtime<T> {
    /// A builder with `config`, no defer sink, no dead-letter sink, the system clock.
    pub fn builder(config: RuntimeConfig) -> RuntimeBuilder<T> {
        RuntimeBuilder::new(config)
    }

    /// Starts pulling from `source` on its own task.
    ///
    /// # Panics
    ///
    /// When the source relies on a dead-letter sink this runtime does not have (see
    /// [`try_attach`](Runtime::try_attach), which returns the error instead).
    pub fn attach<S: Source<Payload = T>>(&mut self, source: S) {
        if let Err(e) = self.try_attach(source) {
            panic!("cannot attach the source: {e}");
        }
    }

    /// Starts pulling from `source` on its own task, after checking that this runtime gives
    /// it what it relies on.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the source's setting when the source relies on a dead-letter
    /// sink ([`Source::needs_dead_letter_sink`]) and the runtime has none: its `Failed`
    /// messages would be acknowledged with no copy kept anywhere.
    pub fn try_attach<S: Source<Payload = T>>(&mut self, source: S) -> Result<(), ConfigError> {
        self.check_source(&source)?;
        self.attach_mode(source, intake::Mode::Normal);
        Ok(())
    }

    fn check_source<S: Source<Payload = T>>(&self, source: &S) -> Result<(), ConfigError> {
        match source.needs_dead_letter_sink() {
            Some(setting) if self.inner.dead_letters.sink.is_none() => Err(ConfigError::new(
                setting,
                "true",
                "false, or a dead-letter sink on the runtime (RuntimeBuilder::dead_letter_sink)",
            )),
            _ => Ok(()),
        }
    }

    /// Starts pulling deferred work back from `source`, only while nothing is shed and the
    /// workers have room. Its messages keep the tier they were deferred with (the connectors'
    /// drains read it from `triage-criticality`) and the count of their deferrals
    /// (`triage-deferrals`); refused again, they are deferred again by their tier's policy until
    /// [`max_deferrals`](RuntimeConfig::max_deferrals), then held (backpressure) until served or
    /// expired. Their pulls do not count as arrivals for pull-based admission.
    ///
    /// # Panics
    ///
    /// As [`attach`](Runtime::attach).
    pub fn attach_drain<S: Source<Payload = T>>(&mut self, source: S) {
        if let Err(e) = self.check_source(&source) {
            panic!("cannot attach the drain: {e}");
        }
        self.attach_mode(source, intake::Mode::Drain);
    }

    fn attach_mode<S: Source<Payload = T>>(&mut self, mut source: S, mode: intake::Mode) {
        self.inner.track_patience(source.patience());
        source.attached(Recall::new(&self.inner));
        self.inner.lifecycle.pulling.fetch_add(1, Ordering::AcqRel);
        self.inner
            .accounts
            .sources_done
            .store(false, Ordering::Release);
        let lag = Arc::new(AtomicU64::new(u64::MAX));
        if mode == intake::Mode::Normal {
            self.inner.signals.lags.lock().push(Arc::clone(&lag));
        }
        let task = intake::run(
            Arc::clone(&self.inner),
            source,
            mode,
            lag,
            self.drained.clone(),
            Arc::clone(&self.final_ack),
        );
        self.intakes.push(tokio::spawn(task));
    }

    /// Offers a message from an in-process producer (an HTTP handler enqueuing background work,
    /// say) rather than an attached [`Source`].
    ///
    /// The message goes through the same admission and refusal policies as a pulled one. When
    /// its tier's policy is Backpressure and it cannot be taken now, it comes back inside the
    /// error so the caller can push back on its own caller (a 503 with `Retry-After`, or a retry
    /// later); deciding that costs one atomic load and allocates nothing. `Ok(())` means the
    /// runtime took the message: queued, deferring, or (for a Drop tier, or a Defer tier with
    /// no defer sink) shed and counted; the [`observe`](RuntimeBuilder::observe) hook tells
    /// which.
    ///
    /// # Errors
    ///
    /// - [`SubmitError::Overloaded`]: queue-age admission, or the operator's
    ///   [`forced_shed_level`](RuntimeConfig::forced_shed_level), refuses the tier; nothing
    ///   recorded but the `triage_refused_total` counter (reason `overloaded` or `forced`).
    ///   (A `defer` tier whose defer sink is failing falls back to backpressure only once the
    ///   message is taken: it is then counted as consumed and released, like `Full`.)
    /// - [`SubmitError::Full`]: the queue is full with nothing lower to evict; the message was
    ///   counted as consumed and then released. (A message with an ordering key is held
    ///   instead, since the later messages of its key must not run before it: `Ok(())`.)
    /// - [`SubmitError::RateLimited`]: its tier's token bucket (and its lenders') is empty;
    ///   counted as consumed and then released, like `Full`.
    /// - [`SubmitError::Memory`]: the memory budget refuses its tier; likewise.
    /// - [`SubmitError::Closed`]: the runtime is shutting down.
    pub fn try_submit(&self, envelope: Envelope<T>) -> Result<(), SubmitError<T>> {
        let inner = &self.inner;
        if inner.lifecycle.stop.is_cancelled() {
            return Err(SubmitError::Closed(envelope));
        }
        let tier = envelope.effective_criticality();
        inner.signals.pushed_seen.store(true, Ordering::Relaxed);
        let forced = !crate::admission::admits_at(inner.live.forced_level(), tier);
        if inner.config().policy[tier] == RefusalPolicy::Backpressure
            && (forced || !inner.queue.admits(tier))
        {
            let reason = if forced {
                Refusal::Forced
            } else {
                Refusal::Overloaded
            };
            inner.accounts.refusals.add(tier, reason);
            return Err(SubmitError::Overloaded(envelope));
        }
        let mut item = item::Item::consumed(envelope, &inner.accounts);
        item.origin = item::Origin::Pushed;
        item.recall_stamp = inner.recalls.stamp();
        inner.map_downstream(&mut item);
        // Parked behind its key: taken, offered when the key's earlier message is settled.
        let Some(item) = inner.pass_gate(item) else {
            return Ok(());
        };
        match inner.offer(item) {
            engine::Offer::Taken => Ok(()),
            // Ours is queued; the message it evicted is not the caller's to take back.
            engine::Offer::Evicted(victim) => {
                inner.hold_in_task(victim);
                Ok(())
            }
            // A keyed message handed back would let the later ones of its key, parked
            // behind it, run first: it is held here instead.
            engine::Offer::Hold(item) if item.key.is_some() => {
                inner.hold_in_task(item);
                Ok(())
            }
            engine::Offer::Hold(item) => match (item.last_refusal, item.hand_back()) {
                (Some(Refusal::Rate), Ok(envelope)) => Err(SubmitError::RateLimited(envelope)),
                (Some(Refusal::Memory), Ok(envelope)) => Err(SubmitError::Memory(envelope)),
                // Refused for load (a `defer` tier whose sink is failing gets here): not `Full`.
                (Some(Refusal::Overloaded | Refusal::Forced), Ok(envelope)) => {
                    Err(SubmitError::Overloaded(envelope))
                }
                (_, Ok(envelope)) => Err(SubmitError::Full(envelope)),
                (_, Err(item)) => {
                    inner.hold_in_task(item);
                    Ok(())
                }
            },
            engine::Offer::CircuitHold(item) if item.key.is_some() => {
                inner.hold_in_task(item);
                Ok(())
            }
            engine::Offer::CircuitHold(item) => match item.hand_back() {
                Ok(envelope) => Err(SubmitError::CircuitOpen(envelope)),
                Err(item) => {
                    inner.hold_in_task(item);
                    Ok(())
                }
            },
        }
    }

    /// The circuit breakers of this runtime's downstream keys (see
    /// [`RuntimeBuilder::downstream`]): their states, and
    /// [`apply`](crate::admission::Breakers::apply) to change their settings while it runs.
    pub fn breakers(&self) -> Arc<crate::admission::Breakers> {
        Arc::clone(&self.inner.breakers)
    }

    /// The concurrency limit this runtime's workers take their slots from: a handle to the
    /// same state (cloning it is one `Arc`), so that other work in the process, such as the
    /// requests of an HTTP or gRPC entry (`triage-tower`), draws on the same capacity. A slot
    /// held outside is one the workers cannot use; each tier's share applies to the sum, and a
    /// release wakes waiters of either side, most critical tier first.
    ///
    /// Work admitted this way is not seen by the runtime's pull-based admission except through
    /// the slots it holds: the capacity it estimates is the workers' own.
    pub fn concurrency_limit(&self) -> ConcurrencyLimit {
        self.inner.limit.clone()
    }

    /// Applies `config` to the running runtime, all or nothing, without a restart (seeds 002
    /// and 003: settings changed without a deploy): the queue's weights, capacity, byte
    /// budget and queue-age cut-offs, the concurrency shares and limit algorithm, the refusal
    /// policies, pull-based admission, retries, deferral settings, the forced shed and
    /// brownout levels. Shrinking the queue evicts by the push rule (the newest message of the
    /// lowest tier first), and each evicted message goes through its tier's refusal policy,
    /// so it ends in one disposition like any other. The settings in [`FIXED`] cannot change
    /// while running. One line is logged naming each field that changed, and the generation
    /// (`triage_config_generation`) goes up by one; a configuration equal to the one in force
    /// changes nothing. The module `reconfigure.rs` documents the order of the steps.
    ///
    /// # Errors
    ///
    /// [`ReconfigureError::Invalid`] with the [`ConfigError`] of the first field out of range,
    /// naming it and its allowed range; of an explicit `defer` policy without a defer sink; or
    /// of a [`FIXED`] setting changed. Nothing changes then: the configuration in force, read
    /// back with [`config`](Self::config), is the one before the call.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = Runtime::builder(RuntimeConfig::default())
    ///     .start(|_job: Job<u32>| async { Ok::<(), HandlerError>(()) })?;
    ///
    /// // An incident: refuse Sheddable and Medium whatever the signals say.
    /// let mut config = RuntimeConfig::clone(&runtime.config());
    /// config.forced_shed_level = 2;
    /// let done = runtime.reconfigure(config.clone())?;
    /// assert_eq!(done.generation, 2);
    /// assert_eq!(done.changes, ["forced_shed_level: 0 -> 2"]);
    ///
    /// // Out of range: refused, naming the field; nothing changes.
    /// config.forced_shed_level = 4;
    /// let err = runtime.reconfigure(config).unwrap_err();
    /// assert_eq!(err.field(), Some("forced_shed_level"));
    /// assert_eq!(runtime.config().forced_shed_level, 2);
    /// assert_eq!(runtime.config_generation(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reconfigure(&self, config: RuntimeConfig) -> Result<Reconfigured, ReconfigureError> {
        self.inner.reconfigure(config)
    }

    /// Reads the TOML file at `path` and applies it as [`reconfigure`](Self::reconfigure)
    /// does, logging the fields that changed or, for a file refused, the error (nothing
    /// changes then).
    ///
    /// # Errors
    ///
    /// As [`reconfigure`](Self::reconfigure), plus [`ReconfigureError::Read`] and
    /// [`ReconfigureError::Parse`] for a file that cannot be read or parsed.
    pub fn reload(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<Reconfigured, ReconfigureError> {
        self.config_handle().reload(path)
    }

    /// The configuration in force, with the refusal policies resolved against the sinks
    /// (`defer_or_drop` reads back as `defer` or `drop`).
    pub fn config(&self) -> Arc<RuntimeConfig> {
        self.inner.config.load_full()
    }

    /// The generation of the configuration in force: 1 at start, one more per applied
    /// reconfiguration (the `triage_config_generation` gauge).
    pub fn config_generation(&self) -> u64 {
        self.inner.live.generation()
    }

    /// Reconfigurations and reloads refused so far (`triage_config_refused_total`): each left
    /// the configuration in force as it was.
    pub fn config_refused(&self) -> u64 {
        self.inner.live.refused()
    }

    /// A handle that reconfigures this runtime from elsewhere (another task, a signal, an
    /// admin endpoint) while the runtime itself is held by its owner.
    pub fn config_handle(&self) -> ConfigHandle {
        ConfigHandle::new(&self.inner)
    }

    /// The accounting right now.
    pub fn stats(&self) -> RuntimeStats {
        stats_of(&self.inner)
    }

    /// The load level handlers see (for brownout).
    pub fn load(&self) -> LoadLevel {
        LoadLevel(self.inner.load_level())
    }

    /// Of the highest tier pull-based admission refuses, how many of its cohorts (slices of
    /// its users, `0..=`[`COHORTS`](crate::admission::COHORTS)) are admitted all the same
    /// (see [`PullAdmission::admitted_set`](crate::admission::PullAdmission::admitted_set));
    /// 0 while nothing is refused. The gauge `triage_cohorts_admitted`, read in process.
    pub fn admitted_cohorts(&self) -> u8 {
        self.inner.signals.shed().1
    }

    /// Waits until every attached source has finished (returned `None`) and every message
    /// taken is settled: for finite sources (tests, the in-memory broker) before shutdown. A
    /// message held because its dead letter is refused for good (see [`DeadLetterSink`]) is
    /// not settled, so this waits for it too; [`stats`](Runtime::stats) shows it in
    /// `dead_letters_held`.
    pub async fn wait_idle(&self) {
        loop {
            // Told when `alive` falls to 0 or a source's intake ends; the poll interval bounds
            // the wait whatever happens.
            let idle = self.inner.accounts.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            let pulling = self.inner.lifecycle.pulling.load(Ordering::Acquire);
            let alive = self.inner.accounts.alive();
            if pulling == 0 && alive == 0 {
                return;
            }
            tokio::select! {
                _ = idle => {}
                _ = tokio::time::sleep(self.inner.poll_interval()) => {}
            }
        }
    }

    /// Stops within `grace`: stops pulling, hands queued work back unacknowledged (or defers
    /// it, per policy), lets running handlers, deferrals and dead letters finish, makes each
    /// source's final acknowledgement, and returns the final accounting. Returns within
    /// `grace` (plus scheduling noise) even if a handler or a sink hangs: when the grace runs
    /// out, running handlers, deferrals and dead-letter publishes are cancelled and their
    /// messages released, never acknowledged (a cancelled publish may still reach its broker:
    /// then the message is both copied and redelivered, at-least-once). Nothing is alive when
    /// it returns (`report.stats.alive == 0`), and the sources' final acknowledgement comes
    /// after every disposition.
    ///
    /// A fifth of `grace` (at most 5 s) is kept for the sources' final acknowledgement.
    pub async fn shutdown(mut self, grace: Duration) -> Report {
        let started = tokio::time::Instant::now();
        // A grace too large to add (`Duration::MAX`, "wait for ever") waits a century.
        let grace = grace.min(Duration::from_secs(100 * 365 * 24 * 3600));
        let deadline = started + grace;
        let reserve = (grace / 5).min(Duration::from_secs(5));
        let work_deadline = deadline - reserve;
        *self.final_ack.lock() = Some(deadline);
        let inner = Arc::clone(&self.inner);
        inner.lifecycle.stop.cancel();
        inner.drain_queue();
        inner.lifecycle.tasks.close();
        let mut workers = std::mem::take(&mut self.workers);
        let finished = tokio::time::timeout_at(work_deadline, async {
            while workers.join_next().await.is_some() {}
            inner.lifecycle.tasks.wait().await;
        })
        .await;
        let grace_exceeded = finished.is_err();
        if grace_exceeded {
            // Cancelled handlers drop their messages, which releases them unacknowledged.
            workers.abort_all();
            while workers.join_next().await.is_some() {}
            // So do deferrals and dead letters still waiting for their broker: left running,
            // they would settle after the sources' final acknowledgement.
            inner.lifecycle.kill.cancel();
            let _ = tokio::time::timeout_at(deadline, inner.lifecycle.tasks.wait()).await;
        }
        self.sampler.abort();
        inner.flush_reject_costs();
        self.drained.cancel();
        for intake in std::mem::take(&mut self.intakes) {
            let abort = intake.abort_handle();
            if tokio::time::timeout_at(deadline, intake).await.is_err() {
                abort.abort();
            }
        }
        inner.accounts.publish_counts();
        Report {
            stats: stats_of(&inner),
            grace_exceeded,
            elapsed: started.elapsed(),
        }
    }
}

/// Dropping a runtime without [`shutdown`](Runtime::shutdown) stops everything it started, at
/// once: intake stops pulling, and every message inside (queued, held, running, deferring,
/// dead-lettering, waiting to retry) is released unacknowledged, as a dropped [`Ack`] is, so
/// the broker redelivers it. The sources are dropped without [`Source::shutdown`]: no final
/// synchronous acknowledgement, so messages settled just before may be redelivered too
/// (at-least-once). Call `shutdown` for a clean stop.
impl<T> Drop for Runtime<T> {
    fn drop(&mut self) {
        let inner = &self.inner;
        inner.lifecycle.stop.cancel();
        inner.lifecycle.kill.cancel();
        for intake in &self.intakes {
            intake.abort();
        }
        self.sampler.abort();
        self.workers.abort_all();
        self.drained.cancel();
        inner.accounts.publish_counts();
        // Now rather than when the last aborted task lets go of `inner`.
        drop(inner.queue.close());
    }
}

fn stats_of<T>(inner: &Inner<T>) -> RuntimeStats {
    RuntimeStats {
        ledger: inner.accounts.ledger.snapshot(),
        queue: inner.queue.stats(),
        alive: inner.accounts.alive().max(0) as u64,
        queued: inner.queue.len() as u64,
        held: inner.signals.held(),
        parked: inner.keys.parked() as u64,
        dead_letters_held: inner.dead_letters.held(),
        running: inner.limit.in_flight() as u64,
        limit: inner.limit.limit() as u64,
        refused: inner.accounts.per_tier(|c| &c.refused),
        admitted: inner.accounts.per_tier(|c| &c.admitted),
        withdrawn: inner.accounts.per_tier(|c| &c.withdrawn),
        handed_back: inner.patience.handed_back(),
    }
}

impl<T> std::fmt::Debug for Runtime<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("workers", &self.workers.len())
            .field("sources", &self.intakes.len())
            .finish_non_exhaustive()
    }
}
