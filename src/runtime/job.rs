//! What the handler sees, and what it answers.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use quanta::{Clock, Instant};

use crate::runtime::Propagation;
use crate::Criticality;

/// How loaded the runtime is, for handlers that degrade instead of being shed (brownout).
///
/// Read when the job starts: `level` tiers from the bottom of the ladder are being refused,
/// the higher of what admission's signals refuse and the operator's
/// [`forced_shed_level`](crate::runtime::RuntimeConfig::forced_shed_level).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LoadLevel(pub(crate) u8);

impl LoadLevel {
    /// Nothing is being refused.
    pub const NORMAL: LoadLevel = LoadLevel(0);

    /// Number of tiers being refused, `0..=4`.
    pub fn shed_tiers(self) -> u8 {
        self.0
    }

    /// Whether any tier is being refused: a good moment to skip optional work.
    pub fn is_overloaded(self) -> bool {
        self.0 > 0
    }

    /// Whether `tier` is still being admitted.
    pub fn admits(self, tier: Criticality) -> bool {
        tier.rank() >= self.0 as usize
    }
}

/// One message being served: the payload and what the handler may want to know about it.
///
/// # Examples
///
/// ```
/// use triage::runtime::{HandlerError, Job};
///
/// async fn handle(job: Job<Vec<u8>>) -> Result<(), HandlerError> {
///     if job.load().is_overloaded() {
///         // brownout: skip the optional enrichment step
///     }
///     let text = std::str::from_utf8(job.payload()).map_err(HandlerError::permanent)?;
///     let _ = text;
///     Ok(())
/// }
/// # let _ = handle;
/// ```
pub struct Job<T> {
    pub(crate) payload: Arc<T>,
    pub(crate) criticality: Criticality,
    pub(crate) original: Criticality,
    pub(crate) attempt: u32,
    pub(crate) deadline: Option<Instant>,
    pub(crate) enqueued_at: Instant,
    pub(crate) load: LoadLevel,
    pub(crate) brownout: u8,
    pub(crate) clock: Clock,
}

impl<T> Job<T> {
    /// A job outside any runtime, at attempt 0 and normal load: to unit-test a handler, or to
    /// call it from another loop.
    pub fn detached(
        payload: T,
        criticality: Criticality,
        deadline: Option<Instant>,
        clock: Clock,
    ) -> Job<T> {
        let now = clock.now();
        Job {
            payload: Arc::new(payload),
            criticality,
            original: criticality,
            attempt: 0,
            deadline,
            enqueued_at: now,
            load: LoadLevel::NORMAL,
            brownout: 0,
            clock,
        }
    }

    /// The same job at brownout level `level` (see [`brownout`](Self::brownout)): to
    /// unit-test a handler's degraded modes.
    #[must_use]
    pub fn with_brownout(mut self, level: u8) -> Job<T> {
        self.brownout = level;
        self
    }

    /// The message.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// A shared handle on the message, to keep it past the handler's borrow.
    pub fn payload_arc(&self) -> Arc<T> {
        Arc::clone(&self.payload)
    }

    /// The tier it is served at: its criticality demoted once per retry.
    pub fn criticality(&self) -> Criticality {
        self.criticality
    }

    /// The criticality the source classified, before retry demotion.
    pub fn original_criticality(&self) -> Criticality {
        self.original
    }

    /// Retries before this one (0 on the first delivery).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time left before the deadline (zero once passed); `None` without a deadline. Pass it
    /// down to the calls the handler makes rather than a fresh timeout.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(self.clock.now()))
    }

    /// What to stamp on the messages this handler publishes for the next hop: the job's
    /// criticality (the tier it is served at, so a retry's follow-up work is demoted with it)
    /// and its absolute deadline on the wall clock (the budget left, passed down rather than a
    /// fresh one). Lower it with [`Propagation::lower_to`]; it cannot be raised. See
    /// `triage_kafka::stamp` and `triage_amqp::stamp` for the broker headers.
    pub fn propagation(&self) -> Propagation {
        let deadline = self.deadline.map(|d| wall_deadline(&self.clock, d));
        Propagation::new(self.criticality, deadline)
    }

    /// How long it waited in the queue before this attempt started.
    pub fn sojourn(&self) -> Duration {
        self.clock.now().saturating_duration_since(self.enqueued_at)
    }

    /// The load when the job started.
    pub fn load(&self) -> LoadLevel {
        self.load
    }

    /// The operator's brownout level when the job started
    /// ([`RuntimeConfig::brownout_level`](crate::runtime::RuntimeConfig::brownout_level), `0`
    /// for full service): a degraded mode decided in advance and switched on by configuration,
    /// live, without a deploy (seed 002, "Brownouts: shedding features, not requests"). What
    /// each level turns off is the handler's to decide; [`load`](Self::load) is the automatic
    /// counterpart, from the admission signals.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::runtime::{HandlerError, Job};
    /// use triage::Criticality;
    ///
    /// async fn handle(job: Job<String>) -> Result<(), HandlerError> {
    ///     if job.brownout() == 0 {
    ///         // full service: enrich, recommend, render the rich preview
    ///     }
    ///     let _ = job.payload();
    ///     Ok(())
    /// }
    /// let job = Job::detached("order".to_owned(), Criticality::High, None, quanta::Clock::new())
    ///     .with_brownout(2);
    /// assert_eq!(job.brownout(), 2);
    /// # let _ = handle;
    /// ```
    pub fn brownout(&self) -> u8 {
        self.brownout
    }
}

