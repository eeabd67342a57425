//! One downstream's circuit breaker: closed, open, half-open.

use crate::sync::{AtomicU32, AtomicU64, Ordering};
use std::fmt;

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
    /// The bucket length the buckets were counted with, ns: a changed `window_ms` starts the
    /// count afresh (buckets of another length do not compare).
    bucket_ns: u64,
    /// Successful probes in the current half-open episode.
    probes_ok: u32,
}

/// A call let through, as the breaker knows it: whether it is a probe, and the episode it
/// started in, so that its outcome counts only in that episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) probe: bool,
    pub(crate) episode: u64,
}

/// The circuit breaker of one downstream key, shared by every message mapped to it.
///
/// Reading whether it admits costs one atomic load while closed (the common case); outcomes
/// are recorded under a mutex of its own, once per handler call. Every method takes the time
/// as nanoseconds since the registry's origin, so the state machine runs on any clock (a mock
/// one in tests). Obtained from [`Breakers::breaker`](super::Breakers::breaker).
///
/// Every change of state starts a new **episode**. A call carries the episode it started in,
/// and its outcome counts only if the circuit is still in that episode when it ends: a probe
/// of an earlier half-open episode, or a call started before the circuit opened and closed
/// again, tells nothing about the downstream as it is now (a late success must not close a
/// circuit its own episode's probes have not, a late neutral must not free a probe slot of
/// another episode).
pub struct CircuitBreaker {
    key: Box<str>,
    /// The state (low two bits) and the episode (the rest), in one word so that a call reads
    /// both with one load.
    word: AtomicU64,
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
            .field("episode", &self.episode())
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

const STATE_BITS: u32 = 2;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;

impl CircuitBreaker {
    pub(crate) fn new(key: &str) -> Self {
        CircuitBreaker {
            key: key.into(),
            word: AtomicU64::new(u64::from(CLOSED)),
            open_until_ns: AtomicU64::new(0),
            probes_started: AtomicU32::new(0),
            window: Mutex::new(Window {
                buckets: [Bucket::default(); BUCKETS],
                bucket_ns: 0,
                probes_ok: 0,
            }),
        }
    }

    /// The downstream key.
    pub fn key(&self) -> &str {
        &self.key
    }

    #[inline]
    fn load(&self) -> (u8, u64) {
        let word = self.word.load(Ordering::Acquire);
        ((word & STATE_MASK) as u8, word >> STATE_BITS)
    }

    /// Moves to `state`, starting a new episode. Called with the window's lock held, so
    /// changes of state are serialised.
    fn enter(&self, state: u8) -> u8 {
        let (from, episode) = self.load();
        let word = ((episode + 1) << STATE_BITS) | u64::from(state);
        self.word.store(word, Ordering::Release);
        from
    }

    /// The state as last recorded (an open circuit whose recovery time has passed reads
    /// `Open` until a call tries it).
    pub fn state(&self) -> CircuitState {
        CircuitState::from_code(self.load().0)
    }

    /// The current episode: how many times the state has changed since the key was first
    /// seen.
    pub fn episode(&self) -> u64 {
        self.load().1
    }

    /// Whether a message of this key may be queued now: closed, open past its recovery time
    /// (its call will be a probe), or half-open with probes left. Never changes the state.
    #[inline]
    pub(crate) fn admits(&self, now_ns: u64, probes: u32) -> bool {
        match self.load().0 {
            CLOSED => true,
            OPEN => now_ns >= self.open_until_ns.load(Ordering::Acquire),
            _ => self.probes_started.load(Ordering::Acquire) < probes,
        }
    }

    /// A normal call's ticket while closed (one load, no clock read); `None` otherwise.
    #[inline]
    pub(crate) fn closed_ticket(&self) -> Option<Ticket> {
        let (state, episode) = self.load();
        (state == CLOSED).then_some(Ticket {
            probe: false,
            episode,
        })
    }

