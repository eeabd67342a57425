//! The core's token buckets and circuit breakers as [`Gate`]s: 429 for a tier over its rate,
//! 503 with the circuit's longer `Retry-After` for a request bound to a failing downstream.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use triage::admission::{
    Breakers, BucketsConfig, Call, CircuitBreaker, CircuitState, Grant, Outcome, TierBuckets,
};
use triage::quanta::Clock;
use triage::{ConfigError, Criticality, PerTier};

use crate::refusal::Rendered;
use crate::{Gate, GateRefusal, Refusal, RefusalReason};

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
/// let config = BucketsConfig {
///     sheddable: Some(BucketConfig { rate: Some(0.5), burst: Some(1), ..BucketConfig::default() }),
///     ..BucketsConfig::default()
/// };
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
/// ([`Breakers::record_failure`]), or the [`CircuitFeedbackLayer`] from the answers.
///
/// A circuit that is half-open lets `half_open_probes` calls through at a time, counting the
/// runtime's and the requests' together: in the layer ([`Gate::enter`]) a request to such a
/// circuit takes a probe slot or is refused, and carries its probe to the feedback layer,
/// which reports its outcome (a request refused later, or never answered, gives the slot
/// back). [`check`](Gate::check) alone takes nothing: it says whether the circuit admits.
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

/// A half-open circuit's probe slot taken for a request by a [`CircuitGate`], carried in the
/// request's extensions to the [`CircuitFeedbackLayer`] that reports its outcome. Clonable
/// only because extensions must be; the call inside is taken once. Dropped untaken (the
/// request refused later, or served without a feedback layer), the call gives its slot back.
#[derive(Clone)]
struct Probe(Arc<parking_lot::Mutex<Option<Call>>>, Arc<Breakers>);

impl Probe {
    /// The call, if this probe was taken from `breakers`.
    fn take_for(&self, breakers: &Arc<Breakers>) -> Option<Call> {
        if Arc::ptr_eq(&self.1, breakers) {
            self.0.lock().take()
        } else {
            None
        }
    }
}

impl CircuitGate {
    fn refusal(&self) -> GateRefusal {
        let recovery = Duration::from_millis(self.breakers.config().recovery_ms);
        GateRefusal::circuit(Some(recovery))
    }

    /// The breaker of a request's key when its circuit is not closed (`None` for no key, an
    /// untracked one, or a closed circuit: one map lookup, and no key is registered for it).
    fn troubled(&self, head: &Parts) -> Option<Arc<CircuitBreaker>> {
        if !self.breakers.enabled() {
            return None;
        }
        let key = (self.key_of)(head)?;
        match self.breakers.state(key)? {
            CircuitState::Closed => None,
            _ => self.breakers.breaker(key),
        }
    }
}

impl Gate for CircuitGate {
    /// Whether the request's circuit admits it now (closed, open past its recovery time, or
    /// half-open with a probe slot free); takes nothing.
    fn check(&self, _tier: Criticality, head: &Parts) -> Result<(), GateRefusal> {
        match self.troubled(head) {
            Some(b) if !self.breakers.admits(&b) => Err(self.refusal()),
            _ => Ok(()),
        }
    }

    /// As [`check`](Gate::check), and a request to a circuit that is not closed takes one of
    /// its probe slots (an open one past its recovery time turns half-open): refused when
    /// none is free, so no more requests than `half_open_probes` reach a recovering
    /// downstream.
    fn enter(&self, _tier: Criticality, head: &mut Parts) -> Result<(), GateRefusal> {
        let Some(b) = self.troubled(head) else {
            return Ok(());
        };
        match self.breakers.try_call(&b) {
            None => Err(self.refusal()),
            Some(call) if call.is_probe() => {
                let probe = Probe(
                    Arc::new(parking_lot::Mutex::new(Some(call))),
                    Arc::clone(&self.breakers),
                );
                head.extensions.insert(probe);
                Ok(())
            }
            // Closed meanwhile: the feedback layer counts the call.
            Some(_) => Ok(()),
        }
    }

    /// Gives back the probe slot a request took, unused.
    fn refund(&self, _tier: Criticality, head: &mut Parts) {
        if let Some(probe) = head.extensions.get::<Probe>() {
            if Arc::ptr_eq(&probe.1, &self.breakers) {
                // Dropping the call unrecorded gives its slot back.
                drop(head.extensions.remove::<Probe>());
            }
        }
    }
}

