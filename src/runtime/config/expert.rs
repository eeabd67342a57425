//! The expert group of the runtime's configuration: every setting whose default is derived or
//! constant, kept for the rare workload that a measurement shows needs another value.

use std::num::NonZeroUsize;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::admission::{BreakerConfig, PullAdmissionConfig};
use crate::limit::{LimitConfig, TierShares};
use crate::queue::WfqConfig;
use crate::{ConfigError, PerTier};

/// Settings for experts (`[expert]` in a file, `RuntimeConfig::expert` in Rust): tuning numbers,
/// not business facts. The defaults are derived or constant; change one only with a
/// measurement that shows the workload needs it (the proving ground, `BENCHMARKS.md`).
///
/// A file written before the group existed, with these settings at the top level (`[queue]`,
/// `[admission]`, `max_held`, ...), still loads: each is moved here, and one warning names
/// where it now lives.
///
/// # Examples
///
/// ```
/// use triage::runtime::RuntimeConfig;
///
/// let config = RuntimeConfig::from_toml(r#"
///     workers = 16
///     [expert]
///     max_held = 8192
///     [expert.queue]
///     capacity = 2000
/// "#)?;
/// assert_eq!(config.expert.queue.capacity.get(), 2000);
/// assert_eq!(config.expert.max_held.get(), 8192);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExpertConfig {
    /// The queue: capacity, byte budget, weights, and the queue-age cut-offs that admit
    /// messages offered with [`try_submit`](crate::runtime::Runtime::try_submit) (pushed work).
    /// Pulled messages are admitted by `admission` instead. See [`WfqConfig`].
    pub queue: WfqConfig,
    /// Admission of pulled messages: overload is arrival beyond capacity (the broker's lag
    /// trend against the measured capacity) that would make work miss its deadline or is
    /// sustained, not a deep queue. See [`PullAdmissionConfig`].
    pub admission: PullAdmissionConfig,
    /// Concurrency limit algorithm (fixed, AIMD or Gradient2). Default: fixed at the user's
    /// `workers`.
    /// Changed live, the algorithm restarts at its `initial` limit; a reconfiguration that
    /// leaves this section as it is keeps the algorithm's adaptive state.
    pub limit: Option<LimitConfig>,
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
    /// Circuit breakers per downstream key: messages bound for a downstream whose circuit is
    /// open are refused at admission (reason `circuit`) and go to their tier's refusal policy,
    /// never to a handler. See [`BreakerConfig`] for each knob and
    /// [`RuntimeBuilder::downstream`](crate::runtime::RuntimeBuilder::downstream) for the
    /// mapping of messages to keys.
    pub breaker: BreakerConfig,
    /// Deferrals waiting for their broker confirm at once; past it, refused messages of a
    /// Defer tier are held (backpressure). By Little's law it caps the defer rate at this
    /// many over the confirm latency, so it must cover the rate a Defer tier is refused at
    /// times the broker's confirm latency (BENCHMARKS.md has the run that set the default).
    /// Each one in flight is a message already in memory (counted by the memory budget) and
    /// a pending publish. Allowed `1..=100_000`. Default `2048`. Fixed while running.
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
    /// (and, on RabbitMQ, prefetch slots): it covers the backlog a refused tier builds while
    /// it waits, e.g. High's rate times its usefulness window. Allowed `1..=100_000`. Default
    /// `4096`.
    #[serde(deserialize_with = "crate::config_de::count::<_, 100_000>")]
    pub max_held: NonZeroUsize,
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
    /// The backoff between a failed handler's retries (how many retries a failure is worth is
    /// the user's [`RetryConfig`](crate::runtime::RetryConfig)). See [`BackoffConfig`].
    pub retry: BackoffConfig,
    /// The memory budget's per-tier thresholds (the budget itself is the user's
    /// `memory.budget_bytes`). See [`MemoryThresholdsConfig`].
    pub memory: MemoryThresholdsConfig,
}

