//! Unit tests of `admission::pull`, beside it so that its file holds the code.

use super::*;
use crate::admission::COHORTS;

pub(in crate::admission) fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Runs `ticks` ticks of 100 ms: capacity 8 handlers of 10 ms, arrivals `rate`/s with the
/// mix 10/20/30/40 (Critical first), the worker pulling `pull`/s.
fn drive(a: &mut PullAdmission, s: &mut PullSample, ticks: u64, rate: f64, pull: f64) {
    let mix = [0.4, 0.3, 0.2, 0.1]; // by rank
    for _ in 0..ticks {
        s.at += ms(100);
        for (r, share) in mix.iter().enumerate() {
            s.pulled[r] += (pull * share / 10.0) as u64;
        }
        let served = (pull.min(800.0) / 10.0) as u64;
        s.served += served;
        s.busy += ms(10) * served as u32;
        let lag = s.lag.unwrap_or(0) as f64 + (rate - pull) / 10.0;
        s.lag = Some(lag.max(0.0) as u64);
        a.observe(s);
    }
}

/// A pull admission on the defaults and its first sample: 8 slots, the lag known and empty.
pub(in crate::admission) fn fresh() -> (PullAdmission, PullSample) {
    let s = PullSample {
        limit: 8,
        lag: Some(0),
        ..PullSample::default()
    };
    (PullAdmission::new(&PullAdmissionConfig::default()), s)
}

#[test]
fn one_x_and_below_shed_nothing() {
    for rate in [400.0, 640.0, 800.0, 830.0] {
        let (mut a, mut s) = fresh();
        drive(&mut a, &mut s, 50, rate, rate);
        assert_eq!(a.level(), 0, "rate {rate}");
    }
}

#[test]
fn overload_sheds_from_the_bottom_by_mix() {
    let (mut a, mut s) = fresh();
    drive(&mut a, &mut s, 20, 2400.0, 800.0);
    assert_eq!(a.level(), 2, "3x: Critical+High = 720/s fit 760/s");
    let (mut a, mut s) = fresh();
    drive(&mut a, &mut s, 20, 8000.0, 800.0);
    assert_eq!(a.level(), 3, "10x: Critical only");
    assert!(a.admits(Criticality::Critical));
}

#[test]
fn the_capacity_left_admits_cohorts_of_the_highest_refused_tier() {
    // 2.5x: Critical + High = 600/s of a budget of 0.95 x 800 = 760/s; the 160/s left is 26.7 %
    // of Medium's 600/s: 34 of 128 cohorts.
    let (mut a, mut s) = fresh();
    drive(&mut a, &mut s, 20, 2000.0, 800.0);
    assert_eq!((a.level(), a.admitted_cohorts()), (2, 34));
    // 3x: 40/s left of Medium's 720/s: 7 cohorts.
    let (mut a, mut s) = fresh();
    drive(&mut a, &mut s, 20, 2400.0, 800.0);
    assert_eq!((a.level(), a.admitted_cohorts()), (2, 7));
    // 10x: Critical alone is over the budget; no High cohort fits.
    let (mut a, mut s) = fresh();
    drive(&mut a, &mut s, 20, 8000.0, 800.0);
    assert_eq!((a.level(), a.admitted_cohorts()), (3, 0));
    // Back to 0.5x: every tier admitted, no partial tier.
    drive(&mut a, &mut s, 60, 400.0, 400.0);
    assert_eq!((a.level(), a.admitted_cohorts()), (0, 0));
}

#[test]
fn deferring_the_refused_tiers_does_not_hide_the_overload() {
    // Once Medium and Sheddable are deferred the worker pulls at the arrival rate and the
    // lag stops growing: the arrival estimate must stay 2,400/s.
    let (mut a, mut s) = fresh();
    drive(&mut a, &mut s, 20, 2400.0, 800.0);
    drive(&mut a, &mut s, 50, 2400.0, 2400.0);
    assert_eq!(a.level(), 2);
    assert!(
        (a.arrival_rate() - 2400.0).abs() < 100.0,
        "{}",
        a.arrival_rate()
    );
}

#[test]
fn recovery_is_bottom_up_after_recover_ms() {
    let (mut a, mut s) = fresh();
    drive(&mut a, &mut s, 20, 2400.0, 800.0);
    assert_eq!(a.level(), 2);
    // Arrival falls to 1.3x (1,040/s): Medium fits again, Sheddable not yet.
    drive(&mut a, &mut s, 30, 1040.0, 1040.0);
    assert_eq!(a.level(), 1);
    // Then to 0.5x: everything is admitted again.
    drive(&mut a, &mut s, 30, 400.0, 400.0);
    assert_eq!(a.level(), 0);
}

