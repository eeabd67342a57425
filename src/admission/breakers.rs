//! The registry of circuit breakers, one per downstream key.

use crate::sync::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;
use quanta::{Clock, Instant};

use super::breaker::{Ticket, Transition};
use super::{BreakerConfig, CircuitBreaker, CircuitState};
use crate::ConfigError;

/// A handler call let through by a circuit: finish it with [`Breakers::record`]. Dropped
/// unrecorded, a probe gives its slot back (as [`Outcome::Neutral`]).
///
/// A call belongs to the episode of its circuit it started in (see [`CircuitBreaker`]): its
/// outcome is ignored if the circuit has changed state since.
#[must_use = "a call's outcome decides the circuit's state: pass it to Breakers::record"]
pub struct Call {
    breaker: Option<Arc<CircuitBreaker>>,
    ticket: Ticket,
}

impl Call {
    /// Whether this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.ticket.probe
    }

    /// The episode of its circuit the call started in ([`CircuitBreaker::episode`]).
    pub fn episode(&self) -> u64 {
        self.ticket.episode
    }

    /// The breaker it belongs to.
    pub fn breaker(&self) -> Option<&Arc<CircuitBreaker>> {
        self.breaker.as_ref()
    }
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("key", &self.breaker.as_ref().map(|b| b.key()))
            .field("probe", &self.ticket.probe)
            .field("episode", &self.ticket.episode)
            .finish()
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Some(b) = self.breaker.take() {
            if self.ticket.probe {
                // No config or time is needed to give a probe's slot back.
                b.record(self.ticket, None, 0, &BreakerConfig::default());
            }
        }
    }
}

/// What a call said about its downstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The downstream answered.
    Success,
    /// The downstream failed (a [`HandlerError::downstream`] naming it).
    ///
    /// [`HandlerError::downstream`]: crate::runtime::HandlerError::downstream
    Failure,
    /// The call failed for another reason (bad input, another downstream, a panic): it says
    /// nothing about this downstream.
    Neutral,
}

/// Circuit breakers per downstream key: seed 003's "circuit breaker integration", where a
/// message bound for a downstream whose circuit is open is refused at admission instead of
/// being queued only to fail, keeping the workers and the queue for work that can complete.
///
/// Each key has the classic three states (Nygard, *Release It!*; Fowler's "CircuitBreaker"):
/// **closed**, counting calls and failures over a sliding window of `window_ms` (ten
/// buckets); **open** once at least `min_calls` were counted and the failed fraction reached
/// `failure_rate`, refusing the key's messages for `recovery_ms`; then **half-open**,
/// letting `half_open_probes` calls through, closing after that many succeed and opening
/// again at the first failure. Written here rather than taken from a crate (`failsafe`,
/// tower's) because admission needs it per key, on an injectable clock, with a check that
/// costs one atomic load and allocates nothing: the breaker is a lookup done once per message
/// (a hash of a borrowed `&str`; a key is allocated once, when first seen) and an `Arc` the
/// message carries after that.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::admission::{BreakerConfig, Breakers, CircuitState, Outcome};
///
/// let (clock, mock) = triage::quanta::Clock::mock();
/// let config = BreakerConfig { min_calls: 2, recovery_ms: 100, half_open_probes: 1, ..Default::default() };
/// let breakers = Breakers::with_clock(config, clock)?;
/// let payments = breakers.breaker("payments").expect("room for the key");
/// for _ in 0..2 {
///     let call = breakers.try_call(&payments).expect("closed");
///     breakers.record(call, Outcome::Failure);
/// }
/// assert_eq!(payments.state(), CircuitState::Open);
/// assert!(!breakers.admits(&payments));
///
/// mock.increment(Duration::from_millis(100));
/// let probe = breakers.try_call(&payments).expect("half-open probe");
/// breakers.record(probe, Outcome::Success);
/// assert_eq!(payments.state(), CircuitState::Closed);
/// # Ok::<(), triage::ConfigError>(())
/// ```
pub struct Breakers {
    config: RwLock<BreakerConfig>,
    /// `config.enabled`, readable without the lock (once per message).
    enabled: AtomicBool,
    keys: RwLock<HashMap<Box<str>, Arc<CircuitBreaker>>>,
    clock: Clock,
    origin: Instant,
    /// State changes so far: a holder of refused messages re-offers them when it moves.
    generation: AtomicU64,
    open: AtomicI64,
    opened: AtomicU64,
    untracked: AtomicU64,
}

impl fmt::Debug for Breakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breakers")
            .field("config", &*self.config.read())
            .field("keys", &self.keys.read().len())
            .field("open", &self.open_count())
            .finish_non_exhaustive()
    }
}

