//! The entry as a hostile client and an unlucky operator meet it: header values at and past
//! the parsers' edges, refused requests that must give back what they took, the retry policy
//! on requests that were retried before, and circuits whose probes must stay within their
//! limit and their episode. Everything runs through the public `Service`, on tokio's paused
//! clock or the mock clock, with exact counts.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, ServiceExt};
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
            cases: 256,
            failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
                "proptest-regressions/hostile.txt",
            ))),
            ..ProptestConfig::default()
        })]

        /// The retry policy on any request and answer headers: never a panic, the attempt it
        /// stamps is one more than the request had (never lower), it stops at `max_retries`
        /// counting earlier attempts, never retries an expired request, and never waits
        /// longer than the longest `Retry-After` or its own backoff cap.
        #[test]
        fn the_retry_policy_on_any_headers(
            attempt in prop::option::of(value()),
            status in prop::sample::select(vec![200u16, 429, 500, 503]),
            answer in proptest::collection::vec((name_or_retry(), value()), 0..4),
        ) {
            use std::sync::Arc;
            use tower::retry::budget::TpsBudget;
            use tower::retry::Policy;
            use triage::runtime::{BackoffConfig, RetryConfig};
            use triage_tower::RetryAfterPolicy;

            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            let _guard = rt.enter();
            let retry = RetryConfig { max_retries: 3 };
            let backoff = BackoffConfig { base_backoff_ms: 10, max_backoff_ms: 50 };
            let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 1_000, 1.0));
            let mut policy = RetryAfterPolicy::new(retry, backoff, budget);
            let mut req = get("/");
            if let Some(a) = &attempt {
                req = req.header(wire::ATTEMPT, a.clone());
            }
            let mut req = req.body(()).unwrap();
            let before = req
                .headers()
                .get(wire::ATTEMPT)
                .and_then(|v| wire::parse_count(v.as_bytes()))
                .unwrap_or(0);
            let mut res = Response::builder().status(status);
            for (n, v) in &answer {
                res = res.header(*n, v.clone());
            }
            let mut result: Result<Response<()>, ()> = Ok(res.body(()).unwrap());
            // The first triage-reason is the one a client reads.
            let expired = answer
                .iter()
                .find(|(n, _)| *n == wire::REASON)
                .is_some_and(|(_, v)| v.as_bytes() == b"expired");
            let started = tokio::time::Instant::now();
            match policy.retry(&mut req, &mut result) {
                Some(sleep) => {
                    prop_assert!(matches!(status, 429 | 503) || answer.iter().any(|(n, _)| *n == wire::GRPC_STATUS));
                    prop_assert!(!expired);
                    prop_assert!(before < 3, "max_retries counts earlier attempts");
                    let stamped = wire::parse_count(req.headers()[wire::ATTEMPT].as_bytes());
                    prop_assert_eq!(stamped, Some(before + 1));
                    prop_assert_eq!(policy.attempt(), before + 1);
                    let wait = sleep.deadline() - started;
                    prop_assert!(wait <= wire::MAX_RETRY_AFTER.max(Duration::from_millis(50)));
                }
                None => {
                    // A 503 or 429 is retried unless expired or out of retries (the budget
                    // here never runs out).
                    prop_assert!(before >= 3 || expired || !matches!(status, 429 | 503));
                }
            }
        }
    }

    /// Response header names the retry policy reads, and others.
    fn name_or_retry() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            wire::RETRY_AFTER,
            wire::GRPC_STATUS,
            wire::GRPC_RETRY_PUSHBACK_MS,
            wire::REASON,
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

