//! Live reconfiguration: a new [`RuntimeConfig`] applied to a running runtime, all or nothing.
//!
//! Seeds 002 and 003: "make everything configurable at runtime: changing the threshold that
//! triggers shedding during an incident should not require a deploy", and "pre-define these
//! degraded modes and make them one switch". The runtime owns the swap; each part applies its
//! own section (DESIGN.md §6).
//!
//! # How a reconfiguration is applied
//!
//! One at a time (a lock serialises them), in two phases:
//!
//! 1. **Check everything, change nothing.** The whole configuration is validated
//!    ([`RuntimeConfig::validate`]), its refusal policies are checked against the runtime's
//!    sinks (an explicit `defer` without a defer sink is refused, naming `policy.<tier>`),
//!    the fields that cannot change while running ([`FIXED`]) are compared with the ones in
//!    force, and whatever must be built (a new limit algorithm) is built. Any error returns
//!    here, naming the field and its allowed range, and the old configuration stays in force.
//! 2. **Apply, infallibly.** The queue (weights, capacity, byte budget, queue-age cut-offs;
//!    shrinking evicts by the push rule, newest of the lowest tier first), the concurrency
//!    shares, the limit algorithm (only if `[expert.limit]` changed: an unchanged one keeps its
//!    adaptive state), the forced shed and brownout levels, the circuit breakers' settings
//!    (`[expert.breaker]`: every downstream key keeps its state), and the configuration every other
//!    setting is read from, swapped whole ([`Inner::config`]). Pull-based admission picks the
//!    new `[expert.admission]` up at its next tick, keeping its window and level. Then the generation
//!    is bumped, the `triage_config_generation` gauge set, one log line names every field that
//!    changed, and the evicted messages go through their tier's refusal policy (each ends in
//!    one disposition: shed, deferred, or held and queued again later).
//!
//! A configuration equal to the one in force changes nothing, not even the generation.
//!
//! Starting a runtime takes the same path: the parts are built with the defaults (and the
//! settings of [`FIXED`], which size them), and the configuration is applied over those
//! (`Applied::Start`), which makes the generation 1.
//!
//! # Adding a part
//!
//! A part with its own section in [`RuntimeConfig`] (token buckets, breakers, a memory
//! budget) becomes live in three steps: its checks go in `RuntimeConfig::validate`; anything
//! of it that can still fail is prepared in phase 1 of [`Inner::reconfigure`], before the
//! queue is touched; its infallible `apply` is called in phase 2, beside the others. A setting
//! that cannot change while running goes in [`FIXED`].

use std::sync::{Arc, Weak};

use crate::runtime::engine::{Inner, Offer};
use crate::runtime::refusal::Refusal;
use crate::runtime::settle::Freed;
use crate::runtime::{DeadLetterSink, DeferSink, LoadConfigError, RefusalPolicy, RuntimeConfig};
use crate::{ConfigError, PerTier};

/// The settings that cannot change while the runtime runs, with why: a reconfiguration that
/// changes one is refused with a [`ConfigError`] naming it, and the value in force as the only
/// one allowed. Restart the runtime to change them.
pub const FIXED: &[(&str, &str)] = &[
    (
        "workers",
        "the worker tasks are spawned at start; change the concurrency limit ([expert.limit]) \
         instead",
    ),
    (
        "expert.max_deferring",
        "a semaphore sized at start holds the deferrals in flight",
    ),
    (
        "expert.max_dead_lettering",
        "a semaphore sized at start holds the dead letters in flight",
    ),
];

/// A reconfiguration that was applied (or that changed nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconfigured {
    /// The generation now in force (`triage_config_generation`): unchanged when nothing
    /// changed.
    pub generation: u64,
    /// Each field that changed, as `path: old -> new` (e.g.
    /// `expert.queue.weights.sheddable: 1 -> 8`), sorted by path. Empty when the configuration
    /// equals the one in force.
    pub changes: Vec<String>,
    /// Messages evicted from the queue because its capacity or byte budget shrank, per tier
    /// (newest of the lowest tier first); each went to its tier's refusal policy.
    pub evicted: PerTier<u64>,
}

