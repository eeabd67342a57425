//! Building a runtime: its builder (sinks, observer, downstream mapping, clock) and `start`,
//! which builds the parts and spawns the workers and the sampler.

use crate::sync::AtomicU64;
use std::future::Future;
use std::sync::Arc;

use quanta::Clock;
use tokio_util::sync::CancellationToken;

use crate::limit::ConcurrencyLimit;
use crate::queue::WfqQueue;
use crate::runtime::accounts::Accounts;
use crate::runtime::engine::{self, Inner};
use crate::runtime::reconfigure::{check_sinks, Applied};
use crate::runtime::{
    cost, dead_letter, deferral, lifecycle, live, metrics, pacing, signals, worker, DeadLetterSink,
    DeferSink, HandlerError, Job, ReconfigureError, Runtime, RuntimeConfig,
};
use crate::ConfigError;

/// Builds a worker's task for a runtime: its handler inside.
pub(super) type SpawnWorker<T> =
    Arc<dyn Fn(Arc<Inner<T>>) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Builds a [`Runtime`].
#[must_use]
pub struct RuntimeBuilder<T> {
    config: RuntimeConfig,
    defer: Option<Arc<dyn DeferSink<T>>>,
    dead_letter: Option<Arc<dyn DeadLetterSink<T>>>,
    observer: Option<engine::Observer<T>>,
    downstream: Option<engine::DownstreamFn<T>>,
    clock: Clock,
}

impl<T> std::fmt::Debug for RuntimeBuilder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("config", &self.config)
            .field("defer", &self.defer.is_some())
            .field("dead_letter", &self.dead_letter.is_some())
            .finish()
    }
}

impl<T> RuntimeBuilder<T> {
    /// A builder with `config`, no defer sink, no dead-letter sink, the system clock.
    pub(super) fn new(config: RuntimeConfig) -> Self {
        RuntimeBuilder {
            config,
            defer: None,
            dead_letter: None,
            observer: None,
            downstream: None,
            clock: Clock::new(),
        }
    }
}