impl Breakers {
    /// A registry with no keys yet, on the system clock.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (under `breaker.`) when `config` is out of range.
    pub fn new(config: BreakerConfig) -> Result<Self, ConfigError> {
        Breakers::with_clock(config, Clock::new())
    }

    /// A registry reading time from `clock` (a mock one in tests).
    ///
    /// # Errors
    ///
    /// As [`new`](Breakers::new).
    pub fn with_clock(config: BreakerConfig, clock: Clock) -> Result<Self, ConfigError> {
        config.validate().map_err(|e| e.within("breaker"))?;
        Ok(Breakers {
            enabled: AtomicBool::new(config.enabled),
            config: RwLock::new(config),
            keys: RwLock::new(HashMap::new()),
            origin: clock.now(),
            clock,
            generation: AtomicU64::new(0),
            open: AtomicI64::new(0),
            opened: AtomicU64::new(0),
            untracked: AtomicU64::new(0),
        })
    }

    /// Replaces the settings, all or nothing, keeping every key's state and counts: a
    /// changed threshold applies from the next recorded outcome, a changed recovery time from
    /// the next opening, a changed window starts each key's count afresh, a lowered
    /// `max_keys` stops tracking closed circuits down to it (open ones once they close). For
    /// live reconfiguration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (under `breaker.`); the old settings stay in force.
    pub fn apply(&self, config: BreakerConfig) -> Result<(), ConfigError> {
        config.validate().map_err(|e| e.within("breaker"))?;
        self.replace(config);
        Ok(())
    }

