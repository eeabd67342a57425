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
//!
//! Time is read from an injectable [`quanta::Clock`], so tests run on a mock clock.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]
#![doc(test(attr(deny(warnings))))]

pub mod admission;
mod criticality;
mod error;
pub mod ledger;
pub mod limit;
#[cfg(feature = "prometheus")]
pub mod observe;
pub mod queue;
pub mod runtime;
mod tier;

pub use criticality::{Criticality, ParseCriticalityError};
pub use error::ConfigError;
pub use tier::PerTier;

/// Re-exported: the clock triage reads time from (`Clock::new()` in production,
/// `Clock::mock()` in tests).
pub use quanta;
