//! Reconciliation: every id produced is matched against the workers' disposition logs and the
//! defer and dead-letter stores; and the per-tier figures of a phase.
//!
//! An id is accounted for when some worker logged it `completed`, `expired`, `shed` or
//! `failed`, or when it is found in the defer or dead-letter topic/queue after the run (a
//! `deferred` line alone is not enough: the copy itself must be there, or its drained copy
//! must have ended). Everything else is unaccounted. Several completions of one id are
//! duplicates (at-least-once delivery: counted, allowed).

// Shared by the binary (src/main.rs) and tests/proving_ground.rs; each uses a part.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::load::Produced;

/// A disposition as logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logged {
    /// `completed`.
    Completed,
    /// `failed` (dead-lettered).
    Failed,
    /// `deferred`.
    Deferred,
    /// `expired`.
    Expired,
    /// `shed`.
    Shed,
}

/// One log line: what, when (Unix ms), sojourn of a completion (µs).
#[derive(Clone, Copy, Debug)]
pub struct Line {
    /// The disposition.
    pub what: Logged,
    /// When it was logged, Unix ms.
    pub at_ms: u64,
    /// Enqueue-to-dequeue time of a completion, µs.
    pub sojourn_us: Option<u64>,
}

/// Every line of every log, by id.
pub type Logs = HashMap<String, Vec<Line>>;

/// Reads the disposition logs (a torn last line, from a kill, is skipped).
pub fn read_logs(paths: &[PathBuf]) -> Logs {
    let mut logs: Logs = HashMap::new();
    for p in paths {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        for line in text.lines() {
            let mut f = line.split(',');
            let (Some(id), Some(d), Some(_tier), Some(at), sojourn) =
                (f.next(), f.next(), f.next(), f.next(), f.next())
            else {
                continue;
            };
            let what = match d {
                "completed" => Logged::Completed,
                "failed" => Logged::Failed,
                "deferred" => Logged::Deferred,
                "expired" => Logged::Expired,
                "shed" => Logged::Shed,
                _ => continue,
            };
            let Ok(at_ms) = at.parse() else { continue };
            logs.entry(id.to_owned()).or_default().push(Line {
                what,
                at_ms,
                sojourn_us: sojourn.and_then(|s| s.parse().ok()),
            });
        }
    }
    logs
}

/// How many produced ids have at least one line.
pub fn seen(produced: &[Produced], logs: &Logs) -> usize {
    produced.iter().filter(|p| logs.contains_key(&p.id)).count()
}

/// The runtime's own counters of a phase, summed over its worker processes (each process's
/// last snapshot: a killed worker's last 250 ms are missing).
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Messages refused at admission (overloaded, full, too large), per tier index.
    pub refused: [u64; 4],
    /// Messages evicted from the queue, per tier index.
    pub evicted: [u64; 4],
    /// Records expired at intake (before queueing, from headers alone), per tier index.
    pub expired_at_intake: [u64; 4],
    /// Samples of the reject cost, ns.
    pub reject_ns: Vec<u64>,
    /// CPU ticks of the processes, at their last snapshot.
    pub cpu_ticks: u64,
}

/// Reads and sums the stats files.
pub fn read_counters(paths: &[PathBuf]) -> Counters {
    let tiers = ["critical", "high", "medium", "sheddable"];
    let mut c = Counters::default();
    for p in paths {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let Some(name) = f.next() else { continue };
            if name == "reject_cost_ns" {
                c.reject_ns.extend(f.filter_map(|v| v.parse::<u64>().ok()));
                continue;
            }
            let value: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if name == "cpu_ticks" {
                c.cpu_ticks += value;
                continue;
            }
            let parts: Vec<&str> = name.split('.').collect();
            if parts.len() == 2 && parts[0] == "triage_expired_at_intake_total" {
                if let Some(t) = tiers.iter().position(|t| *t == parts[1]) {
                    c.expired_at_intake[t] += value;
                }
                continue;
            }
            if parts.len() != 3 || parts[0] != "triage_refused_total" {
                continue;
            }
            let Some(t) = tiers.iter().position(|t| *t == parts[1]) else {
                continue;
            };
            if parts[2] == "evicted" {
                c.evicted[t] += value;
            } else {
                c.refused[t] += value;
            }
        }
    }
    c
}

