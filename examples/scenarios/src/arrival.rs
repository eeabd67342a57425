//! The arrival process: offered load as a multiple of capacity over time, drawn as a Poisson
//! process (a count per millisecond) from the scenario's seed.

use std::time::Duration;

/// A stretch of the run whose load moves linearly from `from` to `to` (times capacity).
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    /// Load at the segment's start, times capacity.
    pub from: f64,
    /// Load at its end, times capacity (equal to `from` for a steady stretch).
    pub to: f64,
    /// Its length.
    pub length: Duration,
}

impl Segment {
    /// A steady stretch.
    pub fn steady(factor: f64, length: Duration) -> Self {
        Segment {
            from: factor,
            to: factor,
            length,
        }
    }

    /// A linear ramp.
    pub fn ramp(from: f64, to: f64, length: Duration) -> Self {
        Segment { from, to, length }
    }
}

/// Short bursts over the segments: every `every`, `length` at `factor` times capacity in place
/// of the segments' load.
#[derive(Clone, Copy, Debug)]
pub struct Bursts {
    /// Time from one burst's start to the next.
    pub every: Duration,
    /// How long a burst lasts.
    pub length: Duration,
    /// Load during a burst, times capacity.
    pub factor: f64,
}

/// Offered load over the run.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// The stretches, in order.
    pub segments: Vec<Segment>,
    /// Bursts laid over them, if any.
    pub bursts: Option<Bursts>,
}

impl Arrival {
    /// One steady stretch.
    pub fn steady(factor: f64, length: Duration) -> Self {
        Arrival {
            segments: vec![Segment::steady(factor, length)],
            bursts: None,
        }
    }

    /// The run's length.
    pub fn duration(&self) -> Duration {
        self.segments.iter().map(|s| s.length).sum()
    }

    /// Offered load at `t` since the start, times capacity (0 past the end).
    pub fn factor_at(&self, t: Duration) -> f64 {
        if let Some(b) = self.bursts {
            let phase = t.as_nanos() % b.every.as_nanos().max(1);
            if phase < b.length.as_nanos() && t < self.duration() {
                return b.factor;
            }
        }
        let mut start = Duration::ZERO;
        for s in &self.segments {
            if t < start + s.length {
                let x = (t - start).as_secs_f64() / s.length.as_secs_f64().max(1e-9);
                return s.from + (s.to - s.from) * x;
            }
            start += s.length;
        }
        0.0
    }

    /// The mean load over the run, times capacity (a numeric integral at 1 ms).
    pub fn mean_factor(&self) -> f64 {
        let ms = self.duration().as_millis() as u64;
        if ms == 0 {
            return 0.0;
        }
        (0..ms)
            .map(|m| self.factor_at(Duration::from_millis(m)))
            .sum::<f64>()
            / ms as f64
    }

    /// The same shape with every length multiplied by `scale` (bursts keep their length, so a
    /// short form still has them).
    pub fn scaled(&self, scale: f64) -> Self {
        Arrival {
            segments: self
                .segments
                .iter()
                .map(|s| Segment {
                    length: s.length.mul_f64(scale),
                    ..*s
                })
                .collect(),
            bursts: self.bursts,
        }
    }
}

/// A Poisson draw with mean `lambda` (Knuth's method, in pieces of at most 30 so that
/// `exp(-lambda)` stays representable).
pub fn poisson(rng: &mut fastrand::Rng, mut lambda: f64) -> u64 {
    let mut n = 0;
    while lambda > 0.0 {
        let piece = lambda.min(30.0);
        lambda -= piece;
        let limit = (-piece).exp();
        let mut p = rng.f64();
        while p > limit {
            n += 1;
            p *= rng.f64();
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_average_to_the_stated_mean() {
        let a = Arrival {
            segments: vec![Segment::steady(4.0 / 9.0, Duration::from_secs(20))],
            bursts: Some(Bursts {
                every: Duration::from_secs(2),
                length: Duration::from_millis(200),
                factor: 5.0,
            }),
        };
        assert!((a.mean_factor() - 0.9).abs() < 0.001, "{}", a.mean_factor());
    }

    #[test]
    fn poisson_has_the_asked_mean() {
        let mut rng = fastrand::Rng::with_seed(1);
        for lambda in [0.5, 4.0, 40.0] {
            let n = 20_000;
            let mean = (0..n).map(|_| poisson(&mut rng, lambda)).sum::<u64>() as f64 / n as f64;
            assert!(
                (mean - lambda).abs() < lambda * 0.03 + 0.02,
                "{lambda}: {mean}"
            );
        }
    }
}
