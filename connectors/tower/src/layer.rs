//! The tower [`Layer`]: configuration, classification, gates, admission and the
//! reappearance tracker, shared by every service it wraps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::Response;
use http_body_util::Full;
use tower::Layer;
use triage::limit::ConcurrencyLimit;
use triage::quanta::{Clock, Instant};
use triage::{wire, ConfigError, Criticality, PerTier};

use crate::classify::{self, Classifier};
use crate::metrics::Handles;
use crate::refusal::Rendered;
use crate::{EntryAdmission, Gate, Reappearance, Refusal, RefusalReason, TriageConfig};

/// The widest `Retry-After` jitter, in seconds, whose answers are rendered in advance.
const MAX_RENDERED_JITTER_S: u64 = 60;

/// Where the id of a request comes from, for the reappearance tracker.
type IdOf = Arc<dyn Fn(&Parts) -> Option<&[u8]> + Send + Sync>;

/// A tower layer that admits requests through triage before the inner service runs.
///
/// For each request, from its head only (no body is read, nothing is authenticated first):
///
/// 1. a path in [`TriageConfig::never_shed`] goes straight to the inner service;
/// 2. the [`Classifier`] gives its tier (demoted per retry) and the deadline comes from
///    `triage-deadline-ms`, `grpc-timeout` or the tier's window;
/// 3. each [`Gate`] may refuse it (a token bucket: 429; an open circuit: 503 with a longer
///    `Retry-After`); what a gate took for a request refused later (a token, a probe slot) is
///    given back ([`Gate::refund`]);
/// 4. it takes a slot of the shared concurrency limit, at once when nobody waits, else it
///    waits in the [`EntryAdmission`] queue (weighted-fair, bounded, queue-age cut-offs):
///    refused at once when not admitted, refused when evicted, answered when its deadline
///    passes, never served late;
/// 5. the inner service runs holding the slot, with the request's tier (a [`Criticality`])
///    in its extensions (for brownout: `req.extensions().get::<Criticality>()`) and
///    `triage-criticality` set to the tier the entry trusts (a client's own claim never
///    reaches it); its latency feeds the limit's algorithm.
///
/// Refusals are answered by [`Refusal::http_response`] (503 or 429, `Retry-After` with
/// jitter, a JSON body) or, for `content-type: application/grpc`, by
/// [`Refusal::grpc_response`]. Ids of shed requests (`x-request-id` by default) go to the
/// [`Reappearance`] tracker.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use tower::{service_fn, Layer, Service, ServiceExt};
/// use triage::limit::{ConcurrencyLimit, Fixed, TierShares};
/// use triage::Criticality;
/// use triage_tower::{Classifier, TriageConfig, TriageLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Share `runtime.concurrency_limit()` instead to draw on a worker runtime's capacity.
/// let limit = ConcurrencyLimit::new(Fixed::new(8)?.into(), TierShares::default());
/// let layer = TriageLayer::builder(TriageConfig::default(), limit)
///     .classifier(Classifier::new().route("/checkout", Criticality::Critical))
///     // A token bucket would go here; this one refuses everything on /limited.
///     .gate(|_tier: Criticality, head: &http::request::Parts| {
///         if head.uri.path() == "/limited" {
///             return Err(triage_tower::GateRefusal::rate(None));
///         }
///         Ok(())
///     })
///     .build()?;
/// let mut service = layer.layer(service_fn(|_req: Request<String>| async {
///     Ok::<_, Infallible>(Response::new(String::from("served")))
/// }));
///
/// let ok = service.ready().await?.call(Request::get("/checkout").body(String::new())?).await?;
/// assert_eq!(ok.status(), 200);
/// let refused = service.ready().await?.call(Request::get("/limited").body(String::new())?).await?;
/// assert_eq!(refused.status(), 429);
/// assert!(refused.headers().contains_key("retry-after"));
/// assert_eq!(layer.stats().served[Criticality::Critical], 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TriageLayer {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for TriageLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TriageLayer")
            .field("config", &self.shared.config)
            .field("classifier", &self.shared.classifier)
            .field("gates", &self.shared.gates.len())
            .field("admission", &self.shared.admission)
            .finish()
    }
}

