//! Why a request was refused, and the answer a client gets: the HTTP status, `Retry-After`,
//! the gRPC status, and a short machine-readable body.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;
use triage::{wire, Criticality};

use crate::names;

/// Why a request was answered without being served. Used as a metric label and in the body,
/// so the set is small and fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The service has no capacity for the request's tier now: queue-age admission refused
    /// it, the entry queue was full with nothing lower to evict, or a more important request
    /// evicted it while it waited. HTTP 503, gRPC `UNAVAILABLE`.
    Capacity,
    /// Its deadline passed (on arrival, or while it waited for a slot): answered, never
    /// served. HTTP 503 without `Retry-After` (retrying is useless), gRPC
    /// `DEADLINE_EXCEEDED`.
    Expired,
    /// The caller, or its tier, is over its rate budget (a token bucket). HTTP 429, gRPC
    /// `RESOURCE_EXHAUSTED`.
    Rate,
    /// The downstream this request needs is failing (an open circuit breaker): a longer
    /// `Retry-After`. HTTP 503, gRPC `UNAVAILABLE`.
    Circuit,
}

impl RefusalReason {
    /// Every reason.
    pub const ALL: [RefusalReason; 4] = [
        RefusalReason::Capacity,
        RefusalReason::Expired,
        RefusalReason::Rate,
        RefusalReason::Circuit,
    ];

