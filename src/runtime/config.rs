//! Configuration of the runtime: one struct, loadable from TOML, with every default documented.

use std::num::NonZeroUsize;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::admission::{BreakerConfig, BucketsConfig, MemoryConfig, PullAdmissionConfig};
use crate::limit::{Fixed, LimitConfig, Limiter, TierShares};
use crate::queue::WfqConfig;
use crate::{ConfigError, PerTier};

/// Highest [`RuntimeConfig::forced_shed_level`]: every tier but Critical refused.
pub(crate) const MAX_FORCED_SHED_LEVEL: u8 = 3;

/// What happens to a message its tier cannot take now (refused at admission or evicted).
/// Decided in advance, per tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalPolicy {
    /// Hold the message, stop pulling from its source, and retry it as capacity returns: the
    /// broker is the buffer. A pull-based source never loses such a message to overload. The
    /// intake holds up to `max_held` per source while it keeps pulling; when that buffer is
    /// full while more important work at risk arrives behind it, the newest held messages are
    /// deferred to make room if a defer sink exists
    /// ([`RuntimeConfig::defer_held_to_make_room`], on by default; set it to `false` to keep
    /// such a tier out of the defer topic).
    Backpressure,
    /// Re-publish it to the durable defer sink and acknowledge it once the broker confirmed
    /// the copy. A refused message (for any reason but shutdown) is shed instead when its
    /// deadline is closer than the soonest a drain can be expected to bring its copy back:
    /// the longest of, while pull admission sheds, `admission.recover_ms` plus the time
    /// shedding has lasted (an overload that has lasted `T` is taken to last about `T` more,
    /// the Lindy estimate); while the operator's `forced_shed_level` is up, the time it has
    /// been up (taken to stay up as long again); and, while there is a backlog (even with
    /// nothing shed), the time it (the sources' lag and what is queued and held) takes to
    /// clear at the estimated capacity. No drain is pulled while anything is shed or while
    /// workers have no room, so its copy would expire before it could come back
    /// (`triage_too_late_to_defer_total`).
    /// Needs a defer sink: without one the runtime refuses to start (a `defer`
    /// written out is a promise that refused messages are kept, and a silent drop would break
    /// it). While the defer sink fails in transport, behaves as `Backpressure` (for
    /// `defer_cooldown_ms`). A message the sink refuses for good (`SinkError::Rejected`: too
    /// large, unroutable) goes to the dead-letter path once, reason `defer_rejected`, and the
    /// tier keeps deferring the others.
    Defer,
    /// Acknowledge it and count it as shed.
    Drop,
    /// `Defer` when the runtime has a defer sink, `Drop` when it has none: the default for
    /// Medium and Sheddable, decided once at start-up.
    DeferOrDrop,
}

/// Retries of failed handlers: exponential backoff with full jitter (AWS Architecture Blog,
/// "Exponential Backoff and Jitter"), one criticality level lower per retry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Retries after the first attempt before a message is dead-lettered. Allowed `0..=100`.
    /// Default `3`.
    pub max_retries: u32,
    /// Backoff before retry `n` is drawn uniformly from `0..min(max_backoff, base × 2^n)`, in
    /// milliseconds, and cut to half the time the message has left before its deadline after
    /// a mean handler run (a retry after the deadline could only expire). Allowed
    /// `1..=3_600_000`. Default `100`.
    pub base_backoff_ms: u64,
    /// Cap on the backoff, in milliseconds. Allowed `base_backoff_ms..=3_600_000`. Default
    /// `10_000`.
    pub max_backoff_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 3,
            base_backoff_ms: 100,
            max_backoff_ms: 10_000,
        }
    }
}

impl RetryConfig {
    /// The backoff before retry number `retry` (1-based), with full jitter.
    pub fn backoff(&self, retry: u32) -> Duration {
        self.backoff_within(retry, Duration::MAX)
    }

