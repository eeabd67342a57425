//! The [`AckSink`] a Kafka source's envelopes report to: every disposition settles its
//! record's offset in [`Offsets`].

use std::sync::Arc;

use triage::ledger::Disposition;
use triage::runtime::{AckRef, AckSink};

use super::offsets::Offsets;

/// The [`AckSink`] the source's envelopes report to.
#[derive(Debug)]
pub(crate) struct KafkaAcks {
    pub(crate) offsets: Arc<Offsets>,
}

impl AckSink for KafkaAcks {
    fn resolve(&self, token: AckRef, disposition: Disposition) {
        // Every disposition settles the offset: Failed means dead-lettered, Deferred means the
        // copy is confirmed, Expired and Shed were decided by policy. Only a release does not.
        let _ = disposition;
        self.offsets.resolve(token);
    }

    fn resolve_all(&self, tokens: &[AckRef], disposition: Disposition) {
        // As `resolve`: every disposition settles the offset.
        let _ = disposition;
        self.offsets.resolve_all(tokens);
    }

    /// `false` once the record's partition is being revoked, or was: the runtime then
    /// releases it rather than serve it (see `link.rs`).
    fn is_current(&self, token: AckRef) -> bool {
        self.offsets.token_current(token)
    }
}
