//! The search for the best hand-tuned settings: every point of a small grid over the knobs
//! that decide what pulled work is admitted today, on every scenario, keeping per scenario the
//! best by goodput (Critical first, then the weighted total; see [`Goodput::better_than`]).
//!
//! Knobs left out, and why: the queue-age cut-offs (`queue.admission`) admit pushed work
//! (`try_submit`) only, and every scenario is pulled; the shares, refusal policies and breaker
//! settings are each tier's business or a downstream's, not a tuning the scenarios vary;
//! `tick_ms`, `window_ms`, `sustained_ms` and `prefetch_per_slot` are held at their defaults
//! to keep the grid small (BENCHMARKS.md says which knobs a first grid found to matter).

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use triage::limit::{Gradient2Config, LimitConfig};
use triage::queue::Weight;
use triage::runtime::RuntimeConfig;
use triage::PerTier;

use crate::consumer::{previous_defaults, Consumer};
use crate::goodput::Goodput;
use crate::outcome::Outcome;
use crate::run::run_virtual;
use crate::scenario::Scenario;

/// The concurrency limit of a grid point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Fixed at the workers (the default).
    Fixed,
    /// Gradient2 between 1 and the workers, starting at the workers.
    Gradient2,
}

/// One point of the grid: the knobs it sets, the rest at their defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// Dequeue weights, Critical first.
    pub weights: [u32; 4],
    /// `expert.admission.headroom`.
    pub headroom: f64,
    /// `expert.retry.base_backoff_ms`.
    pub backoff_ms: u64,
    /// `expert.admission.recover_ms`.
    pub recover_ms: u64,
    /// `expert.queue.capacity`.
    pub capacity: usize,
    /// The concurrency limit.
    pub limit: Limit,
}

impl Point {
    /// The defaults before the zero-configuration controller, as a grid point.
    pub fn defaults() -> Self {
        let c = previous_defaults();
        Point {
            weights: [8, 4, 2, 1],
            headroom: c.expert.admission.headroom,
            backoff_ms: c.expert.retry.base_backoff_ms,
            recover_ms: c.expert.admission.recover_ms,
            capacity: c.expert.queue.capacity.get(),
            limit: Limit::Fixed,
        }
    }

    /// The runtime configuration of this point for `workers` workers: the knobs set on the
    /// defaults before the zero-configuration controller (the queue bounded by
    /// `expert.queue.capacity` alone), since the grid is the hand-tuning the controller replaces.
    pub fn config(&self, workers: usize) -> RuntimeConfig {
        let mut c = previous_defaults();
        // The grid's weights are all in range (1..=1000).
        if let [Ok(w0), Ok(w1), Ok(w2), Ok(w3)] = self.weights.map(|w| Weight::new(i64::from(w))) {
            c.expert.queue.weights = PerTier::new(w0, w1, w2, w3);
        }
        c.expert.queue.capacity = NonZeroUsize::new(self.capacity).unwrap_or(NonZeroUsize::MIN);
        c.expert.admission.headroom = self.headroom;
        c.expert.retry.base_backoff_ms = self.backoff_ms;
        c.expert.admission.recover_ms = self.recover_ms;
        c.expert.limit = match self.limit {
            Limit::Fixed => None,
            Limit::Gradient2 => Some(LimitConfig::Gradient2(Gradient2Config {
                initial: workers,
                max: workers,
                ..Gradient2Config::default()
            })),
        };
        c
    }

