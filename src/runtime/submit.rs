//! What [`Runtime::try_submit`](crate::runtime::Runtime::try_submit) hands back.

use std::fmt;

use crate::runtime::Envelope;

/// A message refused by [`Runtime::try_submit`](crate::runtime::Runtime::try_submit), handed
/// back whole. `Debug` prints `Overloaded(..)` so `T` needs no `Debug`.
#[non_exhaustive]
pub enum SubmitError<T> {
    /// Queue-age admission, or the operator's forced shed level, refuses its tier now.
    Overloaded(Envelope<T>),
    /// The queue is full with nothing of a lower tier to evict.
    Full(Envelope<T>),
    /// The runtime is shutting down.
    Closed(Envelope<T>),
    /// Its downstream's circuit is open (see
    /// [`RuntimeBuilder::downstream`](crate::runtime::RuntimeBuilder::downstream)) and its tier's
    /// policy is Backpressure: a handler call now would be bound to fail. Retry after the
    /// breaker's `recovery_ms`.
    CircuitOpen(Envelope<T>),
    /// Its tier's token bucket, and its lenders', have no token now (`buckets` in the config),
    /// and its tier's policy is Backpressure: "you are over your rate" (an HTTP entry answers
    /// 429), where `Overloaded` and `Full` say "the worker is over its capacity" (503).
    RateLimited(Envelope<T>),
    /// The payload bytes held passed its tier's share of the memory budget (`memory` in the
    /// config), and its tier's policy is Backpressure.
    Memory(Envelope<T>),
}

impl<T> SubmitError<T> {
    /// The refused message.
    pub fn into_inner(self) -> Envelope<T> {
        match self {
            SubmitError::Overloaded(e)
            | SubmitError::Full(e)
            | SubmitError::Closed(e)
            | SubmitError::CircuitOpen(e)
            | SubmitError::RateLimited(e)
            | SubmitError::Memory(e) => e,
        }
    }
}

impl<T> fmt::Debug for SubmitError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SubmitError::Overloaded(_) => "Overloaded(..)",
            SubmitError::Full(_) => "Full(..)",
            SubmitError::Closed(_) => "Closed(..)",
            SubmitError::CircuitOpen(_) => "CircuitOpen(..)",
            SubmitError::RateLimited(_) => "RateLimited(..)",
            SubmitError::Memory(_) => "Memory(..)",
        })
    }
}

impl<T> fmt::Display for SubmitError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SubmitError::Overloaded(_) => "overloaded: queue age is above the tier's cut-off",
            SubmitError::Full(_) => "queue is full with nothing of a lower tier to evict",
            SubmitError::Closed(_) => "runtime is shutting down",
            SubmitError::CircuitOpen(_) => "the circuit of its downstream is open",
            SubmitError::RateLimited(_) => "rate limited: the tier's token bucket is empty",
            SubmitError::Memory(_) => "memory budget: the bytes held passed the tier's threshold",
        })
    }
}

impl<T> std::error::Error for SubmitError<T> {}
