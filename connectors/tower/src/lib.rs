//! # triage-tower
//!
//! triage's admission at an HTTP or gRPC entry: a tower [`Layer`](tower::Layer) over any
//! `http::Request`, usable with axum, hyper and tonic, that decides from the request head,
//! before anything expensive runs, whether a request is served, waits, or is answered at once.
//!
//! - [`TriageLayer`]: classification ([`Classifier`]: a trusted header, a closure, a route
//!   table), deadlines (`triage-deadline-ms`, `grpc-timeout`, or the tier's window), gates
//!   ([`Gate`]; the core's token buckets as [`RateGate`], its circuit breakers as
//!   [`CircuitGate`]), and admission ([`EntryAdmission`]: a
//!   bounded weighted-fair queue in front of a [`ConcurrencyLimit`](triage::limit::ConcurrencyLimit)
//!   that a worker [`Runtime`](triage::runtime::Runtime) in the same process can share, so
//!   HTTP and background work draw on one capacity).
//! - Refusals ([`Refusal`]): 503 with `Retry-After` for capacity, 503 without one for an
//!   expired request (retrying it is useless), 429 for a rate refusal, 503 with a longer
//!   `Retry-After` for an open circuit; gRPC
//!   `UNAVAILABLE`, `RESOURCE_EXHAUSTED` and `DEADLINE_EXCEEDED` for gRPC calls; a short JSON
//!   body; jitter on `Retry-After`.
//! - Paths never shed (health, readiness, metrics).
//! - [`Reappearance`]: how many shed requests come back within the backoff window, per tier.
//! - [`RetryAfterPolicy`]: the client side: honours `Retry-After`, backs off with full jitter,
//!   caps retries as a fraction of traffic, demotes retries.
//!
//! The ideas come from the load-shedding articles triage was designed from: shed at service
//! entry on path and headers (a rejection must cost far less than a success), 503 vs 429,
//! `Retry-After`, never shed health checks, and measure whether shedding reduced demand or
//! only relabelled it.
//!
//! gRPC: refusals are written as trailers-only gRPC responses on plain `http` types
//! (`grpc-status` in the headers), which tonic clients read; the crate does not depend on
//! tonic, whose build (prost, its codegen) would dwarf this crate's.
//!
//! # Example
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use triage::runtime::{HandlerError, Job, Runtime, RuntimeConfig};
//! use triage::Criticality;
//! use triage_tower::{Classifier, TriageConfig, TriageLayer};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Background work and HTTP requests share the runtime's 8 slots.
//! let runtime = Runtime::builder(RuntimeConfig::default())
//!     .start(|_job: Job<String>| async { Ok::<(), HandlerError>(()) })?;
//! let layer = TriageLayer::builder(TriageConfig::default(), runtime.concurrency_limit())
//!     .classifier(Classifier::new().route("/checkout", Criticality::Critical))
//!     .build()?;
//! let app = Router::new()
//!     .route("/checkout", get(|| async { "paid" }))
//!     .route("/healthz", get(|| async { "ok" }))  // never shed
//!     .layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]
#![doc(test(attr(deny(warnings))))]

mod classify;
mod config;
mod entry;
mod gate;
mod gates;
mod layer;
pub mod metrics;
mod names;
mod reappearance;
mod refusal;
mod retry;
mod service;

pub use classify::Classifier;
pub use config::{ReappearanceConfig, RetryAfter, TriageConfig};
pub use entry::EntryAdmission;
pub use gate::{Gate, GateRefusal};
pub use gates::{
    CircuitFeedback, CircuitFeedbackFuture, CircuitFeedbackLayer, CircuitGate, RateGate,
};
pub use layer::{LayerStats, TriageLayer, TriageLayerBuilder};
pub use reappearance::{Reappearance, ReappearanceStats};
pub use refusal::{Refusal, RefusalReason};
pub use retry::{overload_wait, RetryAfterPolicy};
pub use service::{ResponseFuture, TriageBody, TriageService};
