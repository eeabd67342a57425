//! A scenario: a seed, the arrival, service-time and outcome processes, the message mix, and
//! what else the workload brings (a backlog, ordering keys, payload sizes, clients that
//! re-submit). The twelve of issue 33 are [`matrix`].

use std::time::Duration;

use triage::runtime::RuntimeConfig;

use crate::arrival::{Arrival, Bursts, Segment};
use crate::mix::Mix;
use crate::service::{Outcomes, ServiceTime, SlowDown};

/// Key mode with one hot key.
#[derive(Clone, Copy, Debug)]
pub struct HotKey {
    /// Share of messages on the hot key.
    pub share: f64,
    /// Other keys, drawn uniformly for the rest.
    pub others: u64,
}

/// Two payload sizes.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Bytes of a small message.
    pub small: u32,
    /// Bytes of a large one.
    pub large: u32,
    /// Share of large messages.
    pub large_share: f64,
}

/// An overload stretch whose end recovery is timed from.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// When the overload begins, since the start.
    pub start: Duration,
    /// When it ends.
    pub end: Duration,
}

/// One workload.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Short name, used on the command line.
    pub name: &'static str,
    /// One line saying what it is.
    pub summary: &'static str,
    /// Seed of every draw (arrivals, tiers, keys, sizes, service times, outcomes).
    pub seed: u64,
    /// Worker tasks (FIFO and triage alike).
    pub workers: usize,
    /// The service-time process.
    pub service: ServiceTime,
    /// The handler's outcomes.
    pub outcomes: Outcomes,
    /// Tiers and windows.
    pub mix: Mix,
    /// Offered load over time.
    pub arrival: Arrival,
    /// Work already waiting in the broker at the start: this long of 1x traffic, published
    /// over the time before the start (oldest first), so its deadlines run from then.
    pub backlog: Option<Duration>,
    /// Users per tier, each message's drawn uniformly from its tier's (in key mode the key
    /// is the user): the cohorts pull-based admission admits a partly admitted tier by.
    pub users: u32,
    /// Key mode with a hot key.
    pub hot_key: Option<HotKey>,
    /// Payload sizes.
    pub sizes: Option<Sizes>,
    /// A memory budget on the runtime's held payload bytes (the scenario's constraint, applied
    /// to every triage configuration).
    pub memory_budget: Option<u64>,
    /// Producers re-publish at once every message shed (dropped) while its deadline has not
    /// passed.
    pub retry_storm: bool,
    /// The overload stretch recovery is timed from.
    pub step: Option<Step>,
    /// Arrival rates are multiplied by this (1: "1x" is the nominal capacity). The real-time
    /// cross-check sets it to the capacity measured on real timers over the nominal one:
    /// a real `sleep` ends on the timer's next millisecond tick after it is due, so real
    /// service times are longer than drawn.
    pub rate_scale: f64,
}

impl Scenario {
    /// Workers over mean service time, messages per second: what "1x" is (times
    /// `rate_scale`).
    pub fn capacity_per_s(&self) -> f64 {
        self.rate_scale * self.workers as f64 / self.service.mean.as_secs_f64()
    }

    /// The run's length (arrivals only; the runs then settle).
    pub fn duration(&self) -> Duration {
        self.arrival.duration()
    }

    /// `config` with what the scenario fixes: the workers and the memory budget.
    pub fn apply(&self, mut config: RuntimeConfig) -> RuntimeConfig {
        config.workers = self
            .workers
            .try_into()
            .unwrap_or(std::num::NonZeroUsize::MIN);
        if let Some(budget) = self.memory_budget {
            config.memory.budget_bytes = Some(budget);
        }
        config
    }

    /// The same scenario with every length multiplied by `scale` (bursts and windows kept),
    /// for the short form in the test suite.
    pub fn scaled(&self, scale: f64) -> Scenario {
        let mut s = self.clone();
        s.arrival = self.arrival.scaled(scale);
        s.backlog = self.backlog.map(|b| b.mul_f64(scale));
        s.step = self.step.map(|st| Step {
            start: st.start.mul_f64(scale),
            end: st.end.mul_f64(scale),
        });
        if let Some(slow) = &mut s.service.slow {
            slow.from = slow.from.mul_f64(scale);
            slow.until = slow.until.mul_f64(scale);
        }
        s
    }

    /// The same scenario with another seed.
    pub fn with_seed(&self, seed: u64) -> Scenario {
        Scenario {
            seed,
            ..self.clone()
        }
    }
}

