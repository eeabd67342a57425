//! The report of record: per scenario and tier, goodput for each consumer, the best
//! hand-tuned settings, recovery, and the ledger and determinism checks.

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
    /// Triage with today's defaults.
    pub defaults: &'a Outcome,
    /// Whether a second run of the defaults gave the same ledger and goodput.
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
        "# Scenario matrix (issue 33): FIFO, today's defaults, best hand-tuned\n"
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
         runs with a defer topic drained back when load falls, as in README's first command.\n"
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
        "| scenario | tier | offered | FIFO | defaults |{best_head}\n|---|---|---:|---:|---:|{best_sep}"
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
        let _ = writeln!(o, "{line}");
    }

    if let Some(s) = search {
        let _ = writeln!(o, "\n## Best hand-tuned settings\n");
        let _ = writeln!(
            o,
            "The grid: `queue.weights` {:?}, `admission.headroom` {:?}, \
             `retry.base_backoff_ms` {:?}, `admission.recover_ms` {:?}, `queue.capacity` {:?}, \
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
         level / direction changes of the level during the step / after it. `shed samples` \
         counts 10 ms samples with a level above 0.\n"
    );
    let best_head = if search.is_some() {
        " best: recovery |"
    } else {
        ""
    };
    let _ = writeln!(
        o,
        "| scenario | defaults: recovery | shed samples | shed (ledger) | expired | resubmitted |{best_head} ledger balances | same ledger twice |\n|---|---|---:|---:|---:|---:|{best_sep}---|---|"
    );
    for (i, r) in rows.iter().enumerate() {
        let stats = r.defaults.stats;
        let (shed, expired) = stats.map_or((0, 0), |s| {
            let t = s.ledger.total();
            (t.shed, t.expired)
        });
        let mut line = format!(
            "| {} | {} | {} | {} | {} | {} |",
            r.scenario.name,
            recovery_cell(r.defaults.recovery),
            r.defaults.shed_samples(),
            shed,
            expired,
            r.defaults.resubmitted,
        );
        if let Some(s) = search {
            let _ = write!(line, " {} |", recovery_cell(s.best[i].outcome.recovery));
        }
        let _ = write!(
            line,
            " {} | {} |",
            if r.defaults.balances { "yes" } else { "NO" },
            if r.deterministic { "yes" } else { "NO" }
        );
        let _ = writeln!(o, "{line}");
    }
    o
}

fn fmt_secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}
