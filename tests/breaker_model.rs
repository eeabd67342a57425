//! A model of one downstream's circuit breaker, driven through the public registry
//! ([`Breakers`]) on the mock clock: calls, their results (success, failure, neutral, a call
//! dropped unrecorded) in any order and as late as they come, including results of calls
//! started in earlier episodes, failures reported from elsewhere, clock steps and live
//! reconfiguration. It is checked at every step against a reference state machine that tracks
//! episodes: each change of state starts one, and a call's result counts only in the episode
//! it started in.
//!
//! Then the scenarios of issue 30 as a user meets them: a stale probe closing a later
//! half-open episode, a stale neutral freeing its probe slot, and a lowered `max_keys`.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use triage::admission::{BreakerConfig, Breakers, Call, CircuitState, Outcome};
use triage::quanta::{Clock, Mock};

const MS: u64 = 1_000_000;
const BUCKETS: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ticket {
    probe: bool,
    episode: u64,
}

/// The reference: the breaker's rules written plainly, with a list of outcomes instead of
/// the ring of buckets.
struct Model {
    config: BreakerConfig,
    state: State,
    episode: u64,
    open_until: u64,
    started: u32,
    ok: u32,
    /// `(bucket, failed)` of each outcome counted while closed, since the last change of
    /// state or of bucket length.
    outcomes: Vec<(u64, bool)>,
    bucket_ns: u64,
    not_closed: usize,
    opened_total: u64,
}

impl Model {
    fn new(config: BreakerConfig) -> Self {
        Model {
            config,
            state: State::Closed,
            episode: 0,
            open_until: 0,
            started: 0,
            ok: 0,
            outcomes: Vec::new(),
            bucket_ns: 0,
            not_closed: 0,
            opened_total: 0,
        }
    }

    fn change(&mut self, to: State) {
        self.state = to;
        self.episode += 1;
    }

    fn admits(&self, now: u64) -> bool {
        match self.state {
            State::Closed => true,
            State::Open => now >= self.open_until,
            State::HalfOpen => self.started < self.config.half_open_probes,
        }
    }

    fn try_call(&mut self, now: u64) -> Option<Ticket> {
        match self.state {
            State::Closed => {
                return Some(Ticket {
                    probe: false,
                    episode: self.episode,
                })
            }
            State::Open if now < self.open_until => return None,
            State::Open => {
                self.change(State::HalfOpen);
                self.started = 0;
                self.ok = 0;
            }
            State::HalfOpen => {}
        }
        if self.started >= self.config.half_open_probes {
            return None;
        }
        self.started += 1;
        Some(Ticket {
            probe: true,
            episode: self.episode,
        })
    }

    fn trip(&mut self, now: u64) {
        if self.state == State::Closed {
            self.not_closed += 1;
        }
        self.opened_total += 1;
        self.outcomes.clear();
        self.open_until = now.saturating_add(self.config.recovery_ms * MS);
        self.started = 0;
        self.ok = 0;
        self.change(State::Open);
    }

    fn record(&mut self, ticket: Ticket, outcome: Outcome, now: u64) {
        if ticket.episode != self.episode {
            return;
        }
        if ticket.probe {
            assert_eq!(
                self.state,
                State::HalfOpen,
                "a probe's episode is half-open"
            );
            match outcome {
                Outcome::Success => {
                    self.ok += 1;
                    if self.ok >= self.config.half_open_probes {
                        self.outcomes.clear();
                        self.started = 0;
                        self.ok = 0;
                        self.not_closed -= 1;
                        self.change(State::Closed);
                    }
                }
                Outcome::Failure => self.trip(now),
                _ => self.started = self.started.saturating_sub(1),
            }
            return;
        }
        let failed = match outcome {
            Outcome::Success => false,
            Outcome::Failure => true,
            _ => return,
        };
        // Only a failure reported from elsewhere (stamped with the episode it arrives in)
        // can find the circuit not closed: it counts while closed only.
        if self.state != State::Closed {
            return;
        }
        let bucket_ns = (self.config.window_ms * MS / BUCKETS).max(1);
        if bucket_ns != self.bucket_ns {
            self.outcomes.clear();
            self.bucket_ns = bucket_ns;
        }
        let bucket = now / bucket_ns;
        self.outcomes.push((bucket, failed));
        if !failed {
            return;
        }
        let oldest = bucket.saturating_sub(BUCKETS - 1);
        let recent = self.outcomes.iter().filter(|(b, _)| *b >= oldest);
        let (calls, failures) = recent.fold((0u64, 0u64), |(c, f), (_, failed)| {
            (c + 1, f + u64::from(*failed))
        });
        if calls >= u64::from(self.config.min_calls)
            && failures as f64 >= self.config.failure_rate * calls as f64
        {
            self.trip(now);
        }
    }
}