/// Builds a [`TriageLayer`].
#[must_use]
pub struct TriageLayerBuilder {
    config: TriageConfig,
    limit: ConcurrencyLimit,
    classifier: Classifier,
    gates: Vec<Arc<dyn Gate>>,
    id_of: Option<IdOf>,
    clock: Clock,
}

impl std::fmt::Debug for TriageLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TriageLayerBuilder")
            .field("config", &self.config)
            .field("classifier", &self.classifier)
            .finish_non_exhaustive()
    }
}

impl TriageLayerBuilder {
    /// Classifies requests with `classifier` (default: nothing trusted, no routes, so every
    /// request gets [`TriageConfig::default_tier`]).
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Adds a gate, run after classification and before waiting for a slot.
    pub fn gate(mut self, gate: impl Gate) -> Self {
        self.gates.push(Arc::new(gate));
        self
    }

    /// Takes the reappearance id from `id_of` (a client key, an API token's hash) instead of
    /// the `x-request-id` header; `None` from it means the request is not tracked.
    pub fn request_id(
        mut self,
        id_of: impl Fn(&Parts) -> Option<&[u8]> + Send + Sync + 'static,
    ) -> Self {
        self.id_of = Some(Arc::new(id_of));
        self
    }

    /// Reads time from `clock` (deadlines, queue age, latency).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The layer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when the configuration is out of range
    /// ([`TriageConfig::validate`]).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (the entry queue spawns its dispatcher).
    pub fn build(self) -> Result<TriageLayer, ConfigError> {
        self.config.validate()?;
        let admission =
            EntryAdmission::with_clock(self.config.queue.clone(), self.limit, self.clock.clone())?;
        let reappearance =
            Reappearance::with_clock(self.config.reappearance, self.clock.clone()).with_metrics();
        let id_of = self.id_of.unwrap_or_else(|| {
            Arc::new(|head: &Parts| {
                head.headers
                    .get(crate::names::REQUEST_ID)
                    .map(|v| v.as_bytes())
            })
        });
        let jitter_s = self.config.retry_after_jitter.as_secs();
        // Every answer a refusal without a gate's own wait can get, rendered now: a refusal
        // then copies reference-counted bytes. Not for a jitter so wide the table would be big.
        let rendered = if jitter_s <= MAX_RENDERED_JITTER_S {
            let mut all = Vec::new();
            for reason in RefusalReason::ALL {
                for rank in 0..4 {
                    let tier = Criticality::from_rank(rank).unwrap_or(Criticality::Sheddable);
                    for j in 0..=jitter_s {
                        let wait = self.config.retry_after.of(reason) + Duration::from_secs(j);
                        all.push(Rendered::new(&Refusal::new(reason, tier, wait)));
                    }
                }
            }
            all
        } else {
            Vec::new()
        };
        Ok(TriageLayer {
            shared: Arc::new(Shared {
                never_shed: self.config.never_shed.clone(),
                jitter_s,
                rendered,
                config: self.config,
                classifier: self.classifier,
                gates: self.gates,
                admission,
                reappearance,
                id_of,
                metrics: Handles::register(),
                counts: Counts::default(),
                clock: self.clock,
            }),
        })
    }
}

impl TriageLayer {
    /// A builder admitting through `limit`: a new one, or a worker runtime's
    /// ([`Runtime::concurrency_limit`](triage::runtime::Runtime::concurrency_limit)) so that
    /// requests and background work share one capacity.
    pub fn builder(config: TriageConfig, limit: ConcurrencyLimit) -> TriageLayerBuilder {
        TriageLayerBuilder {
            config,
            limit,
            classifier: Classifier::new(),
            gates: Vec::new(),
            id_of: None,
            clock: Clock::new(),
        }
    }

    /// Counts since the layer was built.
    pub fn stats(&self) -> LayerStats {
        self.shared.counts.snapshot()
    }

    /// The retry-reappearance tracker.
    pub fn reappearance(&self) -> &Reappearance {
        &self.shared.reappearance
    }

    /// The entry queue and its shared limit.
    pub fn admission(&self) -> &EntryAdmission {
        &self.shared.admission
    }
}

