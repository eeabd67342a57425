//! The measured spread of a tier's arrival over its cohorts: which cohorts of a partly
//! admitted tier carry the capacity left.
//!
//! The share of a tier that fits the capacity left says how much of its arrival to admit,
//! not which cohorts carry it: users are not spread evenly over cohorts, and one tenant
//! carrying most of a tier is one user in one cohort. Admitting the first `share × COHORTS`
//! cohorts over-admits the tier whenever that tenant's cohort is among them (the excess runs
//! late, work done for nothing) and under-admits it when the first cohorts are light. So the
//! runtime counts what it pulls of each tier per cohort (admitted or refused alike), and the
//! cohorts are admitted in their order (the hour's rotation, `cohort.rs`) for as long as their
//! measured arrival fits: a cohort that alone would pass the capacity left is skipped, and the
//! lighter ones after it fill the rest. Whatever the spread, the admitted arrival is the
//! capacity left, and it is measured again every tick: a tenant that grows is seen within the
//! window.

use std::collections::VecDeque;
use std::time::Duration;

use crate::admission::{CohortSet, COHORTS};

/// Tiers that can be admitted in part, by rank: Sheddable, Medium and High (Critical is never
/// refused).
pub const PARTIAL_TIERS: usize = 3;

/// Messages pulled since start per cohort of each tier that can be admitted in part (indexed
/// by [`Criticality::rank`](crate::Criticality::rank), then cohort), as the runtime counts
/// them for [`PullAdmission::observe_cohorts`](crate::admission::PullAdmission::observe_cohorts).
pub type CohortPulls = [[u64; COHORTS as usize]; PARTIAL_TIERS];

/// Per cohort of each tier that can be admitted in part, a value (`None`: none yet).
type PerCohort<V> = [[Option<V>; COHORTS as usize]; PARTIAL_TIERS];

/// The per-cohort pulls kept over a window, and the choice of cohorts from them.
#[derive(Clone, Debug)]
pub(crate) struct CohortArrival {
    /// Cumulative pulls per cohort with when they were read, oldest first.
    samples: VecDeque<(Duration, Box<CohortPulls>)>,
    /// Each cohort's pull rate while admitted, messages/s: a mean weighted over about the
    /// window, of the spans between readings in which it was admitted (see
    /// [`choose_measured`](Self::choose_measured)).
    admitted_rate: Box<PerCohort<f64>>,
    /// When each cohort was last refused (the reading that ended the span).
    refused_at: Box<PerCohort<Duration>>,
}

impl Default for CohortArrival {
    fn default() -> Self {
        CohortArrival {
            samples: VecDeque::new(),
            admitted_rate: Box::new([[None; COHORTS as usize]; PARTIAL_TIERS]),
            refused_at: Box::new([[None; COHORTS as usize]; PARTIAL_TIERS]),
        }
    }
}