impl<T> fmt::Debug for Job<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("criticality", &self.criticality)
            .field("attempt", &self.attempt)
            .field("deadline", &self.deadline)
            .field("load", &self.load)
            .field("brownout", &self.brownout)
            .finish_non_exhaustive()
    }
}

/// A handler's failure: retry it (demoted one level, after a backoff) or give up now.
///
/// # Examples
///
/// ```
/// use triage::runtime::HandlerError;
///
/// let err = HandlerError::downstream("payments", "connection refused");
/// assert_eq!(err.downstream_key(), Some("payments"));
/// assert!(err.is_retryable());
/// assert_eq!(err.to_string(), "downstream payments failed: connection refused");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum HandlerError {
    /// Worth retrying: a timeout, a dependency briefly unavailable.
    Retryable(Box<dyn std::error::Error + Send + Sync>),
    /// Never worth retrying: malformed input, a business rule. Dead-lettered at once.
    Permanent(Box<dyn std::error::Error + Send + Sync>),
    /// The downstream named `key` failed: retried like [`Retryable`](HandlerError::Retryable),
    /// and counted as a failure by that key's circuit breaker (see
    /// [`RuntimeBuilder::downstream`](crate::runtime::RuntimeBuilder::downstream)).
    Downstream {
        /// The downstream key, as messages are mapped to it.
        key: Cow<'static, str>,
        /// What went wrong.
        error: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl HandlerError {
    /// A failure worth retrying.
    pub fn retryable(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        HandlerError::Retryable(err.into())
    }

    /// A failure not worth retrying.
    pub fn permanent(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        HandlerError::Permanent(err.into())
    }

    /// A failure of the downstream `key` (a payment service, a database): worth retrying, and
    /// counted against `key`'s circuit breaker, so that once its failure rate crosses the
    /// threshold the messages bound for it are refused before they reach a handler. Allocates
    /// nothing for a `&'static str` key.
    pub fn downstream(
        key: impl Into<Cow<'static, str>>,
        err: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        HandlerError::Downstream {
            key: key.into(),
            error: err.into(),
        }
    }

    /// Whether it is worth retrying.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            HandlerError::Retryable(_) | HandlerError::Downstream { .. }
        )
    }

    /// The downstream this failure names, if it is a [`Downstream`](HandlerError::Downstream)
    /// one.
    pub fn downstream_key(&self) -> Option<&str> {
        match self {
            HandlerError::Downstream { key, .. } => Some(key),
            _ => None,
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Retryable(e) => write!(f, "retryable handler error: {e}"),
            HandlerError::Permanent(e) => write!(f, "permanent handler error: {e}"),
            HandlerError::Downstream { key, error } => {
                write!(f, "downstream {key} failed: {error}")
            }
        }
    }
}

impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HandlerError::Retryable(e)
            | HandlerError::Permanent(e)
            | HandlerError::Downstream { error: e, .. } => Some(e.as_ref()),
        }
    }
}

/// A monotonic deadline moved onto the wall clock, which the next hop (or a deferred copy's
/// reader, in another process) reads: now on the wall clock plus the time left, or minus the
/// time since it passed.
pub(crate) fn wall_deadline(clock: &Clock, deadline: Instant) -> SystemTime {
    let now = clock.now();
    let wall = SystemTime::now();
    if deadline >= now {
        wall + deadline.saturating_duration_since(now)
    } else {
        wall.checked_sub(now.saturating_duration_since(deadline))
            .unwrap_or(wall)
    }
}
