//! The generator's record of every message offered and when it was first completed: goodput
//! is judged from the producer's side, by the same rule for every consumer.

use triage::quanta::Instant;
use triage::PerTier;

use crate::goodput::{Goodput, TierRow};
use crate::msg::Msg;
use crate::users::Offered;

/// Messages offered and their first completion.
#[derive(Debug, Default)]
pub struct Tally {
    msgs: Vec<Msg>,
    done: Vec<Option<Instant>>,
}

impl Tally {
    /// Records a new message built from its id.
    pub fn offer(&mut self, build: impl FnOnce(u64) -> Msg) -> Msg {
        let msg = build(self.msgs.len() as u64);
        self.msgs.push(msg);
        self.done.push(None);
        msg
    }

    /// Records a completion of `id` at `at` (the first one counts).
    pub fn complete(&mut self, id: u64, at: Instant) {
        if let Some(slot) = self.done.get_mut(id as usize) {
            slot.get_or_insert(at);
        }
    }

    /// Messages offered so far.
    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    /// Whether nothing was offered.
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Per-tier goodput of everything offered.
    pub fn goodput(&self) -> Goodput {
        let mut tiers = PerTier::<TierRow>::default();
        for (m, done) in self.msgs.iter().zip(&self.done) {
            let r = &mut tiers[m.tier];
            r.offered += 1;
            match done {
                Some(at) if *at <= m.deadline => r.goodput += 1,
                Some(_) => r.late += 1,
                None => {}
            }
        }
        Goodput { tiers }
    }

    /// Every message offered, with its user and whether it was served in time, timed from
    /// `start` (a backlog's messages, published before it, at 0): the per-user report's input.
    pub fn offers(&self, start: Instant) -> Vec<Offered> {
        self.msgs
            .iter()
            .zip(&self.done)
            .map(|(m, done)| Offered {
                tier: m.tier,
                user: m.user,
                cohort: m.cohort,
                at: m.published.saturating_duration_since(start),
                in_time: done.is_some_and(|at| at <= m.deadline),
            })
            .collect()
    }
}
