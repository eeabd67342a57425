//! Configuration of the runtime, loadable from TOML, with every default documented.
//!
//! Two groups. The top level holds what only the user can say, business facts the runtime
//! cannot measure: the resources the handlers may use, each tier's refusal policy, what a
//! failure and a deferral are worth, the memory budget, contractual rates and the operator's
//! switches. [`ExpertConfig`] (`[expert]`) holds the rest: tuning numbers whose defaults are
//! derived or constant. `migrate` moves a file written before the groups existed into them.

mod expert;
mod load;
mod migrate;
#[cfg(test)]
mod tests;

use std::num::NonZeroUsize;

use serde::{Deserialize, Serialize};

use crate::admission::{BucketsConfig, MemoryConfig, MAX_BUDGET_BYTES};
use crate::limit::{Fixed, LimitConfig, Limiter};
use crate::{ConfigError, PerTier};

pub use expert::{BackoffConfig, ExpertConfig, MemoryThresholdsConfig};
pub use load::LoadConfigError;
pub use migrate::MOVED;

/// Highest [`RuntimeConfig::forced_shed_level`]: every tier but Critical refused.
pub(crate) const MAX_FORCED_SHED_LEVEL: u8 = 3;

/// What happens to a message its tier cannot take now (refused at admission or evicted).
/// Decided in advance, per tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalPolicy {
    /// Hold the message, stop pulling from its source, and retry it as capacity returns: the
    /// broker is the buffer. A pull-based source never loses such a message to overload. The
    /// intake holds up to `expert.max_held` per source while it keeps pulling; when that buffer is
    /// full while more important work at risk arrives behind it, the newest held messages are
    /// deferred to make room if a defer sink exists
    /// ([`RuntimeConfig::defer_held_to_make_room`], on by default; set it to `false` to keep
    /// such a tier out of the defer topic).
    Backpressure,
    /// Re-publish it to the durable defer sink and acknowledge it once the broker confirmed
    /// the copy. A refused message (for any reason but shutdown) is shed instead when its
    /// deadline is closer than the soonest a drain can be expected to bring its copy back:
    /// the longest of, while pull admission sheds, `expert.admission.recover_ms` plus the time
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
    /// `expert.defer_cooldown_ms`). A message the sink refuses for good (`SinkError::Rejected`: too
    /// large, unroutable) goes to the dead-letter path once, reason `defer_rejected`, and the
    /// tier keeps deferring the others.
    Defer,
    /// Acknowledge it and count it as shed.
    Drop,
    /// `Defer` when the runtime has a defer sink, `Drop` when it has none: the default for
    /// Medium and Sheddable, decided once at start-up.
    DeferOrDrop,
}

/// How many retries a failed handler's message is worth. The backoff between them is the
/// expert's [`BackoffConfig`] (`expert.retry`).
///
/// Each retry is one criticality level lower than the attempt before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Retries after the first attempt before a message is dead-lettered. Allowed `0..=100`.
    /// Default `3`. The user's: what another attempt is worth (an idempotent charge retried,
    /// an e-mail not sent twice) is a business fact no measurement shows.
    #[serde(deserialize_with = "crate::config_de::int::<_, _, 0, 100>")]
    pub max_retries: u32,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig { max_retries: 3 }
    }
}

impl RetryConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_retries > 100 {
            return Err(ConfigError::new(
                "retry.max_retries",
                self.max_retries,
                "0..=100",
            ));
        }
        Ok(())
    }
}

/// The memory budget (`[memory]` in a file). The per-tier thresholds are the expert's
/// [`MemoryThresholdsConfig`] (`expert.memory`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryBudgetConfig {
    /// The budget on the payload bytes (each message's `size_bytes`) the process holds at once:
    /// queued, held under backpressure, deferring, waiting to retry and in a handler. In bytes.
    /// Allowed `1..=2^50`. Default none (no budget).
    pub budget_bytes: Option<u64>,
}