/// Item 6 of issue 30: `RetryAfterPolicy` stamped its own count over the request's
/// `triage-attempt` (a request sent with attempt 2 was retried with 1, so the server demoted
/// the retry less than the refused attempt), and `max_retries` ignored earlier attempts.
#[tokio::test(start_paused = true)]
async fn the_retry_policy_never_lowers_the_attempt_and_counts_earlier_ones() {
    use std::sync::Arc;
    use tower::retry::budget::TpsBudget;
    use tower::retry::RetryLayer;
    use triage::runtime::{BackoffConfig, RetryConfig};
    use triage_tower::RetryAfterPolicy;

    // Answers 503 (Retry-After 1) to everything, recording the attempt each call carried.
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let server = service_fn({
        let seen = Arc::clone(&seen);
        move |req: Request<String>| {
            seen.lock().push(
                req.headers()
                    .get(wire::ATTEMPT)
                    .map(|v| v.to_str().unwrap().to_owned()),
            );
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            res.headers_mut()
                .insert(wire::RETRY_AFTER, http::HeaderValue::from_static("1"));
            async move { Ok::<_, Infallible>(res) }
        }
    });
    let policy = RetryAfterPolicy::new(
        RetryConfig { max_retries: 3 },
        BackoffConfig {
            base_backoff_ms: 1,
            max_backoff_ms: 1,
        },
        Arc::new(TpsBudget::new(Duration::from_secs(10), 1_000, 1.0)),
    );
    let client = tower::ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .service(server);
    let send = |attempt: Option<&'static str>| {
        let client = client.clone();
        async move {
            let mut req = get("/");
            if let Some(a) = attempt {
                req = req.header(wire::ATTEMPT, a);
            }
            client
                .oneshot(req.body(String::new()).unwrap())
                .await
                .unwrap()
                .status()
        }
    };
    let attempts = |seen: &parking_lot::Mutex<Vec<Option<String>>>| {
        std::mem::take(&mut *seen.lock())
            .into_iter()
            .map(|a| a.unwrap_or_default())
            .collect::<Vec<_>>()
    };
    // A first attempt: retried three times, 1, 2, 3.
    assert_eq!(send(None).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(attempts(&seen), ["", "1", "2", "3"]);
    // Sent as attempt 2 (retried twice before): one more retry, as attempt 3.
    assert_eq!(send(Some("2")).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(attempts(&seen), ["2", "3"]);
    // Sent as attempt 3: max_retries reached already, not retried.
    assert_eq!(send(Some("3")).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(attempts(&seen), ["3"]);
    // A malformed attempt counts as none.
    assert_eq!(send(Some("x")).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(attempts(&seen), ["x", "1", "2", "3"]);
}

/// Item 7 of issue 30: the rate gate spent a token on a request then refused for another
/// reason (an expired request's 503 took a Medium token, so the next valid request got 429
/// with nothing served). A request refused after the gate gives its token back, as the core's
/// buckets do for a message the queue refuses.
#[tokio::test]
async fn a_request_refused_after_the_rate_gate_gives_its_token_back() {
    use std::sync::Arc;
    use tokio::sync::Semaphore;
    use triage::admission::{BucketConfig, BucketsConfig, QueueAgeConfig};
    use triage::queue::WfqConfig;
    use triage_tower::{RateGate, RefusalReason};

    // Three Medium tokens, never refilled (the gate's clock is a mock that does not move).
    let (clock, _mock) = triage::quanta::Clock::mock();
    let buckets = BucketsConfig {
        medium: Some(BucketConfig {
            rate: Some(0.001),
            burst: Some(3),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    let mut config = TriageConfig::default();
    config.queue = WfqConfig {
        capacity: 1.try_into().unwrap(),
        ..WfqConfig::default()
    };
    config.queue.admission = QueueAgeConfig::disabled();
    let layer = TriageLayer::builder(config, limit(1))
        .gate(RateGate::with_clock(&buckets, clock).unwrap())
        .build()
        .unwrap();
    let release = Arc::new(Semaphore::new(0));
    let service = layer.layer(service_fn({
        let release = Arc::clone(&release);
        move |_req: Request<String>| {
            let release = Arc::clone(&release);
            async move {
                release.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        }
    }));
    let call =
        |req: http::request::Builder| service.clone().oneshot(req.body(String::new()).unwrap());

    // Expired on arrival: 503 expired, and its token is given back.
    let res = call(get("/").header(wire::DEADLINE_MS, "1000"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The only slot, held (token 1), and the only place in the queue (token 2).
    let holder = tokio::spawn(call(get("/")));
    while layer.admission().limit().in_flight() < 1 {
        tokio::task::yield_now().await;
    }
    let waiter = tokio::spawn(call(get("/")));
    while layer.admission().waiting().medium < 1 {
        tokio::task::yield_now().await;
    }
    // Full, nothing lower to evict: 503 capacity, token 3 given back.
    let res = call(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[wire::REASON], "capacity");
    release.add_permits(3);
    assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(waiter.await.unwrap().unwrap().status(), StatusCode::OK);
    // Token 3 is still there: served. Then the bucket is empty: 429.
    assert_eq!(call(get("/")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        call(get("/")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let stats = layer.stats();
    assert_eq!(stats.served[Criticality::Medium], 3);
    assert_eq!(
        stats.refused(Criticality::Medium, RefusalReason::Expired),
        1
    );
    assert_eq!(
        stats.refused(Criticality::Medium, RefusalReason::Capacity),
        1
    );
    assert_eq!(stats.refused(Criticality::Medium, RefusalReason::Rate), 1);
}

mod circuit {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use tokio::sync::Semaphore;
    use triage::admission::{BreakerConfig, Breakers, CircuitState};
    use triage::quanta::Clock;
    use triage_tower::{CircuitGate, RefusalReason};

    struct Entry {
        breakers: Arc<Breakers>,
        mock: Arc<triage::quanta::Mock>,
        layer: TriageLayer,
        /// Calls that reached the handler.
        reached: Arc<AtomicU32>,
        /// Each handler call waits for a permit, then answers: `/pay` 502 (the downstream
        /// fails), anything else 200.
        release: Arc<Semaphore>,
        feedback: triage_tower::CircuitFeedbackLayer,
    }

    fn entry(slots: usize, half_open_probes: u32) -> Entry {
        let (clock, mock) = Clock::mock();
        let config = BreakerConfig {
            min_calls: 1,
            recovery_ms: 1_000,
            half_open_probes,
            ..BreakerConfig::default()
        };
        let breakers = Arc::new(Breakers::with_clock(config, clock).unwrap());
        let gate = CircuitGate::new(Arc::clone(&breakers), |head: &http::request::Parts| {
            head.uri.path().starts_with("/pay").then_some("payments")
        });
        let feedback = gate.feedback();
        let mut config = TriageConfig::default();
        config.queue.admission = triage::admission::QueueAgeConfig::disabled();
        let layer = TriageLayer::builder(config, limit(slots))
            .gate(gate)
            .build()
            .unwrap();
        let reached = Arc::new(AtomicU32::new(0));
        let release = Arc::new(Semaphore::new(0));
        Entry {
            breakers,
            mock,
            layer,
            reached,
            release,
            feedback,
        }
    }

    /// The service: the triage layer, the feedback layer inside it, then the handler.
    fn service(
        e: &Entry,
    ) -> impl tower::Service<
        Request<String>,
        Response = Response<triage_tower::TriageBody<String>>,
        Error = Infallible,
        Future = impl Send,
    > + Clone
           + Send {
        let (reached, release) = (Arc::clone(&e.reached), Arc::clone(&e.release));
        let handler = service_fn(move |req: Request<String>| {
            let (reached, release) = (Arc::clone(&reached), Arc::clone(&release));
            async move {
                reached.fetch_add(1, Ordering::SeqCst);
                release.acquire().await.unwrap().forget();
                let mut res = Response::new(String::new());
                if req.uri().path().starts_with("/pay") {
                    *res.status_mut() = StatusCode::BAD_GATEWAY;
                }
                Ok::<_, Infallible>(res)
            }
        });
        e.layer.layer(e.feedback.layer(handler))
    }

    /// Item 4 of issue 30: with `half_open_probes = 1`, five concurrent requests to a circuit
    /// open past its recovery time all reached the failing downstream (the gate admitted an
    /// open circuit without taking a probe slot; the feedback layer let through what
    /// `try_call` refused). Here the five arrive while the only slot is busy, so all of them
    /// pass the gate before any reaches the feedback layer: one probe goes through, the other
    /// four are refused at the gate.
    #[tokio::test]
    async fn a_recovering_circuit_lets_through_its_probes_only() {
        let e = entry(1, 1);
        let svc = service(&e);
        e.breakers.record_failure("payments");
        assert_eq!(e.breakers.state("payments"), Some(CircuitState::Open));
        e.mock.increment(Duration::from_millis(1_000));
        let holder = tokio::spawn(
            svc.clone()
                .oneshot(get("/work").body(String::new()).unwrap()),
        );
        while e.reached.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        let requests: Vec<_> = (0..5)
            .map(|_| {
                tokio::spawn(
                    svc.clone()
                        .oneshot(get("/pay").body(String::new()).unwrap()),
                )
            })
            .collect();
        let refused = |e: &Entry| {
            e.layer
                .stats()
                .refused(Criticality::Medium, RefusalReason::Circuit)
        };
        let waiting = |e: &Entry| e.layer.admission().waiting().medium as u64;
        while waiting(&e) + refused(&e) < 5 {
            tokio::task::yield_now().await;
        }
        // Enough for every call that reaches the handler.
        e.release.add_permits(6);
        assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
        let mut statuses = Vec::new();
        for r in requests {
            statuses.push(r.await.unwrap().unwrap().status().as_u16());
        }
        statuses.sort_unstable();
        assert_eq!(
            e.reached.load(Ordering::SeqCst) - 1,
            1,
            "one probe reached the downstream"
        );
        assert_eq!(statuses, [502, 503, 503, 503, 503]);
        assert_eq!(refused(&e), 4);
        // The probe failed: open again, for another recovery time.
        assert_eq!(e.breakers.state("payments"), Some(CircuitState::Open));
        assert_eq!(e.breakers.opened_total(), 2);
        assert_eq!(e.layer.admission().limit().in_flight(), 0);
    }

    /// The feedback layer does not let a request through when the circuit gives it no call:
    /// one admitted while the circuit was closed, that waited for a slot while it opened, is
    /// answered 503 (circuit) without reaching the downstream, and counted refused, not
    /// served.
    #[tokio::test]
    async fn a_request_whose_circuit_opened_while_it_waited_is_refused_inside() {
        let e = entry(1, 1);
        let svc = service(&e);
        let holder = tokio::spawn(
            svc.clone()
                .oneshot(get("/work").body(String::new()).unwrap()),
        );
        while e.reached.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        let pay = tokio::spawn(
            svc.clone()
                .oneshot(get("/pay").body(String::new()).unwrap()),
        );
        while e.layer.admission().waiting().medium < 1 {
            tokio::task::yield_now().await;
        }
        e.breakers.record_failure("payments");
        e.release.add_permits(1);
        assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
        // Answered, or (as before the fix) reached the handler, where it would wait.
        while !pay.is_finished() && e.reached.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            e.reached.load(Ordering::SeqCst),
            1,
            "the downstream was not called"
        );
        let res = pay.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()[wire::REASON], "circuit");
        assert_eq!(res.headers()[wire::RETRY_AFTER], "1");
        assert_eq!(
            e.reached.load(Ordering::SeqCst),
            1,
            "the downstream was not called"
        );
        let stats = e.layer.stats();
        assert_eq!(stats.served[Criticality::Medium], 1);
        assert_eq!(
            stats.refused(Criticality::Medium, RefusalReason::Circuit),
            1
        );
        assert_eq!(e.layer.admission().limit().in_flight(), 0);
    }
}

/// Issue 32: an already-expired request got `Retry-After`, inviting a retry that cannot
/// succeed. It gets none (HTTP), no pushback (gRPC `DEADLINE_EXCEEDED`), a body saying 0 s,
/// and the crate's retry policy does not retry it.
#[tokio::test]
async fn an_expired_request_gets_no_retry_after() {
    use triage_tower::{overload_wait, Refusal, RefusalReason};

    let layer = TriageLayer::builder(TriageConfig::default(), limit(4))
        .build()
        .unwrap();
    let service = layer.layer(service_fn(ok));
    let res = service
        .clone()
        .oneshot(
            get("/")
                .header(wire::DEADLINE_MS, "1000")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[wire::REASON], "expired");
    assert!(res.headers().get(wire::RETRY_AFTER).is_none());
    assert_eq!(overload_wait(&res), None, "not retryable");
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    let refusal = Refusal::parse_body(&body).unwrap();
    assert_eq!(refusal.reason, RefusalReason::Expired);
    assert_eq!(refusal.retry_after, Duration::ZERO);

    let res = service
        .oneshot(
            Request::post("/svc/M")
                .header("content-type", "application/grpc")
                .header(wire::GRPC_TIMEOUT, "0m")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.headers()[wire::GRPC_STATUS], "4");
    assert!(res.headers().get(wire::RETRY_AFTER).is_none());
    assert!(res.headers().get(wire::GRPC_RETRY_PUSHBACK_MS).is_none());
    // Capacity refusals keep theirs.
    let r = Refusal::new(RefusalReason::Capacity, Criticality::High, Duration::ZERO);
    assert_eq!(r.http_response().headers()[wire::RETRY_AFTER], "1");
}

/// Also seen in issue 30: a route prefix `/checkout` also classified `/checkout-report`. A
/// prefix matches whole path segments: itself, and what lies below it.
#[test]
fn a_route_prefix_matches_whole_segments() {
    let c = Classifier::new()
        .route("/checkout", Criticality::Critical)
        .route("/api/", Criticality::High)
        .route("/", Criticality::Sheddable);
    let tier = |path: &str| c.tier(&get(path).body(()).unwrap().into_parts().0);
    assert_eq!(tier("/checkout"), Some(Criticality::Critical));
    assert_eq!(tier("/checkout/"), Some(Criticality::Critical));
    assert_eq!(tier("/checkout/pay?x=1"), Some(Criticality::Critical));
    assert_eq!(tier("/checkout-report"), Some(Criticality::Sheddable));
    assert_eq!(tier("/checkouts"), Some(Criticality::Sheddable));
    assert_eq!(tier("/api/v1"), Some(Criticality::High));
    assert_eq!(
        tier("/api"),
        Some(Criticality::Sheddable),
        "'/api/' is below '/api'"
    );
    assert_eq!(tier("/anything"), Some(Criticality::Sheddable));
}

/// Also seen in issue 30: an untrusted client's `triage-criticality` header reached the inner
/// service unchanged, so a handler that read it (to propagate it, or to brown out) would
/// escalate the request. The inner service sees the classification the entry trusts (the
/// tier before retry demotion, as the wire contract defines the header), on never-shed paths
/// the header of an untrusted client is removed, and a trusted one's is kept.
#[tokio::test]
async fn the_inner_service_sees_the_criticality_the_entry_trusts() {
    use std::sync::Arc;

    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let classifier = Classifier::new()
        .trust_header_when(|head| head.headers.contains_key("x-internal"))
        .route("/feed", Criticality::Sheddable);
    let layer = TriageLayer::builder(TriageConfig::default(), limit(4))
        .classifier(classifier)
        .build()
        .unwrap();
    let service = layer.layer(service_fn({
        let seen = Arc::clone(&seen);
        move |req: Request<String>| {
            seen.lock().push(
                req.headers()
                    .get(wire::CRITICALITY)
                    .map(|v| v.to_str().unwrap().to_owned()),
            );
            ok(req)
        }
    }));
    let send =
        |req: http::request::Builder| service.clone().oneshot(req.body(String::new()).unwrap());
    send(get("/feed").header(wire::CRITICALITY, "critical"))
        .await
        .unwrap();
    send(get("/other").header(wire::CRITICALITY, "critical"))
        .await
        .unwrap();
    send(
        get("/feed")
            .header(wire::CRITICALITY, "high")
            .header("x-internal", "1")
            .header(wire::ATTEMPT, "1"),
    )
    .await
    .unwrap();
    send(get("/healthz").header(wire::CRITICALITY, "critical"))
        .await
        .unwrap();
    send(
        get("/healthz")
            .header(wire::CRITICALITY, "critical")
            .header("x-internal", "1"),
    )
    .await
    .unwrap();
    assert_eq!(
        *seen.lock(),
        [
            Some("sheddable".to_owned()),
            Some("medium".to_owned()),
            Some("high".to_owned()),
            None,
            Some("critical".to_owned()),
        ]
    );
}

/// Also seen in issue 30: waiters whose client had gone kept their place in the entry queue
/// until the dispatcher popped them, so a queue of abandoned requests refused live ones for
/// capacity (and kept the queue age up). A push that finds the queue full takes the
/// abandoned waiters out first, and the dispatcher's tick takes them out while it waits.
#[tokio::test(start_paused = true)]
async fn abandoned_waiters_give_their_place_back() {
    use std::sync::Arc;
    use tokio::sync::Semaphore;
    use triage::admission::QueueAgeConfig;
    use triage::queue::WfqConfig;

    let mut config = TriageConfig::default();
    config.queue = WfqConfig {
        capacity: 2.try_into().unwrap(),
        ..WfqConfig::default()
    };
    config.queue.admission = QueueAgeConfig::disabled();
    config.tier_window = triage::PerTier::splat(Duration::from_secs(3_600));
    let layer = TriageLayer::builder(config, limit(1)).build().unwrap();
    let release = Arc::new(Semaphore::new(0));
    let service = layer.layer(service_fn({
        let release = Arc::clone(&release);
        move |_req: Request<String>| {
            let release = Arc::clone(&release);
            async move {
                release.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        }
    }));
    let call = || {
        service
            .clone()
            .oneshot(get("/").body(String::new()).unwrap())
    };
    let waiting = || layer.admission().waiting().medium;
    let holder = tokio::spawn(call());
    while layer.admission().limit().in_flight() < 1 {
        tokio::task::yield_now().await;
    }
    // Two clients wait, then go away (their response futures dropped): the queue is full of
    // nobody.
    let gone: Vec<_> = (0..2).map(|_| tokio::spawn(call())).collect();
    while waiting() < 2 {
        tokio::task::yield_now().await;
    }
    for g in &gone {
        g.abort();
    }
    for g in gone {
        assert!(g.await.unwrap_err().is_cancelled());
    }
    // A live request finds room: it waits, then is served.
    let live = tokio::spawn(call());
    while waiting() != 1 && !live.is_finished() {
        tokio::task::yield_now().await;
    }
    assert!(!live.is_finished(), "refused instead of waiting");
    assert_eq!(waiting(), 1);
    // One more abandons; the dispatcher's tick takes it out without any push.
    let gone = tokio::spawn(call());
    while waiting() < 2 {
        tokio::task::yield_now().await;
    }
    gone.abort();
    let _ = gone.await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(waiting(), 1);
    release.add_permits(2);
    assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(live.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(layer.stats().served[Criticality::Medium], 2);
    assert_eq!(
        layer
            .stats()
            .refused(Criticality::Medium, triage_tower::RefusalReason::Capacity),
        0
    );
}

/// Found by a fresh-user trial: an untrusted client's `triage-deadline-ms` an hour ahead kept
/// its request waiting an hour where its tier's work is useful for 250 ms. A client's own
/// deadline may shorten its tier's window; only a trusted one lengthens it.
#[tokio::test]
async fn an_untrusted_deadline_cannot_lengthen_the_tier_window() {
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    for trusted in [false, true] {
        let (clock, mock) = triage::quanta::Clock::mock();
        let gate = Arc::new(Semaphore::new(0));
        let classifier = Classifier::new().trust_header_when(move |_| trusted);
        let layer = TriageLayer::builder(TriageConfig::default(), limit(1))
            .classifier(classifier)
            .clock(clock)
            .build()
            .unwrap();
        let held = Arc::clone(&gate);
        let service = layer.layer(service_fn(move |_req: Request<String>| {
            let held = Arc::clone(&held);
            async move {
                held.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(Response::new(String::from("served")))
            }
        }));
        // The only slot is taken by a request that waits on the gate.
        let first = tokio::spawn(
            service
                .clone()
                .oneshot(get("/").body(String::new()).unwrap()),
        );
        while layer.admission().limit().in_flight() == 0 {
            tokio::task::yield_now().await;
        }
        let hour_ahead = std::time::SystemTime::now() + Duration::from_secs(3600);
        let second = tokio::spawn(
            service.clone().oneshot(
                get("/")
                    .header(wire::DEADLINE_MS, wire::format_deadline_ms(hour_ahead))
                    .body(String::new())
                    .unwrap(),
            ),
        );
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        // Past Medium's 250 ms window, well inside the hour.
        mock.increment(Duration::from_millis(300));
        gate.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
        let res = second.await.unwrap().unwrap();
        if trusted {
            assert_eq!(res.status(), StatusCode::OK, "a trusted deadline holds");
        } else {
            assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(res.headers()[wire::REASON], "expired");
        }
    }
}
