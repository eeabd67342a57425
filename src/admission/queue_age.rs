//! The queue-age admission state machine, free of clocks and locks.

use std::time::Duration;

use crate::admission::QueueAgeConfig;
use crate::Criticality;

/// Decides which tiers are admitted from the queue age each tier sees, with hysteresis.
///
/// The shed set is always a bottom prefix of the ladder, so the whole state is one number, the
/// *shed level*: tiers with `rank() < level` are refused. Level 0 admits everything, level 4
/// refuses everything. This is what lets [`WfqQueue`](crate::queue::WfqQueue) keep the decision
/// in one atomic byte and admit with a single load.
///
/// A tier enters shedding when its age reaches its cut-off and leaves it once its age falls to
/// `exit_ratio × cut-off`: a signal hovering at the cut-off changes the decision once, not on
/// every sample. Because cut-offs and exit points are non-increasing down the ladder, tiers are
/// shed from the bottom up as the signal rises and re-admitted in the reverse order (Critical
/// first, Sheddable last) as it falls, with no manual step.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::admission::{QueueAgeAdmission, QueueAgeConfig};
/// use triage::Criticality;
///
/// let mut admission = QueueAgeAdmission::new(&QueueAgeConfig::default());
/// let ms = Duration::from_millis;
/// // Every tier sees the same 100 ms age: Sheddable (20) and Medium (80) are shed.
/// admission.observe([ms(100); 4]);
/// assert!(!admission.admits(Criticality::Medium));
/// assert!(admission.admits(Criticality::High));
/// // 30 ms is below Medium's exit point (40 ms) but above Sheddable's (10 ms).
/// admission.observe([ms(30); 4]);
/// assert!(admission.admits(Criticality::Medium));
/// assert!(!admission.admits(Criticality::Sheddable));
/// ```
#[derive(Clone, Debug)]
pub struct QueueAgeAdmission {
    enabled: bool,
    /// Indexed by rank.
    enter: [Duration; 4],
    /// Indexed by rank.
    exit: [Duration; 4],
    level: u8,
}

impl QueueAgeAdmission {
    /// A state machine with every tier admitted.
    ///
    /// The config is taken as given; call [`QueueAgeConfig::validate`] first.
    pub fn new(config: &QueueAgeConfig) -> Self {
        let mut this = QueueAgeAdmission {
            enabled: true,
            enter: [Duration::ZERO; 4],
            exit: [Duration::ZERO; 4],
            level: 0,
        };
        this.reconfigure(config);
        this
    }

    /// Applies new cut-offs; the current level is kept and re-evaluated on the next
    /// [`observe`](Self::observe).
    pub fn reconfigure(&mut self, config: &QueueAgeConfig) {
        self.enabled = config.enabled;
        for tier in Criticality::ALL {
            let cutoff = config.cutoff(tier);
            self.enter[tier.rank()] = cutoff;
            self.exit[tier.rank()] = cutoff.mul_f64(config.exit_ratio.clamp(0.0, 1.0));
        }
        if !self.enabled {
            self.level = 0;
        }
    }

    /// Feeds the queue age each tier sees (indexed by [`Criticality::rank`]) and returns the new
    /// shed level.
    ///
    /// `ages[r]` should be the age of the oldest item waiting at rank `r` or above, which is what
    /// a new item of that tier waits behind; ages are then non-increasing with rank.
    pub fn observe(&mut self, ages: [Duration; 4]) -> u8 {
        if !self.enabled {
            return 0;
        }
        let mut level = self.level as usize;
        while level < 4 && ages[level] >= self.enter[level] {
            level += 1;
        }
        while level > 0 && ages[level - 1] <= self.exit[level - 1] {
            level -= 1;
        }
        self.level = level as u8;
        self.level
    }

    /// The current shed level: tiers with `rank() < level` are refused.
    pub fn level(&self) -> u8 {
        self.level
    }

    /// Whether `tier` is admitted at the current level.
    #[inline]
    pub fn admits(&self, tier: Criticality) -> bool {
        admits_at(self.level, tier)
    }
}