/// One tier of one phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct TierRow {
    /// Messages produced (broker-confirmed).
    pub offered: u64,
    /// Completed inside the deadline.
    pub goodput: u64,
    /// Completed, but only after the deadline.
    pub late: u64,
    /// Deferred at least once.
    pub deferred: u64,
    /// Re-publishes to the defer store: every `deferred` line (a copy deferred again counts
    /// again).
    pub republished: u64,
    /// Expired at intake, from the runtime's counter (a subset of `expired`; a killed
    /// worker's last 250 ms are missing).
    pub expired_at_intake: u64,
    /// Expired (never completed).
    pub expired: u64,
    /// Shed (never completed).
    pub shed: u64,
    /// Dead-lettered.
    pub dead: u64,
    /// Evicted, from the runtime's counters (by the tier queued at).
    pub evicted: u64,
    /// Refused at admission, from the runtime's counters.
    pub refused: u64,
    /// Confirmed by the broker only after their deadline: late before any consumer could
    /// see them (the broker or the generator was slow to take them in), whatever became of
    /// them.
    pub late_at_broker: u64,
    /// Median sojourn of completions, ms.
    pub sojourn_p50_ms: f64,
    /// 99th percentile sojourn of completions, ms.
    pub sojourn_p99_ms: f64,
}

impl TierRow {
    /// Goodput as a share of offered, 0..=1.
    pub fn goodput_share(&self) -> f64 {
        if self.offered == 0 {
            1.0
        } else {
            self.goodput as f64 / self.offered as f64
        }
    }
}

/// The reconciliation of one phase.
#[derive(Clone, Debug, Default)]
pub struct Reconciliation {
    /// Ids produced.
    pub produced: u64,
    /// Ids with no end anywhere.
    pub unaccounted: Vec<String>,
    /// Extra completions (an id completed n times adds n - 1).
    pub duplicate_completions: u64,
    /// Ids completed more than once.
    pub duplicated_ids: u64,
    /// Ids accounted for only by their copy in the defer store.
    pub only_in_defer_store: u64,
    /// Copies found in the defer store.
    pub defer_store: u64,
    /// Copies found in the dead-letter store.
    pub dead_store: u64,
}

/// Value at quantile `q` of sorted `v`.
pub fn quantile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Tallies a phase: per tier rows and the reconciliation.
pub fn tally(
    produced: &[Produced],
    logs: &Logs,
    defer_store: &[String],
    dead_store: &[String],
    counters: &Counters,
) -> ([TierRow; 4], Reconciliation) {
    let deferred: HashSet<&str> = defer_store.iter().map(String::as_str).collect();
    let dead: HashSet<&str> = dead_store.iter().map(String::as_str).collect();
    let mut rows = [TierRow::default(); 4];
    let mut sojourns: [Vec<u64>; 4] = Default::default();
    let mut rec = Reconciliation {
        produced: produced.len() as u64,
        defer_store: defer_store.len() as u64,
        dead_store: dead_store.len() as u64,
        ..Reconciliation::default()
    };
    for p in produced {
        let row = &mut rows[p.tier];
        row.offered += 1;
        if p.acked_ms > p.deadline_ms {
            row.late_at_broker += 1;
        }
        let lines = logs.get(&p.id).map_or(&[][..], Vec::as_slice);
        let has = |w: Logged| lines.iter().any(|l| l.what == w);
        let completions: Vec<&Line> = lines
            .iter()
            .filter(|l| l.what == Logged::Completed)
            .collect();
        if completions.len() > 1 {
            rec.duplicated_ids += 1;
            rec.duplicate_completions += completions.len() as u64 - 1;
        }
        if completions.iter().any(|l| l.at_ms <= p.deadline_ms) {
            row.goodput += 1;
        } else if !completions.is_empty() {
            row.late += 1;
        } else if has(Logged::Failed) {
            row.dead += 1;
        } else if has(Logged::Expired) {
            row.expired += 1;
        } else if has(Logged::Shed) {
            row.shed += 1;
        }
        if has(Logged::Deferred) {
            row.deferred += 1;
        }
        row.republished += lines.iter().filter(|l| l.what == Logged::Deferred).count() as u64;
        if let Some(s) = completions.first().and_then(|l| l.sojourn_us) {
            sojourns[p.tier].push(s);
        }
        let ended = lines.iter().any(|l| l.what != Logged::Deferred);
        if !ended {
            if deferred.contains(p.id.as_str()) || dead.contains(p.id.as_str()) {
                rec.only_in_defer_store += 1;
            } else {
                rec.unaccounted.push(p.id.clone());
            }
        }
    }
    for (t, row) in rows.iter_mut().enumerate() {
        row.evicted = counters.evicted[t];
        row.refused = counters.refused[t];
        row.expired_at_intake = counters.expired_at_intake[t];
        let s = &mut sojourns[t];
        s.sort_unstable();
        row.sojourn_p50_ms = quantile(s, 0.5) as f64 / 1000.0;
        row.sojourn_p99_ms = quantile(s, 0.99) as f64 / 1000.0;
    }
    (rows, rec)
}

/// Paths of every file named `worker-*.<ext>` in `dir`.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.extension().is_some_and(|e| e == ext)
                        && p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("worker-"))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}
