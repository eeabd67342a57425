//! A static limit: the baseline against which the adaptive algorithms are judged,
//! and the right choice when the downstream capacity is known (e.g. a pool of N
//! database connections).

use super::error::{LimitConfigError, MAX_LIMIT};
use super::Sample;

/// A concurrency limit that never changes, whatever the samples say.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use triage::limit::{Fixed, Sample};
///
/// let mut fixed = Fixed::new(8)?;
/// let overloaded = Sample { latency: Duration::from_secs(60), in_flight: 8, dropped: true };
/// assert_eq!(fixed.on_sample(overloaded), 8);
/// assert_eq!(fixed.limit(), 8);
/// # Ok::<(), triage::limit::LimitConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fixed {
    limit: usize,
}

impl Fixed {
    /// A limit of `limit` concurrent jobs.
    ///
    /// # Errors
    ///
    /// [`LimitConfigError`] naming `limit.limit` if `limit` is outside
    /// `[1, MAX_LIMIT]`: a limit of 0 would never run anything.
    pub fn new(limit: usize) -> Result<Self, LimitConfigError> {
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(LimitConfigError::new(
                "limit.limit",
                limit,
                format!("[1, {MAX_LIMIT}]"),
            ));
        }
        Ok(Self { limit })
    }

    /// The limit, in concurrent jobs.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Ignores the sample and returns the unchanged limit.
    pub fn on_sample(&mut self, _sample: Sample) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zero_and_huge() {
        let err = Fixed::new(0).unwrap_err();
        assert_eq!(err.field, "limit.limit");
        assert_eq!(
            err.to_string(),
            "limit.limit = 0 is out of range: allowed [1, 1000000]"
        );
        assert!(Fixed::new(MAX_LIMIT + 1).is_err());
        assert_eq!(Fixed::new(MAX_LIMIT).unwrap().limit(), MAX_LIMIT);
    }
}
