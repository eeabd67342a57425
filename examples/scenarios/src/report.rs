//! The report of record: per scenario and tier, goodput for each consumer (the FIFO, the
//! defaults before the zero-configuration controller, the best hand-tuned settings, the
//! zero-configuration default), the bars, the best hand-tuned settings, recovery, and
//! the ledger and determinism checks.

use std::fmt::Write;
use std::time::Duration;

use triage::Criticality;

use crate::grid::{self, Search};
use crate::outcome::Outcome;
use crate::recovery::Recovery;
use crate::scenario::Scenario;

/// One scenario's runs.
#[derive(Debug)]
pub struct Row<'a> {
    /// The scenario.
    pub scenario: &'a Scenario,
    /// The plain FIFO.
    pub fifo: &'a Outcome,
    /// Triage with the defaults before the zero-configuration controller.
    pub defaults: &'a Outcome,
    /// Triage with `RuntimeConfig::default()`, the zero-configuration default.
    pub zero: &'a Outcome,
    /// Whether a second run of the zero-configuration default gave the same ledger and goodput.
    pub deterministic: bool,
}

fn pct(x: f64) -> String {
    format!("{:.1}", 100.0 * x)
}

fn recovery_cell(r: Option<Recovery>) -> String {
    match r {
        None => "-".to_string(),
        Some(r) => format!(
            "{} / {} / {} / {}",
            r.readmitted_after
                .map_or("never".to_string(), |d| format!("{:.2} s", d.as_secs_f64())),
            r.peak,
            r.changes_during,
            r.changes_after
        ),
    }
}