/// Why a reconfiguration or a reload changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconfigureError {
    /// A value out of range, a policy the runtime's sinks cannot honour, or a setting that
    /// cannot change while running ([`FIXED`]): the error names the field and what is allowed.
    #[error("configuration refused, the one in force stays: {0}")]
    Invalid(#[source] ConfigError),
    /// The configuration file is not valid TOML for [`RuntimeConfig`] (the message names the
    /// key).
    #[error("configuration file {path} refused, the one in force stays: {source}")]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// What the parser said.
        #[source]
        source: toml::de::Error,
    },
    /// The configuration file could not be read.
    #[error("configuration file {path} could not be read, the one in force stays: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The runtime has shut down or been dropped.
    #[error("the runtime has stopped")]
    Stopped,
}

impl ReconfigureError {
    /// The field at fault, for [`Invalid`](Self::Invalid).
    pub fn field(&self) -> Option<&str> {
        match self {
            ReconfigureError::Invalid(e) => Some(e.field()),
            _ => None,
        }
    }
}

impl From<ConfigError> for ReconfigureError {
    fn from(e: ConfigError) -> Self {
        ReconfigureError::Invalid(e)
    }
}

/// When a configuration is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    /// At start, over the defaults (with the settings of [`FIXED`] taken from it).
    Start,
    /// To the running runtime.
    Live,
}

/// Reads and parses a configuration file, without validating it.
pub(crate) fn read_config(path: &std::path::Path) -> Result<RuntimeConfig, ReconfigureError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReconfigureError::Read {
        path: path.to_owned(),
        source,
    })?;
    RuntimeConfig::parse_toml(&text).map_err(|e| match e {
        LoadConfigError::Parse(source) => ReconfigureError::Parse {
            path: path.to_owned(),
            source,
        },
        LoadConfigError::Invalid(e) => ReconfigureError::Invalid(e),
    })
}