impl<T: Send + Sync + 'static> RuntimeBuilder<T> {
    /// Re-publishes refused and evicted messages of Defer tiers to `sink`.
    pub fn defer_sink(mut self, sink: Arc<impl DeferSink<T>>) -> Self {
        self.defer = Some(sink);
        self
    }

    /// Publishes messages that failed for good to `sink` before acknowledging them, off the
    /// workers (see [`DeadLetterSink`] for what happens when the sink is down or refuses a
    /// message for good). Without one, such a message is recorded `Failed` and acknowledged
    /// as such: the Kafka source commits past it, the RabbitMQ source rejects it to the
    /// queue's dead-letter exchange.
    pub fn dead_letter_sink(mut self, sink: Arc<impl DeadLetterSink<T>>) -> Self {
        self.dead_letter = Some(sink);
        self
    }

    /// Calls `observer` with every message's disposition, just before its acknowledgement:
    /// for audit trails and reconciliation (which id ended how). It runs on the hot path, refuse
    /// path included, so keep it cheap and never block in it.
    pub fn observe(
        mut self,
        observer: impl Fn(&T, crate::Criticality, crate::ledger::Disposition) + Send + Sync + 'static,
    ) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Maps each message to the downstream it is bound for (a payment service, a database, a
    /// partner's API), for circuit-breaker-aware admission: while that key's circuit is open
    /// (see [`BreakerConfig`](crate::admission::BreakerConfig)) its messages are refused with
    /// reason `circuit` and go to their tier's refusal policy, never to a handler; messages of
    /// other keys are served as usual. `None`: the message has no downstream, never refused
    /// for one.
    ///
    /// Called once per consumed message, on the intake, so keep it cheap: read a header, the
    /// topic or queue, or a field of the message, and return it borrowed. Looking the key up
    /// allocates nothing (but once for a key never seen before; at most
    /// `breaker.max_keys` keys are tracked). The handler says which downstream failed with
    /// [`HandlerError::downstream`].
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
    ///
    /// struct Order { psp: String }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = Runtime::builder(RuntimeConfig::default())
    ///     .downstream(|order: &Order| Some(order.psp.as_str()))
    ///     .start(|job: Job<Order>| async move {
    ///         let psp = job.payload().psp.clone();
    ///         Err(HandlerError::downstream(psp, "503 from the payment provider"))
    ///     })?;
    /// # drop(runtime);
    /// # Ok(())
    /// # }
    /// ```
    pub fn downstream(
        mut self,
        key_of: impl for<'a> Fn(&'a T) -> Option<&'a str> + Send + Sync + 'static,
    ) -> Self {
        self.downstream = Some(Arc::new(key_of));
        self
    }

    /// Reads time from `clock` (deadlines, queue age, latency).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Starts the workers with `handler`, on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when the configuration is out of range.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub fn start<H, F>(self, handler: H) -> Result<Runtime<T>, ConfigError>
    where
        H: Fn(Job<T>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let config = self.config;
        // The settings that cannot change while running size the parts; every other setting
        // is applied to the defaults below, through the path of a live reconfiguration.
        config.validate()?;
        let mut base = RuntimeConfig {
            workers: config.workers,
            ..RuntimeConfig::default()
        };
        base.expert.max_deferring = config.expert.max_deferring;
        base.expert.max_dead_lettering = config.expert.max_dead_lettering;
        check_sinks(&mut base, self.defer.as_ref(), self.dead_letter.as_ref())?;
        let workers = base.workers.get();
        let limit = ConcurrencyLimit::new(base.limiter()?, base.expert.shares);
        // Queue age admits pushed work only (`try_submit`); pulled work is admitted by the
        // pull-based level in `Inner::offer` and queued past the queue-age check.
        let queue = WfqQueue::with_clock(base.expert.queue.clone(), self.clock.clone())?;
        let origin = self.clock.now();
        let accounts = Arc::new(Accounts {
            clock_origin: origin,
            cohort_period: AtomicU64::new(crate::admission::rotation_period()),
            ledger: crate::ledger::Ledger::new(),
            metrics: metrics::Metrics::register(),
            metric_counts: Default::default(),
            counts: Default::default(),
            idle: tokio::sync::Notify::new(),
            sources_done: crate::sync::AtomicBool::new(true),
            memory: crate::admission::MemoryBudget::new(&base.memory_config()),
            decisions: Default::default(),
            decisions_published: Default::default(),
            refusals: Default::default(),
        });
        let live = live::Live::new();
        let breakers = Arc::new(crate::admission::Breakers::with_clock(
            base.expert.breaker.clone(),
            self.clock.clone(),
        )?);
        let buckets = crate::admission::TierBuckets::new(&base.buckets, self.clock.clone());
        let inner = Arc::new(Inner {
            queue,
            limit,
            accounts,
            deferrals: deferral::Deferrals::new(self.defer, base.expert.max_deferring.get()),
            dead_letters: dead_letter::DeadLetters::new(
                self.dead_letter,
                base.expert.max_dead_lettering.get(),
            ),
            config: arc_swap::ArcSwap::from_pointee(base),
            live,
            observer: self.observer,
            breakers,
            downstream: self.downstream,
            buckets,
            reject_costs: cost::CostSamples::new(),
            keys: crate::ordering::KeyGate::new(),
            signals: signals::Signals::new(),
            pacing: pacing::Pacing::new(),
            lifecycle: lifecycle::Lifecycle::new(),
            patience: Default::default(),
            recalls: Default::default(),
            origin,
            clock: self.clock,
        });
        match inner.apply(config, Applied::Start) {
            Ok(_) => {}
            Err(ReconfigureError::Invalid(e)) => return Err(e),
            // Applying checks and builds; it has no file to read nor a runtime that stopped.
            Err(e) => {
                return Err(ConfigError::new(
                    "(configuration)",
                    e,
                    "a valid configuration",
                ))
            }
        }
        let handler = Arc::new(handler);
        let spawn_worker: SpawnWorker<T> =
            Arc::new(move |inner| Box::pin(worker::run(inner, Arc::clone(&handler))));
        let mut worker_set = tokio::task::JoinSet::new();
        for _ in 0..workers {
            worker_set.spawn(spawn_worker(Arc::clone(&inner)));
        }
        let sampler = tokio::spawn(Arc::clone(&inner).sampler());
        Ok(Runtime {
            inner,
            workers: worker_set,
            spawn_worker,
            intakes: Vec::new(),
            sampler,
            drained: CancellationToken::new(),
            final_ack: Arc::new(parking_lot::Mutex::new(None)),
        })
    }
}