impl<S> Layer<S> for TriageLayer {
    type Service = crate::TriageService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::TriageService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Counts of a layer's decisions since it was built, per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LayerStats {
    /// Requests served (the inner service ran).
    pub served: PerTier<u64>,
    /// Of those, the ones that finished within their deadline.
    pub goodput: PerTier<u64>,
    /// Refused requests by reason, indexed in [`RefusalReason::ALL`] order (capacity,
    /// expired, rate, circuit).
    pub refused: PerTier<[u64; 4]>,
    /// Requests given the default tier.
    pub unclassified: u64,
    /// Requests whose deadline header (`triage-deadline-ms`, `grpc-timeout`) did not parse;
    /// they were given the tier's window.
    pub malformed_deadline: u64,
    /// Requests on never-shed paths.
    pub never_shed: u64,
}

impl LayerStats {
    /// Refusals of `tier` for `reason`.
    pub fn refused(&self, tier: Criticality, reason: RefusalReason) -> u64 {
        self.refused[tier][reason.index()]
    }
}

#[derive(Default)]
pub(crate) struct Counts {
    served: [AtomicU64; 4],
    goodput: [AtomicU64; 4],
    refused: [[AtomicU64; 4]; 4],
    unclassified: AtomicU64,
    malformed_deadline: AtomicU64,
    never_shed: AtomicU64,
}

impl Counts {
    fn snapshot(&self) -> LayerStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LayerStats {
            served: PerTier::from_fn(|t| load(&self.served[t.rank()])),
            goodput: PerTier::from_fn(|t| load(&self.goodput[t.rank()])),
            refused: PerTier::from_fn(|t| self.refused[t.rank()].each_ref().map(load)),
            unclassified: load(&self.unclassified),
            malformed_deadline: load(&self.malformed_deadline),
            never_shed: load(&self.never_shed),
        }
    }
}

/// What every service of one layer shares.
pub(crate) struct Shared {
    pub(crate) config: TriageConfig,
    never_shed: Vec<String>,
    jitter_s: u64,
    /// By `(reason index x 4 + tier rank) x (jitter_s + 1) + jitter`; empty when the jitter
    /// is wider than `MAX_RENDERED_JITTER_S`.
    rendered: Vec<Rendered>,
    pub(crate) classifier: Classifier,
    pub(crate) gates: Vec<Arc<dyn Gate>>,
    pub(crate) admission: EntryAdmission,
    pub(crate) reappearance: Reappearance,
    id_of: IdOf,
    pub(crate) metrics: Handles,
    counts: Counts,
    pub(crate) clock: Clock,
}

/// A request's facts, decided from its head.
pub(crate) struct Decided {
    /// The tier before retry demotion.
    pub(crate) base: Criticality,
    pub(crate) tier: Criticality,
    pub(crate) deadline: Instant,
    pub(crate) id: Option<u64>,
    pub(crate) grpc: bool,
    pub(crate) started: Instant,
}

impl Shared {
    /// What the inner service sees of the request's class: its tier in the extensions, and
    /// `triage-criticality` overwritten with the tier the entry trusts (before demotion, as
    /// the wire contract defines the header), never a client's claim.
    pub(crate) fn stamp(&self, d: &Decided, head: &mut Parts) {
        head.extensions.insert(d.tier);
        head.headers.insert(
            crate::names::CRITICALITY,
            http::HeaderValue::from_static(d.base.as_str()),
        );
    }

    /// On a never-shed path (not classified): removes an untrusted `triage-criticality`, so a
    /// handler there cannot read a client's claim either.
    pub(crate) fn strip_untrusted(&self, head: &mut Parts) {
        if head.headers.contains_key(crate::names::CRITICALITY) && !self.classifier.trusts(head) {
            head.headers.remove(crate::names::CRITICALITY);
        }
    }

    pub(crate) fn is_never_shed(&self, head: &Parts) -> bool {
        let path = head.uri.path();
        if self.never_shed.iter().any(|p| p == path) {
            self.counts.never_shed.fetch_add(1, Ordering::Relaxed);
            self.metrics.never_shed.increment(1);
            return true;
        }
        false
    }