#[test]
fn a_backlog_without_arrivals_is_not_overload() {
    let (mut a, mut s) = fresh();
    s.lag = Some(30_000);
    for tick in 0..100 {
        s.at += ms(100);
        s.pulled[1] += 80; // all Medium
        s.served += 80;
        s.busy += ms(800);
        s.lag = s.lag.map(|l| l.saturating_sub(80));
        a.observe(&s);
        assert_eq!(a.level(), 0, "tick {tick}");
    }
    assert!(a.arrival_rate() < 1.0, "{}", a.arrival_rate());
}

#[test]
fn a_step_in_the_lag_is_not_arrival() {
    // A source reports 0 before its first measurement, then the backlog it found; or a
    // rebalance assigns partitions with lag. One step, then the lag falls: no overload.
    let (mut a, mut s) = fresh();
    for tick in 0..60u64 {
        s.at += ms(100);
        s.pulled[1] += 80;
        s.served += 80;
        s.busy += ms(800);
        s.lag = Some(match tick {
            0..=4 => 0,
            _ => 20_000 - 80 * (tick - 4),
        });
        a.observe(&s);
        assert_eq!(a.level(), 0, "tick {tick}: arrival {}", a.arrival_rate());
    }
}

#[test]
fn pulls_before_the_lag_is_known_are_not_arrival() {
    // A consumer starts on a backlog, keyed: its intake pulls ahead to fill the key gate and
    // the queue (2,000 records in the first half second) while the source has not measured
    // its lag yet. Capacity 8 handlers of 100 ms = 80/s; every record due 2 s after it is
    // pulled. The pulls say how fast the runtime reads, not how fast work arrives: nothing
    // arrives at all.
    let (mut a, mut s) = fresh();
    s.lag = None;
    let mut backlog = 10_000u64;
    for tick in 0..40u64 {
        s.at += ms(100);
        let pulled = if tick < 5 { 400 } else { 8 };
        for r in 0..4 {
            s.pulled[r] += pulled / 4;
            s.with_deadline[r] += pulled / 4;
            s.slack[r] += Duration::from_secs(2) * (pulled / 4) as u32;
        }
        backlog -= pulled;
        s.served += 8;
        s.busy += ms(800);
        s.waiting = s.waiting + pulled - 8;
        s.lag = (tick >= 16).then_some(backlog);
        a.observe(&s);
        assert_eq!(a.level(), 0, "tick {tick}: arrival {}", a.arrival_rate());
    }
}

/// Capacity 727/s (8 handlers of 11 ms); 640 records/s (0.88x, mix 10/20/30/40) reach
/// the broker as 0.8 s of nothing, then 512 at once (a producer or a broker that stalls
/// and catches up). Records are stamped `window` per tier at production; those of a burst
/// were produced over the stall. The worker pulls in order at capacity. Returns the
/// highest level seen and the number of ticks at a level above 0.
fn bursty(windows_ms: [u64; 4], with_deadlines: bool) -> (u8, usize) {
    let mut a = PullAdmission::new(&PullAdmissionConfig::default());
    let mut s = PullSample {
        limit: 8,
        lag: Some(0),
        ..PullSample::default()
    };
    // Records in the broker, oldest first: (rank, produced at, in ms).
    let mut broker: VecDeque<(usize, u64)> = VecDeque::new();
    let (mut highest, mut raised) = (0, 0);
    let mut carry = 0.0;
    for tick in 1..=200u64 {
        let now = tick * 100;
        if tick % 8 == 0 {
            // The burst: 512 records produced evenly over the last 800 ms.
            for i in 0..512u64 {
                // Mix 10/20/30/40 %, by rank (Sheddable = 0).
                let rank = match i % 10 {
                    0..=3 => 0,
                    4..=6 => 1,
                    7..=8 => 2,
                    _ => 3,
                };
                broker.push_back((rank, now - 800 + i * 800 / 512));
            }
        }
        // Pulled and served at 72.7 per 100 ms.
        carry += 72.7;
        let n = carry as u64;
        carry -= n as f64;
        for _ in 0..n {
            let Some((rank, produced)) = broker.pop_front() else {
                break;
            };
            s.pulled[rank] += 1;
            s.served += 1;
            s.busy += ms(11);
            if with_deadlines {
                let deadline = produced + windows_ms[3 - rank];
                s.with_deadline[rank] += 1;
                s.slack[rank] += ms(deadline.saturating_sub(now));
            }
        }
        s.at = ms(now);
        s.lag = Some(broker.len() as u64);
        s.waiting = 16.min(broker.len() as u64);
        let level = a.observe(&s);
        highest = highest.max(level);
        raised += usize::from(level > 0);
    }
    (highest, raised)
}

