//! # triage-kafka
//!
//! Kafka connector for [triage]: a consumer-group [`KafkaSource`] that classifies
//! messages from headers, topic and timestamp (never the payload) and commits only the
//! contiguous watermark of settled offsets, and a [`KafkaDeferSink`] that re-publishes deferred
//! or dead-lettered messages to a durable topic and reports success only after the broker's
//! `acks=all` delivery report.
//!
//! - [`source`]: [`KafkaSource`], its [`KafkaSourceConfig`], classification and offsets.
//! - [`sink`]: [`KafkaDeferSink`] and its [`KafkaSinkConfig`]; the `triage-*` headers it writes
//!   and the source reads are the core's wire contract, [`triage::wire`].
//! - [`drain`]: the defer topic consumed back as a source; each copy keeps its tier.
//! - [`metrics`]: every metric this crate records (names under `triage_kafka_`).
//! - [`stamp`]: a handler's follow-up records carry its criticality and deadline to the next
//!   hop ([`Job::propagation`](triage::runtime::Job::propagation)).
//!
//! ## Layouts
//!
//! - **A topic per tier** (strict protection): subscribe one source to, say, `orders.critical`,
//!   `orders.high`, `orders.medium` and `orders.sheddable`, mapped in
//!   [`CriticalityConfig::topic_tiers`](source::CriticalityConfig::topic_tiers). While the
//!   runtime sheds a tier, the source pauses that tier's partitions
//!   ([`Source::pause_tiers`](triage::runtime::Source::pause_tiers)): their records wait in the
//!   broker and a Critical record never waits behind them.
//! - **One mixed topic**, labelled by the `triage-criticality` header on a trusted topic: in one
//!   partition a Critical record is reached only by consuming everything in front of it, so
//!   lower tiers in front of it are deferred (or held) to make room.
//!
//! ## Limits that must agree
//!
//! Every record the source reads may have to be re-published to the defer or dead-letter
//! topic, with triage's headers added. A source given its sinks with
//! [`KafkaSourceBuilder::republish_to`] refuses to start unless its `max_payload_bytes` plus
//! [`KafkaSinkConfig::HEADROOM_BYTES`] fits each sink's `max_message_bytes` (the defaults
//! agree); the destination topics' own `max.message.bytes` must allow as much.
//!
//! Built on rdkafka (librdkafka compiled from source). The connector never touches the core
//! crate's internals: it implements [`triage::runtime::Source`],
//! [`triage::runtime::AckSink`], [`triage::runtime::DeferSink`] and
//! [`triage::runtime::DeadLetterSink`].
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]
#![doc(test(attr(deny(warnings))))]

pub mod drain;
mod error;
mod message;
pub mod metrics;
mod propagate;
pub mod sink;
pub mod source;

pub use error::Error;
pub use message::KafkaMessage;
pub use propagate::stamp;
pub use sink::{KafkaDeferSink, KafkaSinkConfig, REFERENCE_PAYLOAD_BYTES};
pub use source::{KafkaSource, KafkaSourceBuilder, KafkaSourceConfig};

/// Re-exported: the Kafka client this connector is built on, for admin and test code.
pub use rdkafka;
