//! The queue's bounds for pulled work, derived from what the workers clear in time.
//!
//! A consumer's broker is the buffer: what the runtime queues is only what it has decided to
//! serve next. While overloaded the intake pulls as fast as admission decides, so the queue
//! fills with admitted work up to its bound, and work at the back of a deep queue waits past
//! the shorter deadlines: served late, it is capacity spent on nothing. So each tier's bound is
//! what the workers clear within that tier's usefulness window:
//!
//! `bound(tier) = SLACK_SHARE × capacity × slack(tier)`, never below the prefetch,
//!
//! where *capacity* is the measured completions per second (the concurrency limit over the
//! mean handler run, see [`PullAdmission::capacity`]) and *slack* the tier's mean deadline
//! slack at intake (see [`PullAdmission::slack`]). A message of a tier is queued while the
//! queue holds fewer than its tier's bound; past it, it evicts the newest of a lower tier or
//! is refused as into a full queue (its policy then holds, defers or drops it). The tiers with
//! longer windows may fill the queue deeper, since the weighted-fair dequeue serves them
//! first. [`SLACK_SHARE`] leaves room for what the mean hides: the dequeue serves a lower tier
//! at its weight's share of the workers, not in arrival order, and the slack and the capacity
//! are means over a window. A tier with no message with a deadline measured, or every tier
//! before a capacity is measured, keeps the configured capacity, which is then only a memory
//! ceiling.
//!
//! In key mode the intake also looks past the messages parked behind a busy key, for keys
//! that are ready. How far is the same question: [`derived_lookahead`] lets it pull as many as
//! the workers clear within the shortest slack of the admitted work (no share taken: a parked
//! message waits for its key, not behind the queue), so that a hot key whose messages arrive
//! faster than one handler serves them does not hold every other key's messages in the broker
//! until they expire.

use crate::admission::PullAdmission;
use crate::Criticality;

/// The share of a tier's deadline slack that the queue may hold for it, as time at the
/// measured capacity.
pub const SLACK_SHARE: f64 = 0.25;

/// The tiers `pull` admits now (rank at least the returned one): above the shed level, and the
/// highest refused tier while some of its cohorts are admitted.
fn lowest_admitted(pull: &PullAdmission) -> usize {
    let level = usize::from(pull.level());
    if pull.admitted_cohorts() > 0 {
        level.saturating_sub(1)
    } else {
        level
    }
}

/// The shortest mean slack at intake of the tiers `pull` admits, seconds.
fn shortest_slack(pull: &PullAdmission) -> Option<f64> {
    let lowest = lowest_admitted(pull);
    Criticality::ALL
        .into_iter()
        .filter(|t| t.rank() >= lowest)
        .filter_map(|t| pull.slack(t))
        .min()
        .map(|s| s.as_secs_f64())
}

/// How many messages the intake may hold queued and parked behind busy ordering keys before it
/// stops pulling, while not overloaded: the measured capacity × the shortest mean slack at
/// intake of the tiers `pull` admits, at least `floor`. `None` when nothing is measured.
pub fn derived_lookahead(pull: &PullAdmission, floor: usize) -> Option<usize> {
    let capacity = pull.capacity()?;
    let slack = shortest_slack(pull)?;
    Some(((capacity * slack).ceil() as usize).max(floor))
}