#[test]
fn bursty_arrival_below_capacity_is_not_overload() {
    // Every burst clears in 0.7 s; the tiers' windows (10/5/3/2 s) leave time to spare.
    assert_eq!(bursty([10_000, 5_000, 3_000, 2_000], true), (0, 0));
    // Without deadlines only sustained excess counts, and 0.88x never is.
    assert_eq!(bursty([10_000, 5_000, 3_000, 2_000], false), (0, 0));
}

#[test]
fn a_burst_that_would_miss_deadlines_makes_room() {
    // The proving ground's windows (3000/1500/800/400 ms): each burst's Sheddable records
    // would miss, so Sheddable is refused for the burst, never more, and re-admitted.
    let (highest, raised) = bursty([3_000, 1_500, 800, 400], true);
    assert_eq!(highest, 1);
    assert!(raised > 0 && raised < 200, "{raised} ticks raised");
}

#[test]
fn one_x_with_a_dip_in_capacity_does_not_latch() {
    // 700/s offered to 8 handlers of about 11.4 ms (700/s), pulled as it arrives, the lag
    // a handful; for 1.5 s the handlers take 12.5 ms (640/s): a rate excess of 1.09 over
    // the window, with no deadline at stake (Sheddable's slack 390 ms against a wait of
    // 33 ms) and no backlog growing (the dip is in the estimate: the worker keeps up).
    let (mut a, mut s) = fresh();
    let mut levels = Vec::new();
    for tick in 0..100u64 {
        s.at += ms(100);
        let service = if (30..45).contains(&tick) {
            12.5
        } else {
            11.43
        };
        for (r, share) in [0.4, 0.3, 0.2, 0.1].iter().enumerate() {
            s.pulled[r] += (70.0 * share) as u64;
            s.with_deadline[r] += (70.0 * share) as u64;
            s.slack[r] += ms([390, 790, 1490, 2990][r]) * (70.0 * share) as u32;
        }
        s.served += 70;
        s.busy += Duration::from_secs_f64(70.0 * service / 1000.0);
        s.lag = Some(5);
        s.waiting = 16;
        levels.push(a.observe(&s));
    }
    assert!(levels.iter().all(|l| *l == 0), "{levels:?}");
}

#[test]
fn a_raised_level_at_one_x_comes_down_when_nothing_is_at_stake() {
    // 1.3x for 2 s raises the level (the lag grows: sustained, and Sheddable's 400 ms
    // would be missed). Then arrival falls to exactly capacity (above 0.95 x it) and the
    // lag drains to a handful: with nothing at stake the level comes down after
    // recover_ms, where the rate rule alone kept it up for as long as the 1x lasted.
    let (mut a, mut s) = fresh();
    let mut levels = Vec::new();
    for tick in 0..80u64 {
        s.at += ms(100);
        let lag = s.lag.unwrap_or(0);
        let (rate, pull) = match tick {
            0..=19 => (104, 80),
            _ if lag > 5 => (80, 100),
            _ => (80, 80),
        };
        for (r, share) in [0.4, 0.3, 0.2, 0.1].iter().enumerate() {
            let n = (pull as f64 * share) as u64;
            s.pulled[r] += n;
            s.with_deadline[r] += n;
            s.slack[r] += ms([350, 750, 1450, 2950][r]) * n as u32;
        }
        s.served += 80;
        s.busy += ms(800);
        s.lag = Some((lag + rate).saturating_sub(pull));
        s.waiting = 16;
        levels.push(a.observe(&s));
    }
    assert!(levels[..20].contains(&1), "{levels:?}");
    assert_eq!(levels[60..], [0; 20], "{levels:?}");
}

#[test]
fn disabled_never_sheds() {
    let mut a = PullAdmission::new(&PullAdmissionConfig::disabled());
    let mut s = PullSample {
        limit: 8,
        lag: Some(0),
        ..PullSample::default()
    };
    drive(&mut a, &mut s, 20, 8000.0, 800.0);
    assert_eq!(a.level(), 0);
}