impl<T: Send + Sync + 'static> Inner<T> {
    /// Applies `config` live, all or nothing (see the module docs); counts a refusal.
    pub(crate) fn reconfigure(
        self: &Arc<Self>,
        config: RuntimeConfig,
    ) -> Result<Reconfigured, ReconfigureError> {
        if self.lifecycle.stop.is_cancelled() {
            return Err(ReconfigureError::Stopped);
        }
        let done = self.apply(config, Applied::Live);
        if done.is_err() {
            self.count_refused();
        }
        done
    }

    /// A reconfiguration or reload refused: counted for `triage_config_refused_total`.
    pub(crate) fn count_refused(&self) {
        self.live.count_refused();
        self.accounts.metrics.config_refused.increment(1);
    }

    /// Applies `config` over the configuration in force, in the two phases of the module docs:
    /// at start over the defaults (`Applied::Start`), or live.
    pub(crate) fn apply(
        self: &Arc<Self>,
        mut config: RuntimeConfig,
        applied: Applied,
    ) -> Result<Reconfigured, ReconfigureError> {
        let _serial = self.live.serial();
        let old = self.config.load_full();

        // Phase 1: check everything, change nothing.
        config.validate()?;
        check_sinks(
            &mut config,
            self.deferrals.sink.as_ref(),
            self.dead_letters.sink.as_ref(),
        )?;
        let changes = diff(&old, &config);
        // At start the generation becomes 1 even when the defaults are taken as they are.
        if changes.is_empty() && applied == Applied::Live {
            return Ok(Reconfigured {
                generation: self.live.generation(),
                changes: Vec::new(),
                evicted: PerTier::default(),
            });
        }
        for (field, _) in FIXED {
            if let Some(change) = changes.iter().find(|c| c.path == *field) {
                return Err(ConfigError::new(
                    *field,
                    &change.new,
                    format!(
                        "{} (the value in force: it cannot change while running, restart to \
                         change it)",
                        change.old
                    ),
                )
                .into());
            }
        }
        let limiter = if config.expert.limit != old.expert.limit {
            Some(config.limiter()?)
        } else {
            None
        };
        // The queue checks its section before touching anything: the last fallible step.
        let evicted_entries = self.queue.reconfigure(config.expert.queue.clone())?;

        // Phase 2: apply, infallibly.
        self.limit.set_shares(config.expert.shares);
        // Validated with the rest above; every key keeps its state.
        self.breakers.replace(config.expert.breaker.clone());
        self.apply_toolbox(&config);
        if let Some(limiter) = limiter {
            self.limit.set_algorithm(limiter);
        }
        self.live.set_levels(&config, self.recent_ns());
        self.config.store(Arc::new(config));
        let generation = self.live.next_generation();
        let m = &self.accounts.metrics;
        m.config_generation.set(generation as f64);
        m.forced_shed_level.set(f64::from(self.live.forced_level()));
        m.brownout_level.set(f64::from(self.live.brownout()));
        let changes: Vec<String> = changes.iter().map(ToString::to_string).collect();
        match applied {
            Applied::Start => tracing::debug!(
                "runtime started with the defaults but for: {}",
                changes.join(", ")
            ),
            Applied::Live => tracing::info!(
                generation,
                evicted = evicted_entries.len(),
                "configuration applied live: {}",
                changes.join(", ")
            ),
        }
        drop(_serial);

        let mut evicted = PerTier::<u64>::default();
        let mut freed = Freed::default();
        for entry in evicted_entries {
            let victim = entry.into_inner();
            let tier = victim.tier();
            evicted[tier] += 1;
            self.accounts.refusals.add(tier, Refusal::Evicted);
            if let Offer::Hold(v) | Offer::Evicted(v) =
                self.refuse(victim, Refusal::Evicted, &mut freed)
            {
                self.hold_in_task(v);
            }
        }
        self.release(freed);
        // A larger queue or larger shares may have made room for a pacing intake.
        self.pacing.room.notify_waiters();
        Ok(Reconfigured {
            generation,
            changes,
            evicted,
        })
    }
}

/// One field that differs between two configurations.
#[derive(Clone, Debug, PartialEq)]
struct Change {
    path: String,
    old: String,
    new: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} -> {}", self.path, self.old, self.new)
    }
}

/// The fields that differ, by their path in the config file: from the configurations' TOML
/// form, so that a section a part adds to [`RuntimeConfig`] is covered without more code.
fn diff(old: &RuntimeConfig, new: &RuntimeConfig) -> Vec<Change> {
    let mut out = Vec::new();
    match (toml::Value::try_from(old), toml::Value::try_from(new)) {
        (Ok(a), Ok(b)) => diff_values("", Some(&a), Some(&b), &mut out),
        // Not expected (the configuration comes from TOML); compare whole, unnamed.
        _ if old != new => out.push(Change {
            path: "(configuration)".to_owned(),
            old: "(previous)".to_owned(),
            new: "(new)".to_owned(),
        }),
        _ => {}
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn diff_values(
    path: &str,
    old: Option<&toml::Value>,
    new: Option<&toml::Value>,
    out: &mut Vec<Change>,
) {
    if let (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) = (old, new) {
        let mut keys: Vec<&String> = a.keys().collect();
        keys.extend(b.keys().filter(|k| !a.contains_key(*k)));
        for key in keys {
            let sub = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            diff_values(&sub, a.get(key), b.get(key), out);
        }
        return;
    }
    if old != new {
        let show = |v: Option<&toml::Value>| v.map_or_else(|| "(none)".to_owned(), show_value);
        out.push(Change {
            path: path.to_owned(),
            old: show(old),
            new: show(new),
        });
    }
}

fn show_value(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) => {
            let inner: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k} = {}", show_value(v)))
                .collect();
            format!("{{ {} }}", inner.join(", "))
        }
        other => other.to_string(),
    }
}