/// Renders the report; `search` is the grid search, when it was run.
pub fn render(rows: &[Row<'_>], search: Option<&Search>, command: &str, wall: Duration) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# Scenario matrix (issue 33): FIFO, defaults, best hand-tuned, zero-configuration\n"
    );
    let _ = writeln!(
        o,
        "Regenerate: `{command}` (virtual time; {} in all on this machine).\n",
        fmt_secs(wall)
    );
    let _ = writeln!(
        o,
        "Capacity is 8 workers over a 2 ms mean service time (1, 2 or 3 ms, equally likely): \
         4,000 messages a second is 1x. Arrivals are Poisson; the mix is 10 / 20 / 30 / 40 % \
         Critical / High / Medium / Sheddable, due 1000 / 500 / 250 / 100 ms after \
         publishing. Goodput is completions within deadline over offered, per tier, judged \
         by the producer; the weighted total weighs the tiers 8 / 4 / 2 / 1. The FIFO is a \
         bounded channel of 256 in front of the same workers (a failed call retried at once, \
         up to 3 times; in key mode a worker waits for the key's previous message). Triage \
         runs with a defer topic drained back when load falls, as in README's first command. \
         *Defaults* are the defaults before the zero-configuration controller (the intake \
         pulls the prefetch ahead, 8 x it past busy keys, weighs cohorts at their pulls, and \
         the queue serves by weight alone: `expert.admission.derive_bounds = false`); \
         *zero-config* is \
         `RuntimeConfig::default()`: the intake pulls as far ahead as the workers clear within \
         the shortest deadline slack (`triage::admission::derived_lookahead`), the queue \
         serves the tier due first ahead of the weighted order when every more important \
         tier's queued work still meets its deadlines at the measured capacity, counting the \
         longest run of the tier served early (slack stealing), and a cohort refused within \
         the window is weighed at its rate while admitted, not at its re-submissions.\n"
    );
    let _ = writeln!(o, "## Scenarios\n");
    let _ = writeln!(o, "| scenario | what | seed |\n|---|---|---|");
    for r in rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} |",
            r.scenario.name, r.scenario.summary, r.scenario.seed
        );
    }
    let _ = writeln!(o, "\n## Goodput, % of offered\n");
    let best_head = if search.is_some() {
        " best hand-tuned |"
    } else {
        ""
    };
    let best_sep = if search.is_some() { "---:|" } else { "" };
    let _ = writeln!(
        o,
        "| scenario | tier | offered | FIFO | defaults |{best_head} zero-config |\n|---|---|---:|---:|---:|{best_sep}---:|"
    );
    for (i, r) in rows.iter().enumerate() {
        let best = search.map(|s| &s.best[i].outcome);
        for tier in Criticality::ALL {
            let mut line = format!(
                "| {} | {} | {} | {} | {} |",
                r.scenario.name,
                tier.as_str(),
                r.defaults.goodput.tiers[tier].offered,
                pct(r.fifo.goodput.share(tier)),
                pct(r.defaults.goodput.share(tier)),
            );
            if let Some(b) = best {
                let _ = write!(line, " {} |", pct(b.goodput.share(tier)));
            }
            let _ = write!(line, " {} |", pct(r.zero.goodput.share(tier)));
            let _ = writeln!(o, "{line}");
        }
        let mut line = format!(
            "| {} | **weighted** | | **{}** | **{}** |",
            r.scenario.name,
            pct(r.fifo.goodput.weighted()),
            pct(r.defaults.goodput.weighted()),
        );
        if let Some(b) = best {
            let _ = write!(line, " **{}** |", pct(b.goodput.weighted()));
        }
        let _ = write!(line, " **{}** |", pct(r.zero.goodput.weighted()));
        let _ = writeln!(o, "{line}");
    }

    o.push_str(&crate::users::section(rows));

    if let Some(s) = search {
        bars(&mut o, rows, s);
    }

    if let Some(s) = search {
        let _ = writeln!(o, "\n## Best hand-tuned settings\n");
        let _ = writeln!(
            o,
            "The grid: `expert.queue.weights` {:?}, `expert.admission.headroom` {:?}, \
             `expert.retry.base_backoff_ms` {:?}, `expert.admission.recover_ms` {:?}, `expert.queue.capacity` {:?}, \
             limit fixed at the workers or Gradient2 (initial = max = workers): {} points, \
             {} runs in {} on {} threads. Best = highest Critical goodput, then highest \
             weighted total; a tie keeps the earlier point (the defaults come first).\n",
            grid::WEIGHTS,
            grid::HEADROOM,
            grid::BACKOFF_MS,
            grid::RECOVER_MS,
            grid::CAPACITY,
            grid::points().len(),
            s.runs,
            fmt_secs(s.wall),
            s.threads,
        );
        let _ = writeln!(
            o,
            "| scenario | best settings | tied points |\n|---|---|---:|"
        );
        for (i, r) in rows.iter().enumerate() {
            let b = &s.best[i];
            let _ = writeln!(
                o,
                "| {} | {} | {} |",
                r.scenario.name,
                b.point.describe(),
                b.ties
            );
        }
    }

    let _ = writeln!(o, "\n## Recovery and shedding\n");
    let _ = writeln!(
        o,
        "Shed level = tiers refused (`Runtime::load().shed_tiers()`), sampled every 10 ms. \
         Recovery cells: time from the step's end until every tier is admitted again / peak \
         level / direction changes of the level during the step / after it. `shed samples`, \
         `shed (ledger)`, `expired` and `resubmitted` are the zero-configuration default's; \
         `ledger balances` is checked for the defaults and the zero-configuration default.\n"
    );
    let best_head = if search.is_some() {
        " best: recovery |"
    } else {
        ""
    };
    let _ = writeln!(
        o,
        "| scenario | defaults: recovery | zero-config: recovery | shed samples | shed (ledger) | expired | resubmitted |{best_head} ledger balances | same ledger twice |\n|---|---|---|---:|---:|---:|---:|{best_sep}---|---|"
    );
    for (i, r) in rows.iter().enumerate() {
        let stats = r.zero.stats;
        let (shed, expired) = stats.map_or((0, 0), |s| {
            let t = s.ledger.total();
            (t.shed, t.expired)
        });
        let mut line = format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.scenario.name,
            recovery_cell(r.defaults.recovery),
            recovery_cell(r.zero.recovery),
            r.zero.shed_samples(),
            shed,
            expired,
            r.zero.resubmitted,
        );
        if let Some(s) = search {
            let _ = write!(line, " {} |", recovery_cell(s.best[i].outcome.recovery));
        }
        let _ = write!(
            line,
            " {} | {} |",
            if r.zero.balances && r.defaults.balances {
                "yes"
            } else {
                "NO"
            },
            if r.deterministic { "yes" } else { "NO" }
        );
        let _ = writeln!(o, "{line}");
    }
    o
}