/// Configuration of a [`Runtime`](crate::runtime::Runtime).
///
/// The top-level fields are what only the user can say: business facts the runtime cannot
/// measure, each documented with why it cannot be derived. Everything else is in
/// [`expert`](RuntimeConfig::expert): tuning whose defaults are derived or constant.
///
/// Every field can change while the runtime runs, with
/// [`Runtime::reconfigure`](crate::runtime::Runtime::reconfigure) (all or nothing) or a reload
/// of the file, except `workers`, `expert.max_deferring` and `expert.max_dead_lettering`
/// ([`FIXED`](crate::runtime::FIXED)): a change to one of those is refused, naming it. The
/// README's "Changing settings while running" says when each setting takes effect.
///
/// A file written for the layout before the expert group (`[queue]`, `[admission]`,
/// `max_held`, ... at the top level) still loads to the same configuration: see
/// [`from_toml`](RuntimeConfig::from_toml).
///
/// # Examples
///
/// ```
/// use triage::runtime::{RefusalPolicy, RuntimeConfig};
///
/// let config = RuntimeConfig::from_toml(r#"
///     workers = 16
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
/// let err = RuntimeConfig::from_toml("workers = 0").unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "invalid config: workers = 0 is out of range: allowed 1..=100000"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Worker tasks: the most handlers that can ever run at once. The concurrency limit moves
    /// below it. Allowed `1..=100_000`. Default `8`. Fixed while running (change
    /// `expert.limit` instead). The user's: how much the handlers may use at once (cores,
    /// downstream connections, the memory a handler needs) is provisioned, not measured.
    #[serde(deserialize_with = "crate::config_de::count::<_, 100_000>")]
    pub workers: NonZeroUsize,
    /// Refusal policy per tier. Default: Backpressure for Critical and High, DeferOrDrop for
    /// Medium and Sheddable (Defer with a defer sink, Drop without one). An explicit `defer`
    /// without a defer sink is refused at start-up, naming the tier (`policy.medium`).
    /// The user's: what losing, delaying or re-publishing a tier's message costs is business.
    pub policy: PerTier<RefusalPolicy>,
    /// Make room rather than pause when the held buffer is full: if the source delivered a
    /// tier above the lowest held one within the last second, with less deadline slack at
    /// intake than twice the time the workers need to serve what is held and queued (so that
    /// pausing would make it miss its deadline, or with no deadline, or any before a handler
    /// run was measured; the slack is a moving mean, each record weighing 1/8), the held
    /// messages of the tiers below it are deferred (reason `make_room`), lowest tier first and newest first within
    /// it (as the queue evicts), until the buffer is three quarters full, and the intake reads
    /// on to the more important work. Only with a healthy defer sink, only unkeyed messages
    /// deferred fewer than `max_deferrals` times, at most `expert.max_deferring` at once; the rest
    /// stay held and the source pauses as before. Deferral moves work out of the way; it
    /// never loses it. Without it, a tier held under backpressure (High by default) fills the
    /// buffer under sustained overload, the partition pauses, and Critical waits in the
    /// broker behind it: README's Kafka demo at 4x (one mixed partition, one 5 s deadline for
    /// every tier) served 92.8% of Critical in time with `false`. Default `true`.
    /// The user's: whether a backpressured tier's messages may leave their partition or queue
    /// for the defer topic at all (their consumers, their order) is a promise, not a number.
    pub defer_held_to_make_room: bool,
    /// Handler retries: how many a failure is worth. See [`RetryConfig`].
    pub retry: RetryConfig,
    /// Times one message may be deferred (counted by the `triage-deferrals` header its copies
    /// carry). A message deferred this many times is not deferred again: when its tier is
    /// refused it is held (backpressure, in the drain's topic or queue) until it is served or
    /// its deadline passes, so it ends `Completed` or `Expired`, never bouncing between the
    /// topics. Allowed `1..=1000`. Default `3`.
    /// The user's: how often a message may be put off is a promise about when it is served.
    #[serde(deserialize_with = "crate::config_de::int::<_, _, 1, 1000>")]
    pub max_deferrals: u32,
    /// A budget on the payload bytes the process holds (queued, held, deferring, in flight); a
    /// tier's new messages are refused above its threshold of it (reason `memory`,
    /// `expert.memory.thresholds`), and the intake stops pulling while the next message might
    /// not fit. Default: no budget. The user's: the memory the process may use is the
    /// container's limit, which the runtime cannot see. See [`MemoryBudgetConfig`].
    pub memory: MemoryBudgetConfig,
    /// Per-tier token buckets (rate in messages/s or a share of a capacity figure, burst, and
    /// the borrowing chain), checked at intake for pulled and pushed messages; a refusal has
    /// reason `rate`. Default: no bucket (no tier rate-limited), Critical borrowing from High
    /// once both have one. See [`BucketsConfig`].
    /// The user's: rates promised per tier are contracts, not measurements.
    pub buckets: BucketsConfig,
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
    /// The user's: the operator's decision.
    #[serde(deserialize_with = "crate::config_de::int::<_, _, 0, 3>")]
    pub forced_shed_level: u8,
    /// The operator's brownout switch (seed 002: "sometimes it's better to serve every request
    /// with less work"): a level the handler reads from
    /// [`Job::brownout`](crate::runtime::Job::brownout) to skip optional work (enrichment,
    /// recommendations, rich previews). What each level turns off is the handler's choice;
    /// triage only carries the number. `0` is full service. Allowed `0..=255`. Default `0`.
    /// The user's: the operator's decision.
    #[serde(deserialize_with = "crate::config_de::int::<_, _, 0, 255>")]
    pub brownout_level: u8,
    /// Tuning for experts (`[expert]`): every default is derived or constant; change one only
    /// with a measurement. See [`ExpertConfig`].
    pub expert: ExpertConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: NonZeroUsize::new(8).unwrap_or(NonZeroUsize::MIN),
            policy: PerTier::new(
                RefusalPolicy::Backpressure,
                RefusalPolicy::Backpressure,
                RefusalPolicy::DeferOrDrop,
                RefusalPolicy::DeferOrDrop,
            ),
            defer_held_to_make_room: true,
            retry: RetryConfig::default(),
            max_deferrals: 3,
            memory: MemoryBudgetConfig::default(),
            buckets: BucketsConfig::default(),
            forced_shed_level: 0,
            brownout_level: 0,
            expert: ExpertConfig::default(),
        }
    }
}

