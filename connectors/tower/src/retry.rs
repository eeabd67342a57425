//! The client side of the contract: a tower retry policy that honours `Retry-After`, backs off
//! exponentially with full jitter, demotes each retry one level, and caps retries as a
//! fraction of traffic.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::Policy;
use triage::runtime::{BackoffConfig, RetryConfig};
use triage::wire;

/// A [`tower::retry::Policy`] for HTTP (and gRPC over HTTP) clients of a service behind a
/// [`TriageLayer`](crate::TriageLayer), or behind anything that answers overload with 503/429
/// and `Retry-After`.
///
/// - Retries a 503, a 429, a gRPC `UNAVAILABLE` (14) or `RESOURCE_EXHAUSTED` (8) answer, and
///   transport errors; nothing else (a 500 is the handler's failure, not overload).
/// - Waits the longer of the server's `Retry-After` (or `grpc-retry-pushback-ms`) and an
///   exponential backoff with full jitter (triage's [`BackoffConfig::backoff`]: uniform in
///   `0..min(max, base x 2^n)`), so clients do not come back in step.
/// - Caps retries as a fraction of traffic with tower's [`TpsBudget`] (share one budget
///   between all clones, as the default does): when overload makes most requests fail,
///   retries stop at that fraction instead of multiplying the load ("cap retries as a
///   fraction of traffic, not as a count per request"). Also at most
///   [`RetryConfig::max_retries`] per request, counting the attempts it had already been
///   through when it was handed to this client (its `triage-attempt`: a request forwarded by
///   a service that retried it before).
/// - Stamps `triage-attempt` on each retry, one more than the request had, so the server
///   demotes it one level further: first attempts win, retries lose. It never lowers the
///   attempt a request already carries.
///
/// Requests must have a `Clone` body (`String`, `Bytes`, `Full<Bytes>`, `Empty<Bytes>`).
/// Keep the `x-request-id` of the first attempt on retries (a clone does) so the server can
/// count reappearances.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use http::{Request, Response, StatusCode};
/// use tower::retry::RetryLayer;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use triage_tower::RetryAfterPolicy;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let calls = Arc::new(AtomicU32::new(0));
/// let server = service_fn({
///     let calls = Arc::clone(&calls);
///     move |req: Request<String>| {
///         let n = calls.fetch_add(1, Ordering::Relaxed);
///         async move {
///             let mut res = Response::new(String::new());
///             if n == 0 {
///                 *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
///                 res.headers_mut().insert("retry-after", "2".parse().unwrap());
///             } else {
///                 assert_eq!(req.headers()["triage-attempt"], "1");
///             }
///             Ok::<_, Infallible>(res)
///         }
///     }
/// });
/// let client = ServiceBuilder::new()
///     .layer(RetryLayer::new(RetryAfterPolicy::default()))
///     .service(server);
/// let started = tokio::time::Instant::now();
/// let res = client.oneshot(Request::get("/").body(String::new())?).await?;
/// assert_eq!(res.status(), 200);
/// assert!(started.elapsed() >= std::time::Duration::from_secs(2), "honoured Retry-After");
/// assert_eq!(calls.load(Ordering::Relaxed), 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RetryAfterPolicy {
    retry: RetryConfig,
    backoff: BackoffConfig,
    budget: Arc<TpsBudget>,
    attempt: u32,
}

impl Default for RetryAfterPolicy {
    /// Triage's default backoff (3 retries, 100 ms base, 10 s cap) and a budget of 20 % of
    /// traffic over 10 s, with at least 10 retries a second.
    fn default() -> Self {
        RetryAfterPolicy::new(
            RetryConfig::default(),
            BackoffConfig::default(),
            Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2)),
        )
    }
}

impl RetryAfterPolicy {
    /// A policy retrying at most `retry.max_retries` times per request, backing off by
    /// `backoff` and withdrawing each retry from `budget` (share it between every client of
    /// one caller).
    pub fn new(retry: RetryConfig, backoff: BackoffConfig, budget: Arc<TpsBudget>) -> Self {
        RetryAfterPolicy {
            retry,
            backoff,
            budget,
            attempt: 0,
        }
    }