    /// The backoff before retry number `retry` (1-based), with full jitter below the lower of
    /// the exponential bound and `cap`: messages that failed together still retry apart when
    /// their deadline cuts the wait short (a draw clamped to the cap would put most of them
    /// on the same instant).
    pub fn backoff_within(&self, retry: u32, cap: Duration) -> Duration {
        let exp = self
            .base_backoff_ms
            .saturating_mul(1u64 << retry.min(32))
            .min(self.max_backoff_ms);
        let cap_ms = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(fastrand::u64(0..=exp.min(cap_ms)))
    }

    /// The longest backoff, `max_backoff_ms`, without jitter: how long a message whose
    /// dead letter was refused for good waits before it is tried again.
    pub fn max_backoff(&self) -> Duration {
        Duration::from_millis(self.max_backoff_ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_retries > 100 {
            return Err(ConfigError::new(
                "retry.max_retries",
                self.max_retries,
                "0..=100",
            ));
        }
        if !(1..=3_600_000).contains(&self.base_backoff_ms) {
            return Err(ConfigError::new(
                "retry.base_backoff_ms",
                self.base_backoff_ms,
                "1..=3600000",
            ));
        }
        if !(self.base_backoff_ms..=3_600_000).contains(&self.max_backoff_ms) {
            return Err(ConfigError::new(
                "retry.max_backoff_ms",
                self.max_backoff_ms,
                format!(
                    "{}..=3600000 (at least retry.base_backoff_ms)",
                    self.base_backoff_ms
                ),
            ));
        }
        Ok(())
    }
}

/// Configuration of a [`Runtime`](crate::runtime::Runtime).
///
/// Every field can change while the runtime runs, with
/// [`Runtime::reconfigure`](crate::runtime::Runtime::reconfigure) (all or nothing) or a reload
/// of the file, except `workers`, `max_deferring` and `max_dead_lettering`
/// ([`FIXED`](crate::runtime::FIXED)): a change to one of those is refused, naming it. The
/// README's "Changing settings while running" says when each setting takes effect.
///
/// # Examples
///
/// ```
/// use triage::runtime::{RefusalPolicy, RuntimeConfig};
///
/// let config = RuntimeConfig::from_toml(r#"
///     workers = 16
///     [queue]
///     capacity = 2000
///     [limit]
///     kind = "gradient2"
///     initial = 8
///     max = 16
///     [policy]
///     critical = "backpressure"
///     high = "backpressure"
///     medium = "defer"
///     sheddable = "drop"
///     [retry]
///     max_retries = 2
/// "#)?;
/// assert_eq!(config.policy.sheddable, RefusalPolicy::Drop);
///
/// let err = RuntimeConfig::from_toml("[queue]\ncapacity = 0").unwrap_err();
/// assert!(err.to_string().contains("capacity"), "{err}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker tasks: the most handlers that can ever run at once. The concurrency limit moves
    /// below it. Allowed `1..=100_000`. Default `8`. Fixed while running (change `limit`
    /// instead).
    #[serde(deserialize_with = "crate::config_de::count::<_, 100_000>")]
    pub workers: NonZeroUsize,
    /// The queue: capacity, byte budget, weights, and the queue-age cut-offs that admit
    /// messages offered with [`try_submit`](crate::runtime::Runtime::try_submit) (pushed work).
    /// Pulled messages are admitted by `admission` instead. See [`WfqConfig`].
    pub queue: WfqConfig,
    /// Admission of pulled messages: overload is arrival beyond capacity (the broker's lag
    /// trend against the measured capacity) that would make work miss its deadline or is
    /// sustained, not a deep queue. See [`PullAdmissionConfig`].
    pub admission: PullAdmissionConfig,
    /// Circuit breakers per downstream key: messages bound for a downstream whose circuit is
    /// open are refused at admission (reason `circuit`) and go to their tier's refusal policy,
    /// never to a handler. See [`BreakerConfig`] for each knob and
    /// [`RuntimeBuilder::downstream`](crate::runtime::RuntimeBuilder::downstream) for the
    /// mapping of messages to keys.
    pub breaker: BreakerConfig,
    /// Concurrency limit algorithm (fixed, AIMD or Gradient2). Default: fixed at `workers`.
    /// Changed live, the algorithm restarts at its `initial` limit; a reconfiguration that
    /// leaves this section as it is keeps the algorithm's adaptive state.
    pub limit: Option<LimitConfig>,
    /// Per-tier token buckets (rate in messages/s or a share of a capacity figure, burst, and
    /// the borrowing chain), checked at intake for pulled and pushed messages; a refusal has
    /// reason `rate`. Default: no bucket (no tier rate-limited), Critical borrowing from High
    /// once both have one. See [`BucketsConfig`].
    pub buckets: BucketsConfig,
    /// A budget on the payload bytes the process holds (queued, held, deferring, in flight),
    /// with per-tier thresholds (default 1.0 / 0.85 / 0.70 / 0.50 of the budget); a refusal
    /// has reason `memory`, and the intake stops pulling while the next message might not
    /// fit. Default: no budget. See [`MemoryConfig`].
    pub memory: MemoryConfig,
    /// Share of the concurrency limit each tier may use (priority-scaled concurrency shares, as in
    /// "Load Shedding: Drop Low-Priority Work to Save the Rest"). Default
    /// `1.0 / 0.9 / 0.75 / 0.5`.
    pub shares: TierShares,
    /// Work-conserving shares: a tier may use idle slots beyond its share while no higher tier
    /// has work waiting in the queue, so workers never idle next to waiting lower-tier work
    /// (with strict shares at 1x, a tier with a share of 0.5 gets only the slots left while
    /// fewer than half are busy, and its work expires waiting). The cost: a higher-tier message
    /// that arrives while borrowed slots are busy waits for the first to free, at most one
    /// handler run; strict shares cost it more, since the queue the idle workers leave behind
    /// stays longer and it waits behind that. `false` keeps the shares strict. Default `true`.
    /// The proving ground's comparison of the two is in `BENCHMARKS.md`.
    pub work_conserving: bool,
    /// Also keep the shares strict for this long after a higher tier last had work queued, in
    /// milliseconds, for higher tiers that arrive in bursts. With steady mixed traffic any
    /// value above the gap between two higher-tier arrivals turns borrowing off. Allowed
    /// `0..=600_000`. Default `0` (only work waiting now reserves).
    pub share_reserve_ms: u64,
    /// Refusal policy per tier. Default: Backpressure for Critical and High, DeferOrDrop for
    /// Medium and Sheddable (Defer with a defer sink, Drop without one). An explicit `defer`
    /// without a defer sink is refused at start-up, naming the tier (`policy.medium`).
    pub policy: PerTier<RefusalPolicy>,
    /// Handler retries.
    pub retry: RetryConfig,
    /// Times one message may be deferred (counted by the `triage-deferrals` header its copies
    /// carry). A message deferred this many times is not deferred again: when its tier is
    /// refused it is held (backpressure, in the drain's topic or queue) until it is served or
    /// its deadline passes, so it ends `Completed` or `Expired`, never bouncing between the
    /// topics. Allowed `1..=1000`. Default `3`.
    pub max_deferrals: u32,
    /// Deferrals waiting for their broker confirm at once; past it, refused messages of a
    /// Defer tier are held (backpressure). By Little's law it caps the defer rate at this
    /// many over the confirm latency. At 256, README's Kafka demo (2-core machine, broker and
    /// load generator beside it) deferred about 3,000 copies a second (so a confirm took
    /// about 85 ms), less than the 4,200/s of Medium and Sheddable it refused: refused work
    /// piled up in the held buffer, the partition paused and Critical waited in the broker
    /// (88.2% and 96.0% in time in two runs). At `2048`: 100.0% in two runs, none expired. Each one in flight is a message already in memory
    /// (counted by the memory budget) and a pending publish. Allowed `1..=100_000`. Default
    /// `2048`. Fixed while running.
    #[serde(deserialize_with = "crate::config_de::count::<_, 100_000>")]
    pub max_deferring: NonZeroUsize,
    /// Dead letters being published at once, off the workers (each a task: publishing,
    /// retrying a transient error with the retry backoff, or held unacknowledged after the
    /// sink refused it and its reference copy for good; see
    /// [`DeadLetterSink`](crate::runtime::DeadLetterSink) for the policy). A worker whose
    /// message fails for good hands it over and serves the next one at once; only when this
    /// many are already in the dead-letter path does it wait for one to finish (backpressure).
    /// Allowed `1..=100_000`. Default `64`. Fixed while running.
    #[serde(deserialize_with = "crate::config_de::count::<_, 100_000>")]
    pub max_dead_lettering: NonZeroUsize,
    /// While the defer sink is failing in transport (`Unavailable`, `NotConfirmed`), how long
    /// Defer tiers behave as Backpressure before the sink is tried again, in milliseconds. A
    /// permanent rejection of one message (`SinkError::Rejected`) does not count: that message
    /// alone goes to the dead-letter path. Allowed `1..=3_600_000`. Default `1000`.
    pub defer_cooldown_ms: u64,
    /// Messages an intake holds under backpressure while it keeps pulling, per source, so a
    /// refused message does not block the more critical ones behind it in the same partition
    /// (head-of-line blocking). When full, the source is paused. Held messages cost memory only
    /// (and, on RabbitMQ, prefetch slots): size it to the backlog a refused tier builds while
    /// it waits, e.g. High's rate times its usefulness window. Allowed `1..=100_000`. Default
    /// `4096`. (At 64, the README's Kafka demo at 4x overload paused its partition behind
    /// held High messages and served 34.8% of Critical in time; at 4096, 97.2%.)
    #[serde(deserialize_with = "crate::config_de::count::<_, 100_000>")]
    pub max_held: NonZeroUsize,
    /// Make room rather than pause when the held buffer is full: if the source delivered a
    /// tier above the lowest held one within the last second, with less deadline slack at
    /// intake than twice the time the workers need to serve what is held and queued (so that
    /// pausing would make it miss its deadline, or with no deadline, or any before a handler
    /// run was measured; the slack is a moving mean, each record weighing 1/8), the held
    /// messages of the tiers below it are deferred (reason `make_room`), lowest tier first and newest first within
    /// it (as the queue evicts), until the buffer is three quarters full, and the intake reads
    /// on to the more important work. Only with a healthy defer sink, only unkeyed messages
    /// deferred fewer than `max_deferrals` times, at most `max_deferring` at once; the rest
    /// stay held and the source pauses as before. Deferral moves work out of the way; it
    /// never loses it. Without it, a tier held under backpressure (High by default) fills the
    /// buffer under sustained overload, the partition pauses, and Critical waits in the
    /// broker behind it: README's Kafka demo at 4x (one mixed partition, one 5 s deadline for
    /// every tier) served 92.8% of Critical in time with `false`. Default `true`.
    pub defer_held_to_make_room: bool,
    /// Messages parked behind a busy key (sources in `key` or `partition` ordering mode, see
    /// [`crate::ordering`]), across the runtime: a bound of their own, apart from the queue's
    /// capacity. When the key gate holds this many, every intake pauses its source, as a full
    /// held buffer does, until keys complete. Allowed `1..=1_000_000`. Default `10_000`.
    #[serde(deserialize_with = "crate::config_de::count::<_, 1_000_000>")]
    pub max_parked: NonZeroUsize,
    /// How often a held (backpressured) message is retried when nothing else wakes it, and how
    /// often gauges are sampled, in milliseconds. Allowed `1..=60_000`. Default `5`.
    pub poll_interval_ms: u64,
    /// The share of its source's patience a message may wait in the runtime before it is
    /// handed back, for sources that state one
    /// ([`Source::patience`](crate::runtime::Source::patience)): RabbitMQ's, its
    /// `consumer_timeout`.
    ///
    /// RabbitMQ closes the channel of a delivery left unacknowledged past its consumer
    /// timeout (30 minutes by default, or the queue's `x-consumer-timeout`), and every
    /// unsettled delivery on that channel is delivered again, including those whose handlers
    /// had already finished (their acknowledgements fail), so their work is done twice. triage
    /// can keep a message waiting that long by design: a Sheddable message queued behind a
    /// sustained Critical backlog (the concurrency shares keep its tier out), one held under
    /// Backpressure for as long as an overload lasts, one parked behind a slow ordering key.
    /// So a message that has waited this share of the patience (queued, held or parked,
    /// counted from the broker's delivery, the time in the source's own buffer included) is
    /// handed back before the broker acts: deferred (reason `patience`) when its tier's policy
    /// is `defer` and a copy can still come back before its deadline, otherwise released
    /// unacknowledged (on RabbitMQ `basic.nack` with `requeue`), and the broker delivers it
    /// again, to this consumer or another, with a patience of its own. The ledger counts a
    /// released message as `released`, not as a disposition, as at shutdown: its redelivery is
    /// consumed again and ends in exactly one. Counted in `triage_handed_back_total` (by tier,
    /// where it waited, and outcome). A message already in a handler is never handed back:
    /// its run must fit in the rest of the patience.
    ///
    /// Allowed `0.05..=0.95`: the rest of the patience is the margin for the hand-back to reach
    /// the broker, which checks its timeout once per channel tick. Default `0.8`. A change
    /// applies to messages received after it.
    pub patience_share: f64,
    /// The operator's shed switch (seed 002: "pre-define these degraded modes and make them one
    /// switch"): refuse this many tiers from the bottom of the ladder whatever the signals say,
    /// each refused message going to its tier's refusal policy (reason `forced`). `0`
    /// sheds nothing by force, `1` refuses Sheddable, `2` Sheddable and Medium, `3` everything
    /// but Critical. Critical is never refused by force: to stop everything, stop the
    /// consumer. Applies to pulled and pushed (`try_submit`) work alike, and to drains (which
    /// pull only while nothing is shed); per-tier sources pause the refused tiers. So a
    /// deferred copy comes back only once the level is lifted: a refused message of a `defer`
    /// tier whose deadline is closer than the time the level has been up is shed rather than
    /// deferred (see [`RefusalPolicy::Defer`]). The signals may shed more; the effective
    /// level is the higher of the two. Allowed `0..=3`. Default
    /// `0`. Change it live with [`Runtime::reconfigure`](crate::runtime::Runtime::reconfigure).
    pub forced_shed_level: u8,
    /// The operator's brownout switch (seed 002: "sometimes it's better to serve every request
    /// with less work"): a level the handler reads from
    /// [`Job::brownout`](crate::runtime::Job::brownout) to skip optional work (enrichment,
    /// recommendations, rich previews). What each level turns off is the handler's choice;
    /// triage only carries the number. `0` is full service. Allowed `0..=255`. Default `0`.
    pub brownout_level: u8,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: NonZeroUsize::new(8).unwrap_or(NonZeroUsize::MIN),
            queue: WfqConfig::default(),
            admission: PullAdmissionConfig::default(),
            breaker: BreakerConfig::default(),
            limit: None,
            buckets: BucketsConfig::default(),
            memory: MemoryConfig::default(),
            shares: TierShares::default(),
            work_conserving: true,
            share_reserve_ms: 0,
            policy: PerTier::new(
                RefusalPolicy::Backpressure,
                RefusalPolicy::Backpressure,
                RefusalPolicy::DeferOrDrop,
                RefusalPolicy::DeferOrDrop,
            ),
            retry: RetryConfig::default(),
            max_deferrals: 3,
            max_deferring: NonZeroUsize::new(2048).unwrap_or(NonZeroUsize::MIN),
            max_dead_lettering: NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN),
            defer_cooldown_ms: 1000,
            max_held: NonZeroUsize::new(4096).unwrap_or(NonZeroUsize::MIN),
            defer_held_to_make_room: true,
            max_parked: NonZeroUsize::new(10_000).unwrap_or(NonZeroUsize::MIN),
            poll_interval_ms: 5,
            patience_share: 0.8,
            forced_shed_level: 0,
            brownout_level: 0,
        }
    }
}

