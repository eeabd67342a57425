//! The deferral part: the defer sink, the room for deferrals in flight, the sink's health (a
//! transport failure makes Defer tiers behave as Backpressure for a cool-down), and the rule
//! for whether a deferred copy would come back in time. The deferral itself (publish, then
//! settle `Deferred`) is a step of the policy (`policy.rs`).

use crate::sync::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::DeferSink;

/// The defer sink and the deferrals in flight.
pub(crate) struct Deferrals<T> {
    pub(crate) sink: Option<Arc<dyn DeferSink<T>>>,
    /// Room for deferrals in flight (`max_deferring`).
    pub(crate) permits: Arc<tokio::sync::Semaphore>,
    /// Clock reading (ns since the runtime's origin) until which Defer tiers behave as
    /// Backpressure: the sink failed in transport.
    pub(crate) unhealthy_until: AtomicU64,
}

impl<T> Deferrals<T> {
    pub(crate) fn new(sink: Option<Arc<dyn DeferSink<T>>>, max_deferring: usize) -> Self {
        Deferrals {
            sink,
            permits: Arc::new(tokio::sync::Semaphore::new(max_deferring)),
            unhealthy_until: AtomicU64::new(0),
        }
    }
}

impl<T> Deferrals<T> {
    /// Whether the sink is in use at `now_ns` (ns since the runtime's origin): no transport
    /// failure within the cool-down.
    pub(crate) fn healthy_at(&self, now_ns: u64) -> bool {
        now_ns >= self.unhealthy_until.load(Ordering::Relaxed)
    }

    /// A publish failed in transport at `now_ns`: Defer tiers behave as Backpressure for
    /// `cooldown`.
    pub(crate) fn failed_at(&self, now_ns: u64, cooldown: Duration) {
        let until = now_ns.saturating_add(u64::try_from(cooldown.as_nanos()).unwrap_or(u64::MAX));
        self.unhealthy_until.fetch_max(until, Ordering::Relaxed);
    }
}

/// Whether a deferred copy of `item` would expire before a drain could bring it back.
/// The drains are pulled only while nothing is shed and workers have room, so a copy
/// waits for both:
/// - while pull admission sheds (its level above 0), the level comes down only once
///   arrival has fitted for `admission.recover_ms`. How long the overload will last nobody
///   here knows; an episode that has lasted `T` is taken to last about `T` more (the
///   Lindy, or Copernican, estimate: without a forecast of arrival, the current episode
///   is as likely to be in its first half as in its second): `recover_ms` plus the time
///   shedding has lasted;
/// - while there is a backlog, the workers have no room until it is served: the sources'
///   lag plus the messages queued and held, over the estimated capacity (a lower bound:
///   arrivals go on meanwhile). A restart's
///   backlog of minutes is why a held message of a few seconds' slack is not worth a copy
///   even with nothing shed;
/// - while the operator's forced level is up, the drains are closed until the operator lifts
///   it, which nothing here can forecast either: a level that has been up for `T` is taken
///   to stay up about `T` more (the same estimate; no `recover_ms`, since lifting it opens
///   the drains at once).
///
/// So a spike's first refusals are deferred, a sustained overload's, a long forced level's or
/// a long backlog's short-deadline work is not, where its copy would cost a publish and a
/// fetch to end `Expired`. Such a message is shed at once instead
/// (`triage_too_late_to_defer_total`).
///
/// `slack` is the time left until the message's deadline, `backlog` the time the work ahead
/// takes to clear (zero: none), `shedding` how long the current shedding episode has lasted
/// (`None`: nothing is shed), `forced` how long the operator's forced level has been up
/// (`None`: it is 0), `recover` the time the level takes to come down once arrival fits
/// (`admission.recover_ms`).
pub(crate) fn expires_before_drain(
    slack: Duration,
    backlog: Duration,
    shedding: Option<Duration>,
    forced: Option<Duration>,
    recover: Duration,
) -> bool {
    let mut eta = backlog;
    if let Some(lasted) = shedding {
        eta = eta.max(recover.saturating_add(lasted));
    }
    if let Some(lasted) = forced {
        eta = eta.max(lasted);
    }
    slack < eta
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn with_nothing_shed_and_no_backlog_every_copy_comes_back_in_time() {
        assert!(!expires_before_drain(
            ms(1),
            Duration::ZERO,
            None,
            None,
            ms(5_000)
        ));
    }

    #[test]
    fn a_backlog_is_waited_for() {
        assert!(expires_before_drain(
            ms(999),
            ms(1_000),
            None,
            None,
            ms(5_000)
        ));
        assert!(!expires_before_drain(
            ms(1_000),
            ms(1_000),
            None,
            None,
            ms(5_000)
        ));
    }

    #[test]
    fn an_episode_that_lasted_t_is_taken_to_last_t_more_after_the_recovery() {
        // Shedding for 2 s, recovery 1 s: a copy comes back in 3 s at the soonest.
        assert!(expires_before_drain(
            ms(2_999),
            Duration::ZERO,
            Some(ms(2_000)),
            None,
            ms(1_000)
        ));
        assert!(!expires_before_drain(
            ms(3_000),
            Duration::ZERO,
            Some(ms(2_000)),
            None,
            ms(1_000)
        ));
        // The longer of the backlog and the episode.
        assert!(expires_before_drain(
            ms(3_500),
            ms(4_000),
            Some(ms(2_000)),
            None,
            ms(1_000)
        ));
    }

    #[test]
    fn a_forced_level_that_has_been_up_for_t_is_taken_to_stay_up_t_more() {
        // Up for 1 s: a copy comes back in 1 s at the soonest (lifting it opens the drains at
        // once, so no recovery time is added).
        assert!(expires_before_drain(
            ms(999),
            Duration::ZERO,
            None,
            Some(ms(1_000)),
            ms(5_000)
        ));
        assert!(!expires_before_drain(
            ms(1_000),
            Duration::ZERO,
            None,
            Some(ms(1_000)),
            ms(5_000)
        ));
        // Just raised: nothing to estimate from yet, the first refusals are deferred.
        assert!(!expires_before_drain(
            ms(1),
            Duration::ZERO,
            None,
            Some(Duration::ZERO),
            ms(5_000)
        ));
        // With load shedding too, the longer of the two.
        assert!(expires_before_drain(
            ms(2_500),
            Duration::ZERO,
            Some(ms(2_000)),
            Some(ms(1_000)),
            ms(1_000)
        ));
    }

    #[test]
    fn the_sink_is_unhealthy_for_the_cool_down_after_a_transport_failure() {
        let d: Deferrals<u32> = Deferrals::new(None, 1);
        assert!(d.healthy_at(0));
        d.failed_at(1_000, Duration::from_nanos(500));
        assert!(!d.healthy_at(1_499));
        assert!(d.healthy_at(1_500));
        // An earlier failure reported late never shortens the cool-down.
        d.failed_at(100, Duration::from_nanos(500));
        assert!(!d.healthy_at(1_499));
    }
}
