//! What a handler stamps on the messages it publishes for the next hop.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::wire::{self, HeaderValue};
use crate::Criticality;

/// The criticality and absolute deadline a follow-up message inherits from the job that
/// publishes it: seed 000's "a call inherits the criticality of its caller" and "pass the
/// remaining budget down, not a fresh one", carried in the same headers the sources read
/// ([`wire::CRITICALITY`], [`wire::DEADLINE_MS`]), so the next stage, reading a trusted topic
/// or queue, classifies the message as this one and expires it, without a handler call, once
/// the original deadline has passed.
///
/// Obtained only from [`Job::propagation`](crate::runtime::Job::propagation). It can be
/// lowered ([`lower_to`](Propagation::lower_to), [`demoted`](Propagation::demoted)) and its
/// deadline shortened ([`within`](Propagation::within)), never raised nor extended: a stage
/// cannot make its follow-up work more important, or give it more time, than the work that
/// caused it.
///
/// The connectors turn it into broker headers: `triage_kafka::stamp` (rdkafka's
/// `OwnedHeaders`) and `triage_amqp::stamp` (lapin's `FieldTable`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::runtime::Job;
/// use triage::Criticality;
///
/// let clock = triage::quanta::Clock::new();
/// let deadline = clock.now() + Duration::from_secs(2);
/// let job = Job::detached("order-17", Criticality::High, Some(deadline), clock);
///
/// let next = job.propagation();
/// assert_eq!(next.criticality(), Criticality::High);
/// assert!(next.remaining().unwrap() <= Duration::from_secs(2));
///
/// // Lowering is allowed, raising is refused.
/// assert_eq!(next.lower_to(Criticality::Sheddable)?.criticality(), Criticality::Sheddable);
/// assert!(next.lower_to(Criticality::Critical).is_err());
///
/// let headers: Vec<(&str, String)> =
///     next.headers().map(|(name, value)| (name, value.to_string())).collect();
/// assert_eq!(headers[0], ("triage-criticality", "high".to_string()));
/// assert_eq!(headers[1].0, "triage-deadline-ms");
/// # Ok::<(), triage::runtime::RaiseCriticalityError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Propagation {
    criticality: Criticality,
    deadline: Option<SystemTime>,
}

/// A [`Propagation::lower_to`] that would have raised the criticality.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaiseCriticalityError {
    /// The criticality of the job.
    pub from: Criticality,
    /// The higher one asked for.
    pub to: Criticality,
}

impl fmt::Display for RaiseCriticalityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "criticality cannot be raised for the next hop: from {} to {}",
            self.from, self.to
        )
    }
}

impl std::error::Error for RaiseCriticalityError {}

impl Propagation {
    pub(crate) fn new(criticality: Criticality, deadline: Option<SystemTime>) -> Self {
        Propagation {
            criticality,
            deadline,
        }
    }

    /// The criticality to stamp.
    pub fn criticality(&self) -> Criticality {
        self.criticality
    }

    /// The absolute deadline to stamp (wall clock); `None` when the job has none.
    pub fn deadline(&self) -> Option<SystemTime> {
        self.deadline
    }

    /// The budget left before the deadline, by the wall clock now (zero once passed); `None`
    /// without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| {
            d.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        })
    }

    /// The same, at criticality `to`, which must not be above the job's.
    ///
    /// # Errors
    ///
    /// [`RaiseCriticalityError`] when `to` is more critical than the job's criticality.
    pub fn lower_to(self, to: Criticality) -> Result<Self, RaiseCriticalityError> {
        if to > self.criticality {
            return Err(RaiseCriticalityError {
                from: self.criticality,
                to,
            });
        }
        Ok(Propagation {
            criticality: to,
            ..self
        })
    }

    /// One level lower (Sheddable stays Sheddable): for optional follow-up work.
    #[must_use]
    pub fn demoted(self) -> Self {
        Propagation {
            criticality: self.criticality.demoted_by(1),
            ..self
        }
    }

    /// The deadline cut to at most `budget` from now (wall clock): a stage may give its
    /// follow-up work less time than it has left, never more. A budget beyond what the wall
    /// clock can hold (`Duration::MAX`, "no limit") cuts nothing.
    #[must_use]
    pub fn within(self, budget: Duration) -> Self {
        let Some(cap) = SystemTime::now().checked_add(budget) else {
            return self;
        };
        let deadline = Some(self.deadline.map_or(cap, |d| d.min(cap)));
        Propagation { deadline, ..self }
    }

    /// The headers to stamp, as `(name, value)`: [`wire::CRITICALITY`], then
    /// [`wire::DEADLINE_MS`] when there is a deadline. Allocates nothing.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, HeaderValue)> {
        let criticality = (wire::CRITICALITY, wire::criticality_value(self.criticality));
        let deadline = self
            .deadline
            .map(|d| (wire::DEADLINE_MS, wire::deadline_value(d)));
        std::iter::once(criticality).chain(deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_raised_never_extended() {
        let soon = SystemTime::now() + Duration::from_millis(500);
        let p = Propagation::new(Criticality::Medium, Some(soon));
        assert_eq!(
            p.lower_to(Criticality::High),
            Err(RaiseCriticalityError {
                from: Criticality::Medium,
                to: Criticality::High
            })
        );
        assert_eq!(p.lower_to(Criticality::Medium), Ok(p));
        assert_eq!(p.demoted().criticality(), Criticality::Sheddable);
        assert_eq!(p.demoted().demoted().criticality(), Criticality::Sheddable);
        assert_eq!(p.within(Duration::from_secs(60)).deadline(), Some(soon));
        assert!(p.within(Duration::from_millis(10)).deadline().unwrap() < soon);
        let none = Propagation::new(Criticality::High, None);
        assert_eq!(none.headers().count(), 1);
        assert!(none.within(Duration::from_secs(1)).deadline().is_some());
    }

    #[test]
    fn a_budget_too_large_for_the_clock_cuts_nothing() {
        let soon = SystemTime::now() + Duration::from_secs(60);
        let p = Propagation::new(Criticality::Medium, Some(soon));
        assert_eq!(p.within(Duration::MAX).deadline(), Some(soon));
        let none = Propagation::new(Criticality::High, None);
        assert_eq!(none.within(Duration::MAX).deadline(), None);
        assert_eq!(none.within(Duration::MAX).remaining(), None);
    }
}