    /// [`apply`](Breakers::apply) of settings validated already (with the rest of a
    /// `RuntimeConfig`), so it cannot fail.
    pub(crate) fn replace(&self, config: BreakerConfig) {
        self.enabled.store(config.enabled, Ordering::Relaxed);
        let max_keys = config.max_keys;
        *self.config.write() = config;
        self.shrink_to(max_keys);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Stops tracking closed circuits until at most `max_keys` keys are tracked: a lowered
    /// `max_keys` bounds memory at once. A circuit not closed is kept (forgetting it would
    /// let its failing downstream's messages through again) until it closes. A key let go is
    /// tracked afresh, closed and uncounted, when seen again with room for it; calls under way
    /// on the old breaker report to it, and count for nothing.
    fn shrink_to(&self, max_keys: usize) {
        if self.keys.read().len() <= max_keys {
            return;
        }
        let mut keys = self.keys.write();
        let excess = keys.len().saturating_sub(max_keys);
        let closed: Vec<Box<str>> = keys
            .iter()
            .filter(|(_, b)| b.state() == CircuitState::Closed)
            .map(|(k, _)| k.clone())
            .take(excess)
            .collect();
        for key in closed {
            keys.remove(&key);
        }
    }

    /// The settings in force.
    pub fn config(&self) -> BreakerConfig {
        self.config.read().clone()
    }

    /// Whether breakers are switched on (`enabled`).
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The breaker of `key`, created closed when first seen. `None` when `max_keys` keys are
    /// already tracked (counted in [`untracked`](Breakers::untracked)): such a message is
    /// admitted as if it had no key.
    ///
    /// Allocates only for a key not seen before.
    pub fn breaker(&self, key: &str) -> Option<Arc<CircuitBreaker>> {
        if let Some(b) = self.keys.read().get(key) {
            return Some(Arc::clone(b));
        }
        let max = self.config.read().max_keys;
        let mut keys = self.keys.write();
        if let Some(b) = keys.get(key) {
            return Some(Arc::clone(b));
        }
        if keys.len() >= max {
            self.untracked.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let b = Arc::new(CircuitBreaker::new(key));
        keys.insert(key.into(), Arc::clone(&b));
        Some(b)
    }

    /// The state of `key`'s circuit; `None` for a key never seen.
    pub fn state(&self, key: &str) -> Option<CircuitState> {
        self.keys.read().get(key).map(|b| b.state())
    }

    fn now_ns(&self) -> u64 {
        self.clock
            .now()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }

    fn probes(&self) -> u32 {
        self.config.read().half_open_probes
    }

    /// Whether a message for `breaker` may be queued now: its circuit is closed, or open past
    /// its recovery time, or half-open with probes left. One atomic load while closed.
    #[inline]
    pub fn admits(&self, breaker: &CircuitBreaker) -> bool {
        if breaker.state() == CircuitState::Closed {
            return true;
        }
        breaker.admits(self.now_ns(), self.probes())
    }

    /// A handler call for `breaker` is about to start: `Some` when it may (a normal call, or
    /// one of the half-open probes), `None` when the circuit refuses it.
    pub fn try_call(&self, breaker: &Arc<CircuitBreaker>) -> Option<Call> {
        let (ticket, transition) = match breaker.closed_ticket() {
            Some(ticket) => (Some(ticket), Transition::None),
            None => breaker.try_call(self.now_ns(), self.probes()),
        };
        self.count(transition);
        ticket.map(|ticket| Call {
            breaker: Some(Arc::clone(breaker)),
            ticket,
        })
    }

    /// Records how `call` ended.
    pub fn record(&self, mut call: Call, outcome: Outcome) {
        let Some(b) = call.breaker.take() else {
            return;
        };
        let verdict = match outcome {
            Outcome::Success => Some(true),
            Outcome::Failure => Some(false),
            Outcome::Neutral => None,
        };
        let config = self.config.read().clone();
        let transition = b.record(call.ticket, verdict, self.now_ns(), &config);
        self.count(transition);
        if transition == Transition::Closed && self.keys.read().len() > config.max_keys {
            // Kept past a lowered `max_keys` only while not closed: let it go now.
            self.shrink_to(config.max_keys);
        }
    }

    /// Records a failure of `key` reported by a call that was not counted for it (a handler
    /// of a message mapped to another key, or to none, naming `key` in its error). Counts
    /// while the circuit is closed only.
    pub fn record_failure(&self, key: &str) {
        if let Some(b) = self.breaker(key) {
            let ticket = Ticket {
                probe: false,
                episode: b.episode(),
            };
            self.record(
                Call {
                    breaker: Some(b),
                    ticket,
                },
                Outcome::Failure,
            );
        }
    }

    fn count(&self, transition: Transition) {
        match transition {
            Transition::None => return,
            Transition::Opened => {
                self.open.fetch_add(1, Ordering::Relaxed);
                self.opened.fetch_add(1, Ordering::Relaxed);
            }
            Transition::Reopened => {
                self.opened.fetch_add(1, Ordering::Relaxed);
            }
            // An open circuit turning half-open stops refusing every message: still counted
            // as not closed.
            Transition::HalfOpened => {}
            Transition::Closed => {
                self.open.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Circuits not closed now (open or half-open).
    pub fn open_count(&self) -> usize {
        self.open.load(Ordering::Relaxed).max(0) as usize
    }

    /// Times a circuit opened (closed or half-open to open) since start.
    pub fn opened_total(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Lookups of a new key refused because `max_keys` keys were already tracked.
    pub fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.keys.read().len()
    }

    /// Whether no key is tracked yet.
    pub fn is_empty(&self) -> bool {
        self.keys.read().is_empty()
    }

    /// A counter that moves whenever a circuit changes state or the settings change: what a
    /// holder of refused messages watches to know when offering them again may succeed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn keys_are_bounded_and_apply_is_all_or_nothing() {
        let (clock, _mock) = Clock::mock();
        let config = BreakerConfig {
            max_keys: 2,
            ..BreakerConfig::default()
        };
        let b = Breakers::with_clock(config, clock).unwrap();
        let a1 = b.breaker("a").unwrap();
        let a2 = b.breaker("a").unwrap();
        assert!(Arc::ptr_eq(&a1, &a2));
        assert!(b.breaker("b").is_some());
        assert!(b.breaker("c").is_none());
        assert_eq!(b.untracked(), 1);
        let err = b
            .apply(BreakerConfig {
                min_calls: 0,
                ..BreakerConfig::default()
            })
            .unwrap_err();
        assert_eq!(err.field(), "breaker.min_calls");
        assert_eq!(b.config().max_keys, 2, "old settings kept");
        let g = b.generation();
        b.apply(BreakerConfig {
            recovery_ms: 7,
            ..b.config()
        })
        .unwrap();
        assert_eq!(b.config().recovery_ms, 7);
        assert!(b.generation() > g);
    }

    #[test]
    fn dropped_probe_gives_its_slot_back() {
        let (clock, mock) = Clock::mock();
        let config = BreakerConfig {
            min_calls: 1,
            recovery_ms: 10,
            half_open_probes: 1,
            ..BreakerConfig::default()
        };
        let b = Breakers::with_clock(config, clock).unwrap();
        let k = b.breaker("k").unwrap();
        b.record_failure("k");
        assert_eq!(k.state(), CircuitState::Open);
        assert_eq!(b.open_count(), 1);
        mock.increment(Duration::from_millis(10));
        let probe = b.try_call(&k).unwrap();
        assert!(probe.is_probe());
        assert!(b.try_call(&k).is_none());
        drop(probe);
        let probe = b.try_call(&k).unwrap();
        b.record(probe, Outcome::Success);
        assert_eq!(k.state(), CircuitState::Closed);
        assert_eq!(b.open_count(), 0);
        assert_eq!(b.opened_total(), 1);
    }
}