/// Each tier's bound for pulled work now, in messages, indexed by [`Criticality::rank`]:
/// [`SLACK_SHARE`] × measured capacity × the tier's mean slack at intake, at least `prefetch`;
/// a tier whose slack was never measured is bounded as the tier below it, or not at all
/// (`usize::MAX`: the configured capacity) above the highest measured tier; and no bound is
/// below a lower tier's, so that no message is refused for room where a less important one
/// would be queued. `None` when there is no capacity estimate or no tier's slack was
/// measured.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::admission::{derived_bounds, PullAdmission, PullAdmissionConfig, PullSample};
///
/// let mut pull = PullAdmission::new(&PullAdmissionConfig::default());
/// assert_eq!(derived_bounds(&pull, 16), None, "nothing measured yet");
/// // Eight handlers of 2 ms (4,000/s); by rank (Sheddable first) messages pulled with 100,
/// // 400 and 250 ms left, and Critical's without deadlines.
/// let mut s = PullSample { limit: 8, lag: Some(0), ..PullSample::default() };
/// for tick in 1..=10u64 {
///     s.at = Duration::from_millis(100 * tick);
///     s.pulled = [40 * tick; 4];
///     s.with_deadline = [40 * tick, 40 * tick, 40 * tick, 0];
///     for (rank, ms) in [100u64, 400, 250].into_iter().enumerate() {
///         s.slack[rank] = Duration::from_millis(ms) * (40 * tick) as u32;
///     }
///     s.served = 160 * tick;
///     s.busy = Duration::from_millis(2 * 160 * tick);
///     pull.observe(&s);
/// }
/// // A quarter of each slack at 4,000/s, never below a lower tier's bound (High's 250 ms
/// // gives 250, Medium's 400 ms 400), and no bound for Critical.
/// assert_eq!(derived_bounds(&pull, 16), Some([100, 400, 400, usize::MAX]));
/// ```
pub fn derived_bounds(pull: &PullAdmission, prefetch: usize) -> Option<[usize; 4]> {
    let capacity = pull.capacity()?;
    // By rank, Sheddable first: the measured tiers' bounds.
    let mut measured = [None; 4];
    for t in Criticality::ALL {
        measured[t.rank()] = pull.slack(t).map(|slack| {
            // Saturating float-to-int: a huge bound is clamped by the queue's capacity anyway.
            let bound = (SLACK_SHARE * capacity * slack.as_secs_f64()).ceil() as usize;
            bound.max(prefetch).max(1)
        });
    }
    let highest = measured.iter().rposition(Option::is_some)?;
    let lowest = measured.iter().position(Option::is_some)?;
    // A tier without a measured slack below the highest measured one (no message with a
    // deadline, most often no message at all) is bounded as the tier below it (the lowest ones
    // as the lowest measured tier): bounded at all, so that it cannot lift the bounds above it.
    // Above the highest measured tier, none is derived. Then no tier's bound is below a lower
    // tier's.
    let mut bounds = [usize::MAX; 4];
    let mut floor = measured[lowest].unwrap_or(usize::MAX);
    for rank in 0..=highest {
        floor = floor.max(measured[rank].unwrap_or(floor));
        bounds[rank] = floor;
    }
    Some(bounds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::pull::tests::{fresh, ms};
    use crate::admission::{PullAdmissionConfig, PullSample};

    /// Feeds `ticks` ticks of 100 ms: 8 handlers of 10 ms (800/s) serving 80 a tick, `rate`/s
    /// arriving with the mix 10/20/30/40 % (Critical first), the worker pulling at most 800/s
    /// (the rest grows the lag), each tier's messages with `slack_ms` (by rank) left at
    /// intake.
    fn drive(a: &mut PullAdmission, s: &mut PullSample, ticks: u64, rate: f64, slack_ms: [u64; 4]) {
        let mix = [0.4, 0.3, 0.2, 0.1];
        for _ in 0..ticks {
            s.at += ms(100);
            let pull = rate.min(800.0);
            for r in 0..4 {
                let n = (pull * mix[r] / 10.0) as u64;
                s.pulled[r] += n;
                s.with_deadline[r] += n;
                s.slack[r] += ms(slack_ms[r]) * n as u32;
            }
            s.served += 80;
            s.busy += ms(800);
            let lag = s.lag.unwrap_or(0) as f64 + (rate - pull) / 10.0;
            s.lag = Some(lag as u64);
            a.observe(s);
        }
    }

    /// Slack at intake by rank (Sheddable first): the windows 1000 / 500 / 250 / 100 ms.
    const SLACK: [u64; 4] = [100, 250, 500, 1000];

    #[test]
    fn nothing_is_derived_before_a_capacity_and_a_slack_are_measured() {
        let (a, _) = fresh();
        assert_eq!(derived_bounds(&a, 16), None);
        assert_eq!(derived_lookahead(&a, 16), None);
        // Messages without deadlines: a capacity, but no slack.
        let (mut b, mut t) = fresh();
        for _ in 0..10 {
            t.at += ms(100);
            t.pulled[3] += 40;
            t.served += 40;
            t.busy += ms(400);
            b.observe(&t);
        }
        assert!(b.capacity().is_some());
        assert_eq!(derived_bounds(&b, 16), None);
        assert_eq!(derived_lookahead(&b, 16), None);
    }

    #[test]
    fn each_tier_is_bounded_by_what_the_workers_clear_within_its_slack() {
        // A quarter of 100 / 250 / 500 / 1000 ms at 800/s, by rank (Sheddable first).
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 400.0, SLACK);
        assert_eq!(a.level(), 0);
        assert_eq!(derived_bounds(&a, 16), Some([20, 50, 100, 200]));
        // Never below the prefetch: the workers always have work queued.
        assert_eq!(derived_bounds(&a, 64), Some([64, 64, 100, 200]));
        // The look-ahead past busy keys: all of Sheddable's 100 ms at 800/s, at least the floor.
        assert_eq!(derived_lookahead(&a, 16), Some(80));
        assert_eq!(derived_lookahead(&a, 128), Some(128));
        // A more important tier with a shorter window is bounded as the less important one.
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 400.0, [100, 250, 50, 1000]);
        assert_eq!(derived_bounds(&a, 16), Some([20, 50, 50, 200]));
    }

    #[test]
    fn a_tier_without_deadlines_neither_lifts_nor_lowers_the_others() {
        // Medium and High carry no deadlines: bounded as Sheddable, below Critical's 200.
        let (mut b, mut t) = fresh();
        let mix = [0.4, 0.3, 0.2, 0.1];
        for _ in 0..20 {
            t.at += ms(100);
            for (r, share) in mix.iter().enumerate() {
                let n = (400.0 * share / 10.0) as u64;
                t.pulled[r] += n;
                if r == 0 || r == 3 {
                    t.with_deadline[r] += n;
                    t.slack[r] += ms(if r == 0 { 100 } else { 1000 }) * n as u32;
                }
            }
            t.served += 80;
            t.busy += ms(800);
            b.observe(&t);
        }
        assert_eq!(derived_bounds(&b, 16), Some([20, 20, 20, 200]));
        // Critical without deadlines: not bounded; Sheddable's alone below it, as the rest.
        let mut c = PullAdmission::new(&PullAdmissionConfig::default());
        let mut u = PullSample {
            limit: 8,
            lag: Some(0),
            ..PullSample::default()
        };
        for _ in 0..20 {
            u.at += ms(100);
            u.pulled[0] += 16;
            u.pulled[3] += 4;
            u.with_deadline[1] += 12;
            u.pulled[1] += 12;
            u.slack[1] += ms(250) * 12;
            u.served += 80;
            u.busy += ms(800);
            c.observe(&u);
        }
        assert_eq!(
            derived_bounds(&c, 16),
            Some([50, 50, usize::MAX, usize::MAX])
        );
    }

    #[test]
    fn while_shedding_the_look_ahead_follows_the_lowest_admitted_tier() {
        // 3x: Medium and Sheddable refused, some Medium cohorts admitted: Medium's 250 ms.
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 2400.0, SLACK);
        assert_eq!((a.level(), a.admitted_cohorts()), (2, 7));
        assert_eq!(derived_lookahead(&a, 16), Some(200));
        // 10x: Critical alone, no High cohort: Critical's 1000 ms.
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 8000.0, SLACK);
        assert_eq!((a.level(), a.admitted_cohorts()), (3, 0));
        assert_eq!(derived_lookahead(&a, 16), Some(800));
    }

    #[test]
    fn a_shorter_slack_at_intake_lowers_the_bound() {
        // The broker's wait eats into the slack: with half the windows left, half the bounds.
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 2400.0, SLACK.map(|v| v / 2));
        assert_eq!(derived_bounds(&a, 16), Some([16, 25, 50, 100]));
    }
}
