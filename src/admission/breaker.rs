//! One downstream's circuit breaker: closed, open, half-open.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use parking_lot::Mutex;

use super::BreakerConfig;

/// Buckets of the sliding failure-rate window.
const BUCKETS: usize = 10;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// The state of a downstream's circuit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CircuitState {
    /// Calls go through; outcomes are counted over the window.
    Closed,
    /// The failure rate crossed the threshold: the key's messages are refused until the
    /// recovery time has passed.
    Open,
    /// Recovery time passed: a few probe calls go through; they decide whether the circuit
    /// closes or opens again.
    HalfOpen,
}

impl CircuitState {
    /// Lowercase name: `closed`, `open`, `half_open`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }

    fn from_code(code: u8) -> Self {
        match code {
            OPEN => CircuitState::Open,
            HALF_OPEN => CircuitState::HalfOpen,
            _ => CircuitState::Closed,
        }
    }
}

impl fmt::Display for CircuitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Calls and failures seen in one tenth of the window.
#[derive(Clone, Copy, Default)]
struct Bucket {
    /// Which tenth of time (`now / bucket length`) the counts belong to.
    epoch: u64,
    calls: u32,
    failures: u32,
}

/// What is only touched when an outcome is recorded or the state changes.
struct Window {
    buckets: [Bucket; BUCKETS],
    /// Successful probes in the current half-open episode.
    probes_ok: u32,
}

/// The circuit breaker of one downstream key, shared by every message mapped to it.
///
/// Reading whether it admits costs one atomic load while closed (the common case); outcomes
/// are recorded under a mutex of its own, once per handler call. Every method takes the time
/// as nanoseconds since the registry's origin, so the state machine runs on any clock (a mock
/// one in tests). Obtained from [`Breakers::breaker`](super::Breakers::breaker).
pub struct CircuitBreaker {
    key: Box<str>,
    state: AtomicU8,
    /// While open: when half-open probes may start, ns since the registry's origin.
    open_until_ns: AtomicU64,
    /// Probe calls started in the current half-open episode.
    probes_started: AtomicU32,
    window: Mutex<Window>,
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("key", &self.key)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

/// How a state change moved the registry's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    /// Closed to open.
    Opened,
    /// Half-open to open: a probe failed.
    Reopened,
    HalfOpened,
    Closed,
}

impl CircuitBreaker {
    pub(crate) fn new(key: &str) -> Self {
        CircuitBreaker {
            key: key.into(),
            state: AtomicU8::new(CLOSED),
            open_until_ns: AtomicU64::new(0),
            probes_started: AtomicU32::new(0),
            window: Mutex::new(Window {
                buckets: [Bucket::default(); BUCKETS],
                probes_ok: 0,
            }),
        }
    }

    /// The downstream key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The state as last recorded (an open circuit whose recovery time has passed reads
    /// `Open` until a call tries it).
    pub fn state(&self) -> CircuitState {
        CircuitState::from_code(self.state.load(Ordering::Acquire))
    }

    /// Whether a message of this key may be queued now: closed, open past its recovery time
    /// (its call will be a probe), or half-open with probes left. Never changes the state.
    #[inline]
    pub(crate) fn admits(&self, now_ns: u64, probes: u32) -> bool {
        match self.state.load(Ordering::Acquire) {
            CLOSED => true,
            OPEN => now_ns >= self.open_until_ns.load(Ordering::Acquire),
            _ => self.probes_started.load(Ordering::Acquire) < probes,
        }
    }

    /// A handler call is about to start: `Some(false)` for a normal call, `Some(true)` for a
    /// half-open probe (an open circuit past its recovery time turns half-open here), `None`
    /// when the call must not happen.
    pub(crate) fn try_call(&self, now_ns: u64, probes: u32) -> (Option<bool>, Transition) {
        match self.state.load(Ordering::Acquire) {
            CLOSED => (Some(false), Transition::None),
            OPEN if now_ns < self.open_until_ns.load(Ordering::Acquire) => (None, Transition::None),
            _ => {
                let mut w = self.window.lock();
                let mut transition = Transition::None;
                match self.state.load(Ordering::Acquire) {
                    CLOSED => return (Some(false), Transition::None),
                    OPEN => {
                        if now_ns < self.open_until_ns.load(Ordering::Acquire) {
                            return (None, Transition::None);
                        }
                        w.probes_ok = 0;
                        self.probes_started.store(0, Ordering::Release);
                        self.state.store(HALF_OPEN, Ordering::Release);
                        transition = Transition::HalfOpened;
                    }
                    _ => {}
                }
                let started = self.probes_started.load(Ordering::Acquire);
                if started >= probes {
                    return (None, transition);
                }
                self.probes_started.store(started + 1, Ordering::Release);
                (Some(true), transition)
            }
        }
    }