/// Reconfigures a running runtime from elsewhere: a signal task, an admin endpoint, a config
/// service's watcher. Cheap to clone; holds the runtime weakly, so once the runtime is gone
/// every call returns [`ReconfigureError::Stopped`]. Get one with
/// [`Runtime::config_handle`](crate::runtime::Runtime::config_handle).
#[derive(Clone)]
pub struct ConfigHandle {
    target: Arc<dyn Reconfigurable>,
    // Read only by the SIGHUP task (feature `reload`), which ends with the runtime.
    #[cfg_attr(not(feature = "reload"), allow(dead_code))]
    stop: tokio_util::sync::CancellationToken,
}

impl std::fmt::Debug for ConfigHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigHandle")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

/// The runtime's side of a [`ConfigHandle`], erasing the payload type.
trait Reconfigurable: Send + Sync {
    fn reconfigure(&self, config: RuntimeConfig) -> Result<Reconfigured, ReconfigureError>;
    fn current(&self) -> Option<(Arc<RuntimeConfig>, u64)>;
    /// Counts a file that could not be read or parsed; `None` once the runtime is gone.
    fn count_refused(&self) -> Option<u64>;
    fn refused(&self) -> Option<u64>;
}

/// Holds the runtime weakly: a handle must not keep a stopped runtime's state alive.
struct Target<T>(Weak<Inner<T>>);

impl<T: Send + Sync + 'static> Reconfigurable for Target<T> {
    fn reconfigure(&self, config: RuntimeConfig) -> Result<Reconfigured, ReconfigureError> {
        let inner = self.0.upgrade().ok_or(ReconfigureError::Stopped)?;
        inner.reconfigure(config)
    }

    fn current(&self) -> Option<(Arc<RuntimeConfig>, u64)> {
        let inner = self.0.upgrade()?;
        let _serial = inner.live.serial();
        Some((inner.config.load_full(), inner.live.generation()))
    }

    fn count_refused(&self) -> Option<u64> {
        let inner = self.0.upgrade()?;
        inner.count_refused();
        Some(inner.live.refused())
    }

    fn refused(&self) -> Option<u64> {
        self.0.upgrade().map(|inner| inner.live.refused())
    }
}