/// A configuration that could not be loaded: bad TOML, or a value out of range.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadConfigError {
    /// The text is not valid TOML for this structure (the message names the key).
    Parse(toml::de::Error),
    /// A value is outside its allowed range.
    Invalid(ConfigError),
}

impl std::fmt::Display for LoadConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadConfigError::Parse(e) => write!(f, "invalid config: {e}"),
            LoadConfigError::Invalid(e) => write!(f, "invalid config: {e}"),
        }
    }
}

impl std::error::Error for LoadConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadConfigError::Parse(e) => Some(e),
            LoadConfigError::Invalid(e) => Some(e),
        }
    }
}

impl RuntimeConfig {
    /// The concurrency limiter this configuration asks for: the `[limit]` algorithm, or a fixed
    /// limit of `workers` without one. Built here alone, for start and for a reconfiguration.
    pub(crate) fn limiter(&self) -> Result<Limiter, ConfigError> {
        match &self.limit {
            Some(limit) => Ok(limit.build()?),
            None => Ok(Limiter::from(
                Fixed::new(self.workers.get())
                    .map_err(|e| ConfigError::new("workers", e.value, e.allowed))?,
            )),
        }
    }

    /// Parses and validates a TOML document.
    ///
    /// # Errors
    ///
    /// [`LoadConfigError::Parse`] for text that is not this structure (unknown keys included),
    /// [`LoadConfigError::Invalid`] for a value out of range; both name the field.
    pub fn from_toml(text: &str) -> Result<Self, LoadConfigError> {
        let config: RuntimeConfig = toml::from_str(text).map_err(LoadConfigError::Parse)?;
        config.validate().map_err(LoadConfigError::Invalid)?;
        Ok(config)
    }

    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers.get() > 100_000 {
            return Err(ConfigError::new("workers", self.workers, "1..=100000"));
        }
        self.queue.validate()?;
        self.admission
            .validate()
            .map_err(|e| e.within("admission"))?;
        self.breaker.validate().map_err(|e| e.within("breaker"))?;
        self.buckets.validate().map_err(|e| e.within("buckets"))?;
        self.memory.validate().map_err(|e| e.within("memory"))?;
        if self.share_reserve_ms > 600_000 {
            return Err(ConfigError::new(
                "share_reserve_ms",
                self.share_reserve_ms,
                "0..=600000",
            ));
        }
        if !(1..=1000).contains(&self.max_deferrals) {
            return Err(ConfigError::new(
                "max_deferrals",
                self.max_deferrals,
                "1..=1000",
            ));
        }
        if let Some(limit) = &self.limit {
            limit.validate()?;
        }
        self.retry.validate()?;
        if self.max_deferring.get() > 100_000 {
            return Err(ConfigError::new(
                "max_deferring",
                self.max_deferring,
                "1..=100000",
            ));
        }
        if self.max_dead_lettering.get() > 100_000 {
            return Err(ConfigError::new(
                "max_dead_lettering",
                self.max_dead_lettering,
                "1..=100000",
            ));
        }
        if self.max_held.get() > 100_000 {
            return Err(ConfigError::new("max_held", self.max_held, "1..=100000"));
        }
        if self.max_parked.get() > 1_000_000 {
            return Err(ConfigError::new(
                "max_parked",
                self.max_parked,
                "1..=1000000",
            ));
        }
        if !(1..=3_600_000).contains(&self.defer_cooldown_ms) {
            return Err(ConfigError::new(
                "defer_cooldown_ms",
                self.defer_cooldown_ms,
                "1..=3600000",
            ));
        }
        if !(1..=60_000).contains(&self.poll_interval_ms) {
            return Err(ConfigError::new(
                "poll_interval_ms",
                self.poll_interval_ms,
                "1..=60000",
            ));
        }
        if !(0.05..=0.95).contains(&self.patience_share) {
            return Err(ConfigError::new(
                "patience_share",
                self.patience_share,
                "0.05..=0.95",
            ));
        }
        if self.forced_shed_level > MAX_FORCED_SHED_LEVEL {
            return Err(ConfigError::new(
                "forced_shed_level",
                self.forced_shed_level,
                "0..=3 (Critical is never refused by force)",
            ));
        }
        Ok(())
    }
}
