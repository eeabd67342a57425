//! Per-user figures of the partly admitted tier: whether shedding took the same users' work
//! (cohorts, DAGOR's user priority) or everyone's in part.
//!
//! While a tier is the highest one refused (shed level `L`, the tier of rank `L - 1`), pull
//! admission admits some of its cohorts: the capacity the tiers above leave. The tier is
//! *partly admitted* while some of its cohorts are and some are not
//! (`0 < Runtime::admitted_cohorts() < COHORTS`). Each message offered meanwhile counts for
//! its user (a tier's users are its own: see [`Scenario::users`](crate::Scenario::users)), and
//! each such user is **fully served** (every one of those messages completed by its
//! deadline), **partly served** (some) or **not served** (none). The stretches come from the
//! run of `RuntimeConfig::default()` (the zero-configuration default; sampled every 10 ms);
//! the defaults before it and the FIFO are judged over the same messages, for comparison.

use std::collections::HashMap;
use std::fmt::Write;
use std::time::Duration;

use triage::admission::COHORTS;
use triage::Criticality;

use crate::report::Row;

/// One offered message, as the per-user figures see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offered {
    /// Its tier.
    pub tier: Criticality,
    /// Its user within the tier (in key mode, its key).
    pub user: u64,
    /// Its user's cohort (`0..COHORTS`, the rotation period fixed).
    pub cohort: u8,
    /// When it was first published, since the run's start (0 for a backlog's).
    pub at: Duration,
    /// Whether it was completed by its deadline.
    pub in_time: bool,
}

/// A tier's users over the time it was the highest refused tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Users {
    /// Users who offered at least one message meanwhile.
    pub offered: usize,
    /// Of those, users with every one of those messages served in time.
    pub full: usize,
    /// Users with some served in time, not all.
    pub part: usize,
    /// Of those, users with at least half served in time.
    pub half: usize,
    /// Users with none served in time.
    pub none: usize,
    /// Messages offered meanwhile.
    pub messages: u64,
}

impl Users {
    /// Users served at all (fully or partly).
    pub fn served(&self) -> usize {
        self.full + self.part
    }

    /// `n` as a share of the users offered (0 when none were).
    pub fn share(&self, n: usize) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            n as f64 / self.offered as f64
        }
    }
}

/// A triage run's shed level and admitted cohorts over time, sampled together in order.
#[derive(Clone, Copy, Debug)]
pub struct Stretches<'a> {
    /// (time since start, shed level).
    pub levels: &'a [(Duration, u8)],
    /// The cohorts admitted of the highest refused tier at each of those samples.
    pub cohorts: &'a [u8],
}

impl<'a> Stretches<'a> {
    /// The shed level and cohort series of a triage run.
    pub fn of(run: &'a crate::Outcome) -> Self {
        Stretches {
            levels: &run.shed_series,
            cohorts: &run.cohort_series,
        }
    }

    /// The tier of the sample at `i`, if it was partly admitted then (Critical never is).
    fn tier_at(&self, i: usize) -> Option<Criticality> {
        let level = usize::from(self.levels.get(i)?.1);
        let cohorts = *self.cohorts.get(i)?;
        (level > 0 && cohorts > 0 && cohorts < COHORTS)
            .then(|| Criticality::from_rank(level - 1))
            .flatten()
    }

    /// The tier partly admitted at `at`, if any: as at the last sample before it.
    pub fn partial_tier(&self, at: Duration) -> Option<Criticality> {
        let i = self.levels.partition_point(|(t, _)| *t <= at);
        self.tier_at(i.checked_sub(1)?)
    }

    /// The tiers ever partly admitted, most important first, with the samples each was.
    pub fn tiers(&self) -> Vec<(Criticality, usize)> {
        let mut samples = [0usize; 4];
        for i in 0..self.levels.len() {
            if let Some(t) = self.tier_at(i) {
                samples[t.rank()] += 1;
            }
        }
        Criticality::ALL
            .into_iter()
            .filter(|t| samples[t.rank()] > 0)
            .map(|t| (t, samples[t.rank()]))
            .collect()
    }
}

