//! The HTTP entry (`triage-tower`): a sequence of requests with arbitrary paths, header names
//! and bytes through the real [`TriageService`](triage_tower::TriageService), on a mock clock
//! and paused tokio time.
//!
//! Input:
//! - byte 0, the setup: bits 0-1 the slots of the concurrency limit minus one (1 to 4); bit 2
//!   queue-age admission on (default cut-offs) or off; bits 3-4 the entry queue's capacity (1,
//!   2, 4 or 64); bit 5 a rate gate (token buckets: Medium 2/s burst 2, Sheddable 1/s burst
//!   1); bits 6-7 the time between two requests (0, 1 ms, 50 ms or 2 s).
//! - then requests, separated by an empty line (at most [`MAX_REQUESTS`]). A request's first
//!   line is a byte saying what happens to it (`h`: the inner service holds it until every
//!   request has been sent; `d`: its client goes away if it is not answered at once; anything
//!   else: answered at once) followed by the path. Each further
//!   line is a header, `name: value`, bytes as a client sends them (a name or value the `http`
//!   crate refuses is left out, as a server refuses such a request before any layer runs), or
//!   `~N` for a `triage-deadline-ms` N milliseconds (signed decimal) from the wall clock's
//!   now, since an absolute time written in an input cannot follow the clock.
//!
//! Routes: `/checkout` Critical, `/search` High, `/api` Medium, `/recommendations` Sheddable;
//! default tier Medium; a request with an `x-internal` header may name its own tier.
//!
//! Invariants:
//! - a request refused at once holds no slot: the limit's in-flight count is what it was
//!   before the call; a request served at once gives its slot back with its response; after
//!   the last response, nothing is in flight;
//! - every request ends served or answered once every slot is free (or its client went away),
//!   and the layer's counts add up to the requests sent (served + refused + never shed + gone);
//! - the tier a request is served or refused with is never above what trust allows: the
//!   highest of the default and every route whose prefix matches, or anything for a trusted
//!   request, demoted by the request's `triage-attempt`; the inner service is handed one
//!   `triage-criticality`, the entry's (that tier before demotion), and on a never-shed path
//!   none unless trusted;
//! - a request whose deadline header leaves it time is never refused as expired at once; one
//!   whose deadline has passed (`grpc-timeout: 0m`, a `triage-deadline-ms` in the past) is never
//!   served; a served request starts within its deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body::Body as _;
use http_body_util::{Either, Full};
use tokio::sync::watch;
use tower::{Layer, Service};
use triage::admission::{BucketConfig, BucketsConfig, QueueAgeConfig};
use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
use triage::quanta::{Clock, Instant};
use triage::queue::WfqConfig;
use triage::{wire, Criticality, PerTier};
use triage_tower::{Classifier, RateGate, Refusal, TriageConfig, TriageLayer};

use crate::input::{header, lines};

/// The most requests one input sends.
pub const MAX_REQUESTS: usize = 24;

/// The header that makes a request trusted to name its own tier.
const INTERNAL: &str = "x-internal";

/// Where the mock clock starts: a day of uptime, as a monotonic clock reads on a real host.
const UPTIME: Duration = Duration::from_secs(86_400);

/// A request's number, in its extensions, so the inner service can say whom it served.
#[derive(Clone, Copy, Debug)]
struct Id(usize);

/// One request as the input describes it.
struct Spec {
    head: Parts,
    hold: bool,
    /// Its client goes away if it is not answered at once.
    drop: bool,
}

/// What the inner service saw of a request it served.
#[derive(Clone, Debug)]
struct Call {
    id: usize,
    tier: Option<Criticality>,
    /// Every `triage-criticality` value it was handed.
    labels: Vec<Vec<u8>>,
    at: Instant,
}

/// What the harness knows of a request it sent.
#[derive(Clone, Copy, Debug)]
struct Sent {
    /// The highest tier it may be classified in, before retry demotion.
    base_bound: Criticality,
    /// Its `triage-attempt`, as the entry reads it.
    attempt: u32,
    /// May it name its own tier?
    trusted: bool,
    /// Time left by its own deadline headers.
    left: Option<Duration>,
    arrived: Instant,
    never_shed: bool,
}

type Body = Either<(), Full<Bytes>>;

/// The inner service's calls, in order.
#[derive(Default)]
struct Calls(Mutex<Vec<Call>>);

impl Calls {
    fn push(&self, call: Call) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(call);
    }

    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
type Pending =
    Pin<Box<dyn Future<Output = Result<Response<Body>, std::convert::Infallible>> + Send>>;