#[derive(Clone, Debug)]
enum Action {
    /// A handler call is about to start.
    Call,
    /// A call under way ends (`pick` modulo how many are under way).
    Finish {
        pick: usize,
        outcome: u8,
    },
    /// A call under way is dropped unrecorded (its probe slot, if any, comes back).
    Abandon {
        pick: usize,
    },
    /// A failure of the key reported by a call not counted for it.
    ReportFailure,
    Advance {
        ms: u64,
    },
    Reconfigure(BreakerConfig),
}

fn config() -> impl Strategy<Value = BreakerConfig> {
    (
        prop::sample::select(vec![0.25, 0.5, 0.75, 1.0]),
        prop::sample::select(vec![100u64, 200, 1_000]),
        1u32..5,
        1u64..60,
        1u32..4,
    )
        .prop_map(
            |(failure_rate, window_ms, min_calls, recovery_ms, half_open_probes)| BreakerConfig {
                failure_rate,
                window_ms,
                min_calls,
                recovery_ms,
                half_open_probes,
                ..BreakerConfig::default()
            },
        )
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => Just(Action::Call),
        6 => (any::<usize>(), 0u8..3).prop_map(|(pick, outcome)| Action::Finish { pick, outcome }),
        1 => any::<usize>().prop_map(|pick| Action::Abandon { pick }),
        1 => Just(Action::ReportFailure),
        3 => (0u64..80).prop_map(|ms| Action::Advance { ms }),
        1 => config().prop_map(Action::Reconfigure),
    ]
}