/// Whether `tier` is admitted at shed `level`.
#[inline]
pub(crate) fn admits_at(level: u8, tier: Criticality) -> bool {
    tier.rank() >= level as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn admitted(a: &QueueAgeAdmission) -> Vec<Criticality> {
        Criticality::ALL
            .into_iter()
            .filter(|t| a.admits(*t))
            .collect()
    }

    #[test]
    fn each_tier_is_refused_exactly_at_its_cutoff() {
        let config = QueueAgeConfig::default();
        for tier in Criticality::ALL {
            let cutoff = config.cutoff(tier);
            let mut a = QueueAgeAdmission::new(&config);
            a.observe([cutoff - Duration::from_nanos(1); 4]);
            assert!(a.admits(tier), "{tier} refused below its cut-off");
            a.observe([cutoff; 4]);
            assert!(!a.admits(tier), "{tier} admitted at its cut-off");
            // Every tier above it is still admitted.
            for above in Criticality::ALL.into_iter().filter(|t| *t > tier) {
                assert!(a.admits(above), "{above} refused at {tier}'s cut-off");
            }
        }
    }

    #[test]
    fn readmits_bottom_up_as_the_signal_falls() {
        let mut a = QueueAgeAdmission::new(&QueueAgeConfig::default());
        assert_eq!(a.observe([ms(500); 4]), 4);
        assert!(admitted(&a).is_empty());
        let mut order = Vec::new();
        for age in (0..=500).rev() {
            let before = admitted(&a);
            a.observe([ms(age); 4]);
            for t in admitted(&a) {
                if !before.contains(&t) {
                    order.push((t, age));
                }
            }
        }
        assert_eq!(
            order,
            vec![
                (Criticality::Critical, 200),
                (Criticality::High, 100),
                (Criticality::Medium, 40),
                (Criticality::Sheddable, 10),
            ]
        );
    }

    #[test]
    fn a_signal_hovering_at_the_cutoff_does_not_flap() {
        let mut a = QueueAgeAdmission::new(&QueueAgeConfig::default());
        let mut changes = 0;
        let mut last = a.admits(Criticality::Medium);
        // A spike to 81 ms, then noise between 60 and 100 ms around Medium's 80 ms cut-off.
        for i in 0..1000u64 {
            let age = if i == 0 { 81 } else { 60 + (i * 37) % 41 };
            a.observe([ms(age); 4]);
            let now = a.admits(Criticality::Medium);
            if now != last {
                changes += 1;
                last = now;
            }
        }
        assert_eq!(changes, 1, "medium changed state {changes} times");
        assert!(!a.admits(Criticality::Medium));
        a.observe([ms(40); 4]);
        assert!(a.admits(Criticality::Medium));
    }

    #[test]
    fn a_single_spike_sheds_once_and_recovers_once() {
        let mut a = QueueAgeAdmission::new(&QueueAgeConfig::default());
        let mut trace = Vec::new();
        for age in [5, 5, 450, 5, 5, 5] {
            trace.push(a.observe([ms(age); 4]));
        }
        assert_eq!(trace, vec![0, 0, 4, 0, 0, 0]);
    }

    #[test]
    fn per_tier_ages_shed_only_the_tiers_that_wait() {
        let mut a = QueueAgeAdmission::new(&QueueAgeConfig::default());
        // Critical items flow (5 ms); a Sheddable backlog waits 300 ms.
        a.observe([ms(300), ms(5), ms(5), ms(5)]);
        assert_eq!(
            admitted(&a),
            vec![
                Criticality::Critical,
                Criticality::High,
                Criticality::Medium
            ]
        );
    }

    #[test]
    fn disabled_admits_everything() {
        let mut a = QueueAgeAdmission::new(&QueueAgeConfig::disabled());
        assert_eq!(a.observe([ms(10_000); 4]), 0);
        assert_eq!(admitted(&a).len(), 4);
    }
}
