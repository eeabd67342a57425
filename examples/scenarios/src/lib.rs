//! The scenario matrix of issue 33, in virtual time.
//!
//! A [`Scenario`] is a seed, an arrival process (offered load over time as a multiple of
//! capacity, drawn as a Poisson process), a service-time process, the handler's outcomes, a
//! message mix (tiers and deadlines) and what else the workload brings (a backlog, a hot key,
//! payload sizes, producers that re-submit shed work). [`run_virtual`] runs one through a
//! [`Consumer`] (a plain bounded FIFO, or the triage runtime with a `RuntimeConfig`) on
//! tokio's paused clock with triage's mock clock following it: minutes of traffic run in
//! seconds, and the same seed gives the same ledger. [`grid`] is the search for the best
//! hand-tuned settings; [`report`] renders the report of record.
//!
//! Goodput is judged from the producer's side: a message counts when its first successful
//! handler call ended by its deadline, whatever consumer served it.
#![warn(missing_docs, missing_debug_implementations)]

pub mod arrival;
pub mod broker;
pub mod clock;
pub mod consumer;
pub mod fifo;
pub mod generate;
pub mod goodput;
pub mod grid;
mod hash;
pub mod mix;
pub mod msg;
pub mod outcome;
pub mod recovery;
pub mod report;
pub mod run;
pub mod scenario;
pub mod service;
pub mod tally;
pub mod triaged;
pub mod users;
pub mod work;

pub use consumer::Consumer;
pub use goodput::Goodput;
pub use outcome::Outcome;
pub use run::{run_real_time, run_virtual};
pub use scenario::{matrix, Scenario};
