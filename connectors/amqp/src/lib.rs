//! RabbitMQ (AMQP 0-9-1) connector for [triage], on [lapin] and tokio.
//!
//! - [`AmqpSource`]: consumes a queue with a bounded prefetch, classifies each delivery from
//!   its `priority` property or a trusted header (never the body), and settles it exactly
//!   once after its disposition.
//! - [`AmqpDeferSink`]: re-publishes deferred or dead-lettered messages to a durable queue
//!   with publisher confirms; `Ok` only once the broker confirmed.
//! - [`metrics`]: every metric recorded, under `triage_amqp_`.
//! - [`stamp`] and [`stamped`]: a handler's follow-up messages carry its criticality and
//!   deadline to the next hop ([`Job::propagation`](triage::runtime::Job::propagation)).
//!
//! Delivery is at-least-once: a delivery whose settlement did not reach the broker (crash,
//! lost connection) is redelivered with the `redelivered` flag, so handlers must be
//! idempotent.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]
#![doc(test(attr(deny(warnings))))]

mod connection;
mod error;
mod message;
pub mod metrics;
mod propagate;
mod sink;
mod source;

pub use connection::ReconnectConfig;
pub use error::AmqpError;
pub use message::AmqpMessage;
pub use metrics::AmqpSourceStats;
pub use propagate::{stamp, stamped};
pub use sink::{AmqpDeferSink, AmqpSinkConfig};
pub use source::{
    AmqpSource, AmqpSourceConfig, AmqpStatsHandle, ClassifyConfig, DeadlineConfig, PriorityMapping,
    QueueDeclareConfig, TierQueue,
};

#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use source::fuzzing;

/// Re-exported: the AMQP client, for its property and field-table types.
pub use lapin;