    /// Records a call's outcome: `Some(true)` success, `Some(false)` failure, `None` neither
    /// (the call failed for another reason: a probe's slot is given back).
    pub(crate) fn record(
        &self,
        probe: bool,
        outcome: Option<bool>,
        now_ns: u64,
        config: &BreakerConfig,
    ) -> Transition {
        let mut w = self.window.lock();
        let state = self.state.load(Ordering::Acquire);
        if probe {
            // A probe started in an earlier half-open episode has no say in this one.
            if state != HALF_OPEN {
                return Transition::None;
            }
            return match outcome {
                Some(true) => {
                    w.probes_ok += 1;
                    if w.probes_ok >= config.half_open_probes {
                        w.buckets = [Bucket::default(); BUCKETS];
                        w.probes_ok = 0;
                        self.probes_started.store(0, Ordering::Release);
                        self.state.store(CLOSED, Ordering::Release);
                        Transition::Closed
                    } else {
                        Transition::None
                    }
                }
                Some(false) => self.trip(&mut w, now_ns, config),
                None => {
                    let started = self.probes_started.load(Ordering::Acquire);
                    self.probes_started
                        .store(started.saturating_sub(1), Ordering::Release);
                    Transition::None
                }
            };
        }
        let Some(success) = outcome else {
            return Transition::None;
        };
        // A call started while closed that ends after the circuit opened tells nothing new.
        if state != CLOSED {
            return Transition::None;
        }
        let bucket_ns = (config.window_ms * 1_000_000 / BUCKETS as u64).max(1);
        let epoch = now_ns / bucket_ns;
        let b = &mut w.buckets[(epoch % BUCKETS as u64) as usize];
        if b.epoch != epoch {
            *b = Bucket {
                epoch,
                calls: 0,
                failures: 0,
            };
        }
        b.calls = b.calls.saturating_add(1);
        if !success {
            b.failures = b.failures.saturating_add(1);
        }
        if success {
            return Transition::None;
        }
        let oldest = epoch.saturating_sub(BUCKETS as u64 - 1);
        let (calls, failures) = w
            .buckets
            .iter()
            .filter(|b| b.epoch >= oldest && b.epoch <= epoch)
            .fold((0u64, 0u64), |(c, f), b| {
                (c + u64::from(b.calls), f + u64::from(b.failures))
            });
        if calls >= u64::from(config.min_calls)
            && failures as f64 >= config.failure_rate * calls as f64
        {
            return self.trip(&mut w, now_ns, config);
        }
        Transition::None
    }

    fn trip(&self, w: &mut Window, now_ns: u64, config: &BreakerConfig) -> Transition {
        w.buckets = [Bucket::default(); BUCKETS];
        w.probes_ok = 0;
        self.open_until_ns.store(
            now_ns.saturating_add(config.recovery_ms.saturating_mul(1_000_000)),
            Ordering::Release,
        );
        self.probes_started.store(0, Ordering::Release);
        match self.state.swap(OPEN, Ordering::AcqRel) {
            CLOSED => Transition::Opened,
            HALF_OPEN => Transition::Reopened,
            _ => Transition::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn config() -> BreakerConfig {
        BreakerConfig {
            failure_rate: 0.5,
            window_ms: 1_000,
            min_calls: 4,
            recovery_ms: 200,
            half_open_probes: 2,
            ..BreakerConfig::default()
        }
    }

    #[test]
    fn opens_at_the_rate_after_min_calls_then_probes_then_closes() {
        let c = config();
        let b = CircuitBreaker::new("payments");
        // Three failures: below min_calls, still closed.
        for i in 0..3 {
            assert_eq!(b.try_call(i * MS, 2), (Some(false), Transition::None));
            assert_eq!(b.record(false, Some(false), i * MS, &c), Transition::None);
        }
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(b.record(false, Some(false), 3 * MS, &c), Transition::Opened);
        assert_eq!(b.state(), CircuitState::Open);
        assert!(!b.admits(100 * MS, 2));
        assert_eq!(b.try_call(100 * MS, 2).0, None);
        // Recovery passed: admitted for queueing, and the first call turns it half-open.
        assert!(b.admits(203 * MS, 2));
        assert_eq!(
            b.try_call(203 * MS, 2),
            (Some(true), Transition::HalfOpened)
        );
        assert_eq!(b.try_call(203 * MS, 2), (Some(true), Transition::None));
        assert_eq!(b.try_call(203 * MS, 2).0, None, "only two probes");
        assert!(!b.admits(203 * MS, 2));
        assert_eq!(b.record(true, Some(true), 210 * MS, &c), Transition::None);
        assert_eq!(b.record(true, Some(true), 211 * MS, &c), Transition::Closed);
        assert_eq!(b.state(), CircuitState::Closed);
    }

    #[test]
    fn a_failed_probe_opens_again_and_a_neutral_one_gives_its_slot_back() {
        let c = BreakerConfig {
            min_calls: 1,
            ..config()
        };
        let b = CircuitBreaker::new("k");
        b.try_call(0, 2);
        assert_eq!(b.record(false, Some(false), 0, &c), Transition::Opened);
        assert_eq!(b.try_call(200 * MS, 2).0, Some(true));
        assert_eq!(b.try_call(200 * MS, 2).0, Some(true));
        assert_eq!(b.record(true, None, 201 * MS, &c), Transition::None);
        assert_eq!(b.try_call(201 * MS, 2).0, Some(true), "slot given back");
        assert_eq!(
            b.record(true, Some(false), 202 * MS, &c),
            Transition::Reopened
        );
        assert!(!b.admits(300 * MS, 2));
        assert!(b.admits(402 * MS, 2));
    }

    #[test]
    fn the_rate_counts_only_the_window() {
        let c = config();
        let b = CircuitBreaker::new("k");
        // Two failures, then a window later two more and two successes: 2 of 4 in the
        // window would open it at 0.5, but the old ones fell out.
        b.record(false, Some(false), 0, &c);
        b.record(false, Some(false), MS, &c);
        b.record(false, Some(true), 1_500 * MS, &c);
        b.record(false, Some(true), 1_500 * MS, &c);
        b.record(false, Some(true), 1_500 * MS, &c);
        assert_eq!(
            b.record(false, Some(false), 1_600 * MS, &c),
            Transition::None
        );
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(
            b.record(false, Some(false), 1_600 * MS, &c),
            Transition::None
        );
        assert_eq!(
            b.record(false, Some(false), 1_600 * MS, &c),
            Transition::Opened
        );
    }
}
