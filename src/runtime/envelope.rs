//! What a source hands to the runtime.

use std::time::Duration;

use quanta::Instant;

use crate::admission::{cohort, rotation_period, user_hash};
use crate::runtime::Ack;
use crate::Criticality;

/// A consumed message with what admission needs to decide about it, classified from headers,
/// topic and timestamp only: the payload has not been touched.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::runtime::{Ack, Envelope};
/// use triage::Criticality;
///
/// let clock = triage::quanta::Clock::new();
/// let envelope = Envelope::new(b"order-17".to_vec(), Criticality::Critical, Ack::noop())
///     .with_deadline(clock.now() + Duration::from_secs(5))
///     .with_size_bytes(8);
/// assert_eq!(envelope.attempt, 0);
/// ```
#[derive(Debug)]
pub struct Envelope<T> {
    /// The message itself, still in its wire form.
    pub payload: T,
    /// Tier from the trusted classifier, before any retry demotion.
    pub criticality: Criticality,
    /// Retries so far (0 for a first delivery); the runtime demotes one level per retry.
    pub attempt: u32,
    /// Times this message has already been deferred (the `triage-deferrals` header of a drained
    /// copy; 0 for a first delivery). A message deferred `max_deferrals` times is not deferred
    /// again.
    pub deferrals: u32,
    /// Instant after which serving it is useless; `None` never expires.
    pub deadline: Option<Instant>,
    /// Size counted against the queue's byte budget, in bytes.
    pub size_bytes: usize,
    /// The acknowledgement handle, resolved once with the message's disposition.
    pub ack: Ack,
    /// Messages with the same ordering key are processed one at a time, in the order the
    /// runtime receives them (see [`crate::ordering`]); `None` (the default) is unordered. Set
    /// by the source from its [`OrderingConfig`](crate::ordering::OrderingConfig).
    pub ordering_key: Option<u64>,
    /// How long the message had already waited unacknowledged in the source (since the broker
    /// delivered it) when the source handed it out: counted against the source's
    /// [`patience`](crate::runtime::Source::patience). Default zero.
    pub waited: Duration,
    /// The cohort (`0..COHORTS`) of the user or tenant the message serves, or `None`: set
    /// with [`with_user`](Self::with_user). When pull-based admission can take only part of a
    /// tier, it admits whole cohorts of users (see
    /// [`admission::cohort`](crate::admission::cohort)), so the capacity left serves the same
    /// users fully rather than every user partly. Without it the ordering key stands for the
    /// user, and a message with neither is its own user. A value past `COHORTS` is taken
    /// modulo `COHORTS`.
    pub cohort: Option<u8>,
}

impl<T> Envelope<T> {
    /// A first delivery of `payload` at `criticality`, no deadline, size 0.
    pub fn new(payload: T, criticality: Criticality, ack: Ack) -> Self {
        Envelope {
            payload,
            criticality,
            attempt: 0,
            deferrals: 0,
            deadline: None,
            size_bytes: 0,
            ack,
            ordering_key: None,
            waited: Duration::ZERO,
            cohort: None,
        }
    }

    /// Sets the deadline.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets or clears the deadline.
    #[must_use]
    pub fn with_deadline_opt(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets the size in bytes.
    #[must_use]
    pub fn with_size_bytes(mut self, size_bytes: usize) -> Self {
        self.size_bytes = size_bytes;
        self
    }

    /// Sets the ordering key: messages with the same key are processed one at a time, in order
    /// (see [`crate::ordering`]).
    #[must_use]
    pub fn with_ordering_key(mut self, key: u64) -> Self {
        self.ordering_key = Some(key);
        self
    }

    /// Sets or clears the ordering key (`None`: unordered).
    #[must_use]
    pub fn with_ordering_key_opt(mut self, key: Option<u64>) -> Self {
        self.ordering_key = key;
        self
    }

    /// Sets how long the message already waited unacknowledged in the source (see
    /// [`waited`](Self::waited)).
    #[must_use]
    pub fn with_waited(mut self, waited: Duration) -> Self {
        self.waited = waited;
        self
    }

    /// Sets the user or tenant the message serves, by its key: its cohort in the current
    /// rotation period ([`cohort`](crate::admission::cohort) of [`user_hash`], DAGOR's hourly
    /// reshuffle), the same on every consumer of the group.
    #[must_use]
    pub fn with_user(mut self, user: &[u8]) -> Self {
        self.cohort = Some(cohort(user_hash(user), rotation_period()));
        self
    }

    /// Sets the retry count.
    #[must_use]
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Sets the count of earlier deferrals (from the `triage-deferrals` header).
    #[must_use]
    pub fn with_deferrals(mut self, deferrals: u32) -> Self {
        self.deferrals = deferrals;
        self
    }

    /// The tier it is queued in: its criticality demoted once per retry.
    pub fn effective_criticality(&self) -> Criticality {
        self.criticality.demoted_by(self.attempt)
    }
}
