//! How far ahead of the workers the intake pulls, derived from what they clear in time.
//!
//! A consumer's broker is the buffer, and it hands messages over in offset order: a Sheddable
//! message due in 100 ms that sits behind a burst of Critical work due in a second waits there
//! until it expires, though the Critical work had time to let it pass. The runtime can serve by
//! deadline only what it has pulled (see the queue's deadline-ordered service,
//! `WfqQueue::set_drain`). So, while not overloaded, the intake pulls as many messages as the
//! workers clear within the shortest deadline slack of the admitted work:
//!
//! `look-ahead = capacity × shortest slack`, never below the prefetch,
//!
//! where *capacity* is the measured completions per second (the concurrency limit over the mean
//! handler run, see [`PullAdmission::capacity`]) and *slack* a tier's mean deadline slack at
//! intake (see [`PullAdmission::slack`]). Pulling further would hold messages that could not
//! be served within that slack anyway; the runtime also keeps it to half the queue, so that
//! pulling ahead never fills the queue. With no deadline measured the intake keeps to the
//! prefetch, and a backlog stays in the broker.
//!
//! In key mode the intake also looks past the messages parked behind a busy key, for keys
//! that are ready. How far is the same question: as many as the workers clear within the
//! shortest slack (a parked message waits for its key, not behind the queue), so that a hot key
//! whose messages arrive faster than one handler serves them does not hold every other key's
//! messages in the broker until they expire. But while any message is parked, the queue itself
//! is pulled only to the prefetch: a keyed message waiting in a deep queue holds its key, and
//! every message parked behind it waits as long (at 2x with 15% of messages on one key, a
//! queue pulled deep kept 94.2% of Critical in time against 97.9% without).

use crate::admission::PullAdmission;
use crate::Criticality;

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

/// How many messages the intake may hold (queued, and parked behind busy ordering keys) before
/// it stops pulling, while not overloaded: the measured capacity (messages/s) × the shortest
/// mean slack at intake (s) of the tiers `pull` admits, at least `floor` messages. `None` when
/// there is no capacity estimate or no admitted tier's slack was measured.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::admission::{derived_lookahead, PullAdmission, PullAdmissionConfig, PullSample};
///
/// let mut pull = PullAdmission::new(&PullAdmissionConfig::default());
/// assert_eq!(derived_lookahead(&pull, 16), None, "nothing measured yet");
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
/// // What 4,000/s clear in Sheddable's 100 ms; never below the floor.
/// assert_eq!(derived_lookahead(&pull, 16), Some(400));
/// assert_eq!(derived_lookahead(&pull, 1000), Some(1000));
/// ```
pub fn derived_lookahead(pull: &PullAdmission, floor: usize) -> Option<usize> {
    let capacity = pull.capacity()?;
    let slack = shortest_slack(pull)?;
    Some(((capacity * slack).ceil() as usize).max(floor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::pull::tests::{fresh, ms};
    use crate::admission::PullSample;

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
        assert_eq!(derived_lookahead(&b, 16), None);
    }

    #[test]
    fn the_lookahead_is_what_the_workers_clear_within_the_shortest_slack() {
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 400.0, SLACK);
        assert_eq!(a.level(), 0);
        // All of Sheddable's 100 ms at 800/s, at least the floor.
        assert_eq!(derived_lookahead(&a, 16), Some(80));
        assert_eq!(derived_lookahead(&a, 128), Some(128));
        // The shortest slack, whichever tier has it.
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 20, 400.0, [100, 250, 50, 1000]);
        assert_eq!(derived_lookahead(&a, 16), Some(40));
    }

    #[test]
    fn a_refused_tier_does_not_shorten_the_lookahead() {
        // At 3x, Sheddable (100 ms) and Medium (250 ms) are refused: the shortest slack of
        // what is admitted is High's 500 ms (Medium's while some of its cohorts are admitted).
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 30, 2400.0, SLACK);
        assert!(a.level() >= 2, "level {}", a.level());
        let expected = if a.admitted_cohorts() > 0 { 200 } else { 400 };
        assert_eq!(derived_lookahead(&a, 16), Some(expected));
    }
}