    /// Classification, deadline, id (and its reappearance), from the head.
    pub(crate) fn decide(&self, head: &Parts) -> Decided {
        let started = self.clock.now();
        let (base, tier, classified) = self.classifier.classify(head, self.config.default_tier);
        if !classified {
            self.counts.unclassified.fetch_add(1, Ordering::Relaxed);
            self.metrics.unclassified.increment(1);
        }
        let id = (self.id_of)(head).map(|id| self.reappearance.hash(id));
        if let Some(id) = id {
            self.reappearance.arrived(id);
        }
        if classify::deadline_malformed(head) {
            self.counts
                .malformed_deadline
                .fetch_add(1, Ordering::Relaxed);
            self.metrics.malformed_deadline.increment(1);
        }
        // A client's own deadline may shorten its tier's window; only a trusted one may
        // lengthen it (an untrusted `triage-deadline-ms` an hour ahead would otherwise keep a
        // request queued an hour where its tier's work is useful for 250 ms), as the brokers'
        // sources read the deadline header only on trusted topics and queues.
        let tier_window = self.config.tier_window[tier];
        let window = match classify::remaining(head) {
            Some(own) if self.classifier.trusts(head) => own,
            Some(own) => own.min(tier_window),
            None => tier_window,
        };
        Decided {
            base,
            tier,
            // Time left from a header may be anything a client writes: saturating.
            deadline: wire::deadline_after(started, window),
            id,
            grpc: classify::is_grpc(head),
            started,
        }
    }

    /// Gives back what the first `passed` gates took for a request refused after them, the
    /// last one first.
    pub(crate) fn refund(&self, tier: Criticality, head: &mut Parts, passed: usize) {
        for gate in self.gates[..passed].iter().rev() {
            gate.refund(tier, head);
        }
    }

    /// The answer to a refused request, counted, its id remembered.
    pub(crate) fn refuse(
        &self,
        d: &Decided,
        reason: RefusalReason,
        wait: Option<Duration>,
    ) -> Response<Full<Bytes>> {
        let least = self.config.retry_after.of(reason);
        let wait = wait.map_or(least, |w| w.max(least));
        let jitter = fastrand::u64(0..=self.jitter_s);
        let rank = d.tier.rank();
        let index = (reason.index() * 4 + rank) * (self.jitter_s as usize + 1) + jitter as usize;
        let fresh;
        let rendered = match self.rendered.get(index) {
            Some(r) if wait == least => r,
            _ => {
                let wait = wait.saturating_add(Duration::from_secs(jitter));
                let refusal = Refusal::new(reason, d.tier, wait);
                fresh = Rendered::new(&refusal);
                &fresh
            }
        };
        let response = if d.grpc {
            rendered.grpc()
        } else {
            rendered.http()
        };
        self.refused(d.tier, reason, d.id, d.started);
        response
    }

    /// Counts a refusal of a `tier` request that arrived at `started`, its id remembered.
    pub(crate) fn refused(
        &self,
        tier: Criticality,
        reason: RefusalReason,
        id: Option<u64>,
        started: Instant,
    ) {
        let rank = tier.rank();
        self.counts.refused[rank][reason.index()].fetch_add(1, Ordering::Relaxed);
        self.metrics.refused[rank][reason.index()].increment(1);
        if let Some(id) = id {
            self.reappearance.shed(id, tier);
        }
        let elapsed = self.clock.now().saturating_duration_since(started);
        self.metrics.refused_seconds[rank].record(elapsed.as_secs_f64());
    }

    /// Records a served request that finished at `finished`.
    pub(crate) fn served(&self, tier: Criticality, deadline: Instant, started: Instant) {
        let finished = self.clock.now();
        let rank = tier.rank();
        self.counts.served[rank].fetch_add(1, Ordering::Relaxed);
        self.metrics.served[rank].increment(1);
        if finished <= deadline {
            self.counts.goodput[rank].fetch_add(1, Ordering::Relaxed);
            self.metrics.goodput[rank].increment(1);
        }
        self.metrics.served_seconds[rank]
            .record(finished.saturating_duration_since(started).as_secs_f64());
    }
}
