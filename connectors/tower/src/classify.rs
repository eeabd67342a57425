//! Classification from the request head only, before anything else runs: the tier (a trusted
//! header, a route table or a closure), retry demotion, and the deadline.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::request::Parts;
use triage::{wire, Criticality};

use crate::names;

type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;
type Closure = Arc<dyn Fn(&Parts) -> Option<Criticality> + Send + Sync>;

/// Decides a request's tier from its head.
///
/// In order, the first that answers wins:
/// 1. the `triage-criticality` header, only when the trust predicate says the request may set
///    its own tier (an authenticated extension, an internal listener): a client that could
///    name itself Critical would, so by default no request is trusted;
/// 2. the user's closure;
/// 3. the route table, longest matching path prefix first (a prefix matches whole path
///    segments: `/checkout` matches `/checkout` and `/checkout/pay`, not `/checkout-report`);
/// 4. the configured default tier, counted as unclassified (as is a trusted header with an
///    unknown label).
///
/// Then the `triage-attempt` header (retries so far, set by the retry policy of this crate)
/// demotes the tier one level per retry, from anyone: it can only lower a request.
///
/// The inner service sees the outcome, never a client's claim: the tier in the request's
/// extensions (a [`Criticality`], after demotion), and `triage-criticality` overwritten with
/// the tier before demotion (the header's meaning in the wire contract, for a handler that
/// propagates it to the next hop).
///
/// # Examples
///
/// ```
/// use triage::Criticality;
/// use triage_tower::Classifier;
///
/// #[derive(Clone)]
/// struct Internal; // put in the request's extensions by an authenticating layer
///
/// let classifier = Classifier::new()
///     .trust_header_when(|head| head.extensions.get::<Internal>().is_some())
///     .route("/checkout", Criticality::Critical)
///     .route("/search", Criticality::High)
///     .route("/recommendations", Criticality::Sheddable);
///
/// let head = |req: http::Request<()>| req.into_parts().0;
/// let checkout = head(http::Request::get("/checkout/pay").body(()).unwrap());
/// assert_eq!(classifier.tier(&checkout), Some(Criticality::Critical));
///
/// // An outside caller cannot raise itself...
/// let claims = head(http::Request::get("/recommendations")
///     .header("triage-criticality", "critical").body(()).unwrap());
/// assert_eq!(classifier.tier(&claims), Some(Criticality::Sheddable));
/// // ...an internal one can.
/// let internal = head(http::Request::get("/recommendations")
///     .header("triage-criticality", "critical").extension(Internal).body(()).unwrap());
/// assert_eq!(classifier.tier(&internal), Some(Criticality::Critical));
/// // A retry is demoted one level.
/// let retry = head(http::Request::get("/checkout")
///     .header("triage-attempt", "1").body(()).unwrap());
/// assert_eq!(classifier.tier(&retry), Some(Criticality::High));
/// // Nothing matches: the layer's default tier, counted.
/// assert_eq!(classifier.tier(&head(http::Request::get("/other").body(()).unwrap())), None);
/// ```
#[derive(Clone, Default)]
pub struct Classifier {
    trust: Option<Predicate>,
    closure: Option<Closure>,
    /// Sorted by prefix length, longest first.
    routes: Vec<(String, Criticality)>,
}

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classifier")
            .field("trusts_header", &self.trust.is_some())
            .field("closure", &self.closure.is_some())
            .field("routes", &self.routes)
            .finish()
    }
}

