//! A generated message.

use triage::quanta::Instant;
use triage::Criticality;

/// What the generator publishes; `id` indexes the run's tally. A producer's re-submission of
/// refused work (the retry storm) publishes the same `Msg` again.
#[derive(Clone, Copy, Debug)]
pub struct Msg {
    /// Index in the tally.
    pub id: u64,
    /// Its tier.
    pub tier: Criticality,
    /// When the producer first published it (a backlog's messages: before the run started).
    pub published: Instant,
    /// Publish time plus its tier's window.
    pub deadline: Instant,
    /// Bound for downstream `b` (the one that may fail).
    pub to_b: bool,
    /// Payload bytes it stands for (for a memory budget); 0 when the scenario has no sizes.
    pub size: u32,
    /// Ordering key, in key mode.
    pub key: Option<u64>,
    /// Times its producer re-published it after it was shed (the retry storm).
    pub resubmits: u32,
    /// The user it serves, one of its tier's [`Scenario::users`](crate::Scenario::users)
    /// (drawn from the seed and its id); in key mode its ordering key.
    pub user: u64,
    /// The cohort of the user it serves (see `triage::admission::cohort`): its key's in key
    /// mode, otherwise its user's within its tier. Set by the generator with a fixed
    /// rotation period: the runtime's own choice, for a message without one, mixes in the
    /// wall clock's hour, and a run would then differ from one hour to the next.
    pub cohort: u8,
}