/// Feeds a [`CircuitGate`]'s breakers from the answers of the requests it lets through: a
/// 5xx answer (or an error of the inner service) is a failure of the request's downstream,
/// anything else a success; a request with no downstream key records nothing. Put it inside
/// the [`TriageLayer`](crate::TriageLayer), around the handlers, so that only admitted
/// requests are counted (a refusal by the layer says nothing about the downstream). Made by
/// [`CircuitGate::feedback`].
///
/// Each request is a call of its circuit: the probe its gate took, or one taken here. When
/// the circuit gives none (it opened while the request waited for a slot, or it is half-open
/// with every probe under way) the inner service is not called: the answer is a circuit
/// refusal (503 with the recovery time as `Retry-After`, or gRPC `UNAVAILABLE`, with an empty
/// body of the inner service's type), which the `TriageLayer` counts as refused, not served.
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
    pub struct CircuitFeedbackFuture<F, B> {
        #[pin]
        kind: FeedbackKind<F, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = FeedbackProj]
    enum FeedbackKind<F, B> {
        // The inner service called; its call reported when it answers.
        Called { #[pin] inner: F, call: Option<(Arc<Breakers>, Call)> },
        // The circuit gave no call: answered at once.
        Refused { response: Option<http::Response<B>> },
    }
}

impl<F, B> fmt::Debug for CircuitFeedbackFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitFeedbackFuture")
            .finish_non_exhaustive()
    }
}

impl<F, B, E> std::future::Future for CircuitFeedbackFuture<F, B>
where
    F: std::future::Future<Output = Result<http::Response<B>, E>>,
{
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.project().kind.project() {
            FeedbackProj::Refused { response } => match response.take() {
                Some(r) => std::task::Poll::Ready(Ok(r)),
                None => panic!("CircuitFeedbackFuture polled after completion"),
            },
            FeedbackProj::Called { inner, call } => {
                let out = std::task::ready!(inner.poll(cx));
                if let Some((breakers, call)) = call.take() {
                    let failed = match &out {
                        Ok(response) => response.status().is_server_error(),
                        Err(_) => true,
                    };
                    let outcome = if failed {
                        Outcome::Failure
                    } else {
                        Outcome::Success
                    };
                    breakers.record(call, outcome);
                }
                std::task::Poll::Ready(out)
            }
        }
    }
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for CircuitFeedback<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CircuitFeedbackFuture<S::Future, ResBody>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let called = |inner: S::Future, call: Option<Call>, breakers: &Arc<Breakers>| {
            CircuitFeedbackFuture {
                kind: FeedbackKind::Called {
                    inner,
                    call: call.map(|c| (Arc::clone(breakers), c)),
                },
            }
        };
        if !self.breakers.enabled() {
            return called(self.inner.call(request), None, &self.breakers);
        }
        let (mut head, body) = request.into_parts();
        let probe = head
            .extensions
            .get::<Probe>()
            .and_then(|p| p.take_for(&self.breakers));
        if probe.is_some() {
            head.extensions.remove::<Probe>();
        }
        let call = match probe {
            Some(call) => Some(call),
            None => match (self.key_of)(&head).and_then(|key| self.breakers.breaker(key)) {
                // No downstream, or a key past `max_keys`: nothing to count.
                None => None,
                Some(b) => match self.breakers.try_call(&b) {
                    Some(call) => Some(call),
                    None => {
                        let recovery = Duration::from_millis(self.breakers.config().recovery_ms);
                        let tier = head
                            .extensions
                            .get::<Criticality>()
                            .copied()
                            .unwrap_or(Criticality::Medium);
                        let refusal = Refusal::new(RefusalReason::Circuit, tier, recovery);
                        let response =
                            Rendered::new(&refusal).inside(crate::classify::is_grpc(&head));
                        return CircuitFeedbackFuture {
                            kind: FeedbackKind::Refused {
                                response: Some(response),
                            },
                        };
                    }
                },
            },
        };
        called(
            self.inner.call(http::Request::from_parts(head, body)),
            call,
            &self.breakers,
        )
    }
}
