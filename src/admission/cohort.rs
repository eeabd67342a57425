//! Cohorts: the users of a tier, sliced so that a partly admitted tier serves the same users
//! completely instead of every user partly.
//!
//! Refusing whole tiers sheds too much or too little: at 3x with 10 / 20 / 30 / 40 % Critical /
//! High / Medium / Sheddable, Critical and High take 30 % of the arrival and capacity is 33 %,
//! so the 3 % left goes to Medium messages taken at random, and every Medium user sees a
//! share of their work fail. WeChat's DAGOR ("Overload Control for Scaling WeChat
//! Microservices", SoCC 2018) admits by business priority *and* a user priority, a hash of the
//! user rotated hourly: the admission threshold moves through the users of the boundary
//! priority, so the capacity left serves a consistent subset of users fully, and nobody is
//! the one refused for ever.
//!
//! Here a message's cohort is one of [`COHORTS`] slices of its tier, taken from a stable hash
//! of its user (or tenant) key and the current rotation period, so that every consumer of a
//! group, on any machine, puts a user in the same cohort at the same time. Pull-based
//! admission admits cohorts of the highest refused tier, in cohort order, while their measured
//! arrival fits the capacity left ([`PullAdmission::admitted_set`], `cohort_arrival.rs`).
//!
//! [`PullAdmission::admitted_set`]: crate::admission::PullAdmission::admitted_set

use std::hash::Hasher;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use siphasher::sip::SipHasher13;

use crate::admission::CohortSet;

/// Cohorts per tier: the resolution of a partial admission, 1/128 of a tier's arrival.
pub const COHORTS: u8 = 128;

/// How often every user moves to another cohort (DAGOR's hourly rotation), so that a tier
/// partly admitted for hours does not refuse the same users all that time.
pub const ROTATION: Duration = Duration::from_secs(3600);

/// A stable 64-bit hash of a user or tenant key, as
/// [`Envelope::with_user`](crate::runtime::Envelope::with_user) takes it: SipHash-1-3 with fixed keys,
/// the same on every machine and in every version of triage, so the consumers of one group
/// agree on who is in which cohort.
///
/// # Examples
///
/// ```
/// use triage::admission::user_hash;
///
/// assert_eq!(user_hash(b"tenant-42"), user_hash(b"tenant-42"));
/// assert_ne!(user_hash(b"tenant-42"), user_hash(b"tenant-43"));
/// ```
pub fn user_hash(user: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(0x7472_6961_6765_0001, 0x636f_686f_7274_0001);
    h.write(user);
    h.finish()
}

/// The rotation period now: wall-clock time since the Unix epoch in [`ROTATION`]s. Every
/// consumer of a group agrees on it (up to clock skew at the turn of the hour).
pub fn rotation_period() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / ROTATION.as_secs())
}

/// The cohort (`0..COHORTS`) of a user in a rotation period.
///
/// A mix of the user's hash (from [`user_hash`]) with the period (splitmix64's finaliser),
/// so that each period reshuffles every user independently of the others.
///
/// # Examples
///
/// ```
/// use triage::admission::{cohort, user_hash, COHORTS};
///
/// let user = user_hash(b"tenant-42");
/// assert!(cohort(user, 7) < COHORTS);
/// assert_eq!(cohort(user, 7), cohort(user, 7));
/// ```
pub fn cohort(user: u64, period: u64) -> u8 {
    let mut z = user ^ period.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % u64::from(COHORTS)) as u8
}

/// Whether a message of tier `rank` (0 = Sheddable) in `cohort` is admitted at shed `level`
/// (tiers with `rank < level` refused) with the cohorts `admitted` of the highest refused tier
/// (`rank == level - 1`) let through.
#[inline]
pub(crate) fn admits(level: u8, admitted: CohortSet, rank: usize, cohort: u8) -> bool {
    rank >= level as usize || (rank + 1 == level as usize && admitted.contains(cohort))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cohorts_are_balanced_and_rotate() {
        let mut counts = [0u32; COHORTS as usize];
        let mut moved = 0;
        for u in 0..128_000u32 {
            let user = user_hash(&u.to_le_bytes());
            let c = cohort(user, 1);
            counts[c as usize] += 1;
            if cohort(user, 2) != c {
                moved += 1;
            }
        }
        // 1,000 expected per cohort: within 15 %.
        assert!(
            counts.iter().all(|&n| (850..=1150).contains(&n)),
            "{counts:?}"
        );
        // A new period reshuffles: about 127 in 128 users change cohort.
        assert!(moved > 126_000, "{moved}");
    }

    #[test]
    fn the_hash_is_stable_across_builds() {
        // Fixed keys: a change here would put every user of a running fleet in another
        // cohort than the consumers still on the old version.
        assert_eq!(user_hash(b"tenant-42"), 14_923_203_044_193_528_808);
        assert_eq!(cohort(14_923_203_044_193_528_808, 491_000), 26);
    }

    #[test]
    fn admits_whole_tiers_above_and_the_first_cohorts_of_the_boundary() {
        // Level 2: Sheddable (0) and Medium (1) refused; 10 cohorts of Medium admitted.
        let ten = CohortSet::first(10);
        let none = CohortSet::default();
        assert!(admits(2, ten, 3, 127));
        assert!(admits(2, ten, 2, 127));
        assert!(admits(2, ten, 1, 9));
        assert!(!admits(2, ten, 1, 10));
        assert!(!admits(2, ten, 0, 0));
        assert!(admits(0, none, 0, 127));
        assert!(!admits(1, none, 0, 0));
        assert!(admits(1, CohortSet::first(COHORTS), 0, COHORTS - 1));
        // A set with a gap: the heavy cohort 0 skipped.
        let skipped = CohortSet::default().with(1).with(70);
        assert!(!admits(2, skipped, 1, 0) && admits(2, skipped, 1, 70));
    }
}