fn run(initial: BreakerConfig, actions: Vec<Action>) -> Result<(), TestCaseError> {
    let (clock, mock): (Clock, std::sync::Arc<Mock>) = Clock::mock();
    let breakers = Breakers::with_clock(initial.clone(), clock).unwrap();
    let key = breakers.breaker("k").unwrap();
    let mut model = Model::new(initial);
    let mut now = 0u64;
    let mut under_way: Vec<(Call, Ticket)> = Vec::new();
    for (step, action) in actions.into_iter().enumerate() {
        match action {
            Action::Call => {
                let expected = model.try_call(now);
                let got = breakers.try_call(&key);
                prop_assert_eq!(
                    got.as_ref().map(|c| Ticket {
                        probe: c.is_probe(),
                        episode: c.episode(),
                    }),
                    expected,
                    "step {}",
                    step
                );
                if let (Some(call), Some(ticket)) = (got, expected) {
                    under_way.push((call, ticket));
                }
            }
            Action::Finish { pick, outcome } if !under_way.is_empty() => {
                let (call, ticket) = under_way.swap_remove(pick % under_way.len());
                let outcome =
                    [Outcome::Success, Outcome::Failure, Outcome::Neutral][usize::from(outcome)];
                model.record(ticket, outcome, now);
                breakers.record(call, outcome);
            }
            Action::Abandon { pick } if !under_way.is_empty() => {
                let (call, ticket) = under_way.swap_remove(pick % under_way.len());
                model.record(ticket, Outcome::Neutral, now);
                drop(call);
            }
            Action::Finish { .. } | Action::Abandon { .. } => {}
            Action::ReportFailure => {
                let ticket = Ticket {
                    probe: false,
                    episode: model.episode,
                };
                model.record(ticket, Outcome::Failure, now);
                breakers.record_failure("k");
            }
            Action::Advance { ms } => {
                now += ms * MS;
                mock.increment(Duration::from_millis(ms));
            }
            Action::Reconfigure(config) => {
                breakers.apply(config.clone()).unwrap();
                model.config = config;
            }
        }
        let state = match key.state() {
            CircuitState::Closed => State::Closed,
            CircuitState::Open => State::Open,
            CircuitState::HalfOpen => State::HalfOpen,
            other => panic!("unknown state {other:?}"),
        };
        prop_assert_eq!(state, model.state, "step {}", step);
        prop_assert_eq!(key.episode(), model.episode, "step {}", step);
        prop_assert_eq!(breakers.admits(&key), model.admits(now), "step {}", step);
        prop_assert_eq!(breakers.open_count(), model.not_closed, "step {}", step);
        prop_assert_eq!(breakers.opened_total(), model.opened_total, "step {}", step);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1_024,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/breaker_model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_breaker_follows_the_model(
        initial in config(),
        actions in proptest::collection::vec(action(), 1..200),
    ) {
        run(initial, actions)?;
    }
}

fn registry(half_open_probes: u32) -> (Breakers, std::sync::Arc<Mock>) {
    let (clock, mock) = Clock::mock();
    let config = BreakerConfig {
        min_calls: 1,
        recovery_ms: 100,
        half_open_probes,
        ..BreakerConfig::default()
    };
    (Breakers::with_clock(config, clock).unwrap(), mock)
}

/// Item 5 of issue 30: with two probes, A and B start; B fails and the circuit opens again
/// while A runs. In the next episode C starts, then A succeeds late and C succeeds: only C
/// is a probe of this episode, so the circuit must stay half-open (it closed).
#[test]
fn a_late_success_from_an_earlier_episode_does_not_close_the_circuit() {
    let (breakers, mock) = registry(2);
    let k = breakers.breaker("k").unwrap();
    breakers.record_failure("k");
    mock.increment(Duration::from_millis(100));
    let a = breakers.try_call(&k).expect("probe A");
    let b = breakers.try_call(&k).expect("probe B");
    breakers.record(b, Outcome::Failure);
    assert_eq!(k.state(), CircuitState::Open);
    mock.increment(Duration::from_millis(100));
    let c = breakers.try_call(&k).expect("probe C");
    breakers.record(a, Outcome::Success);
    breakers.record(c, Outcome::Success);
    assert_eq!(k.state(), CircuitState::HalfOpen);
    let d = breakers.try_call(&k).expect("the episode's second probe");
    breakers.record(d, Outcome::Success);
    assert_eq!(k.state(), CircuitState::Closed);
}

/// Item 5, its neutral half: a late neutral result (or a call dropped unrecorded) of an
/// earlier episode must not free a probe slot of the current one.
#[test]
fn a_late_neutral_from_an_earlier_episode_frees_no_probe_slot() {
    let (breakers, mock) = registry(2);
    let k = breakers.breaker("k").unwrap();
    breakers.record_failure("k");
    mock.increment(Duration::from_millis(100));
    let a = breakers.try_call(&k).expect("probe A");
    let b = breakers.try_call(&k).expect("probe B");
    breakers.record(b, Outcome::Failure);
    mock.increment(Duration::from_millis(100));
    let _c = breakers.try_call(&k).expect("probe C");
    let _d = breakers.try_call(&k).expect("probe D");
    breakers.record(a, Outcome::Neutral);
    assert!(
        breakers.try_call(&k).is_none(),
        "two probes under way at most"
    );
    assert!(!breakers.admits(&k));
}

/// Also seen in issue 30: lowering `breaker.max_keys` live evicted nothing. Closed circuits
/// are let go down to the new bound at once; an open one stays until it closes, then goes.
#[test]
fn a_lowered_max_keys_lets_closed_keys_go() {
    let (clock, mock) = Clock::mock();
    let config = BreakerConfig {
        min_calls: 1,
        recovery_ms: 10,
        half_open_probes: 1,
        ..BreakerConfig::default()
    };
    let b = Breakers::with_clock(config.clone(), clock).unwrap();
    for key in ["a", "b", "c", "d"] {
        assert!(b.breaker(key).is_some());
    }
    let d = b.breaker("d").unwrap();
    b.record_failure("d");
    assert_eq!(b.state("d"), Some(CircuitState::Open));
    b.apply(BreakerConfig {
        max_keys: 1,
        ..config.clone()
    })
    .unwrap();
    // Only the open circuit is still tracked, and a new key finds no room.
    assert_eq!(b.len(), 1);
    assert_eq!(b.state("d"), Some(CircuitState::Open));
    assert!(b.breaker("e").is_none());
    assert_eq!(b.untracked(), 1);
    // Kept while open; within the bound once closed.
    mock.increment(Duration::from_millis(10));
    let probe = b.try_call(&d).unwrap();
    b.record(probe, Outcome::Success);
    assert_eq!(b.state("d"), Some(CircuitState::Closed));
    assert_eq!(b.len(), 1);
    // Room for two: 'e' opens; lowered to one: the closed 'd' goes, the open 'e' stays, over
    // the bound only until it closes.
    b.apply(BreakerConfig {
        max_keys: 2,
        ..config.clone()
    })
    .unwrap();
    let e = b.breaker("e").unwrap();
    b.record_failure("e");
    b.apply(BreakerConfig {
        max_keys: 1,
        ..config.clone()
    })
    .unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b.state("e"), Some(CircuitState::Open));
    assert_eq!(b.state("d"), None);
    let _ = e;
}
