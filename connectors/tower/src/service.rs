//! The tower [`Service`] a [`TriageLayer`](crate::TriageLayer) wraps around an inner service,
//! and its response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use pin_project_lite::pin_project;
use tower::Service;
use triage::limit::Permit;
use triage::quanta::Instant;
use triage::Criticality;

use crate::layer::{Decided, Shared};
use crate::refusal::RefusedInside;
use crate::RefusalReason;

/// The response body of a [`TriageService`]: the inner service's body when served, a short
/// JSON body (empty for gRPC) when refused.
pub type TriageBody<B> = Either<B, Full<Bytes>>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A service admitted through triage: see [`TriageLayer`](crate::TriageLayer) for what it
/// decides and in what order.
pub struct TriageService<S> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared>,
}

impl<S: Clone> Clone for TriageService<S> {
    fn clone(&self) -> Self {
        TriageService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S> std::fmt::Debug for TriageService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TriageService").finish_non_exhaustive()
    }
}

/// An admitted request, holding its permit (a slot of the limit): releases it with a latency
/// sample when the inner service answers, and counts the request served (and within its
/// deadline or not). Dropped first (the client went away), it releases the slot without a
/// sample.
struct Admitted {
    permit: Permit,
    granted: Instant,
    tier: Criticality,
    deadline: Instant,
    started: Instant,
    id: Option<u64>,
    shared: Arc<Shared>,
}

impl Admitted {
    /// A request granted `permit` now.
    fn new(permit: Permit, d: &Decided, shared: &Arc<Shared>) -> Self {
        Admitted {
            permit,
            granted: shared.clock.now(),
            tier: d.tier,
            deadline: d.deadline,
            started: d.started,
            id: d.id,
            shared: Arc::clone(shared),
        }
    }

    /// The inner service answered `response` (`None`: with an error).
    fn finish<B>(self, response: Option<&Response<B>>) {
        let inside = response.and_then(|r| r.extensions().get::<RefusedInside>());
        if let Some(RefusedInside(reason)) = inside {
            // Refused by a layer inside (an open circuit): not served, and its quick answer
            // is no sample of the service's latency. The slot is released as `permit` drops.
            self.shared
                .refused(self.tier, *reason, self.id, self.started);
            return;
        }
        let latency = self
            .shared
            .clock
            .now()
            .saturating_duration_since(self.granted);
        let _ = self.permit.record(latency, false);
        self.shared.served(self.tier, self.deadline, self.started);
    }
}

pin_project! {
    /// The response future of a [`TriageService`].
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        // Answered at once: no slot, the inner service not called.
        Refused { response: Option<Response<Full<Bytes>>> },
        // A never-shed path.
        Direct { #[pin] fut: F },
        // Admitted at once, holding its slot.
        Served { #[pin] fut: F, admitted: Option<Admitted> },
        // Waiting for a slot, then served or refused.
        Waiting { fut: BoxFuture<Result<Response<TriageBody<B>>, E>> },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TriageBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Refused { response } => match response.take() {
                Some(r) => Poll::Ready(Ok(r.map(Either::Right))),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Direct { fut } => fut.poll(cx).map_ok(|r| r.map(Either::Left)),
            KindProj::Served { fut, admitted } => {
                let out = std::task::ready!(fut.poll(cx));
                if let Some(admitted) = admitted.take() {
                    admitted.finish(out.as_ref().ok());
                }
                Poll::Ready(out.map(|r| r.map(Either::Left)))
            }
            KindProj::Waiting { fut } => fut.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn refused(response: Response<Full<Bytes>>) -> Self {
        ResponseFuture {
            kind: Kind::Refused {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for TriageService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<TriageBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let (mut head, body) = request.into_parts();
        if shared.is_never_shed(&head) {
            shared.strip_untrusted(&mut head);
            return ResponseFuture {
                kind: Kind::Direct {
                    fut: self.inner.call(Request::from_parts(head, body)),
                },
            };
        }
        let d = shared.decide(&head);
        for (i, gate) in shared.gates.iter().enumerate() {
            if let Err(g) = gate.enter(d.tier, &mut head) {
                shared.refund(d.tier, &mut head, i);
                return ResponseFuture::refused(shared.refuse(&d, g.reason, g.retry_after));
            }
        }
        let passed = shared.gates.len();
        if d.deadline <= d.started {
            shared.refund(d.tier, &mut head, passed);
            return ResponseFuture::refused(shared.refuse(&d, RefusalReason::Expired, None));
        }
        if let Some(permit) = shared.admission.try_now(d.tier) {
            shared.stamp(&d, &mut head);
            let admitted = Admitted::new(permit, &d, shared);
            return ResponseFuture {
                kind: Kind::Served {
                    fut: self.inner.call(Request::from_parts(head, body)),
                    admitted: Some(admitted),
                },
            };
        }
        let wait = match shared.admission.start_wait(d.tier, Some(d.deadline)) {
            Ok(wait) => wait,
            Err(reason) => {
                shared.refund(d.tier, &mut head, passed);
                return ResponseFuture::refused(shared.refuse(&d, reason, None));
            }
        };
        // The service made ready by `poll_ready` goes with the request; a clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(shared);
        ResponseFuture {
            kind: Kind::Waiting {
                fut: Box::pin(async move {
                    match wait.await {
                        Ok(permit) => {
                            shared.stamp(&d, &mut head);
                            let admitted = Admitted::new(permit, &d, &shared);
                            let out = inner.call(Request::from_parts(head, body)).await;
                            admitted.finish(out.as_ref().ok());
                            out.map(|r| r.map(Either::Left))
                        }
                        Err(reason) => {
                            shared.refund(d.tier, &mut head, passed);
                            Ok(shared.refuse(&d, reason, None).map(Either::Right))
                        }
                    }
                }),
            },
        }
    }
}