/// Runs the target on one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    let Some((&setup, rest)) = data.split_first() else {
        return;
    };
    let specs = requests(rest);
    if specs.is_empty() {
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime")
        .block_on(drive(setup, specs));
}

/// The requests of the input, at most [`MAX_REQUESTS`]; ones the `http` crate refuses to
/// build (an invalid path) are left out.
fn requests(data: &[u8]) -> Vec<Spec> {
    let mut specs = Vec::new();
    let mut block: Vec<&[u8]> = Vec::new();
    for line in lines(data).chain(std::iter::once(&b""[..])) {
        if !line.is_empty() {
            block.push(line);
            continue;
        }
        if let Some(spec) = request(&block) {
            specs.push(spec);
            if specs.len() == MAX_REQUESTS {
                break;
            }
        }
        block.clear();
    }
    specs
}

fn request(block: &[&[u8]]) -> Option<Spec> {
    let (first, headers) = block.split_first()?;
    let (&what, path) = first.split_first()?;
    let mut builder = Request::get(path);
    for line in headers {
        if let Some(offset) = line.strip_prefix(b"~") {
            let offset: i64 = std::str::from_utf8(offset).ok()?.trim().parse().ok()?;
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            builder = builder.header(wire::DEADLINE_MS, now.saturating_add(offset).to_string());
            continue;
        }
        let (name, value) = header(line);
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name),
            HeaderValue::from_bytes(value.unwrap_or_default()),
        ) else {
            continue;
        };
        builder = builder.header(name, value);
    }
    let (head, ()) = builder.body(()).ok()?.into_parts();
    Some(Spec {
        head,
        hold: what == b'h',
        drop: what == b'd',
    })
}

/// The layer's configuration and gates from the setup byte.
fn layer(setup: u8, clock: &Clock) -> (TriageLayer, ConcurrencyLimit) {
    let slots = usize::from(setup & 0b11) + 1;
    let mut config = TriageConfig::default();
    // The smallest reappearance tracker: its default table (65,536 ids) would be most of what
    // an input costs, and it is not what this target checks.
    config.reappearance.max_ids = std::num::NonZeroUsize::new(16).expect("16");
    config.queue = WfqConfig {
        capacity: ([1, 2, 4, 64][usize::from((setup >> 3) & 0b11)])
            .try_into()
            .unwrap(),
        ..WfqConfig::default()
    };
    if setup & 0b100 == 0 {
        config.queue.admission = QueueAgeConfig::disabled();
    }
    let limit = ConcurrencyLimit::new(
        Fixed::new(slots).expect("1 to 4 slots").into(),
        TierShares::default(),
    );
    let classifier = Classifier::new()
        .trust_header_when(|head| head.headers.contains_key(INTERNAL))
        .route("/checkout", Criticality::Critical)
        .route("/search", Criticality::High)
        .route("/api", Criticality::Medium)
        .route("/recommendations", Criticality::Sheddable);
    let mut builder = TriageLayer::builder(config, limit.clone())
        .classifier(classifier)
        .clock(clock.clone());
    if setup & 0b10_0000 != 0 {
        let buckets = BucketsConfig {
            medium: Some(BucketConfig {
                rate: Some(2.0),
                burst: Some(2),
                ..BucketConfig::default()
            }),
            sheddable: Some(BucketConfig {
                rate: Some(1.0),
                burst: Some(1),
                ..BucketConfig::default()
            }),
            ..BucketsConfig::default()
        };
        builder =
            builder.gate(RateGate::with_clock(&buckets, clock.clone()).expect("valid buckets"));
    }
    (builder.build().expect("a valid layer"), limit)
}

/// The highest tier `head` may be given before retry demotion: anything when trusted, else
/// the highest of the default and every route whose prefix matches (by bytes: looser than
/// the entry's whole segments, so a bound all the same).
fn base_bound(head: &Parts, default: Criticality) -> Criticality {
    if head.headers.contains_key(INTERNAL) {
        Criticality::Critical
    } else {
        let path = head.uri.path();
        [
            ("/checkout", Criticality::Critical),
            ("/search", Criticality::High),
            ("/api", Criticality::Medium),
            ("/recommendations", Criticality::Sheddable),
        ]
        .into_iter()
        .filter(|(prefix, _)| path.starts_with(prefix))
        .map(|(_, tier)| tier)
        .fold(default, Criticality::max)
    }
}

/// The request's retries so far: its first `triage-attempt`, 0 when absent or malformed.
fn attempt(head: &Parts) -> u32 {
    head.headers
        .get(wire::ATTEMPT)
        .and_then(|v| wire::parse_count(v.as_bytes()))
        .unwrap_or(0)
}

