//! Dispositions and safe acknowledgement.
//!
//! Every message consumed from a source ends in exactly one [`Disposition`]:
//! completed, failed (dead-lettered), deferred (durably re-published), expired
//! or shed. Its source offset (Kafka) or delivery tag (RabbitMQ) may be
//! acknowledged only after that. Messages finish out of order (priorities,
//! concurrency, retries), so a message cannot simply acknowledge its own
//! offset: Kafka commits a position that covers everything below it, and a
//! lost worker would lose the unfinished messages below.
//!
//! # The invariant
//!
//! [`AckTracker`] keeps, per source partition (or per AMQP channel), the
//! **contiguous watermark**: position N may be committed only when every
//! consumed offset below N has a disposition. A message that is slow, or that
//! fails and is retried, holds the watermark back until it is dead-lettered or
//! otherwise settled; nothing is ever acknowledged before its disposition. On
//! a crash or a rebalance, what was not acknowledged is redelivered
//! (at-least-once), never lost.
//!
//! Assignments have epochs: after a revoke or a reassignment, completions of
//! the old generation return [`ResolveError::Stale`] and never move the new
//! owner's watermark.
//!
//! # Kafka
//!
//! One key per topic-partition. Commit [`AckTracker::committable`] positions
//! periodically (they are already Kafka's "next offset to consume"), call
//! [`AckTracker::mark_committed`] on success, and commit
//! [`Revoked::watermark`] from the revoke callback. Offsets may have gaps
//! (compaction, transaction markers); gaps are never pending.
//!
//! # RabbitMQ
//!
//! RabbitMQ settles deliveries one by one, and `triage-amqp` acks each delivery on its own
//! rather than with `multiple = true` up to a watermark: a multiple ack would let one slow
//! message hold back the acks of every later one and stall the whole prefetch window, and
//! RabbitMQ closes the channel ("unknown delivery tag") when a multiple ack's own tag was
//! already settled. Idempotence there comes from the set of outstanding tags per channel
//! epoch, bounded by the prefetch. The tracker still fits a consumer that does want
//! cumulative acks: delivery tags are sequential per channel from 1, and
//! `basic.ack(w - 1, multiple = true)` never covers an unsettled delivery (never send it with
//! tag 0, which means *all* outstanding deliveries).
//!
//! # Accounting
//!
//! [`Ledger`] counts consumed messages and dispositions per criticality tier,
//! lock-free. The runtime checks
//! `consumed = completed + failed + deferred + expired + shed + queued + in_flight`
//! with [`LedgerSnapshot::unresolved`].

mod counters;
mod disposition;
mod error;
mod tracker;

#[cfg(test)]
mod tests;

pub use counters::{Ledger, LedgerSnapshot, TierCounts};
pub use disposition::Disposition;
pub use error::{ResolveError, TrackError};
pub use tracker::{AckToken, AckTracker, Assignment, Epoch, Revoked};