impl CohortArrival {
    /// Keeps a reading at `at`, and the newest reading at least `span` older (the window).
    /// `admitted(rank, cohort)` says whether that cohort of that tier was admitted since the
    /// previous reading.
    pub(crate) fn record(
        &mut self,
        at: Duration,
        pulled: &CohortPulls,
        span: Duration,
        admitted: impl Fn(usize, u8) -> bool,
    ) {
        if let Some((before, last)) = self.samples.back() {
            let dt = at.saturating_sub(*before).as_secs_f64();
            let weight = (dt / span.as_secs_f64().max(dt)).min(1.0);
            for rank in 0..PARTIAL_TIERS {
                for c in 0..COHORTS {
                    let i = usize::from(c);
                    if !admitted(rank, c) {
                        self.refused_at[rank][i] = Some(at);
                    } else if dt > 0.0 {
                        let n = (pulled[rank][i].wrapping_sub(last[rank][i]) as i64).max(0);
                        let now = n as f64 / dt;
                        let rate = &mut self.admitted_rate[rank][i];
                        *rate = Some(rate.map_or(now, |r| r + weight * (now - r)));
                    }
                }
            }
        }
        self.samples.push_back((at, Box::new(*pulled)));
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| at.saturating_sub(*t) >= span)
        {
            self.samples.pop_front();
        }
    }

    /// Pulls of tier `rank` per cohort over the window, or `None` when there were none (or no
    /// window yet).
    fn window(&self, rank: usize) -> Option<[u64; COHORTS as usize]> {
        let ((_, first), (_, last)) = (self.samples.front()?, self.samples.back()?);
        let (first, last) = (first.get(rank)?, last.get(rank)?);
        // A message handed back is counted out again: a cohort's count may fall a little
        // within the window, never below none.
        let counts: [u64; COHORTS as usize] =
            std::array::from_fn(|c| (last[c].wrapping_sub(first[c]) as i64).max(0) as u64);
        (counts.iter().sum::<u64>() > 0).then_some(counts)
    }

    /// The cohorts of tier `rank` to admit so that their measured share of the tier's arrival
    /// is `share` (the capacity left over the tier's arrival; any value, clamped), taken in
    /// cohort order, a cohort that would pass `share` skipped.
    ///
    /// `current` (the cohorts admitted now, of the same tier) is kept while its measured
    /// share stays within `band` of `share`: the estimate of the capacity left is a small
    /// difference of two noisy rates, and a set that follows each tick's noise would serve the
    /// users of its last cohorts in part. Without a measured arrival (none of the tier pulled
    /// in the window), the first `share × COHORTS` cohorts, as if users were spread evenly.
    pub(crate) fn choose(
        &self,
        rank: usize,
        share: f64,
        band: f64,
        current: Option<CohortSet>,
    ) -> CohortSet {
        let Some(counts) = self.window(rank) else {
            return CohortSet::first((share.clamp(0.0, 1.0) * f64::from(COHORTS)).floor() as u8);
        };
        let total = counts.iter().sum::<u64>() as f64;
        if let Some(current) = current {
            let carried: u64 = (0..COHORTS)
                .filter(|&c| current.contains(c))
                .map(|c| counts[usize::from(c)])
                .sum();
            if (carried as f64 / total - share).abs() <= band {
                return current;
            }
        }
        let budget = share * total;
        let mut set = CohortSet::default();
        let mut taken = 0u64;
        for c in 0..COHORTS {
            let n = counts[usize::from(c)];
            if (taken + n) as f64 <= budget {
                taken += n;
                set = set.with(c);
            }
        }
        set
    }

    /// The cohorts of tier `rank` (whose arrival is `own` messages/s) whose users send `left`
    /// messages/s: the current set (none after a change of level), kept while it carries
    /// `left` within `band` messages/s; below it, the first refused cohorts added while they
    /// fit; above it, the set chosen again in cohort order (a cohort that would pass `left`
    /// skipped, so that a tenant grown heavy goes, not the light users after it). `None` without a measured arrival over the window (none of the tier pulled).
    /// The zero-configuration controller's choice (`derive_bounds`); [`choose`](Self::choose)
    /// is the one before it.
    ///
    /// A cohort refused within the window is weighed at the lower of its pull rate over the
    /// window and its rate while admitted (a mean weighted over about the window, of the
    /// spans it was admitted in); any other at its pull rate. Refused work comes
    /// back when its producers re-publish it (clients retrying at once: a retry storm), so a
    /// refused cohort is pulled many times over what its users send, and one admitted a
    /// moment ago still carries that in the window. Weighed at those rates, the capacity left
    /// was filled a cohort or two per tick, the cohorts dropped again as soon as their past
    /// showed, and idle workers filled with whatever refused message came first (the retry
    /// storm: Medium 60.6 % where the best hand-tuned settings serve 78.6 %). A refused
    /// cohort's pulls bound what its users send from above, its rate while admitted is their
    /// last measure: a tenant that grew while refused is admitted on its old rate, and taken
    /// out again once its pulls while admitted show it.
    pub(crate) fn choose_measured(
        &self,
        rank: usize,
        own: f64,
        left: f64,
        band: f64,
        current: Option<CohortSet>,
    ) -> Option<CohortSet> {
        let counts = self.window(rank)?;
        let span = self.span().max(f64::MIN_POSITIVE);
        let (admitted, refused_at) = (self.admitted_rate.get(rank)?, self.refused_at.get(rank)?);
        let window_start = self.samples.front().map(|(at, _)| *at)?;
        // Pulls lag arrival while the broker's backlog grows: each cohort's pulls stand for
        // the same share of the tier's arrival.
        let scale = own / (counts.iter().sum::<u64>() as f64 / span);
        let rate = |c: u8| {
            let i = usize::from(c);
            let pulled = counts[i] as f64 / span;
            // Refused within the window: its pulls there count its users' re-submissions.
            let refused = refused_at[i].is_some_and(|t| t > window_start);
            let rate = match admitted[i] {
                Some(a) if refused => a.min(pulled),
                _ => pulled,
            };
            scale * rate
        };
        let kept = current.unwrap_or_default();
        let mut carried: f64 = (0..COHORTS).filter(|&c| kept.contains(c)).map(rate).sum();
        if current.is_some() && (carried - left).abs() <= band {
            return Some(kept);
        }
        // Past it from above, chosen again from none: a cohort grown heavy is skipped, not
        // the light ones after it in the order.
        let (mut set, skip) = if carried > left {
            carried = 0.0;
            (CohortSet::default(), CohortSet::default())
        } else {
            (kept, kept)
        };
        for c in (0..COHORTS).filter(|&c| !skip.contains(c)) {
            let r = rate(c);
            if carried + r <= left {
                carried += r;
                set = set.with(c);
            }
        }
        Some(set)
    }

    /// The time the window spans, seconds.
    fn span(&self) -> f64 {
        match (self.samples.front(), self.samples.back()) {
            (Some((first, _)), Some((last, _))) => last.saturating_sub(*first).as_secs_f64(),
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A window of one second over which Medium (rank 1) pulled `per_cohort[c]` of cohort `c`.
    fn measured(per_cohort: impl Fn(usize) -> u64) -> CohortArrival {
        let mut a = CohortArrival::default();
        let zero = [[0u64; COHORTS as usize]; PARTIAL_TIERS];
        let mut after = zero;
        for (c, n) in after[1].iter_mut().enumerate() {
            *n = per_cohort(c);
        }
        a.record(ms(0), &zero, ms(3000), |_, _| true);
        a.record(ms(1000), &after, ms(3000), |_, _| true);
        a
    }

    #[test]
    fn an_even_spread_admits_the_first_cohorts() {
        let a = measured(|_| 10);
        assert_eq!(a.choose(1, 0.25, 0.0, None), CohortSet::first(32));
        assert_eq!(a.choose(1, 1.0, 0.0, None), CohortSet::first(COHORTS));
        assert_eq!(a.choose(1, -0.2, 0.0, None), CohortSet::default());
    }

    #[test]
    fn a_heavy_cohort_is_skipped_and_lighter_ones_fill_the_rest() {
        // Cohort 0 carries 70 % of the tier (one tenant); the others 0.3 / 127 each.
        let a = measured(|c| if c == 0 { 127 * 70 } else { 30 });
        let total = 127.0 * 100.0;
        let set = a.choose(1, 0.2667, 0.0, None);
        assert!(!set.contains(0), "{set:?}");
        // 0.2667 of the tier is 3,387 messages: 112 light cohorts of 30.
        assert_eq!(set, (1..=112).fold(CohortSet::default(), CohortSet::with));
        let carried = f64::from(set.len()) * 30.0 / total;
        assert!(carried <= 0.2667 && carried > 0.26, "{carried}");
        // With room for the tenant, it is admitted first, as its cohort's place says.
        let set = a.choose(1, 0.8, 0.0, None);
        assert!(
            set.contains(0) && set.contains(1) && !set.contains(100),
            "{set:?}"
        );
    }

    #[test]
    fn the_admitted_set_holds_while_it_carries_the_share_within_the_band() {
        let a = measured(|_| 10);
        let current = CohortSet::first(32); // a share of 0.25
        assert_eq!(a.choose(1, 0.27, 0.025, Some(current)), current);
        assert_eq!(a.choose(1, 0.23, 0.025, Some(current)), current);
        // Past the band either way, chosen again.
        assert_eq!(a.choose(1, 0.3, 0.025, Some(current)), CohortSet::first(38));
        assert_eq!(a.choose(1, 0.2, 0.025, Some(current)), CohortSet::first(25));
    }

    #[test]
    fn without_a_measured_arrival_users_are_taken_as_spread_evenly() {
        let a = CohortArrival::default();
        assert_eq!(a.choose(1, 0.5, 0.0, None), CohortSet::first(64));
        // Another tier measured, this one not pulled in the window (its topic paused).
        let a = measured(|_| 10);
        assert_eq!(a.choose(0, 0.25, 0.0, None), CohortSet::first(32));
    }

    #[test]
    fn the_window_forgets_readings_older_than_its_span() {
        let mut a = CohortArrival::default();
        let mut pulls = [[0u64; COHORTS as usize]; PARTIAL_TIERS];
        // For 3 s cohort 0 carries everything, then for 3 s every cohort evenly.
        for tick in 0..=60u64 {
            if tick > 0 && tick <= 30 {
                pulls[1][0] += 128;
            } else if tick > 30 {
                for n in &mut pulls[1] {
                    *n += 1;
                }
            }
            a.record(ms(100 * tick), &pulls, ms(3000), |_, _| true);
        }
        assert_eq!(a.choose(1, 0.5, 0.0, None), CohortSet::first(64));
    }

    /// Medium's users send 10 messages/s per cohort. For 3 s every cohort is admitted; then
    /// for 3 s only `admitted`, the others refused and re-published by their producers until
    /// each message is pulled `retries + 1` times.
    fn storm(admitted: CohortSet, retries: u64) -> CohortArrival {
        let mut a = CohortArrival::default();
        let mut pulls = [[0u64; COHORTS as usize]; PARTIAL_TIERS];
        for tick in 0..=60u64 {
            let storm = tick > 30;
            for (c, n) in pulls[1].iter_mut().enumerate() {
                let c = c as u8;
                *n += if storm && !admitted.contains(c) {
                    1 + retries
                } else {
                    1
                };
            }
            let set = if storm {
                admitted
            } else {
                CohortSet::first(COHORTS)
            };
            a.record(ms(100 * tick), &pulls, ms(3000), |rank, c| {
                rank != 1 || set.contains(c)
            });
        }
        a
    }

    /// The tier's pull rate over the window, messages/s (no lag: pulls are arrival).
    fn pull_rate(a: &CohortArrival) -> f64 {
        a.window(1).map_or(0.0, |w| w.iter().sum::<u64>() as f64) / a.span()
    }

    #[test]
    fn a_retry_storm_is_weighed_at_what_its_users_send() {
        // 32 cohorts admitted (320/s), 640/s left: 32 more, whatever their re-submissions.
        let a = storm(CohortSet::first(32), 16);
        let own = pull_rate(&a);
        assert!(own > 16.0 * 960.0, "{own}");
        let set = a.choose_measured(1, own, 640.0, 20.0, Some(CohortSet::first(32)));
        assert_eq!(set, Some(CohortSet::first(64)));
        // Weighed at their pulls, the refused cohorts look 17 times heavier: only the ones
        // admitted already fit, and the capacity left is not used.
        let before = a.choose(1, 640.0 / own, 20.0 / own, Some(CohortSet::first(32)));
        assert!(before.len() < 40, "{before:?}");
    }

    #[test]
    fn past_the_band_the_last_cohorts_go_first_and_within_it_the_set_holds() {
        let a = storm(CohortSet::first(64), 16);
        let own = pull_rate(&a);
        let current = Some(CohortSet::first(64));
        // 640/s carried: 630 is within the band, 400 takes the last 24 cohorts out.
        assert_eq!(a.choose_measured(1, own, 630.0, 20.0, current), current);
        assert_eq!(
            a.choose_measured(1, own, 400.0, 20.0, current),
            Some(CohortSet::first(40))
        );
        // Without re-submissions the measure is the pulls: the same choice.
        let calm = storm(CohortSet::first(64), 0);
        assert_eq!(
            calm.choose_measured(1, pull_rate(&calm), 400.0, 20.0, current),
            Some(CohortSet::first(40))
        );
        // Nothing pulled of the tier: nothing measured.
        assert_eq!(a.choose_measured(0, 1.0, 400.0, 20.0, current), None);
    }

    #[test]
    fn a_tenant_grown_heavy_goes_and_the_light_users_after_it_stay() {
        // Every cohort admitted for 6 s, 10/s each; over the last 3 s cohort 5's tenant
        // sends 800/s, more than the 640/s left: the 64 light cohorts other than 5.
        let mut a = CohortArrival::default();
        let mut pulls = [[0u64; COHORTS as usize]; PARTIAL_TIERS];
        for tick in 0..=60u64 {
            for (c, n) in pulls[1].iter_mut().enumerate() {
                *n += if c == 5 && tick > 30 { 80 } else { 1 };
            }
            a.record(ms(100 * tick), &pulls, ms(3000), |_, _| true);
        }
        let current = Some(CohortSet::first(64));
        let set = a
            .choose_measured(1, pull_rate(&a), 640.0, 20.0, current)
            .unwrap_or_default();
        assert!(!set.contains(5), "{set:?}");
        assert_eq!(set, CohortSet::first(65).without(5));
    }
}