    /// A handler call is about to start: a ticket for a normal call or for a half-open probe
    /// (an open circuit past its recovery time turns half-open here, and its first call is
    /// the episode's first probe), `None` when the call must not happen.
    pub(crate) fn try_call(&self, now_ns: u64, probes: u32) -> (Option<Ticket>, Transition) {
        let (state, episode) = self.load();
        match state {
            CLOSED => {
                return (
                    Some(Ticket {
                        probe: false,
                        episode,
                    }),
                    Transition::None,
                )
            }
            OPEN if now_ns < self.open_until_ns.load(Ordering::Acquire) => {
                return (None, Transition::None)
            }
            _ => {}
        }
        let mut w = self.window.lock();
        let mut transition = Transition::None;
        let (state, episode) = self.load();
        match state {
            CLOSED => {
                return (
                    Some(Ticket {
                        probe: false,
                        episode,
                    }),
                    Transition::None,
                )
            }
            OPEN => {
                if now_ns < self.open_until_ns.load(Ordering::Acquire) {
                    return (None, Transition::None);
                }
                w.probes_ok = 0;
                self.probes_started.store(0, Ordering::Release);
                self.enter(HALF_OPEN);
                transition = Transition::HalfOpened;
            }
            _ => {}
        }
        let started = self.probes_started.load(Ordering::Acquire);
        if started >= probes {
            return (None, transition);
        }
        self.probes_started.store(started + 1, Ordering::Release);
        let ticket = Ticket {
            probe: true,
            episode: self.load().1,
        };
        (Some(ticket), transition)
    }

