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
pub mod sink;
pub mod source;

pub use error::Error;
pub use message::KafkaMessage;
pub use sink::{KafkaDeferSink, KafkaSinkConfig};
pub use source::{KafkaSource, KafkaSourceBuilder, KafkaSourceConfig};

/// Re-exported: the Kafka client this connector is built on, for admin and test code.
pub use rdkafka;
