//! # triage
//!
//! Overload control for background workers and stream processors: which messages to serve,
//! defer or drop when more arrives than can be served, decided without spending the capacity
//! it is trying to save.
//!
//! - [`Criticality`]: the four-level ladder, retries demoted one level.
//! - [`queue::WfqQueue`]: the bounded weighted-fair queue: weighted dequeue, eviction of the
//!   newest item of the lowest tier when full, deadline expiry at dequeue.
//! - [`admission`]: queue-age cut-offs per tier, with hysteresis.
//! - [`limit`]: concurrency limits (fixed, AIMD, Gradient2) and each tier's share of them.
//! - [`ordering`]: per-key (or per-partition) sequential processing, parallel across keys.
//! - [`ledger`]: dispositions, per-tier counters, the per-partition acknowledgement watermark.
//! - [`runtime`]: sources -> admission -> queue -> workers -> handler, refusal policies
//!   (backpressure, defer, drop), retries with demotion, dead letters, graceful shutdown,
//!   metrics through the [`metrics`] facade.
//! - `observe` (feature `prometheus`): the Prometheus and liveness endpoint.
//!
//! The broker connectors are crates of their own: `triage-kafka` and `triage-amqp`.
//!
//! Time is read from an injectable [`quanta::Clock`], so tests run on a mock clock.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use triage::runtime::{HandlerError, Job, MemoryBroker, Runtime, RuntimeConfig};
//! use triage::Criticality;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.publish("pay invoice 17", Criticality::Critical, None);
//! broker.publish("refresh recommendations", Criticality::Sheddable, None);
//! broker.close();
//!
//! let mut runtime = Runtime::builder(RuntimeConfig::default())
//!     .start(|job: Job<&'static str>| async move {
//!         println!("{} at {}", job.payload(), job.criticality());
//!         Ok::<(), HandlerError>(())
//!     })?;
//! runtime.attach(broker.source());
//! runtime.wait_idle().await;
//! let report = runtime.shutdown(Duration::from_secs(5)).await;
//! assert!(report.stats.balances());
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]
#![doc(test(attr(deny(warnings))))]

pub mod admission;
mod config_de;
mod criticality;
mod error;
pub mod ledger;
pub mod limit;
mod loom;
#[cfg(feature = "prometheus")]
pub mod observe;
pub mod ordering;
pub mod queue;
pub mod runtime;
mod sync;
mod tier;
pub mod wire;

pub use criticality::{Criticality, ParseCriticalityError};
pub use error::ConfigError;
pub use tier::PerTier;

/// Re-exported: the clock triage reads time from (`Clock::new()` in production,
/// `Clock::mock()` in tests).
pub use quanta;