/// Time left by the request's own deadline headers, read as the entry documents them:
/// `triage-deadline-ms` when it parses, else `grpc-timeout` when it parses, else none.
fn time_left(head: &Parts, wall: SystemTime) -> Option<Duration> {
    if let Some(at) = head
        .headers
        .get(wire::DEADLINE_MS)
        .and_then(|v| wire::parse_deadline_ms(v.as_bytes()))
    {
        return Some(at.duration_since(wall).unwrap_or(Duration::ZERO));
    }
    head.headers
        .get(wire::GRPC_TIMEOUT)
        .and_then(|v| wire::parse_grpc_timeout(v.as_bytes()))
}

fn poll_once(fut: &mut Pending) -> Poll<Result<Response<Body>, std::convert::Infallible>> {
    fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// The tier and reason of a refusal, from its answer (the JSON body over HTTP, the message
/// over gRPC); `None` for a served request.
fn refusal(response: &Response<Body>) -> Option<(Criticality, String)> {
    let Either::Right(body) = response.body() else {
        return None;
    };
    if let Some(message) = response.headers().get(wire::GRPC_MESSAGE) {
        // "shed: <reason> (<tier>)"
        let message = String::from_utf8_lossy(message.as_bytes());
        let (reason, tier) = message
            .strip_prefix("shed: ")
            .and_then(|m| m.strip_suffix(')'))
            .and_then(|m| m.split_once(" ("))
            .unwrap_or_else(|| panic!("a gRPC refusal's message: {message:?}"));
        let tier = wire::parse_criticality(tier.as_bytes()).expect("a tier in the message");
        return Some((tier, reason.to_owned()));
    }
    let mut body = body.clone();
    let bytes = match Pin::new(&mut body).poll_frame(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    };
    let refusal = Refusal::parse_body(&bytes)
        .unwrap_or_else(|| panic!("a refusal's body: {:?}", String::from_utf8_lossy(&bytes)));
    Some((refusal.tier, refusal.reason.as_str().to_owned()))
}

async fn drive(setup: u8, specs: Vec<Spec>) {
    let (clock, mock) = Clock::mock();
    mock.increment(UPTIME);
    let step = [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_millis(50),
        Duration::from_secs(2),
    ][usize::from(setup >> 6)];
    let (layer, limit) = layer(setup, &clock);
    let default = TriageConfig::default().default_tier;
    let windows: PerTier<Duration> = TriageConfig::default().tier_window;

    let (release, released) = watch::channel(false);
    let calls = Arc::new(Calls::default());
    let holds: Arc<Vec<bool>> = Arc::new(specs.iter().map(|s| s.hold).collect());
    let inner = {
        let (calls, clock) = (Arc::clone(&calls), clock.clone());
        tower::service_fn(move |req: Request<()>| {
            let id = req.extensions().get::<Id>().expect("the harness's id").0;
            calls.push(Call {
                id,
                tier: req.extensions().get::<Criticality>().copied(),
                labels: req
                    .headers()
                    .get_all(wire::CRITICALITY)
                    .iter()
                    .map(|v| v.as_bytes().to_vec())
                    .collect(),
                at: clock.now(),
            });
            let mut released = released.clone();
            let hold = holds[id];
            async move {
                if hold {
                    let _ = released.wait_for(|r| *r).await;
                }
                Ok::<_, std::convert::Infallible>(Response::new(()))
            }
        })
    };
    let mut service = layer.layer(inner);

    // What the harness knows of each request: its bound, its deadline on the clock (from its
    // headers, or its tier's window once the tier is known), and how it ended.
    let mut sent: Vec<Sent> = Vec::new();
    // A request not answered at its first poll runs on as a task, driven by the executor as a
    // server drives it.
    let mut pending: Vec<(usize, tokio::task::JoinHandle<Response<Body>>)> = Vec::new();
    let mut ended: Vec<(usize, Response<Body>)> = Vec::new();
    let mut gone = 0u64;
    for (id, spec) in specs.into_iter().enumerate() {
        let wall = SystemTime::now();
        let left = time_left(&spec.head, wall);
        let arrived = clock.now();
        let never_shed = TriageConfig::default()
            .never_shed
            .iter()
            .any(|p| p == spec.head.uri.path());
        sent.push(Sent {
            base_bound: base_bound(&spec.head, default),
            attempt: attempt(&spec.head),
            trusted: spec.head.headers.contains_key(INTERNAL),
            left,
            arrived,
            never_shed,
        });

        let drop = spec.drop;
        let mut request = Request::from_parts(spec.head, ());
        request.extensions_mut().insert(Id(id));
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .expect("always ready");
        let before = limit.in_flight();
        let mut fut: Pending = Box::pin(service.call(request));
        match poll_once(&mut fut) {
            Poll::Ready(response) => {
                let response = response.expect("infallible");
                if let Some((_, reason)) = refusal(&response) {
                    assert_eq!(
                        limit.in_flight(),
                        before,
                        "request {id} refused at once ({reason}) holds a slot"
                    );
                    if reason == "expired" {
                        // Refused as expired at once: its own deadline had passed (or left
                        // less than the wall clock moved while the harness ran).
                        assert!(
                            left.is_some_and(|l| l < Duration::from_secs(1)),
                            "request {id} refused as expired at once with {left:?} left"
                        );
                    }
                } else {
                    assert_eq!(
                        limit.in_flight(),
                        before,
                        "request {id} served at once kept its slot after its response"
                    );
                }
                ended.push((id, response));
            }
            Poll::Pending if drop => {
                gone += 1;
                std::mem::drop(fut);
            }
            Poll::Pending => pending.push((
                id,
                tokio::spawn(async move { fut.await.expect("infallible") }),
            )),
        }
        mock.increment(step);
        tokio::time::advance(step).await;
        tokio::task::yield_now().await;
    }

    // Every slot is freed: whatever waits is served or answered, in virtual time.
    release.send_replace(true);
    let waited = tokio::time::timeout(Duration::from_secs(3_600), async {
        let mut out = Vec::new();
        for (id, task) in pending {
            out.push((id, task.await.expect("a request's task")));
        }
        out
    })
    .await
    .expect("a request neither served nor answered an hour after every slot was freed");
    ended.extend(waited);
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        limit.in_flight(),
        0,
        "slots in flight after the last response"
    );

    // Tiers within trust, deadlines kept.
    for (id, response) in &ended {
        let Sent {
            left, never_shed, ..
        } = sent[*id];
        let bound = sent[*id].base_bound.demoted_by(sent[*id].attempt);
        if let Some((tier, _)) = refusal(response) {
            assert!(
                tier <= bound,
                "request {id} refused as {tier:?} above {bound:?}"
            );
        } else if !never_shed {
            assert!(
                !left.is_some_and(|l| l.is_zero()),
                "request {id} served although its deadline had passed"
            );
        }
    }
    let calls = calls.take();
    for call in &calls {
        let Sent {
            base_bound,
            attempt,
            trusted,
            left,
            arrived,
            never_shed,
        } = sent[call.id];
        if never_shed {
            // Not classified: a client's own claim is not handed on unless trusted.
            assert!(
                trusted || call.labels.is_empty(),
                "never-shed request {} handed an untrusted triage-criticality",
                call.id
            );
            continue;
        }
        let tier = call.tier.expect("a served request carries its tier");
        let bound = base_bound.demoted_by(attempt);
        // The header the inner service reads is the entry's own: one value, the tier before
        // demotion, never above what trust allows.
        let [label] = call.labels.as_slice() else {
            panic!(
                "request {} handed {} triage-criticality values",
                call.id,
                call.labels.len()
            );
        };
        let base = wire::parse_criticality(label).expect("the entry writes a label");
        assert!(
            base <= base_bound,
            "request {} handed {base:?} above {base_bound:?}",
            call.id
        );
        assert_eq!(base.demoted_by(attempt), tier, "request {}", call.id);
        assert!(
            tier <= bound,
            "request {} served as {tier:?} above {bound:?}",
            call.id
        );
        let window = left.unwrap_or(windows[tier]);
        assert!(
            arrived
                .checked_add(window)
                .is_none_or(|deadline| call.at <= deadline),
            "request {} started {:?} after arrival, its deadline {window:?}",
            call.id,
            call.at.saturating_duration_since(arrived)
        );
    }

    // Every request counted once.
    let stats = layer.stats();
    let served: u64 = Criticality::ALL.iter().map(|t| stats.served[*t]).sum();
    let refused: u64 = Criticality::ALL
        .iter()
        .map(|t| stats.refused[*t].iter().sum::<u64>())
        .sum();
    assert_eq!(
        served + refused + stats.never_shed + gone,
        sent.len() as u64,
        "served {served} + refused {refused} + never shed {} + gone {gone} of {} sent",
        stats.never_shed,
        sent.len()
    );
    // A request whose client went away while served reached the inner service uncounted.
    let served_calls = calls.iter().filter(|c| !sent[c.id].never_shed).count() as u64;
    assert!(
        served <= served_calls && served_calls <= served + gone,
        "served {served} counted, {served_calls} inner calls, {gone} gone"
    );
}