    /// The knobs that differ from the defaults, as `field = value` (TOML paths); `defaults`
    /// when none does.
    pub fn describe(&self) -> String {
        let d = Point::defaults();
        let mut parts = Vec::new();
        if self.weights != d.weights {
            let w = self.weights;
            parts.push(format!(
                "expert.queue.weights = {}/{}/{}/{}",
                w[0], w[1], w[2], w[3]
            ));
        }
        if self.capacity != d.capacity {
            parts.push(format!("expert.queue.capacity = {}", self.capacity));
        }
        if self.headroom != d.headroom {
            parts.push(format!("expert.admission.headroom = {}", self.headroom));
        }
        if self.backoff_ms != d.backoff_ms {
            parts.push(format!(
                "expert.retry.base_backoff_ms = {}",
                self.backoff_ms
            ));
        }
        if self.recover_ms != d.recover_ms {
            parts.push(format!("expert.admission.recover_ms = {}", self.recover_ms));
        }
        if self.limit == Limit::Gradient2 {
            parts.push("expert.limit = gradient2 (initial = max = workers)".to_string());
        }
        if parts.is_empty() {
            "defaults".to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// The values each knob takes: the default first.
pub const WEIGHTS: [[u32; 4]; 2] = [[8, 4, 2, 1], [32, 8, 2, 1]];
/// `expert.admission.headroom` values.
pub const HEADROOM: [f64; 2] = [0.95, 0.85];
/// `expert.retry.base_backoff_ms` values.
pub const BACKOFF_MS: [u64; 2] = [100, 10];
/// `expert.admission.recover_ms` values.
pub const RECOVER_MS: [u64; 3] = [500, 150, 2000];
/// `expert.queue.capacity` values.
pub const CAPACITY: [usize; 2] = [1024, 256];
/// Concurrency limits.
pub const LIMITS: [Limit; 2] = [Limit::Fixed, Limit::Gradient2];

/// Every point of the grid (the product of the values above), the defaults first.
pub fn points() -> Vec<Point> {
    let mut v = Vec::new();
    for weights in WEIGHTS {
        for headroom in HEADROOM {
            for backoff_ms in BACKOFF_MS {
                for recover_ms in RECOVER_MS {
                    for capacity in CAPACITY {
                        for limit in LIMITS {
                            v.push(Point {
                                weights,
                                headroom,
                                backoff_ms,
                                recover_ms,
                                capacity,
                                limit,
                            });
                        }
                    }
                }
            }
        }
    }
    v
}

/// The best point found for one scenario.
#[derive(Clone, Debug)]
pub struct Best {
    /// The point.
    pub point: Point,
    /// Its run.
    pub outcome: Outcome,
    /// Points tied with it (same Critical and weighted goodput).
    pub ties: usize,
}

/// The search over every scenario.
#[derive(Debug)]
pub struct Search {
    /// Per scenario, in the order given.
    pub best: Vec<Best>,
    /// Runs made.
    pub runs: usize,
    /// Real time the search took.
    pub wall: Duration,
    /// Threads it ran on.
    pub threads: usize,
}

/// Runs every point of `points` on every scenario on `threads` threads, each run in virtual
/// time on a runtime of its own.
///
/// # Panics
///
/// If `points` is empty.
pub fn search(scenarios: &[Scenario], points: &[Point], threads: usize) -> Search {
    let start = Instant::now();
    let jobs: Vec<(usize, usize)> = (0..scenarios.len())
        .flat_map(|s| (0..points.len()).map(move |p| (s, p)))
        .collect();
    let results: Mutex<Vec<Vec<Option<Goodput>>>> =
        Mutex::new(vec![vec![None; points.len()]; scenarios.len()]);
    let outcomes: Mutex<Vec<Vec<Option<Outcome>>>> =
        Mutex::new(vec![vec![None; points.len()]; scenarios.len()]);
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(s, p)) = jobs.get(i) else { break };
                let sc = &scenarios[s];
                let consumer = Consumer::Triage(Box::new(points[p].config(sc.workers)));
                let out = run_virtual(sc, &consumer);
                results.lock()[s][p] = Some(out.goodput);
                outcomes.lock()[s][p] = Some(out);
            });
        }
    });
    let results = results.into_inner();
    let mut outcomes = outcomes.into_inner();
    let best = results
        .iter()
        .enumerate()
        .map(|(s, row)| {
            let goodput: Vec<Goodput> = row.iter().map(|g| g.unwrap_or_default()).collect();
            let mut b = 0;
            for (p, g) in goodput.iter().enumerate() {
                if g.better_than(&goodput[b]) {
                    b = p;
                }
            }
            let ties = goodput
                .iter()
                .filter(|g| !g.better_than(&goodput[b]) && !goodput[b].better_than(g))
                .count();
            Best {
                point: points[b],
                outcome: outcomes[s][b].take().expect("every point ran"),
                ties,
            }
        })
        .collect();
    Search {
        best,
        runs: jobs.len(),
        wall: start.elapsed(),
        threads: threads.max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_point_is_todays_defaults_and_the_grid_has_every_combination() {
        let pts = points();
        assert_eq!(pts.len(), 96);
        assert_eq!(pts[0], Point::defaults());
        assert_eq!(pts[0].config(8), previous_defaults());
        assert_eq!(pts[0].describe(), "defaults");
        for (i, a) in pts.iter().enumerate() {
            assert!(pts[i + 1..].iter().all(|b| b != a), "{a:?} twice");
            a.config(8)
                .validate()
                .expect("every point is a valid configuration");
        }
    }
}