impl Classifier {
    /// Trusts no header, no closure, no routes: every request gets the default tier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Honours the `triage-criticality` header of requests for which `trusted` is true.
    #[must_use]
    pub fn trust_header_when(
        mut self,
        trusted: impl Fn(&Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.trust = Some(Arc::new(trusted));
        self
    }

    /// Classifies by `classify` (after a trusted header, before the routes); `None` passes on.
    #[must_use]
    pub fn with(
        mut self,
        classify: impl Fn(&Parts) -> Option<Criticality> + Send + Sync + 'static,
    ) -> Self {
        self.closure = Some(Arc::new(classify));
        self
    }

    /// Requests whose path is `prefix` or lies below it are of `tier` (the longest prefix
    /// wins). A prefix matches whole segments: `/checkout` takes `/checkout` and
    /// `/checkout/pay` but not `/checkout-report`; a prefix ending in `/` (`/api/`, `/`) takes
    /// every path that starts with it.
    #[must_use]
    pub fn route(mut self, prefix: impl Into<String>, tier: Criticality) -> Self {
        self.routes.push((prefix.into(), tier));
        self.routes.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        self
    }

    /// The tier before retry demotion, or `None` when nothing names a valid one.
    fn base_tier(&self, head: &Parts) -> Option<Criticality> {
        if let Some(trust) = &self.trust {
            if let Some(value) = head.headers.get(names::CRITICALITY) {
                if trust(head) {
                    // A trusted but unknown label falls to the default, counted: it is not a
                    // reason to let the route table raise or lower the request.
                    return wire::parse_criticality(value.as_bytes()).ok();
                }
            }
        }
        if let Some(closure) = &self.closure {
            if let Some(tier) = closure(head) {
                return Some(tier);
            }
        }
        let path = head.uri.path();
        self.routes
            .iter()
            .find(|(prefix, _)| below(path, prefix))
            .map(|(_, tier)| *tier)
    }

    /// Whether the `triage-criticality` header of this request is trusted.
    pub(crate) fn trusts(&self, head: &Parts) -> bool {
        self.trust.as_ref().is_some_and(|trust| trust(head))
    }

    /// The request's tier, demoted by its `triage-attempt`; `None` when nothing classifies
    /// it (the layer then uses its default tier, demoted likewise, and counts it).
    pub fn tier(&self, head: &Parts) -> Option<Criticality> {
        self.base_tier(head)
            .map(|tier| tier.demoted_by(attempt(head)))
    }

    /// The request's tier before and after retry demotion, `default` when unclassified;
    /// the flag says whether it was.
    pub(crate) fn classify(
        &self,
        head: &Parts,
        default: Criticality,
    ) -> (Criticality, Criticality, bool) {
        let (base, classified) = match self.base_tier(head) {
            Some(tier) => (tier, true),
            None => (default, false),
        };
        (base, base.demoted_by(attempt(head)), classified)
    }
}

/// Whether `path` is `prefix` or lies below it, by whole segments.
fn below(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
        None => false,
    }
}

/// Retries so far, from `triage-attempt` (0 when absent or malformed).
fn attempt(head: &Parts) -> u32 {
    head.headers
        .get(names::ATTEMPT)
        .and_then(|v| wire::parse_count(v.as_bytes()))
        .unwrap_or(0)
}

/// How long the request may still be served, from its own headers: `triage-deadline-ms`
/// (absolute, Unix milliseconds; a past one gives zero), else `grpc-timeout` (relative), else
/// `None` (the tier's window applies).
pub(crate) fn remaining(head: &Parts) -> Option<Duration> {
    remaining_at(head, SystemTime::now)
}

/// [`remaining`] reading the wall clock from `now`, only when a `triage-deadline-ms` is there.
fn remaining_at(head: &Parts, now: impl FnOnce() -> SystemTime) -> Option<Duration> {
    if let Some(deadline) = head
        .headers
        .get(names::DEADLINE_MS)
        .and_then(|v| wire::parse_deadline_ms(v.as_bytes()))
    {
        return Some(deadline.duration_since(now()).unwrap_or(Duration::ZERO));
    }
    head.headers
        .get(names::GRPC_TIMEOUT)
        .and_then(|v| wire::parse_grpc_timeout(v.as_bytes()))
}

/// Whether a deadline header is present but does not parse (the tier's window then applies,
/// and the layer counts the request).
pub(crate) fn deadline_malformed(head: &Parts) -> bool {
    let deadline_ms = head
        .headers
        .get(names::DEADLINE_MS)
        .is_some_and(|v| wire::parse_deadline_ms(v.as_bytes()).is_none());
    let grpc_timeout = head
        .headers
        .get(names::GRPC_TIMEOUT)
        .is_some_and(|v| wire::parse_grpc_timeout(v.as_bytes()).is_none());
    deadline_ms || grpc_timeout
}