impl Default for ExpertConfig {
    fn default() -> Self {
        ExpertConfig {
            queue: WfqConfig::default(),
            admission: PullAdmissionConfig::default(),
            limit: None,
            shares: TierShares::default(),
            work_conserving: true,
            share_reserve_ms: 0,
            breaker: BreakerConfig::default(),
            max_deferring: NonZeroUsize::new(2048).unwrap_or(NonZeroUsize::MIN),
            max_dead_lettering: NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN),
            defer_cooldown_ms: 1000,
            max_held: NonZeroUsize::new(4096).unwrap_or(NonZeroUsize::MIN),
            max_parked: NonZeroUsize::new(10_000).unwrap_or(NonZeroUsize::MIN),
            poll_interval_ms: 5,
            patience_share: 0.8,
            retry: BackoffConfig::default(),
            memory: MemoryThresholdsConfig::default(),
        }
    }
}

impl ExpertConfig {
    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range by its path under `expert.`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check().map_err(|e| e.within("expert"))
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.queue.validate()?;
        self.admission
            .validate()
            .map_err(|e| e.within("admission"))?;
        if let Some(limit) = &self.limit {
            limit.validate()?;
        }
        if self.share_reserve_ms > 600_000 {
            return Err(ConfigError::new(
                "share_reserve_ms",
                self.share_reserve_ms,
                "0..=600000",
            ));
        }
        self.breaker.validate().map_err(|e| e.within("breaker"))?;
        let counts = [
            ("max_deferring", self.max_deferring, 100_000),
            ("max_dead_lettering", self.max_dead_lettering, 100_000),
            ("max_held", self.max_held, 100_000),
            ("max_parked", self.max_parked, 1_000_000),
        ];
        for (field, value, max) in counts {
            if value.get() > max {
                return Err(ConfigError::new(field, value, format!("1..={max}")));
            }
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
        self.retry.validate().map_err(|e| e.within("retry"))?;
        self.memory.validate().map_err(|e| e.within("memory"))
    }
}

/// The backoff between retries of a failed handler: exponential with full jitter (AWS
/// Architecture Blog, "Exponential Backoff and Jitter"). `[expert.retry]` in a file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackoffConfig {
    /// Backoff before retry `n` is drawn uniformly from `0..min(max_backoff, base × 2^n)`, in
    /// milliseconds, and cut to half the time the message has left before its deadline after
    /// a mean handler run (a retry after the deadline could only expire). Allowed
    /// `1..=3_600_000`. Default `100`.
    pub base_backoff_ms: u64,
    /// Cap on the backoff, in milliseconds. Allowed `base_backoff_ms..=3_600_000`. Default
    /// `10_000`.
    pub max_backoff_ms: u64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            base_backoff_ms: 100,
            max_backoff_ms: 10_000,
        }
    }
}

impl BackoffConfig {
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

    /// Checks both fields against their allowed ranges.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (`base_backoff_ms` or `max_backoff_ms`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=3_600_000).contains(&self.base_backoff_ms) {
            return Err(ConfigError::new(
                "base_backoff_ms",
                self.base_backoff_ms,
                "1..=3600000",
            ));
        }
        if !(self.base_backoff_ms..=3_600_000).contains(&self.max_backoff_ms) {
            return Err(ConfigError::new(
                "max_backoff_ms",
                self.max_backoff_ms,
                format!(
                    "{}..=3600000 (at least base_backoff_ms)",
                    self.base_backoff_ms
                ),
            ));
        }
        Ok(())
    }
}

/// The memory budget's thresholds, per tier (`[expert.memory]` in a file): the fraction of
/// the user's `memory.budget_bytes` above which a tier's new messages are refused (reason
/// `memory`), so the lower tiers are refused first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryThresholdsConfig {
    /// Per tier, a fraction of the budget. Allowed `0.0 < t <= 1.0`, non-increasing from
    /// Critical down to Sheddable. Default `1.0 / 0.85 / 0.70 / 0.50`.
    pub thresholds: PerTier<f64>,
}

impl Default for MemoryThresholdsConfig {
    fn default() -> Self {
        MemoryThresholdsConfig {
            thresholds: crate::admission::MemoryConfig::default().thresholds,
        }
    }
}

impl MemoryThresholdsConfig {
    /// Checks the thresholds as [`MemoryConfig::validate`](crate::admission::MemoryConfig)
    /// does.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the tier's threshold (`thresholds.high`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::admission::MemoryConfig {
            budget_bytes: None,
            thresholds: self.thresholds,
        }
        .validate()
    }
}
