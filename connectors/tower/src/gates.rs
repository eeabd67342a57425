//! The core's token buckets and circuit breakers as [`Gate`]s: 429 for a tier over its rate,
//! 503 with the circuit's longer `Retry-After` for a request bound to a failing downstream.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use triage::admission::{Breakers, BucketsConfig, CircuitState, Grant, TierBuckets};
use triage::quanta::Clock;
use triage::{ConfigError, Criticality, PerTier};

use crate::{Gate, GateRefusal};

/// Per-tier token buckets with borrowing ([`TierBuckets`], seed 003) in front of the entry: a
/// request of a tier whose bucket (and its lenders') is empty is answered 429, with a
/// `Retry-After` of the time one token takes to refill (at least the configured rate wait).
///
/// The buckets are this gate's own: requests are metered apart from the worker runtime's
/// messages (its buckets are not shared outside it).
///
/// # Examples
///
/// ```
/// use triage::admission::{BucketConfig, BucketsConfig};
/// use triage::Criticality;
/// use triage_tower::{Gate, RateGate, RefusalReason};
///
/// let config = BucketsConfig::default()
///     .with(Criticality::Sheddable, Some(BucketConfig::per_second(0.5).burst(1)));
/// let gate = RateGate::new(&config)?;
/// let (head, ()) = http::Request::get("/").body(()).unwrap().into_parts();
/// assert!(gate.check(Criticality::Sheddable, &head).is_ok());
/// let refused = gate.check(Criticality::Sheddable, &head).unwrap_err();
/// assert_eq!(refused.reason, RefusalReason::Rate);
/// assert_eq!(refused.retry_after, Some(std::time::Duration::from_secs(2)));
/// assert!(gate.check(Criticality::High, &head).is_ok(), "High has no bucket");
/// # Ok::<(), triage::ConfigError>(())
/// ```
pub struct RateGate {
    buckets: TierBuckets,
    /// The time one token takes to refill, per tier with a bucket.
    refill: PerTier<Option<Duration>>,
}

impl fmt::Debug for RateGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateGate")
            .field("buckets", &self.buckets)
            .field("refill", &self.refill)
            .finish()
    }
}

impl RateGate {
    /// Buckets from `config`, full, on the system clock.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `config` is out of range.
    pub fn new(config: &BucketsConfig) -> Result<Self, ConfigError> {
        Self::with_clock(config, Clock::new())
    }

    /// As [`new`](Self::new), reading time from `clock`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_clock(config: &BucketsConfig, clock: Clock) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(RateGate {
            buckets: TierBuckets::new(config, clock),
            refill: PerTier::from_fn(|t| {
                config
                    .rate(t)
                    .filter(|r| *r > 0.0)
                    .map(|r| Duration::from_secs_f64(1.0 / r))
            }),
        })
    }

    /// The buckets (fill ratios, tokens).
    pub fn buckets(&self) -> &TierBuckets {
        &self.buckets
    }
}

/// A token a [`RateGate`] borrowed from a lender's bucket for a request, kept in the
/// request's extensions until it is served or refunded. A token from the tier's own bucket
/// (the common case) is not recorded: no allocation on the way in, and a refund without this
/// record goes to the tier's own bucket.
#[derive(Clone, Copy)]
struct BorrowedToken {
    /// The gate's buckets, so another rate gate on the same request does not refund it.
    gate: usize,
    lender: Criticality,
}

impl RateGate {
    fn id(&self) -> usize {
        std::ptr::from_ref(&self.buckets) as usize
    }
}

impl Gate for RateGate {
    fn check(&self, tier: Criticality, _head: &Parts) -> Result<(), GateRefusal> {
        match self.buckets.try_acquire(tier) {
            Some(_) => Ok(()),
            None => Err(GateRefusal::rate(self.refill[tier])),
        }
    }

    fn enter(&self, tier: Criticality, head: &mut Parts) -> Result<(), GateRefusal> {
        match self.buckets.try_acquire(tier) {
            Some(Grant::Borrowed(lender)) => {
                head.extensions.insert(BorrowedToken {
                    gate: self.id(),
                    lender,
                });
                Ok(())
            }
            Some(_) => Ok(()),
            None => Err(GateRefusal::rate(self.refill[tier])),
        }
    }

