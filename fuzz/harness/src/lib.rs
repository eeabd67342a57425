//! The bodies of triage's fuzz targets: everything that comes from outside, driven through the
//! code that reads it, each target asserting invariants and not only the absence of a panic.
//!
//! Each module has one `run(data: &[u8])`, called by its cargo-fuzz target in `fuzz/fuzz_targets/`
//! (libFuzzer, nightly) and by `tests/corpus.rs`, which replays the committed corpora and crash
//! reproducers on stable as part of the test suite. A failed invariant panics with what broke.
//!
//! - [`wire`]: the core's header parsers and formatters (`triage::wire`), against reference
//!   models computed in wide integers.
//! - [`http_entry`]: a sequence of requests with arbitrary paths, header names and bytes through
//!   the real tower service of `triage-tower`: no refused request holds a slot, every request
//!   ends served or answered, a tier never rises above what trust allows, a deadline header
//!   with time left is never refused as expired at once.
//! - [`kafka`]: the Kafka source's classification of a record's topic, key, headers and
//!   timestamp, and the mapping of its deadline onto the clock.
//! - [`amqp`]: the RabbitMQ source's classification of a delivery's properties, parsed from
//!   their wire form by lapin's own parser.
//! - [`config`]: the runtime's TOML configuration with arbitrary values at every key, started
//!   and applied live: a configuration applies whole or changes nothing.
//!
//! The inputs are bytes whose layout each module documents; `fuzz/seeds.rs` writes the seeds.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod amqp;
pub mod config;
pub mod http_entry;
mod input;
pub mod kafka;
pub mod wire;

/// A target's body: runs one input, panics when an invariant breaks.
pub type Target = fn(&[u8]);

/// Every target by name, as in `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/`.
pub const TARGETS: [(&str, Target); 5] = [
    ("wire", wire::run),
    ("http_entry", http_entry::run),
    ("kafka_classify", kafka::run),
    ("amqp_classify", amqp::run),
    ("config", config::run),
];