/// Users per tier in every scenario: a few hundred, so that each of the 128 cohorts holds
/// two or three of a tier's users.
pub const USERS: u32 = 300;

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn base(name: &'static str, summary: &'static str, arrival: Arrival) -> Scenario {
    Scenario {
        name,
        summary,
        seed: 33,
        workers: 8,
        service: ServiceTime::standard(),
        outcomes: Outcomes::default(),
        mix: Mix::standard(),
        arrival,
        backlog: None,
        users: USERS,
        hot_key: None,
        sizes: None,
        memory_budget: None,
        retry_storm: false,
        step: None,
        rate_scale: 1.0,
    }
}

/// 0.5x, then `factor` for 10 s, then 0.5x: a step whose recovery is timed.
fn step(name: &'static str, summary: &'static str, factor: f64) -> Scenario {
    let mut sc = base(
        name,
        summary,
        Arrival {
            segments: vec![
                Segment::steady(0.5, s(5)),
                Segment::steady(factor, s(10)),
                Segment::steady(0.5, s(15)),
            ],
            bursts: None,
        },
    );
    sc.step = Some(Step {
        start: s(5),
        end: s(15),
    });
    sc
}

/// The twelve scenarios of issue 33. Capacity is 8 workers over a 2 ms mean service time
/// (4,000 messages a second); the mix is README's first command's unless a scenario says
/// otherwise.
pub fn matrix() -> Vec<Scenario> {
    let mut v = vec![
        base("steady-0.8x", "0.8x for 30 s", Arrival::steady(0.8, s(30))),
        base("steady-1x", "1x for 30 s", Arrival::steady(1.0, s(30))),
        step("step-3x", "0.5x 5 s, 3x 10 s, 0.5x 15 s", 3.0),
        step("step-10x", "0.5x 5 s, 10x 10 s, 0.5x 15 s", 10.0),
    ];

    let mut ramp = base(
        "ramp-3x",
        "0.5x to 3x over 30 s, then 0.5x 15 s",
        Arrival {
            segments: vec![Segment::ramp(0.5, 3.0, s(30)), Segment::steady(0.5, s(15))],
            bursts: None,
        },
    );
    ramp.step = Some(Step {
        start: Duration::ZERO,
        end: s(30),
    });
    v.push(ramp);

    // 0.444x between bursts of 5x lasting 200 ms every 2 s: a mean of 0.9x.
    v.push(base(
        "bursty-0.9x",
        "bursts of 5x for 200 ms every 2 s over 0.44x: 0.9x on average, 30 s",
        Arrival {
            segments: vec![Segment::steady(0.8 / 1.8, s(30))],
            bursts: Some(Bursts {
                every: s(2),
                length: Duration::from_millis(200),
                factor: 5.0,
            }),
        },
    ));

    let mut slow = base(
        "slow-downstream",
        "0.8x for 35 s; service time doubles from 10 s to 25 s (1.6x of the capacity left)",
        Arrival::steady(0.8, s(35)),
    );
    slow.service.slow = Some(SlowDown {
        from: s(10),
        until: s(25),
        factor: 2.0,
    });
    slow.step = Some(Step {
        start: s(10),
        end: s(25),
    });
    v.push(slow);

    let mut failing = base(
        "failing-downstream",
        "0.8x for 30 s; half the messages call downstream b, which fails 30% of its calls",
        Arrival::steady(0.8, s(30)),
    );
    failing.outcomes = Outcomes {
        to_b: 0.5,
        b_fails: 0.3,
    };
    v.push(failing);

    let mut storm = step(
        "retry-storm",
        "0.5x 5 s, 2x 10 s, 0.5x 15 s; every shed message re-published at once while in time",
        2.0,
    );
    storm.retry_storm = true;
    v.push(storm);

    let mut backlog = base(
        "backlog",
        "60 s of 1x work waiting at start (published over the minute before), then 1x for 30 s",
        Arrival::steady(1.0, s(30)),
    );
    backlog.backlog = Some(s(60));
    v.push(backlog);

    let mut hot = base(
        "hot-key",
        "key mode, 0.8x for 30 s, 30% of messages on one key, the rest over 1,000 keys",
        Arrival::steady(0.8, s(30)),
    );
    hot.hot_key = Some(HotKey {
        share: 0.3,
        others: 1000,
    });
    v.push(hot);

    let mut memory = step(
        "memory-mix",
        "0.5x 5 s, 2x 10 s, 0.5x 15 s; 95% 1 KB and 5% 1 MB messages, a 64 MB memory budget",
        2.0,
    );
    memory.sizes = Some(Sizes {
        small: 1024,
        large: 1 << 20,
        large_share: 0.05,
    });
    memory.memory_budget = Some(64 << 20);
    v.push(memory);
    v
}

/// The scenario of that name.
pub fn by_name(name: &str) -> Option<Scenario> {
    matrix().into_iter().find(|s| s.name == name)
}