impl ConfigHandle {
    pub(crate) fn new<T: Send + Sync + 'static>(inner: &Arc<Inner<T>>) -> Self {
        ConfigHandle {
            target: Arc::new(Target(Arc::downgrade(inner))),
            stop: inner.lifecycle.stop.clone(),
        }
    }

    /// Applies `config` to the running runtime, all or nothing: see
    /// [`Runtime::reconfigure`](crate::runtime::Runtime::reconfigure).
    ///
    /// # Errors
    ///
    /// [`ReconfigureError::Invalid`] naming the field and its allowed range (the configuration
    /// in force stays), [`ReconfigureError::Stopped`] once the runtime is gone.
    pub fn reconfigure(&self, config: RuntimeConfig) -> Result<Reconfigured, ReconfigureError> {
        self.target.reconfigure(config)
    }

    /// Reads the TOML file at `path` and applies it, all or nothing, logging the fields that
    /// changed or, for a file refused, the error (at `error` level; nothing changes). See
    /// [`Runtime::reconfigure`](crate::runtime::Runtime::reconfigure).
    ///
    /// # Errors
    ///
    /// As [`reconfigure`](Self::reconfigure), plus [`ReconfigureError::Read`] and
    /// [`ReconfigureError::Parse`] for a file that cannot be read or parsed.
    pub fn reload(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<Reconfigured, ReconfigureError> {
        let path = path.as_ref();
        let done = match read_config(path) {
            Ok(config) => self.target.reconfigure(config),
            Err(e) => match self.target.count_refused() {
                Some(_) => Err(e),
                None => Err(ReconfigureError::Stopped),
            },
        };
        match &done {
            Ok(done) if done.changes.is_empty() => tracing::info!(
                path = %path.display(),
                generation = done.generation,
                "configuration file reloaded: nothing changed"
            ),
            // `reconfigure` logged the fields that changed.
            Ok(_) | Err(ReconfigureError::Stopped) => {}
            Err(e) => tracing::error!(path = %path.display(), "configuration file reload: {e}"),
        }
        done
    }

    /// The configuration in force (policies resolved against the runtime's sinks:
    /// `defer_or_drop` reads back as `defer` or `drop`), or `None` once the runtime is gone.
    pub fn config(&self) -> Option<Arc<RuntimeConfig>> {
        self.target.current().map(|(c, _)| c)
    }

    /// The generation in force (`triage_config_generation`: 1 at start, one more per applied
    /// reconfiguration), or `None` once the runtime is gone.
    pub fn generation(&self) -> Option<u64> {
        self.target.current().map(|(_, g)| g)
    }

    /// Reconfigurations and reloads refused so far (`triage_config_refused_total`): an
    /// invalid configuration, a file that could not be read or parsed. `None` once the
    /// runtime is gone.
    pub fn refused(&self) -> Option<u64> {
        self.target.refused()
    }

    /// Reloads the TOML file at `path` on every `SIGHUP`, on a task of the current tokio
    /// runtime, until the runtime stops: the Unix convention for "re-read your
    /// configuration" (`kill -HUP <pid>`, `systemctl reload`). Each reload is all or nothing
    /// and logged: the fields changed, or the error (a bad file changes nothing). Needs the
    /// `reload` feature (tokio's `signal`).
    ///
    /// # Errors
    ///
    /// The error of registering the signal handler.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    #[cfg(all(unix, feature = "reload"))]
    pub fn reload_on_sighup(
        &self,
        path: impl Into<std::path::PathBuf>,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{signal, SignalKind};
        let path = path.into();
        let mut hangups = signal(SignalKind::hangup())?;
        let handle = self.clone();
        Ok(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = handle.stop.cancelled() => return,
                    got = hangups.recv() => if got.is_none() { return },
                }
                // `reload` logs what changed, or why nothing did.
                if let Err(ReconfigureError::Stopped) = handle.reload(&path) {
                    return;
                }
            }
        }))
    }
}

/// What the configuration asks of the sinks, against the sinks there are: resolves
/// `DeferOrDrop`, and refuses what cannot work.
pub(crate) fn check_sinks<T>(
    config: &mut RuntimeConfig,
    defer: Option<&Arc<dyn DeferSink<T>>>,
    dead_letter: Option<&Arc<dyn DeadLetterSink<T>>>,
) -> Result<(), ConfigError> {
    for tier in crate::Criticality::ALL {
        match config.policy[tier] {
            RefusalPolicy::DeferOrDrop if defer.is_some() => {
                config.policy[tier] = RefusalPolicy::Defer;
            }
            RefusalPolicy::DeferOrDrop => config.policy[tier] = RefusalPolicy::Drop,
            RefusalPolicy::Defer if defer.is_none() => {
                return Err(ConfigError::new(
                    format!("policy.{}", tier.as_str()),
                    "defer",
                    "backpressure, drop or defer_or_drop: no defer sink is configured \
                     (RuntimeBuilder::defer_sink)",
                ));
            }
            _ => {}
        }
    }
    if let (Some(defer), Some(dead_letter)) = (defer, dead_letter) {
        // One sink object is one topic or queue: dead letters there would be drained back
        // as deferred work and handled again, failing again, for ever.
        if std::ptr::addr_eq(Arc::as_ptr(defer), Arc::as_ptr(dead_letter)) {
            return Err(ConfigError::new(
                "dead_letter_sink",
                "the defer sink",
                "a sink other than the defer sink (dead letters would be drained back as \
                 deferred work)",
            ));
        }
    }
    Ok(())
}
