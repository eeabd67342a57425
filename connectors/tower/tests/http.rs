//! The layer through a real TCP listener (axum) and a real HTTP client (hyper): 503 vs 429 vs
//! the circuit's answer, `Retry-After` within its jitter, health paths served at any load,
//! bodies parsed back, eviction and expiry while waiting, gRPC statuses, reappearances, and the
//! retry policy end to end. No wall-clock thresholds: the handler holds its slot until the test
//! lets it go, and the test waits for states, not for durations.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::Request as AxumRequest;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;
use tower::retry::RetryLayer;
use tower::{ServiceBuilder, ServiceExt};
use triage::admission::QueueAgeConfig;
use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
use triage::queue::WfqConfig;
use triage::{wire, Criticality};
use triage_tower::{
    Classifier, GateRefusal, Refusal, RefusalReason, RetryAfterPolicy, TriageConfig, TriageLayer,
};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, String>;

/// The jitter configured on the server: every `Retry-After` is in `least..=least + JITTER`.
const JITTER_S: u64 = 2;

struct Server {
    addr: SocketAddr,
    layer: TriageLayer,
    /// `/work` waits for a permit of this semaphore before answering.
    release: Arc<Semaphore>,
    /// `/work` calls that reached the handler, in order, by their `x-tag` header.
    served: Arc<parking_lot::Mutex<Vec<String>>>,
    /// Handler calls that saw a `triage-attempt` header (the retried ones).
    retried_seen: Arc<AtomicU32>,
}