    /// Gives the request's token back to the bucket it came from, as
    /// [`TierBuckets::refund`] does for a message the queue refuses: a request refused for
    /// another reason (expired, no capacity) must not also spend the tier's rate.
    fn refund(&self, tier: Criticality, head: &mut Parts) {
        let grant = match head.extensions.get::<BorrowedToken>() {
            Some(b) if b.gate == self.id() => {
                let lender = b.lender;
                head.extensions.remove::<BorrowedToken>();
                Grant::Borrowed(lender)
            }
            // A tier without a bucket took nothing, and a refund to it is nothing.
            _ => Grant::Own(tier),
        };
        self.buckets.refund(grant);
    }
}

type KeyOf = Arc<dyn Fn(&Parts) -> Option<&str> + Send + Sync>;

/// Circuit-breaker-aware admission at the entry: a request mapped to a downstream key (by the
/// route, say) whose circuit is open is answered 503 with the circuit's `Retry-After` (its
/// `recovery_ms`, at least the configured circuit wait: 30 s by default) instead of waiting
/// for a slot only to fail.
///
/// Share the runtime's breakers ([`Runtime::breakers`](triage::runtime::Runtime::breakers))
/// and a downstream failing the background work also sheds the requests that need it; the
/// runtime's handlers feed them (`HandlerError::downstream`), and so can request handlers
/// ([`Breakers::record_failure`]). This gate only reads them.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use triage::admission::{BreakerConfig, Breakers};
/// use triage::Criticality;
/// use triage_tower::{CircuitGate, Gate, RefusalReason};
///
/// let config = BreakerConfig { min_calls: 2, recovery_ms: 45_000, ..Default::default() };
/// let breakers = Arc::new(Breakers::new(config)?);
/// let gate = CircuitGate::new(Arc::clone(&breakers), |head: &http::request::Parts| {
///     head.uri.path().starts_with("/pay").then_some("payments")
/// });
/// let (pay, ()) = http::Request::get("/pay/17").body(()).unwrap().into_parts();
/// assert!(gate.check(Criticality::Critical, &pay).is_ok());
/// breakers.record_failure("payments");
/// breakers.record_failure("payments");
/// let refused = gate.check(Criticality::Critical, &pay).unwrap_err();
/// assert_eq!(refused.reason, RefusalReason::Circuit);
/// assert_eq!(refused.retry_after, Some(std::time::Duration::from_secs(45)));
/// let (other, ()) = http::Request::get("/search").body(()).unwrap().into_parts();
/// assert!(gate.check(Criticality::Critical, &other).is_ok());
/// # Ok::<(), triage::ConfigError>(())
/// ```
pub struct CircuitGate {
    breakers: Arc<Breakers>,
    key_of: KeyOf,
}

impl fmt::Debug for CircuitGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitGate")
            .field("breakers", &self.breakers)
            .finish_non_exhaustive()
    }
}

impl CircuitGate {
    /// Refuses requests whose downstream key (`key_of`; `None`: no downstream) has an open
    /// circuit in `breakers`.
    pub fn new(
        breakers: Arc<Breakers>,
        key_of: impl Fn(&Parts) -> Option<&str> + Send + Sync + 'static,
    ) -> Self {
        CircuitGate {
            breakers,
            key_of: Arc::new(key_of),
        }
    }
}

impl Gate for CircuitGate {
    fn check(&self, _tier: Criticality, head: &Parts) -> Result<(), GateRefusal> {
        if !self.breakers.enabled() {
            return Ok(());
        }
        let Some(key) = (self.key_of)(head) else {
            return Ok(());
        };
        // Only a key already tracked can be open: no key is registered for a mere check, and
        // a closed circuit costs one map lookup.
        match self.breakers.state(key) {
            None | Some(CircuitState::Closed) => Ok(()),
            Some(_) => match self.breakers.breaker(key) {
                Some(b) if !self.breakers.admits(&b) => {
                    let recovery = Duration::from_millis(self.breakers.config().recovery_ms);
                    Err(GateRefusal::circuit(Some(recovery)))
                }
                _ => Ok(()),
            },
        }
    }
}