    /// Lowercase name, as in the body and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Capacity => "capacity",
            RefusalReason::Expired => "expired",
            RefusalReason::Rate => "rate",
            RefusalReason::Circuit => "circuit",
        }
    }

    /// The HTTP status: 429 for [`Rate`](Self::Rate) ("you specifically are over budget"),
    /// 503 for the others ("come back later").
    pub const fn status(self) -> StatusCode {
        match self {
            RefusalReason::Rate => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The gRPC status code: 14 `UNAVAILABLE` (capacity, circuit), 8 `RESOURCE_EXHAUSTED`
    /// (rate), 4 `DEADLINE_EXCEEDED` (expired).
    pub const fn grpc_code(self) -> u8 {
        match self {
            RefusalReason::Capacity | RefusalReason::Circuit => 14,
            RefusalReason::Rate => 8,
            RefusalReason::Expired => 4,
        }
    }

    /// Whether the answer invites a retry (carries `Retry-After`): every reason but
    /// [`Expired`](Self::Expired), whose request cannot succeed on a retry.
    pub const fn invites_retry(self) -> bool {
        !matches!(self, RefusalReason::Expired)
    }

    pub(crate) const fn index(self) -> usize {
        match self {
            RefusalReason::Capacity => 0,
            RefusalReason::Expired => 1,
            RefusalReason::Rate => 2,
            RefusalReason::Circuit => 3,
        }
    }

    /// The reason named `name` ([`as_str`](Self::as_str)), if any.
    pub fn from_name(name: &str) -> Option<RefusalReason> {
        RefusalReason::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal is the error of [`EntryAdmission::admit`](crate::EntryAdmission::admit).
impl std::error::Error for RefusalReason {}

/// A refusal as answered: reason, the request's tier, and the wait given in `Retry-After`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::Criticality;
/// use triage_tower::{Refusal, RefusalReason};
///
/// let refusal = Refusal::new(RefusalReason::Rate, Criticality::High, Duration::from_secs(2));
/// let response = refusal.http_response();
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "2");
/// let body = String::from_utf8(refusal.body().to_vec())?;
/// assert_eq!(body, r#"{"reason":"rate","tier":"high","retry_after_s":2}"#);
/// assert_eq!(Refusal::parse_body(body.as_bytes()), Some(refusal));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// The tier the request was classified in (after demotion of a retry).
    pub tier: Criticality,
    /// The wait given to the client, whole seconds (what `Retry-After` says); zero, and no
    /// `Retry-After`, for a reason that invites no retry ([`RefusalReason::invites_retry`]).
    pub retry_after: Duration,
}

impl Refusal {
    /// A refusal; `retry_after` is rounded up to whole seconds, at least 1 s and at most
    /// [`wire::MAX_RETRY_AFTER`], as the header will say; zero for a reason that invites no
    /// retry.
    pub fn new(reason: RefusalReason, tier: Criticality, retry_after: Duration) -> Refusal {
        if !reason.invites_retry() {
            return Refusal {
                reason,
                tier,
                retry_after: Duration::ZERO,
            };
        }
        let secs = retry_after.min(wire::MAX_RETRY_AFTER);
        let secs = (secs.as_secs() + u64::from(secs.subsec_nanos() > 0)).max(1);
        Refusal {
            reason,
            tier,
            retry_after: Duration::from_secs(secs),
        }
    }

    /// The body: one line of JSON, `{"reason":..,"tier":..,"retry_after_s":..}`.
    pub fn body(&self) -> Bytes {
        Bytes::from(format!(
            r#"{{"reason":"{}","tier":"{}","retry_after_s":{}}}"#,
            self.reason.as_str(),
            self.tier.as_str(),
            self.retry_after.as_secs()
        ))
    }

    /// Reads back a [`body`](Self::body) (for clients and tests): `None` if it is not one.
    /// A small reader of this fixed shape rather than a JSON library, so the crate needs none.
    pub fn parse_body(body: &[u8]) -> Option<Refusal> {
        let text = std::str::from_utf8(body).ok()?.trim();
        let text = text.strip_prefix('{')?.strip_suffix('}')?;
        let (mut reason, mut tier, mut secs) = (None, None, None);
        for field in text.split(',') {
            let (key, value) = field.split_once(':')?;
            let value = value.trim();
            match key.trim().trim_matches('"') {
                "reason" => reason = RefusalReason::from_name(value.trim_matches('"')),
                "tier" => tier = wire::parse_criticality(value.trim_matches('"').as_bytes()).ok(),
                "retry_after_s" => secs = value.parse::<u64>().ok(),
                _ => {}
            }
        }
        Some(Refusal {
            reason: reason?,
            tier: tier?,
            retry_after: Duration::from_secs(secs?),
        })
    }

    /// The HTTP answer: [`RefusalReason::status`], `Retry-After` (unless the reason invites
    /// no retry), `triage-reason`, and the JSON [`body`](Self::body).
    pub fn http_response(&self) -> Response<Full<Bytes>> {
        Rendered::new(self).http()
    }

    /// The gRPC answer, trailers-only: HTTP 200 with `content-type: application/grpc`,
    /// `grpc-status` ([`RefusalReason::grpc_code`]), `grpc-message` (the reason and tier),
    /// `grpc-retry-pushback-ms` and `Retry-After` (unless the reason invites no retry), and
    /// no body; tonic clients read the status from these headers.
    pub fn grpc_response(&self) -> Response<Full<Bytes>> {
        Rendered::new(self).grpc()
    }
}

/// In a response's extensions: a layer inside the `TriageLayer` refused the request (the
/// inner service did not serve it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RefusedInside(pub(crate) RefusalReason);

/// A refusal's body and header values, rendered once: the layer keeps one per reason, tier
/// and `Retry-After` second within the jitter, so answering copies reference-counted bytes
/// instead of formatting.
#[derive(Clone)]
pub(crate) struct Rendered {
    reason: RefusalReason,
    body: Bytes,
    /// `Retry-After` and `grpc-retry-pushback-ms`, for a reason that invites a retry.
    retry: Option<(HeaderValue, HeaderValue)>,
    message: HeaderValue,
}

impl Rendered {
    pub(crate) fn new(refusal: &Refusal) -> Rendered {
        let value = |text: String| {
            HeaderValue::from_maybe_shared(Bytes::from(text))
                .unwrap_or(HeaderValue::from_static("1"))
        };
        let pushback_ms = u64::try_from(refusal.retry_after.as_millis()).unwrap_or(u64::MAX);
        let retry = refusal.reason.invites_retry().then(|| {
            (
                value(wire::format_retry_after(refusal.retry_after)),
                value(pushback_ms.to_string()),
            )
        });
        Rendered {
            reason: refusal.reason,
            body: refusal.body(),
            retry,
            message: value(format!(
                "shed: {} ({})",
                refusal.reason.as_str(),
                refusal.tier.as_str()
            )),
        }
    }

    /// The answer of a layer inside a [`TriageLayer`](crate::TriageLayer) (the circuit
    /// feedback layer) that refuses a request already admitted: the status and headers of
    /// [`http`](Self::http) or [`grpc`](Self::grpc), an empty body of the inner service's
    /// type, and the reason in the response's extensions, so the `TriageLayer` counts it as
    /// refused, not served.
    pub(crate) fn inside<B: Default>(&self, grpc: bool) -> Response<B> {
        let answer = if grpc { self.grpc() } else { self.http() };
        let (mut parts, _) = answer.into_parts();
        if !grpc {
            // The JSON body is not there to describe.
            parts.headers.remove(http::header::CONTENT_TYPE);
        }
        parts.extensions.insert(RefusedInside(self.reason));
        Response::from_parts(parts, B::default())
    }

    pub(crate) fn http(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body.clone()));
        *response.status_mut() = self.reason.status();
        let headers = response.headers_mut();
        if let Some((retry_after, _)) = &self.retry {
            headers.insert(names::RETRY_AFTER, retry_after.clone());
        }
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            names::REASON,
            HeaderValue::from_static(self.reason.as_str()),
        );
        response
    }

    pub(crate) fn grpc(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::new()));
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(
            names::GRPC_STATUS,
            HeaderValue::from_static(match self.reason.grpc_code() {
                14 => "14",
                8 => "8",
                _ => "4",
            }),
        );
        headers.insert(names::GRPC_MESSAGE, self.message.clone());
        if let Some((retry_after, pushback_ms)) = &self.retry {
            headers.insert(names::GRPC_RETRY_PUSHBACK_MS, pushback_ms.clone());
            headers.insert(names::RETRY_AFTER, retry_after.clone());
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_by_reason() {
        let t = Criticality::Medium;
        let s = Duration::from_secs(1);
        assert_eq!(
            Refusal::new(RefusalReason::Capacity, t, s)
                .http_response()
                .status(),
            503
        );
        assert_eq!(
            Refusal::new(RefusalReason::Expired, t, s)
                .http_response()
                .status(),
            503
        );
        assert_eq!(
            Refusal::new(RefusalReason::Rate, t, s)
                .http_response()
                .status(),
            429
        );
        assert_eq!(
            Refusal::new(RefusalReason::Circuit, t, s)
                .http_response()
                .status(),
            503
        );
        for (reason, code) in [
            (RefusalReason::Capacity, "14"),
            (RefusalReason::Circuit, "14"),
            (RefusalReason::Rate, "8"),
            (RefusalReason::Expired, "4"),
        ] {
            let r = Refusal::new(reason, t, Duration::from_millis(1_500)).grpc_response();
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()[wire::GRPC_STATUS], code);
            if reason.invites_retry() {
                assert_eq!(r.headers()[wire::GRPC_RETRY_PUSHBACK_MS], "2000");
                assert_eq!(r.headers()[wire::RETRY_AFTER], "2");
            } else {
                assert!(r.headers().get(wire::GRPC_RETRY_PUSHBACK_MS).is_none());
                assert!(r.headers().get(wire::RETRY_AFTER).is_none());
            }
            assert_eq!(r.headers()["content-type"], "application/grpc");
            let h = Refusal::new(reason, t, s).http_response();
            assert_eq!(h.headers()[wire::REASON], reason.as_str());
        }
    }

    #[test]
    fn bodies_round_trip() {
        for reason in RefusalReason::ALL {
            for tier in Criticality::ALL {
                let r = Refusal::new(reason, tier, Duration::from_millis(2_500));
                let secs = if reason.invites_retry() { 3 } else { 0 };
                assert_eq!(r.retry_after, Duration::from_secs(secs));
                assert_eq!(Refusal::parse_body(&r.body()), Some(r));
            }
        }
        assert_eq!(Refusal::parse_body(b"{}"), None);
        assert_eq!(Refusal::parse_body(b"not json"), None);
        assert_eq!(
            Refusal::new(RefusalReason::Rate, Criticality::High, Duration::ZERO).retry_after,
            Duration::from_secs(1)
        );
    }
}