    /// Records the outcome of the call of `ticket`: `Some(true)` success, `Some(false)`
    /// failure, `None` neither (the call failed for another reason: a probe's slot is given
    /// back). An outcome from another episode than the current one is ignored.
    pub(crate) fn record(
        &self,
        ticket: Ticket,
        outcome: Option<bool>,
        now_ns: u64,
        config: &BreakerConfig,
    ) -> Transition {
        let mut w = self.window.lock();
        let (state, episode) = self.load();
        if ticket.episode != episode {
            return Transition::None;
        }
        if ticket.probe {
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
                        self.enter(CLOSED);
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
        if state != CLOSED {
            return Transition::None;
        }
        let bucket_ns = (config.window_ms.saturating_mul(1_000_000) / BUCKETS as u64).max(1);
        if w.bucket_ns != bucket_ns {
            w.buckets = [Bucket::default(); BUCKETS];
            w.bucket_ns = bucket_ns;
        }
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
        if success {
            return Transition::None;
        }
        b.failures = b.failures.saturating_add(1);
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
        match self.enter(OPEN) {
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

    /// The kind of call `try_call` gives: `Some(true)` a probe, `Some(false)` a normal call.
    fn kind(t: (Option<Ticket>, Transition)) -> (Option<bool>, Transition) {
        (t.0.map(|t| t.probe), t.1)
    }

    fn normal(b: &CircuitBreaker) -> Ticket {
        Ticket {
            probe: false,
            episode: b.episode(),
        }
    }

    #[test]
    fn opens_at_the_rate_after_min_calls_then_probes_then_closes() {
        let c = config();
        let b = CircuitBreaker::new("payments");
        // Three failures: below min_calls, still closed.
        for i in 0..3 {
            let (t, tr) = b.try_call(i * MS, 2);
            assert_eq!((t.map(|t| t.probe), tr), (Some(false), Transition::None));
            assert_eq!(
                b.record(t.unwrap(), Some(false), i * MS, &c),
                Transition::None
            );
        }
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(
            b.record(normal(&b), Some(false), 3 * MS, &c),
            Transition::Opened
        );
        assert_eq!(b.state(), CircuitState::Open);
        assert!(!b.admits(100 * MS, 2));
        assert_eq!(b.try_call(100 * MS, 2).0, None);
        // Recovery passed: admitted for queueing, and the first call turns it half-open.
        assert!(b.admits(203 * MS, 2));
        let (p1, tr) = b.try_call(203 * MS, 2);
        assert_eq!(tr, Transition::HalfOpened);
        assert_eq!(
            kind(b.try_call(203 * MS, 2)),
            (Some(true), Transition::None)
        );
        let p2 = Ticket {
            probe: true,
            episode: b.episode(),
        };
        assert_eq!(b.try_call(203 * MS, 2).0, None, "only two probes");
        assert!(!b.admits(203 * MS, 2));
        assert_eq!(
            b.record(p1.unwrap(), Some(true), 210 * MS, &c),
            Transition::None
        );
        assert_eq!(b.record(p2, Some(true), 211 * MS, &c), Transition::Closed);
        assert_eq!(b.state(), CircuitState::Closed);
    }

    #[test]
    fn a_failed_probe_opens_again_and_a_neutral_one_gives_its_slot_back() {
        let c = BreakerConfig {
            min_calls: 1,
            ..config()
        };
        let b = CircuitBreaker::new("k");
        let t = b.try_call(0, 2).0.unwrap();
        assert_eq!(b.record(t, Some(false), 0, &c), Transition::Opened);
        let p1 = b.try_call(200 * MS, 2).0.unwrap();
        let p2 = b.try_call(200 * MS, 2).0.unwrap();
        assert!(p1.probe && p2.probe);
        assert_eq!(b.record(p1, None, 201 * MS, &c), Transition::None);
        let p3 = b.try_call(201 * MS, 2).0.unwrap();
        assert!(p3.probe, "slot given back");
        assert_eq!(
            b.record(p2, Some(false), 202 * MS, &c),
            Transition::Reopened
        );
        assert!(!b.admits(300 * MS, 2));
        assert!(b.admits(402 * MS, 2));
    }

    /// Item 5 of issue 30: with two probes, A and B start, B fails and the circuit opens
    /// again while A runs; in the next episode C starts, A succeeds late, C succeeds. Only C
    /// is a probe of that episode: the circuit stays half-open until a second probe of its
    /// own succeeds. A late neutral from A frees no slot of the new episode either.
    #[test]
    fn a_stale_probe_has_no_say_in_a_later_episode() {
        let c = BreakerConfig {
            min_calls: 1,
            ..config()
        };
        let b = CircuitBreaker::new("k");
        let t = b.try_call(0, 2).0.unwrap();
        b.record(t, Some(false), 0, &c);
        let a = b.try_call(200 * MS, 2).0.unwrap();
        let bb = b.try_call(200 * MS, 2).0.unwrap();
        assert_eq!(
            b.record(bb, Some(false), 201 * MS, &c),
            Transition::Reopened
        );
        let cc = b.try_call(401 * MS, 2).0.unwrap();
        assert!(cc.probe);
        assert_ne!(cc.episode, a.episode);
        assert_eq!(b.record(a, Some(true), 402 * MS, &c), Transition::None);
        assert_eq!(b.record(cc, Some(true), 403 * MS, &c), Transition::None);
        assert_eq!(
            b.state(),
            CircuitState::HalfOpen,
            "one probe of its own is not two"
        );
        // The second slot of the episode is still there; A's late neutral frees none.
        let d = b.try_call(404 * MS, 2).0.unwrap();
        assert!(d.probe);
        assert_eq!(b.record(a, None, 405 * MS, &c), Transition::None);
        assert_eq!(
            b.try_call(405 * MS, 2).0,
            None,
            "two probes under way at most"
        );
        assert_eq!(b.record(d, Some(true), 406 * MS, &c), Transition::Closed);
    }

    /// A call started while closed that ends after the circuit opened and closed again tells
    /// nothing about the downstream now: not counted.
    #[test]
    fn a_normal_call_from_before_the_opening_is_not_counted_after_it() {
        let c = BreakerConfig {
            min_calls: 1,
            half_open_probes: 1,
            ..config()
        };
        let b = CircuitBreaker::new("k");
        let late = b.try_call(0, 1).0.unwrap();
        let t = b.try_call(0, 1).0.unwrap();
        assert_eq!(b.record(t, Some(false), 0, &c), Transition::Opened);
        let p = b.try_call(200 * MS, 1).0.unwrap();
        assert_eq!(b.record(p, Some(true), 201 * MS, &c), Transition::Closed);
        assert_eq!(b.record(late, Some(false), 202 * MS, &c), Transition::None);
        assert_eq!(b.state(), CircuitState::Closed);
    }

    #[test]
    fn the_rate_counts_only_the_window() {
        let c = config();
        let b = CircuitBreaker::new("k");
        let rec = |ok: bool, ms: u64| b.record(normal(&b), Some(ok), ms * MS, &c);
        // Two failures, then a window later two more and two successes: 2 of 4 in the
        // window would open it at 0.5, but the old ones fell out.
        rec(false, 0);
        rec(false, 1);
        rec(true, 1_500);
        rec(true, 1_500);
        rec(true, 1_500);
        assert_eq!(rec(false, 1_600), Transition::None);
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(rec(false, 1_600), Transition::None);
        assert_eq!(rec(false, 1_600), Transition::Opened);
    }

    #[test]
    fn a_changed_window_counts_afresh() {
        let c = BreakerConfig {
            min_calls: 2,
            ..config()
        };
        let b = CircuitBreaker::new("k");
        assert_eq!(b.record(normal(&b), Some(false), 0, &c), Transition::None);
        let wider = BreakerConfig {
            window_ms: 10_000,
            ..c.clone()
        };
        // One failure under the old window is not counted under the new one.
        assert_eq!(
            b.record(normal(&b), Some(false), MS, &wider),
            Transition::None
        );
        assert_eq!(
            b.record(normal(&b), Some(false), 2 * MS, &wider),
            Transition::Opened
        );
    }
}
