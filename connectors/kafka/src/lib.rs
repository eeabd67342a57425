//! Kafka connector for triage (work in progress).
#![warn(missing_docs)]