/// As [`drive`], feeding the pulls per cohort too: of Medium's, `weight(c)` parts in cohort
/// `c` (Sheddable's and High's spread evenly). `acc` carries the fractions between ticks.
#[allow(clippy::too_many_arguments)]
fn drive_cohorts(
    a: &mut PullAdmission,
    s: &mut PullSample,
    pulls: &mut CohortPulls,
    acc: &mut [[f64; COHORTS as usize]; 3],
    ticks: u64,
    rate: f64,
    pull: f64,
    weight: impl Fn(usize) -> f64,
) {
    let mix = [0.4, 0.3, 0.2];
    let total: f64 = (0..COHORTS as usize).map(&weight).sum();
    for _ in 0..ticks {
        for (r, share) in mix.iter().enumerate() {
            for c in 0..COHORTS as usize {
                let part = if r == 1 {
                    weight(c) / total
                } else {
                    1.0 / 128.0
                };
                acc[r][c] += pull * share / 10.0 * part;
                let whole = acc[r][c].floor();
                acc[r][c] -= whole;
                pulls[r][c] += whole as u64;
            }
        }
        a.observe_cohorts(s.at + ms(100), pulls);
        drive(a, s, 1, rate, pull);
    }
}

#[test]
fn a_heavy_tenant_cohort_is_skipped_and_the_light_cohorts_carry_the_capacity_left() {
    // 2.5x: 160/s left of Medium's 600/s, of which one tenant in cohort 0 sends 70 % (420/s,
    // more than the capacity left by itself) and the others 180/s over 127 cohorts.
    let (mut a, mut s) = fresh();
    let mut pulls = [[0u64; COHORTS as usize]; 3];
    let mut acc = [[0.0; COHORTS as usize]; 3];
    let heavy = |c: usize| if c == 0 { 0.7 * 127.0 / 0.3 } else { 1.0 };
    drive_cohorts(
        &mut a, &mut s, &mut pulls, &mut acc, 40, 2000.0, 800.0, heavy,
    );
    let set = a.admitted_set();
    assert_eq!(a.level(), 2);
    assert!(!set.contains(0), "the tenant's cohort admitted: {set:?}");
    // 160/s of 180/s over 127 light cohorts (1.42/s each): the first ones, carrying the
    // capacity left within the margin the set is kept in (half the headroom's, 20/s).
    let carried = 180.0 * f64::from(set.len()) / 127.0;
    assert!(
        (138.0..=182.0).contains(&carried),
        "{carried}/s admitted of 160/s left"
    );
    assert!((1..=set.len()).all(|c| set.contains(c)), "{set:?}");
    // Without the per-cohort counts, the first 34 cohorts: the tenant's among them, 420/s
    // and more admitted where 160/s fit.
    let (mut b, mut t) = fresh();
    drive(&mut b, &mut t, 40, 2000.0, 800.0);
    assert!(b.admitted_set().contains(0) && b.admitted_cohorts() == 34);
}

#[test]
fn the_admitted_cohorts_hold_through_noise_in_the_estimate() {
    // 2.5x with users spread evenly, the arrival 2 % above or below for half a second at a
    // time: the capacity left (a small difference of two estimates) moves by several
    // cohorts' arrival, the admitted set does not.
    let (mut a, mut s) = fresh();
    let mut pulls = [[0u64; COHORTS as usize]; 3];
    let mut acc = [[0.0; COHORTS as usize]; 3];
    let even = |_: usize| 1.0;
    drive_cohorts(
        &mut a, &mut s, &mut pulls, &mut acc, 30, 2000.0, 800.0, even,
    );
    let settled = a.admitted_set();
    assert_eq!(a.level(), 2);
    assert!((30..=38).contains(&settled.len()), "{settled:?}");
    for tick in 0..30 {
        let rate = if tick / 5 % 2 == 0 { 1960.0 } else { 2040.0 };
        drive_cohorts(&mut a, &mut s, &mut pulls, &mut acc, 1, rate, 800.0, even);
        assert_eq!(a.admitted_set(), settled, "tick {tick}");
    }
    // A lasting change past the margin moves it: 3x leaves 40/s of Medium's 720/s.
    drive_cohorts(
        &mut a, &mut s, &mut pulls, &mut acc, 20, 2400.0, 800.0, even,
    );
    assert!(
        (5..=8).contains(&a.admitted_cohorts()),
        "{}",
        a.admitted_cohorts()
    );
}
