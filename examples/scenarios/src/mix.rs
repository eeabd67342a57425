//! The message mix: which tier a message is, and how long it stays useful.

use std::time::Duration;

use triage::{Criticality, PerTier};

/// Share of offered messages per tier and each tier's usefulness window (a message's deadline
/// is its publish time plus its tier's window).
#[derive(Clone, Debug)]
pub struct Mix {
    /// Percent per tier, Critical first; they add up to 100.
    pub percent: [u32; 4],
    /// Usefulness window per tier.
    pub windows: PerTier<Duration>,
}

impl Mix {
    /// README's first command: 10 / 20 / 30 / 40 % Critical / High / Medium / Sheddable, due
    /// 1000 / 500 / 250 / 100 ms after publishing.
    pub fn standard() -> Self {
        Mix {
            percent: [10, 20, 30, 40],
            windows: PerTier::new(
                Duration::from_millis(1000),
                Duration::from_millis(500),
                Duration::from_millis(250),
                Duration::from_millis(100),
            ),
        }
    }

    /// The tier of a uniform draw `u` in `[0, 1)`.
    pub fn tier(&self, u: f64) -> Criticality {
        let total: u32 = self.percent.iter().sum();
        let x = u * f64::from(total);
        let mut acc = 0.0;
        for (i, share) in self.percent.iter().enumerate() {
            acc += f64::from(*share);
            if x < acc {
                return Criticality::ALL[i];
            }
        }
        Criticality::Sheddable
    }

    /// The longest window: after it, nothing offered can still be served in time.
    pub fn longest_window(&self) -> Duration {
        Criticality::ALL
            .iter()
            .map(|&t| self.windows[t])
            .max()
            .unwrap_or_default()
    }
}
