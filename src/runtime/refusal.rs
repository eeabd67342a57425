//! Why a message was refused: one vocabulary for the whole runtime.
//!
//! A [`Refusal`] is what the admission checks answer when they do not admit a message, and
//! everything downstream of that answer reads it from the one value: the `reason` label of
//! `triage_refused_total` and `triage_shed_total` ([`label`](Refusal::label)), the
//! `triage-reason` of a deferred copy ([`defer_reason`](Refusal::defer_reason)), the message's
//! place in the decision breakdown ([`decision`](Refusal::decision)), the error a producer of
//! [`try_submit`](crate::runtime::Runtime::try_submit) gets back, and whether an intake may hold
//! the lower tiers at once behind it ([`refuses_bottom_prefix`](Refusal::refuses_bottom_prefix)).
//! Adding a reason is adding a variant: the compiler then names every place that must answer
//! for it.
//!
//! A message past its deadline is no refusal: no policy applies to what is useless, so the
//! gate answers it apart (`gate::Denied::Expired`) and it is settled `Expired`, counted in
//! `triage_expired_total` and, when it is the first decision about it, as `shed-expired` in the
//! decision breakdown.

use crate::admission::Decision;
use crate::queue::RefuseReason;
use crate::runtime::DeferReason;

/// Why a message was refused (or evicted from the queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Refusal {
    /// Its tier is shed: pull-based admission (arrival beyond capacity) or queue-age
    /// admission (pushed work) refuses it.
    Overloaded,
    /// The queue is full with nothing of a lower tier to evict.
    Full,
    /// The message alone is larger than the queue's byte budget.
    TooLarge,
    /// It was queued, and a more important message evicted it.
    Evicted,
    /// The circuit of its downstream is open.
    Circuit,
    /// Its tier's token bucket (and its lenders') has no token.
    Rate,
    /// The bytes held passed its tier's share of the memory budget.
    Memory,
    /// The operator's forced shed level refuses its tier. A capacity decision (the operator
    /// says capacity is short) under a reason of its own, so that a forced refusal is told from
    /// one of the signals'.
    Forced,
}

impl Refusal {
    /// Every reason, in the order of [`index`](Self::index).
    pub(crate) const ALL: [Refusal; 8] = [
        Refusal::Overloaded,
        Refusal::Full,
        Refusal::TooLarge,
        Refusal::Evicted,
        Refusal::Circuit,
        Refusal::Rate,
        Refusal::Memory,
        Refusal::Forced,
    ];

    /// How many reasons there are: the length of an array with one slot per reason.
    pub(crate) const COUNT: usize = Self::ALL.len();

    /// Its slot in an array with one slot per reason (counters, metric handles).
    #[inline]
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// The `reason` label of `triage_refused_total` and `triage_shed_total`.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Refusal::Overloaded => "overloaded",
            Refusal::Full => "full",
            Refusal::TooLarge => "too_large",
            Refusal::Evicted => "evicted",
            Refusal::Circuit => "circuit",
            Refusal::Rate => "rate",
            Refusal::Memory => "memory",
            Refusal::Forced => "forced",
        }
    }

    /// The `triage-reason` of the copy when the tier's policy defers the message.
    pub(crate) const fn defer_reason(self) -> DeferReason {
        match self {
            Refusal::Overloaded => DeferReason::Overloaded,
            Refusal::Full | Refusal::TooLarge => DeferReason::Full,
            Refusal::Evicted => DeferReason::Evicted,
            Refusal::Circuit => DeferReason::Circuit,
            Refusal::Rate => DeferReason::Rate,
            Refusal::Memory => DeferReason::Memory,
            Refusal::Forced => DeferReason::Forced,
        }
    }

    /// The decision a message's first refusal counts as in the decision breakdown
    /// (`triage_admission_decisions_total`).
    pub(crate) const fn decision(self) -> Decision {
        match self {
            Refusal::Circuit => Decision::ShedCircuit,
            Refusal::Rate => Decision::ShedRate,
            Refusal::Memory => Decision::ShedMemory,
            Refusal::Overloaded
            | Refusal::Full
            | Refusal::TooLarge
            | Refusal::Evicted
            | Refusal::Forced => Decision::ShedCapacity,
        }
    }

    /// Whether the refusal of one tier refuses every tier below it too (a bottom prefix of the
    /// ladder), so an intake may hold the lower tiers at once behind it. A bucket is per tier
    /// and a breaker per downstream: those refuse tier by tier.
    pub(crate) const fn refuses_bottom_prefix(self) -> bool {
        !matches!(self, Refusal::Circuit | Refusal::Rate)
    }

    /// The queue's reason for refusing a push; `None` for a closed queue, which is no
    /// admission decision (the runtime is shutting down).
    pub(crate) const fn from_queue(reason: RefuseReason) -> Option<Refusal> {
        match reason {
            RefuseReason::Overloaded => Some(Refusal::Overloaded),
            RefuseReason::Full => Some(Refusal::Full),
            RefuseReason::TooLarge => Some(Refusal::TooLarge),
            RefuseReason::Closed => None,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_reason_has_its_own_slot_and_label() {
        for (i, r) in Refusal::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r}");
        }
        let labels: BTreeSet<&str> = Refusal::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Refusal::COUNT);
    }

    #[test]
    fn the_labels_are_the_metric_labels_of_record() {
        let labels: Vec<&str> = Refusal::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(
            labels,
            [
                "overloaded",
                "full",
                "too_large",
                "evicted",
                "circuit",
                "rate",
                "memory",
                "forced"
            ]
        );
    }

    #[test]
    fn each_reason_knows_its_decision_and_defer_reason() {
        use Refusal::*;
        let table = [
            (Overloaded, Decision::ShedCapacity, DeferReason::Overloaded),
            (Full, Decision::ShedCapacity, DeferReason::Full),
            (TooLarge, Decision::ShedCapacity, DeferReason::Full),
            (Evicted, Decision::ShedCapacity, DeferReason::Evicted),
            (Circuit, Decision::ShedCircuit, DeferReason::Circuit),
            (Rate, Decision::ShedRate, DeferReason::Rate),
            (Memory, Decision::ShedMemory, DeferReason::Memory),
            (Forced, Decision::ShedCapacity, DeferReason::Forced),
        ];
        for (r, decision, defer) in table {
            assert_eq!(r.decision(), decision, "{r}");
            assert_eq!(r.defer_reason(), defer, "{r}");
            assert_eq!(
                r.refuses_bottom_prefix(),
                !matches!(r, Circuit | Rate),
                "{r}"
            );
        }
    }

    #[test]
    fn the_queue_reasons_map_and_a_closed_queue_is_no_refusal() {
        assert_eq!(
            Refusal::from_queue(RefuseReason::Overloaded),
            Some(Refusal::Overloaded)
        );
        assert_eq!(Refusal::from_queue(RefuseReason::Full), Some(Refusal::Full));
        assert_eq!(
            Refusal::from_queue(RefuseReason::TooLarge),
            Some(Refusal::TooLarge)
        );
        assert_eq!(Refusal::from_queue(RefuseReason::Closed), None);
    }
}