    /// Retries so far for the request this policy instance follows, including those it had
    /// been through before (its `triage-attempt` when first retried); 0 before its first
    /// retry.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// The retries a request has been through, from its `triage-attempt` (0 when absent or
/// malformed).
fn attempts_of<B>(req: &Request<B>) -> u32 {
    req.headers()
        .get(crate::names::ATTEMPT)
        .and_then(|v| wire::parse_count(v.as_bytes()))
        .unwrap_or(0)
}

/// Whether a response says "overloaded, come back later", and the wait it asks for.
/// `None`: not retryable (a request refused because its deadline passed, `triage-reason:
/// expired`, cannot succeed on a retry). `Some(None)`: retryable, no wait given.
pub fn overload_wait<B>(response: &Response<B>) -> Option<Option<Duration>> {
    let headers = response.headers();
    if headers
        .get(crate::names::REASON)
        .is_some_and(|r| r.as_bytes() == crate::RefusalReason::Expired.as_str().as_bytes())
    {
        return None;
    }
    let retry_after = headers
        .get(wire::RETRY_AFTER)
        .and_then(|v| wire::parse_retry_after(v.as_bytes()));
    match response.status() {
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => Some(retry_after),
        StatusCode::OK => {
            let grpc = headers
                .get(wire::GRPC_STATUS)
                .and_then(|v| wire::parse_count(v.as_bytes()))?;
            if grpc != 14 && grpc != 8 {
                return None;
            }
            // Held to the longest Retry-After, as a Retry-After is: a client must not sleep
            // for weeks on one header.
            let pushback = headers
                .get(wire::GRPC_RETRY_PUSHBACK_MS)
                .and_then(|v| wire::parse_count(v.as_bytes()))
                .map(|ms| Duration::from_millis(u64::from(ms)).min(wire::MAX_RETRY_AFTER));
            Some(pushback.or(retry_after))
        }
        _ => None,
    }
}

impl<B: Clone, R, E> Policy<Request<B>, Response<R>, E> for RetryAfterPolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<B>,
        result: &mut Result<Response<R>, E>,
    ) -> Option<Self::Future> {
        if self.attempt == 0 {
            self.budget.deposit();
        }
        let asked = match result {
            Ok(response) => overload_wait(response)?,
            Err(_) => None,
        };
        // The request's own count, which this policy stamps on every retry, or was given by
        // whoever sent it first: the larger, so a retry is never demoted less than the
        // attempt that was refused.
        let before = attempts_of(req).max(self.attempt);
        if before >= self.retry.max_retries || !self.budget.withdraw() {
            return None;
        }
        self.attempt = before.saturating_add(1);
        let wait = self
            .backoff
            .backoff(self.attempt)
            .max(asked.unwrap_or_default());
        req.headers_mut()
            .insert(crate::names::ATTEMPT, HeaderValue::from(self.attempt));
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, headers: &[(&str, &str)]) -> Response<()> {
        let mut b = Response::builder().status(status);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn what_is_retryable() {
        assert_eq!(
            overload_wait(&response(503, &[("retry-after", "3")])),
            Some(Some(Duration::from_secs(3)))
        );
        assert_eq!(overload_wait(&response(429, &[])), Some(None));
        assert_eq!(overload_wait(&response(500, &[("retry-after", "3")])), None);
        assert_eq!(overload_wait(&response(200, &[])), None);
        assert_eq!(
            overload_wait(&response(
                200,
                &[("grpc-status", "14"), ("grpc-retry-pushback-ms", "1500")]
            )),
            Some(Some(Duration::from_millis(1_500)))
        );
        assert_eq!(
            overload_wait(&response(200, &[("grpc-status", "8")])),
            Some(None)
        );
        assert_eq!(overload_wait(&response(200, &[("grpc-status", "4")])), None);
    }

    #[test]
    fn budget_caps_retries_as_a_fraction_of_traffic() {
        // No floor, 10 % of deposits may be retried.
        let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 0, 0.1));
        let policy =
            RetryAfterPolicy::new(RetryConfig::default(), BackoffConfig::default(), budget);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let mut retried = 0;
        for _ in 0..100 {
            let mut p = policy.clone();
            let mut req = Request::new(());
            let mut res: Result<Response<()>, ()> = Ok(response(503, &[("retry-after", "1")]));
            if p.retry(&mut req, &mut res).is_some() {
                retried += 1;
                assert_eq!(req.headers()[wire::ATTEMPT], "1");
            }
        }
        assert!(
            (9..=11).contains(&retried),
            "{retried} retries of 100 refusals"
        );
    }

    #[test]
    fn at_most_max_retries_and_waits_at_least_retry_after() {
        let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 1_000, 1.0));
        let backoff = BackoffConfig {
            base_backoff_ms: 1,
            max_backoff_ms: 5,
        };
        let mut p = RetryAfterPolicy::new(RetryConfig { max_retries: 2 }, backoff, budget);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let _guard = rt.enter();
        let mut req = Request::new(());
        let mut res: Result<Response<()>, ()> = Ok(response(503, &[("retry-after", "4")]));
        let now = tokio::time::Instant::now();
        let sleep = p.retry(&mut req, &mut res).unwrap();
        assert!(sleep.deadline() >= now + Duration::from_secs(4));
        assert!(p.retry(&mut req, &mut res).is_some());
        assert_eq!(req.headers()[wire::ATTEMPT], "2");
        assert!(p.retry(&mut req, &mut res).is_none(), "max_retries reached");
        assert_eq!(p.attempt(), 2);
    }
}