async fn server(slots: usize, queue: usize) -> Server {
    let mut config = TriageConfig::default();
    config.queue = WfqConfig {
        capacity: queue.try_into().unwrap(),
        ..WfqConfig::default()
    };
    // Deterministic: only capacity decides, not how long the test takes to fill the queue.
    config.queue.admission = QueueAgeConfig::disabled();
    config.retry_after_jitter = Duration::from_secs(JITTER_S);
    config.default_tier = Criticality::Medium;
    let limit = ConcurrencyLimit::new(Fixed::new(slots).unwrap().into(), TierShares::default());
    let classifier = Classifier::new()
        .trust_header_when(|head| head.headers.contains_key("x-internal"))
        .route("/work", Criticality::Medium)
        .route("/pay", Criticality::Critical);
    let layer = TriageLayer::builder(config, limit)
        .classifier(classifier)
        .gate(|_tier: Criticality, head: &http::request::Parts| {
            match head.uri.path() {
                "/limited" => Err(GateRefusal::rate(None)),
                "/pay" => Err(GateRefusal::circuit(Some(Duration::from_secs(45)))),
                // Refuses first attempts only: the retry policy's second try passes.
                "/flaky" if !head.headers.contains_key(wire::ATTEMPT) => {
                    Err(GateRefusal::rate(None))
                }
                _ => Ok(()),
            }
        })
        .build()
        .unwrap();
    let release = Arc::new(Semaphore::new(0));
    let served = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let retried_seen = Arc::new(AtomicU32::new(0));
    let work = {
        let (release, served) = (Arc::clone(&release), Arc::clone(&served));
        move |req: AxumRequest| {
            let (release, served) = (Arc::clone(&release), Arc::clone(&served));
            async move {
                let tag = req
                    .headers()
                    .get("x-tag")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                release.acquire().await.unwrap().forget();
                served.lock().push(tag);
                "done"
            }
        }
    };
    let flaky = {
        let seen = Arc::clone(&retried_seen);
        move |req: AxumRequest| {
            let seen = Arc::clone(&seen);
            async move {
                if req.headers().contains_key(wire::ATTEMPT) {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
                "flaky ok"
            }
        }
    };
    let app = Router::new()
        .route("/work", get(work))
        .route(
            "/limited",
            get(|| async { "never" }).post(|| async { "never" }),
        )
        .route("/pay", get(|| async { "never" }))
        .route("/flaky", get(flaky))
        .route("/healthz", get(|| async { "ok" }))
        .route("/grpc.Svc/Call", post(|| async { "never" }))
        .layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server {
        addr,
        layer,
        release,
        served,
        retried_seen,
    }
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get_req(addr: SocketAddr, path: &str) -> http::request::Builder {
    Request::get(format!("http://{addr}{path}"))
}

async fn send(
    client: &HttpClient,
    req: http::request::Builder,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let res = client
        .request(req.body(String::new()).unwrap())
        .await
        .unwrap();
    split(res).await
}

async fn split<B: http_body::Body>(res: Response<B>) -> (StatusCode, http::HeaderMap, Bytes)
where
    B::Error: std::fmt::Debug,
{
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}

/// The refusal in `body`, checked against the status and `Retry-After`, which must lie in
/// `least..=least + JITTER_S` (and be absent for an expired request: retrying is useless).
fn refusal(status: StatusCode, headers: &http::HeaderMap, body: &[u8], least: u64) -> Refusal {
    let r = Refusal::parse_body(body).unwrap_or_else(|| panic!("not a refusal body: {body:?}"));
    assert_eq!(status, r.reason.status());
    assert_eq!(headers[wire::REASON], r.reason.as_str());
    if r.reason == RefusalReason::Expired {
        assert!(headers.get(wire::RETRY_AFTER).is_none());
        assert_eq!(r.retry_after, Duration::ZERO);
        return r;
    }
    let secs = wire::parse_retry_after(headers[wire::RETRY_AFTER].as_bytes())
        .unwrap()
        .as_secs();
    assert!(
        (least..=least + JITTER_S).contains(&secs),
        "Retry-After {secs} outside {least}..={}",
        least + JITTER_S
    );
    assert_eq!(r.retry_after.as_secs(), secs, "body and header agree");
    assert_eq!(headers[wire::REASON], r.reason.as_str());
    r
}

async fn until(mut cond: impl FnMut() -> bool) {
    while !cond() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_eviction_expiry_and_health_at_full_load() {
    let s = server(1, 2).await;
    let c = client();
    let waiting = |s: &Server| {
        let w = s.layer.admission().waiting();
        w.critical + w.high + w.medium + w.sheddable
    };
    // 1. The only slot: held by the handler until released.
    let first = tokio::spawn({
        let c = c.clone();
        let addr = s.addr;
        async move { send(&c, get_req(addr, "/work").header("x-tag", "first")).await }
    });
    until(|| s.layer.admission().limit().in_flight() == 1).await;
    // 2. Two Medium requests wait: the queue is full.
    let mut medium = Vec::new();
    for tag in ["m1", "m2"] {
        medium.push(tokio::spawn({
            let c = c.clone();
            let addr = s.addr;
            async move { send(&c, get_req(addr, "/work").header("x-tag", tag)).await }
        }));
        let n = medium.len();
        until(|| waiting(&s) == n).await;
    }
    // 3. Full, nothing lower than Medium: refused at once, 503 capacity.
    let (status, headers, body) = send(&c, get_req(s.addr, "/work").header("x-tag", "m3")).await;
    let r = refusal(status, &headers, &body, 1);
    assert_eq!(
        (r.reason, r.tier),
        (RefusalReason::Capacity, Criticality::Medium)
    );
    assert_eq!(status, 503);
    // 4. Health is served at this load, without a slot.
    for _ in 0..3 {
        let (status, _, body) = send(&c, get_req(s.addr, "/healthz")).await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    }
    // 5. A trusted Critical request evicts the newest Medium (m2), which is answered at once.
    let critical = tokio::spawn({
        let c = c.clone();
        let addr = s.addr;
        async move {
            send(
                &c,
                get_req(addr, "/work")
                    .header("x-tag", "crit")
                    .header("x-internal", "1")
                    .header(wire::CRITICALITY, "critical"),
            )
            .await
        }
    });
    let (status, headers, body) = medium.pop().unwrap().await.unwrap();
    let r = refusal(status, &headers, &body, 1);
    assert_eq!(
        (r.reason, r.tier),
        (RefusalReason::Capacity, Criticality::Medium)
    );
    until(|| s.layer.admission().waiting().critical == 1).await;
    // 6. An untrusted header does not raise a request: Medium, and the queue is full.
    let (status, headers, body) = send(
        &c,
        get_req(s.addr, "/work").header(wire::CRITICALITY, "critical"),
    )
    .await;
    assert_eq!(
        refusal(status, &headers, &body, 1).tier,
        Criticality::Medium
    );
    // 7. Release the slot three times: Critical, queued after m1, is served before it.
    s.release.add_permits(3);
    let (status, _, body) = first.await.unwrap();
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"done"[..]));
    assert_eq!(critical.await.unwrap().0, StatusCode::OK);
    assert_eq!(medium.pop().unwrap().await.unwrap().0, StatusCode::OK);
    assert_eq!(*s.served.lock(), ["first", "crit", "m1"]);

    // 8. A request whose deadline passes while it waits is answered, never served.
    let hold = tokio::spawn({
        let c = c.clone();
        let addr = s.addr;
        async move { send(&c, get_req(addr, "/work").header("x-tag", "hold")).await }
    });
    until(|| s.layer.admission().limit().in_flight() == 1).await;
    // The header carries whole milliseconds: the deadline the service sees is this one.
    let header = wire::format_deadline_ms(SystemTime::now() + Duration::from_millis(150));
    let deadline = wire::parse_deadline_ms(header.as_bytes()).unwrap();
    let (status, headers, body) = send(
        &c,
        get_req(s.addr, "/work")
            .header("x-tag", "late")
            .header(wire::DEADLINE_MS, header),
    )
    .await;
    let r = refusal(status, &headers, &body, 1);
    assert_eq!(r.reason, RefusalReason::Expired);
    assert!(
        SystemTime::now() >= deadline,
        "answered at its deadline, not before"
    );
    // Already past: refused without waiting.
    let (status, headers, body) = send(
        &c,
        get_req(s.addr, "/work").header(wire::DEADLINE_MS, "1000"),
    )
    .await;
    assert_eq!(
        refusal(status, &headers, &body, 1).reason,
        RefusalReason::Expired
    );
    s.release.add_permits(1);
    assert_eq!(hold.await.unwrap().0, StatusCode::OK);
    assert_eq!(
        *s.served.lock(),
        ["first", "crit", "m1", "hold"],
        "'late' never served"
    );

    let stats = s.layer.stats();
    assert_eq!(stats.served[Criticality::Medium], 3);
    assert_eq!(stats.served[Criticality::Critical], 1);
    assert_eq!(
        stats.refused(Criticality::Medium, RefusalReason::Capacity),
        3
    );
    assert_eq!(
        stats.refused(Criticality::Medium, RefusalReason::Expired),
        2
    );
    assert_eq!(stats.never_shed, 3);
    // The last handler's permit is returned when its future completes, which may be just
    // after the test saw it served: wait for it, boundedly, rather than race it.
    let drained = tokio::time::timeout(
        Duration::from_secs(10),
        until(|| s.layer.admission().limit().in_flight() == 0),
    )
    .await;
    assert!(drained.is_ok(), "a concurrency permit was never returned");
    assert_eq!(s.layer.admission().limit().in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_is_429_circuit_is_503_with_a_longer_wait_grpc_has_its_codes() {
    let s = server(4, 16).await;
    let c = client();
    // 429 for a rate refusal, over many draws so the jitter's range is exercised.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let (status, headers, body) = send(&c, get_req(s.addr, "/limited")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        let r = refusal(status, &headers, &body, 1);
        assert_eq!(
            (r.reason, r.tier),
            (RefusalReason::Rate, Criticality::Medium)
        );
        seen.insert(r.retry_after.as_secs());
    }
    assert!(seen.len() > 1, "jitter varies Retry-After: {seen:?}");
    // An open circuit: 503 with the gate's own, longer wait.
    let (status, headers, body) = send(&c, get_req(s.addr, "/pay")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let r = refusal(status, &headers, &body, 45);
    assert_eq!(
        (r.reason, r.tier),
        (RefusalReason::Circuit, Criticality::Critical)
    );
    // gRPC: trailers-only answers with the gRPC status.
    let grpc = |path: &str| {
        Request::post(format!("http://{}{path}", s.addr))
            .header("content-type", "application/grpc")
            .header(wire::GRPC_TIMEOUT, "5S")
    };
    let (status, headers, body) = send(&c, grpc("/limited")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[wire::GRPC_STATUS], "8");
    assert!(body.is_empty());
    let ms = wire::parse_count(headers[wire::GRPC_RETRY_PUSHBACK_MS].as_bytes()).unwrap();
    assert!(
        (1_000..=(1 + JITTER_S as u32) * 1_000).contains(&ms),
        "{ms}"
    );
    let stats = s.layer.stats();
    assert_eq!(stats.refused(Criticality::Medium, RefusalReason::Rate), 41);
    assert_eq!(
        stats.refused(Criticality::Critical, RefusalReason::Circuit),
        1
    );
    // Nothing here was classified by route but /pay: the rest took the default, counted.
    assert_eq!(stats.unclassified, 41);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_ids_that_come_back_are_counted_once() {
    let s = server(4, 16).await;
    let c = client();
    for id in ["a", "a", "a", "b"] {
        let (status, ..) = send(&c, get_req(s.addr, "/limited").header(wire::REQUEST_ID, id)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    }
    // Untracked without an id.
    send(&c, get_req(s.addr, "/limited")).await;
    let stats = s.layer.reappearance().stats();
    // "a" shed 3 times and came back twice; "b" shed once.
    assert_eq!(stats.shed[Criticality::Medium], 4);
    assert_eq!(stats.reappeared[Criticality::Medium], 2);
    assert_eq!(stats.ratio(Criticality::Medium), Some(0.5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_policy_honours_retry_after_and_is_demoted() {
    let s = server(4, 16).await;
    let c = client();
    let retrying = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryAfterPolicy::default()))
        .service(c);
    let started = tokio::time::Instant::now();
    let res = retrying
        .oneshot(
            get_req(s.addr, "/flaky")
                .header(wire::REQUEST_ID, "once")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let (status, _, body) = split(res).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"flaky ok"[..]));
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited Retry-After"
    );
    assert_eq!(s.retried_seen.load(Ordering::Relaxed), 1);
    let stats = s.layer.stats();
    // The first attempt was Medium (default) and refused; the retry was demoted to Sheddable.
    assert_eq!(stats.refused(Criticality::Medium, RefusalReason::Rate), 1);
    assert_eq!(stats.served[Criticality::Sheddable], 1);
    assert_eq!(
        s.layer.reappearance().stats().reappeared[Criticality::Medium],
        1
    );
}

#[test]
fn public_types_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<TriageLayer>();
    both::<triage_tower::TriageService<Router>>();
    both::<triage_tower::EntryAdmission>();
    both::<triage_tower::Reappearance>();
    both::<RetryAfterPolicy>();
    both::<Classifier>();
    both::<Refusal>();
    both::<TriageConfig>();
    both::<triage_tower::LayerStats>();
    both::<triage_tower::RateGate>();
    both::<triage_tower::CircuitGate>();
    both::<triage_tower::CircuitFeedbackLayer>();
    both::<triage_tower::ReappearanceStats>();
}

/// The core's token buckets and the runtime's circuit breakers, through the real listener:
/// 429 with the bucket's refill time, 503 with the circuit's recovery time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cores_buckets_and_the_runtimes_breakers_as_gates() {
    use triage::admission::{BreakerConfig, BucketConfig, BucketsConfig};
    use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
    use triage_tower::{CircuitGate, RateGate};

    let runtime = Runtime::builder(RuntimeConfig {
        expert: triage::runtime::ExpertConfig {
            breaker: BreakerConfig {
                min_calls: 2,
                recovery_ms: 45_000,
                ..Default::default()
            },
            ..triage::runtime::ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    })
    .start(|_job: Job<u32>| async { Ok::<(), HandlerError>(()) })
    .unwrap();
    let breakers = runtime.breakers();
    let buckets = BucketsConfig {
        sheddable: Some(BucketConfig {
            rate: Some(0.25),
            burst: Some(1),
            ..BucketConfig::default()
        }),
        ..BucketsConfig::default()
    };
    let mut config = TriageConfig::default();
    config.retry_after_jitter = Duration::from_secs(JITTER_S);
    let layer_builder = TriageLayer::builder(config, runtime.concurrency_limit()).classifier(
        Classifier::new()
            .route("/feed", Criticality::Sheddable)
            .route("/pay", Criticality::Critical),
    );
    let circuit = CircuitGate::new(std::sync::Arc::clone(&breakers), |head| {
        head.uri.path().starts_with("/pay").then_some("payments")
    });
    // Admitted requests' answers feed the breakers: inside the triage layer.
    let feedback = circuit.feedback();
    let layer = layer_builder
        .gate(RateGate::new(&buckets).unwrap())
        .gate(circuit)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/feed", get(|| async { "feed" }))
        .route("/pay", get(|| async { "paid" }))
        .route(
            "/pay/down",
            get(|| async { (StatusCode::BAD_GATEWAY, "payments down") }),
        )
        .layer(feedback)
        .layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let c = client();

    // The bucket holds one token: the second Sheddable request is over its rate.
    assert_eq!(send(&c, get_req(addr, "/feed")).await.0, StatusCode::OK);
    let (status, headers, body) = send(&c, get_req(addr, "/feed")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // One token every 4 s.
    let r = refusal(status, &headers, &body, 4);
    assert_eq!(
        (r.reason, r.tier),
        (RefusalReason::Rate, Criticality::Sheddable)
    );

    // One success, then one 502: two calls (min_calls 2), half failed (failure_rate 0.5): the
    // feedback layer opens the circuit.
    assert_eq!(send(&c, get_req(addr, "/pay")).await.0, StatusCode::OK);
    assert_eq!(
        send(&c, get_req(addr, "/pay/down")).await.0,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(
        breakers.state("payments"),
        Some(triage::admission::CircuitState::Open)
    );
    let (status, headers, body) = send(&c, get_req(addr, "/pay")).await;
    let r = refusal(status, &headers, &body, 45);
    assert_eq!(
        (r.reason, r.tier),
        (RefusalReason::Circuit, Criticality::Critical)
    );
    let stats = layer.stats();
    assert_eq!(
        stats.refused(Criticality::Sheddable, RefusalReason::Rate),
        1
    );
    assert_eq!(
        stats.refused(Criticality::Critical, RefusalReason::Circuit),
        1
    );
    assert_eq!(stats.served[Criticality::Critical], 2);
    runtime.shutdown(Duration::from_secs(5)).await;
}
