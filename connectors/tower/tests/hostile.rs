//! The entry as a hostile client and an unlucky operator meet it: header values at and past
//! the parsers' edges, refused requests that must give back what they took, the retry policy
//! on requests that were retried before, and circuits whose probes must stay within their
//! limit and their episode. Everything runs through the public `Service`, on tokio's paused
//! clock or the mock clock, with exact counts.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, Service, ServiceExt};
use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
use triage::{wire, Criticality};
use triage_tower::{Classifier, TriageConfig, TriageLayer};

fn limit(slots: usize) -> ConcurrencyLimit {
    ConcurrencyLimit::new(Fixed::new(slots).unwrap().into(), TierShares::default())
}

async fn ok(_req: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::from("served")))
}

fn get(path: &str) -> http::request::Builder {
    Request::get(path)
}

/// Item 1 of issue 30: a valid `grpc-timeout` of eight digits in hours, or a
/// `triage-deadline-ms` thousands of years ahead, made `call` panic ("overflow when adding
/// duration to instant"). Now the deadline saturates (held to `wire::MAX_DEADLINE_AHEAD`)
/// and the request is served; a value past what the parsers take counts as malformed.
#[tokio::test]
async fn deadline_headers_far_ahead_are_held_not_a_panic() {
    let layer = TriageLayer::builder(TriageConfig::default(), limit(4))
        .build()
        .unwrap();
    let service = layer.layer(service_fn(ok));
    let far = [
        (wire::GRPC_TIMEOUT, "99999999H"),
        (wire::GRPC_TIMEOUT, "99999999M"),
        (wire::DEADLINE_MS, "99999999999999"),
        (wire::DEADLINE_MS, "9999999999999999999"),
    ];
    for (name, value) in far {
        let res = service
            .clone()
            .oneshot(get("/").header(name, value).body(String::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{name}: {value}");
    }
    let stats = layer.stats();
    assert_eq!(stats.served[Criticality::Medium], 4);
    assert_eq!(stats.goodput[Criticality::Medium], 4);
    assert_eq!(stats.malformed_deadline, 0);
    // Past u64 milliseconds: malformed, the tier's window applies.
    let res = service
        .clone()
        .oneshot(
            get("/")
                .header(wire::DEADLINE_MS, "99999999999999999999")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(layer.stats().malformed_deadline, 1);
    assert_eq!(layer.admission().limit().in_flight(), 0);
}

mod any_headers {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;
    use triage_tower::Refusal;

    /// Header values as a hostile client may send them (any bytes a header value may hold),
    /// and the shapes near the parsers' edges.
    fn value() -> impl Strategy<Value = HeaderValue> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..24),
            "[ \t]?[0-9]{0,22}[HMSmunx]?[ \t]?".prop_map(String::into_bytes),
            "[-+]?[0-9]{1,20}".prop_map(String::into_bytes),
            "(critical|high|medium|sheddable|CRITICAL|urgent|)".prop_map(String::into_bytes),
            "application/grpc[+a-z]{0,6}".prop_map(String::into_bytes),
        ]
        .prop_filter_map("not a header value", |v| HeaderValue::from_bytes(&v).ok())
    }

    fn name() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            wire::DEADLINE_MS,
            wire::GRPC_TIMEOUT,
            wire::ATTEMPT,
            wire::CRITICALITY,
            wire::REQUEST_ID,
            "content-type",
            "x-internal",
            "x-other",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
                "proptest-regressions/hostile.txt",
            ))),
            ..ProptestConfig::default()
        })]

        /// Any headers, through the real service: never a panic; the answer is served or a
        /// well-formed refusal; the tier the handler sees is never above what trust allows
        /// (the route's Medium, demoted by retries, unless `x-internal` is sent); and no
        /// request, served or refused, keeps a slot.
        #[test]
        fn any_header_values_through_the_service(
            headers in proptest::collection::vec((name(), value()), 0..8),
            path in prop::sample::select(vec!["/", "/checkout", "/checkout-report", "/healthz"]),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let classifier = Classifier::new()
                    .trust_header_when(|head| head.headers.contains_key("x-internal"))
                    .route("/", Criticality::Medium);
                let layer = TriageLayer::builder(TriageConfig::default(), limit(2))
                    .classifier(classifier)
                    .build()
                    .unwrap();
                let seen = std::sync::Arc::new(parking_lot::Mutex::new(None));
                let service = layer.layer(service_fn({
                    let seen = std::sync::Arc::clone(&seen);
                    move |req: Request<String>| {
                        *seen.lock() = Some(req.extensions().get::<Criticality>().copied());
                        async { Ok::<_, Infallible>(Response::new(String::new())) }
                    }
                }));
                let mut req = get(path);
                for (n, v) in &headers {
                    req = req.header(*n, v.clone());
                }
                let internal = headers.iter().any(|(n, _)| *n == "x-internal");
                let res = service.oneshot(req.body(String::new()).unwrap()).await.unwrap();
                let grpc = res.headers().get(wire::GRPC_STATUS).is_some();
                match res.status() {
                    StatusCode::OK if !grpc => {
                        if path != "/healthz" && !internal {
                            let tier = seen.lock().flatten().expect("the tier in the extensions");
                            prop_assert!(tier <= Criticality::Medium, "{tier:?}");
                        }
                    }
                    StatusCode::OK => {
                        prop_assert!(seen.lock().is_none(), "a gRPC refusal never reaches the handler");
                    }
                    status => {
                        prop_assert!(seen.lock().is_none());
                        let body = http_body_util::BodyExt::collect(res.into_body())
                            .await
                            .unwrap()
                            .to_bytes();
                        let refusal = Refusal::parse_body(&body).expect("a refusal body");
                        prop_assert_eq!(status, refusal.reason.status());
                        if !internal {
                            prop_assert!(refusal.tier <= Criticality::Medium);
                        }
                    }
                }
                prop_assert_eq!(layer.admission().limit().in_flight(), 0);
                Ok(())
            })?;
        }
    }
}