/// Whether the request is a gRPC call (its refusals are answered with a gRPC status).
pub(crate) fn is_grpc(head: &Parts) -> bool {
    head.headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn head(req: http::request::Builder) -> Parts {
        req.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_deadline_header_that_does_not_parse_is_malformed() {
        for bad in ["abc", "-5", "99999999999999999999999"] {
            let h = head(http::Request::get("/").header(wire::DEADLINE_MS, bad));
            assert!(deadline_malformed(&h), "{bad}");
            assert_eq!(remaining_at(&h, SystemTime::now), None, "{bad}");
        }
        let h = head(http::Request::get("/").header(wire::GRPC_TIMEOUT, "xyz"));
        assert!(deadline_malformed(&h));
        let fine = head(
            http::Request::get("/")
                .header(wire::DEADLINE_MS, "1000250")
                .header(wire::GRPC_TIMEOUT, "100m"),
        );
        assert!(!deadline_malformed(&fine));
        assert!(!deadline_malformed(&head(http::Request::get("/"))));
    }

    #[test]
    fn header_only_when_trusted() {
        let untrusted = Classifier::new().route("/", Criticality::Medium);
        let trusted = untrusted.clone().trust_header_when(|_| true);
        let h = head(http::Request::get("/x").header(wire::CRITICALITY, "critical"));
        assert_eq!(untrusted.tier(&h), Some(Criticality::Medium));
        assert_eq!(trusted.tier(&h), Some(Criticality::Critical));
        // Trusted but unknown: unclassified (the default, counted), not the route.
        let bad = head(http::Request::get("/x").header(wire::CRITICALITY, "urgent"));
        assert_eq!(
            trusted.classify(&bad, Criticality::High),
            (Criticality::High, Criticality::High, false)
        );
    }

    #[test]
    fn closure_before_routes_longest_prefix_first() {
        let c = Classifier::new()
            .route("/api", Criticality::Medium)
            .route("/api/pay", Criticality::Critical)
            .with(|h| (h.method == http::Method::DELETE).then_some(Criticality::Sheddable));
        assert_eq!(
            c.tier(&head(http::Request::get("/api/pay/1"))),
            Some(Criticality::Critical)
        );
        assert_eq!(
            c.tier(&head(http::Request::get("/api/list"))),
            Some(Criticality::Medium)
        );
        assert_eq!(
            c.tier(&head(http::Request::delete("/api/pay/1"))),
            Some(Criticality::Sheddable)
        );
        assert_eq!(
            c.classify(&head(http::Request::get("/")), Criticality::Medium),
            (Criticality::Medium, Criticality::Medium, false)
        );
    }

    #[test]
    fn retries_demoted_default_included() {
        let c = Classifier::new();
        let h = head(http::Request::get("/").header(wire::ATTEMPT, "2"));
        assert_eq!(
            c.classify(&h, Criticality::Critical),
            (Criticality::Critical, Criticality::Medium, false)
        );
        // More retries than a u32 holds are still retries: demoted to the floor.
        for many in ["255", "4294967296", "18446744073709551615", &"9".repeat(30)] {
            let h = head(http::Request::get("/").header(wire::ATTEMPT, many));
            assert_eq!(
                c.classify(&h, Criticality::Critical).1,
                Criticality::Sheddable,
                "{many}"
            );
        }
    }

    #[test]
    fn deadlines_from_headers() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let h = head(http::Request::get("/").header(wire::DEADLINE_MS, "1000250"));
        assert_eq!(remaining_at(&h, || now), Some(Duration::from_millis(250)));
        let past = head(http::Request::get("/").header(wire::DEADLINE_MS, "999000"));
        assert_eq!(remaining_at(&past, || now), Some(Duration::ZERO));
        let grpc = head(
            http::Request::post("/svc/M")
                .header(wire::GRPC_TIMEOUT, "300m")
                .header("content-type", "application/grpc+proto"),
        );
        assert_eq!(
            remaining_at(&grpc, || now),
            Some(Duration::from_millis(300))
        );
        assert!(is_grpc(&grpc));
        assert_eq!(remaining_at(&head(http::Request::get("/")), || now), None);
        assert!(!is_grpc(&head(http::Request::get("/"))));
    }
}