impl RuntimeConfig {
    /// The concurrency limiter this configuration asks for: the `expert.limit` algorithm, or a
    /// fixed limit of `workers` without one. Built here alone, for start and for a
    /// reconfiguration.
    ///
    /// The limit moves below `workers`: its `limit`, `initial`, `min` and `max` are capped at
    /// `workers` once checked. No more than `workers` handlers can run, and the tier shares are
    /// fractions of the limit, so a limit above `workers` would leave the shares of the part
    /// above it unenforced (the AIMD and Gradient2 defaults start at 20 and reach 200).
    pub(crate) fn limiter(&self) -> Result<Limiter, ConfigError> {
        match &self.expert.limit {
            Some(limit) => {
                limit
                    .validate()
                    .map_err(|e| ConfigError::from(e).within("expert"))?;
                capped(limit, self.workers.get())
                    .build()
                    .map_err(|e| ConfigError::from(e).within("expert"))
            }
            None => Ok(Limiter::from(
                Fixed::new(self.workers.get())
                    .map_err(|e| ConfigError::new("workers", e.value, e.allowed))?,
            )),
        }
    }

    /// The memory budget with its thresholds, as the budget part takes it.
    pub(crate) fn memory_config(&self) -> MemoryConfig {
        MemoryConfig {
            budget_bytes: self.memory.budget_bytes,
            thresholds: self.expert.memory.thresholds,
        }
    }

    /// Checks every field against its allowed range.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first field out of range by its dotted path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers.get() > 100_000 {
            return Err(ConfigError::new("workers", self.workers, "1..=100000"));
        }
        if !(1..=1000).contains(&self.max_deferrals) {
            return Err(ConfigError::new(
                "max_deferrals",
                self.max_deferrals,
                "1..=1000",
            ));
        }
        self.retry.validate()?;
        if let Some(b) = self.memory.budget_bytes {
            if !(1..=MAX_BUDGET_BYTES).contains(&b) {
                return Err(ConfigError::new(
                    "memory.budget_bytes",
                    b,
                    format!("1..={MAX_BUDGET_BYTES} (bytes)"),
                ));
            }
        }
        self.buckets.validate().map_err(|e| e.within("buckets"))?;
        if self.forced_shed_level > MAX_FORCED_SHED_LEVEL {
            return Err(ConfigError::new(
                "forced_shed_level",
                self.forced_shed_level,
                "0..=3 (Critical is never refused by force)",
            ));
        }
        self.expert.validate()
    }
}

/// `limit` with its limits capped at `workers` (see [`RuntimeConfig::limiter`]).
fn capped(limit: &LimitConfig, workers: usize) -> LimitConfig {
    let mut limit = limit.clone();
    match &mut limit {
        LimitConfig::Fixed { limit } => *limit = (*limit).min(workers),
        LimitConfig::Aimd(c) => {
            c.max = c.max.min(workers);
            c.min = c.min.min(c.max);
            c.initial = c.initial.clamp(c.min, c.max);
        }
        LimitConfig::Gradient2(c) => {
            c.max = c.max.min(workers);
            c.min = c.min.min(c.max);
            c.initial = c.initial.clamp(c.min, c.max);
        }
    }
    limit
}
