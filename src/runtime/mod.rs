//! The worker runtime: sources -> admission -> queue -> workers -> handler, with every message
//! ending in exactly one recorded disposition.

mod ack;
mod envelope;
mod job;
mod sink;
mod source;

pub use ack::{Ack, AckRef, AckSink};
pub use envelope::Envelope;
pub use job::{HandlerError, Job, LoadLevel};
pub use sink::{DeadLetterSink, DeferReason, DeferSink, Republish, SinkError};
pub use source::Source;