/// Whether `a` is better than `b` by at least the report's precision (0.05 point, so that a
/// win shows in figures rounded to 0.1).
fn better(a: f64, b: f64) -> bool {
    a - b >= 0.0005
}

/// The bars, per scenario and in all: the zero-configuration default within 0.1 point
/// of the best hand-tuned Critical goodput and within 2 % (relative) of its weighted total,
/// better than the defaults in at least half the scenarios, and after each step the shed level
/// changing direction at most twice.
fn bars(o: &mut String, rows: &[Row<'_>], s: &Search) {
    let _ = writeln!(o, "\n## The bars (issue 33)\n");
    let _ = writeln!(
        o,
        "Zero-config against the best hand-tuned point: Critical within 0.1 point, weighted \
         total within 2 % (relative); against the defaults: better (by at least 0.05 point of \
         the weighted total) in at least 6 of 12; after a step, the shed level changes \
         direction at most twice.\n"
    );
    let _ = writeln!(
        o,
        "| scenario | Critical: zero-config - best (points) | weighted: zero-config / best - 1 (%) | weighted: zero-config - defaults (points) | shed level changes after the step | bars |\n|---|---:|---:|---:|---:|---|"
    );
    let (mut critical_ok, mut weighted_ok, mut wins, mut steady) = (0, 0, 0, 0);
    for (i, r) in rows.iter().enumerate() {
        let best = &s.best[i].outcome.goodput;
        let zero = &r.zero.goodput;
        let dc = zero.share(Criticality::Critical) - best.share(Criticality::Critical);
        let rel = if best.weighted() > 0.0 {
            zero.weighted() / best.weighted() - 1.0
        } else {
            0.0
        };
        let dd = zero.weighted() - r.defaults.goodput.weighted();
        let changes = r.zero.recovery.map(|rc| rc.changes_after);
        let c_ok = dc >= -0.001;
        let w_ok = rel >= -0.02;
        let win = better(zero.weighted(), r.defaults.goodput.weighted());
        let s_ok = changes.is_none_or(|c| c <= 2);
        critical_ok += usize::from(c_ok);
        weighted_ok += usize::from(w_ok);
        wins += usize::from(win);
        steady += usize::from(s_ok);
        let mut met = Vec::new();
        if !c_ok {
            met.push("Critical missed");
        }
        if !w_ok {
            met.push("weighted missed");
        }
        if win {
            met.push("better than defaults");
        }
        if !s_ok {
            met.push("oscillates");
        }
        let _ = writeln!(
            o,
            "| {} | {:+.2} | {:+.2} | {:+.2} | {} | {} |",
            r.scenario.name,
            100.0 * dc,
            100.0 * rel,
            100.0 * dd,
            changes.map_or("-".to_string(), |c| c.to_string()),
            if met.is_empty() {
                "met".to_string()
            } else {
                met.join(", ")
            }
        );
    }
    let n = rows.len();
    let _ = writeln!(
        o,
        "\nIn all: Critical within 0.1 point of the best in {critical_ok} of {n}; weighted \
         within 2 % in {weighted_ok} of {n}; better than the defaults in {wins} of {n} (the \
         bar: half); at most two direction changes after a step in {steady} of {n}."
    );
}

fn fmt_secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