/// The users of `tier` over the messages offered while it was partly admitted in `stretches`
/// (a triage run's), judged on `offers` (any consumer's run of the same scenario: the same
/// messages).
pub fn users(offers: &[Offered], stretches: Stretches<'_>, tier: Criticality) -> Users {
    // Per user: (offered, served in time).
    let mut per_user: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut u = Users::default();
    for m in offers {
        if m.tier != tier || stretches.partial_tier(m.at) != Some(tier) {
            continue;
        }
        u.messages += 1;
        let e = per_user.entry(m.user).or_default();
        e.0 += 1;
        e.1 += u64::from(m.in_time);
    }
    u.offered = per_user.len();
    for &(offered, served) in per_user.values() {
        if served == offered {
            u.full += 1;
        } else if served == 0 {
            u.none += 1;
        } else {
            u.part += 1;
            if served * 2 >= offered {
                u.half += 1;
            }
        }
    }
    u
}

fn pct(x: f64) -> String {
    format!("{:.1}", 100.0 * x)
}

fn cells(u: &Users) -> String {
    format!(
        "{} | {} ({}) | {}",
        pct(u.share(u.full)),
        pct(u.share(u.part)),
        pct(u.share(u.half)),
        pct(u.share(u.none))
    )
}

/// The report's section: per scenario and partly admitted tier, its users fully, partly and
/// not served, under today's defaults and the FIFO.
pub fn section(rows: &[Row<'_>]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "\n## Users of the partly admitted tier\n");
    let _ = writeln!(
        o,
        "Each tier has {} users of its own (a message's drawn from the seed; in key mode its \
         key is its user). While a tier is the highest refused one, pull admission admits \
         the cohorts of its users whose arrival fits the capacity left; `time` is how long \
         the zero-configuration default had it partly admitted (some cohorts admitted, some \
         not; sampled every 10 ms), settling included. Over the messages offered meanwhile, \
         a user is fully served (every one completed in time), partly served (in brackets: \
         at least half in time), or not served; the defaults before the zero-configuration \
         controller and the FIFO are judged over the same messages. Shares are % of the \
         users offered.\n",
        crate::scenario::USERS
    );
    let _ = writeln!(
        o,
        "| scenario | tier | time (s) | messages | users | zero-config: full | part | none | defaults: full | part | none | FIFO: full | part | none |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let stretches = Stretches::of(r.zero);
        let tiers = stretches.tiers();
        if tiers.is_empty() {
            let _ = writeln!(
                o,
                "| {} | none partly admitted | | | | | | | | | | | | |",
                r.scenario.name
            );
        }
        for (tier, samples) in tiers {
            let z = users(&r.zero.offers, stretches, tier);
            let d = users(&r.defaults.offers, stretches, tier);
            let f = users(&r.fifo.offers, stretches, tier);
            let _ = writeln!(
                o,
                "| {} | {} | {:.2} | {} | {} | {} | {} | {} |",
                r.scenario.name,
                tier.as_str(),
                samples as f64 * 0.01,
                z.messages,
                z.offered,
                cells(&z),
                cells(&d),
                cells(&f)
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn users_are_judged_over_the_time_their_tier_is_partly_admitted() {
        // Level 2 from 10 ms to 40 ms, Medium partly admitted until 30 ms (then every cohort).
        let levels = [
            (ms(0), 0),
            (ms(10), 2),
            (ms(20), 2),
            (ms(30), 2),
            (ms(40), 0),
        ];
        let cohorts = [0, 30, 40, COHORTS, 0];
        let stretches = Stretches {
            levels: &levels,
            cohorts: &cohorts,
        };
        let m = |user, at, in_time| Offered {
            tier: Criticality::Medium,
            user,
            cohort: 0,
            at: ms(at),
            in_time,
        };
        let offers = [
            m(1, 12, true),
            m(1, 25, true),
            m(2, 12, true),
            m(2, 25, false),
            m(3, 15, false),
            // Outside the stretch, or another tier: not counted.
            m(3, 5, true),
            m(4, 35, false),
            m(4, 45, false),
            Offered {
                tier: Criticality::High,
                ..m(5, 15, false)
            },
        ];
        let u = users(&offers, stretches, Criticality::Medium);
        assert_eq!(
            u,
            Users {
                offered: 3,
                full: 1,
                part: 1,
                half: 1,
                none: 1,
                messages: 5
            }
        );
        assert_eq!(stretches.tiers(), vec![(Criticality::Medium, 2)]);
        assert_eq!(
            users(&offers, stretches, Criticality::High),
            Users::default()
        );
    }
}
