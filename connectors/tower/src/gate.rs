//! Checks that refuse a request before it waits for capacity: where token buckets (429) and
//! circuit breakers (a longer `Retry-After`) plug in.

use std::time::Duration;

use triage::Criticality;

use crate::RefusalReason;

/// A refusal made by a [`Gate`]: the reason ([`RefusalReason::Rate`] or
/// [`RefusalReason::Circuit`], usually), and the wait it suggests, if it knows one (a token
/// bucket knows when its next token comes; a breaker when it half-opens). Without one, the
/// layer's configured [`RetryAfter`](crate::RetryAfter) for the reason applies; either way the
/// configured jitter is added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateRefusal {
    /// Why.
    pub reason: RefusalReason,
    /// The gate's own wait, at least the configured one.
    pub retry_after: Option<Duration>,
}

impl GateRefusal {
    /// A rate refusal (HTTP 429).
    pub const fn rate(retry_after: Option<Duration>) -> Self {
        GateRefusal {
            reason: RefusalReason::Rate,
            retry_after,
        }
    }

    /// An open circuit (HTTP 503 with the circuit's longer `Retry-After`).
    pub const fn circuit(retry_after: Option<Duration>) -> Self {
        GateRefusal {
            reason: RefusalReason::Circuit,
            retry_after,
        }
    }
}

/// A check run on every classified request, from its head only, before it waits for a slot:
/// the place for per-tier token buckets and circuit-breaker-aware admission. Gates run in the
/// order they were added; the first refusal answers the request. A gate must be cheap (it is
/// on the refuse path) and must not block.
///
/// Any `Fn(Criticality, &http::request::Parts) -> Result<(), GateRefusal>` is a gate.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use triage::Criticality;
/// use triage_tower::{Gate, GateRefusal};
///
/// // A breaker's state, flipped elsewhere: while open, calls to /pay are refused.
/// let open = Arc::new(AtomicBool::new(true));
/// let gate = {
///     let open = Arc::clone(&open);
///     move |_tier: Criticality, head: &http::request::Parts| {
///         if head.uri.path().starts_with("/pay") && open.load(Ordering::Relaxed) {
///             return Err(GateRefusal::circuit(Some(Duration::from_secs(45))));
///         }
///         Ok(())
///     }
/// };
/// let (head, ()) = http::Request::get("/pay/17").body(()).unwrap().into_parts();
/// assert!(gate.check(Criticality::Critical, &head).is_err());
/// ```
pub trait Gate: Send + Sync + 'static {
    /// `Ok(())` lets the request go on to wait for a slot; `Err` answers it at once.
    ///
    /// # Errors
    ///
    /// The refusal to answer with.
    fn check(&self, tier: Criticality, head: &http::request::Parts) -> Result<(), GateRefusal>;

    /// What the layer calls for each request: by default [`check`](Self::check). A gate that
    /// takes something for the request it lets through (a token, a circuit's probe slot)
    /// takes it here, and may leave in `head.extensions` what a layer inside needs (the
    /// probe, for [`CircuitFeedbackLayer`](crate::CircuitFeedbackLayer) to report on).
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check); a refused request took nothing.
    fn enter(&self, tier: Criticality, head: &mut http::request::Parts) -> Result<(), GateRefusal> {
        self.check(tier, head)
    }

    /// A request that [`enter`](Self::enter) let through is answered without being served
    /// (a later gate refused it, its deadline passed, there was no capacity, a more important
    /// request evicted it while it waited): give back what `enter` took for it, as the core's
    /// buckets give back a token spent on a message the queue then refuses. Called at most
    /// once per request, never for one that is served. By default nothing.
    fn refund(&self, tier: Criticality, head: &mut http::request::Parts) {
        let _ = (tier, head);
    }
}

impl<F> Gate for F
where
    F: Fn(Criticality, &http::request::Parts) -> Result<(), GateRefusal> + Send + Sync + 'static,
{
    fn check(&self, tier: Criticality, head: &http::request::Parts) -> Result<(), GateRefusal> {
        self(tier, head)
    }
}
