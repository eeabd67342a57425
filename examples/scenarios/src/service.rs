//! The service-time process and the handler's outcome, both drawn per message (see `hash`).

use std::time::Duration;

use crate::hash;

/// How long a handler call takes: 1, 2 or 3 ms with equal chance (a mean of 2 ms, whole
/// milliseconds because tokio's timers have millisecond resolution), times `slow.factor`
/// while a slow-down lasts.
#[derive(Clone, Copy, Debug)]
pub struct ServiceTime {
    /// Mean service time when nothing is slowed; the draws are 0.5x, 1x and 1.5x of it.
    pub mean: Duration,
    /// A slow-down of the downstream during part of the run.
    pub slow: Option<SlowDown>,
}

/// The downstream slows by `factor` between `from` and `until` (since the run's start).
#[derive(Clone, Copy, Debug)]
pub struct SlowDown {
    /// Start of the slow-down.
    pub from: Duration,
    /// Its end.
    pub until: Duration,
    /// Service time multiplier while it lasts.
    pub factor: f64,
}

impl ServiceTime {
    /// 2 ms on average, never slowed.
    pub fn standard() -> Self {
        ServiceTime {
            mean: Duration::from_millis(2),
            slow: None,
        }
    }

    /// The service time of message `id`'s attempt `attempt`, begun at `at` since the start.
    pub fn draw(&self, seed: u64, id: u64, attempt: u32, at: Duration) -> Duration {
        let u = hash::unit(seed, 1, id, attempt);
        let base = self.mean.mul_f64(0.5 + (u * 3.0).floor() * 0.5);
        match self.slow {
            Some(s) if at >= s.from && at < s.until => base.mul_f64(s.factor),
            _ => base,
        }
    }
}

/// What a handler call returns: a share of messages goes to downstream `b`, which fails a
/// share of its calls (after the full service time, as a timeout or an error reply would).
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcomes {
    /// Share of messages bound for downstream `b` (the rest go to `a`, which never fails).
    pub to_b: f64,
    /// Share of `b`'s calls that fail.
    pub b_fails: f64,
}

impl Outcomes {
    /// Whether message `id` is bound for downstream `b`.
    pub fn bound_for_b(&self, seed: u64, id: u64) -> bool {
        self.to_b > 0.0 && hash::unit(seed, 2, id, 0) < self.to_b
    }

    /// Whether attempt `attempt` of message `id` (bound for `b` or not) fails.
    pub fn fails(&self, seed: u64, id: u64, attempt: u32, to_b: bool) -> bool {
        to_b && hash::unit(seed, 3, id, attempt) < self.b_fails
    }
}