/// Feeds a [`CircuitGate`]'s breakers from the answers of the requests it lets through: a
/// 5xx answer (or an error of the inner service) is a failure of the request's downstream,
/// anything else a success; a request with no downstream key records nothing. Put it inside
/// the [`TriageLayer`](crate::TriageLayer), around the handlers, so that only admitted
/// requests are counted (a refusal by the layer says nothing about the downstream). Made by
/// [`CircuitGate::feedback`].
#[derive(Clone)]
pub struct CircuitFeedbackLayer {
    breakers: Arc<Breakers>,
    key_of: KeyOf,
}

impl fmt::Debug for CircuitFeedbackLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitFeedbackLayer")
            .finish_non_exhaustive()
    }
}

impl CircuitGate {
    /// The layer that reports the answers of admitted requests to these breakers, with the
    /// same downstream keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::sync::Arc;
    /// use http::{Request, Response, StatusCode};
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use triage::admission::{BreakerConfig, Breakers, CircuitState};
    /// use triage_tower::CircuitGate;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = BreakerConfig { min_calls: 2, ..Default::default() };
    /// let breakers = Arc::new(Breakers::new(config)?);
    /// let gate = CircuitGate::new(Arc::clone(&breakers), |_head: &http::request::Parts| Some("payments"));
    /// let failing = gate.feedback().layer(service_fn(|_req: Request<()>| async {
    ///     let mut res = Response::new(());
    ///     *res.status_mut() = StatusCode::BAD_GATEWAY;
    ///     Ok::<_, Infallible>(res)
    /// }));
    /// for _ in 0..2 {
    ///     failing.clone().oneshot(Request::new(())).await?;
    /// }
    /// assert_eq!(breakers.state("payments"), Some(CircuitState::Open));
    /// # Ok(())
    /// # }
    /// ```
    pub fn feedback(&self) -> CircuitFeedbackLayer {
        CircuitFeedbackLayer {
            breakers: Arc::clone(&self.breakers),
            key_of: Arc::clone(&self.key_of),
        }
    }
}

impl<S> tower::Layer<S> for CircuitFeedbackLayer {
    type Service = CircuitFeedback<S>;

    fn layer(&self, inner: S) -> CircuitFeedback<S> {
        CircuitFeedback {
            inner,
            breakers: Arc::clone(&self.breakers),
            key_of: Arc::clone(&self.key_of),
        }
    }
}

/// The service of a [`CircuitFeedbackLayer`].
#[derive(Clone)]
pub struct CircuitFeedback<S> {
    inner: S,
    breakers: Arc<Breakers>,
    key_of: KeyOf,
}

impl<S> fmt::Debug for CircuitFeedback<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitFeedback").finish_non_exhaustive()
    }
}

pin_project_lite::pin_project! {
    /// The response future of a [`CircuitFeedback`] service.
    pub struct CircuitFeedbackFuture<F> {
        #[pin]
        inner: F,
        call: Option<(Arc<Breakers>, triage::admission::Call)>,
    }
}

impl<F> fmt::Debug for CircuitFeedbackFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitFeedbackFuture")
            .finish_non_exhaustive()
    }
}

impl<F, B, E> std::future::Future for CircuitFeedbackFuture<F>
where
    F: std::future::Future<Output = Result<http::Response<B>, E>>,
{
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        if let Some((breakers, call)) = this.call.take() {
            let failed = match &out {
                Ok(response) => response.status().is_server_error(),
                Err(_) => true,
            };
            let outcome = if failed {
                triage::admission::Outcome::Failure
            } else {
                triage::admission::Outcome::Success
            };
            breakers.record(call, outcome);
        }
        std::task::Poll::Ready(out)
    }
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for CircuitFeedback<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CircuitFeedbackFuture<S::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        if !self.breakers.enabled() {
            return CircuitFeedbackFuture {
                inner: self.inner.call(request),
                call: None,
            };
        }
        let (head, body) = request.into_parts();
        let call = (self.key_of)(&head)
            .and_then(|key| self.breakers.breaker(key))
            .and_then(|b| self.breakers.try_call(&b))
            .map(|c| (Arc::clone(&self.breakers), c));
        CircuitFeedbackFuture {
            inner: self.inner.call(http::Request::from_parts(head, body)),
            call,
        }
    }
}
