//! The report: a Markdown file with every figure, and an SVG chart of goodput share per tier
//! against the offered load factor (plotters' SVG backend; text is written as SVG `<text>`
//! with plotters' built-in size estimate, so no font library or system font is needed).

// Shared by the binary (src/main.rs) and tests/proving_ground.rs; each uses a part.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::harness::{BrokerResult, PhaseResult, RunConfig};
use crate::reconcile::quantile;

const TIERS: [&str; 4] = ["critical", "high", "medium", "sheddable"];

/// Reject cost of a phase in ns: (mean, median, samples).
pub fn reject_cost(p: &PhaseResult) -> Option<(f64, u64, usize)> {
    let mut s = p.counters.reject_ns.clone();
    if s.is_empty() {
        return None;
    }
    s.sort_unstable();
    let mean = s.iter().sum::<u64>() as f64 / s.len() as f64;
    Some((mean, quantile(&s, 0.5), s.len()))
}

/// The seeds' served fraction `(1 - r k) / (1 - r)`, clamped to `0..=1`.
pub fn predicted(r: f64, k: f64) -> f64 {
    ((1.0 - r * k) / (1.0 - r)).clamp(0.0, 1.0)
}

/// `r`: the mean reject cost over the time one success takes of the worker at capacity.
pub fn cost_ratio(p: &PhaseResult, capacity: f64) -> Option<f64> {
    let (mean, _, _) = reject_cost(p)?;
    Some(mean / (1e9 / capacity))
}

/// Writes `proving-ground.md` and `proving-ground.svg` into `dir`; returns the Markdown.
///
/// # Errors
///
/// When a file cannot be written or the chart cannot be drawn.
pub fn write(
    dir: &Path,
    config: &RunConfig,
    results: &[BrokerResult],
    command: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let md = markdown(config, results, command);
    std::fs::write(dir.join("proving-ground.md"), &md)?;
    chart(&dir.join("proving-ground.svg"), results)?;
    Ok(md)
}

fn markdown(config: &RunConfig, results: &[BrokerResult], command: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Proving ground: triage under overload and faults, on real brokers\n"
    );
    let _ = writeln!(s, "Command: `{command}`\n");
    let _ = writeln!(
        s,
        "Worker: {} tasks, {} ms fixed service time (a sleep), queue capacity {}; one process \
         per worker, started by the harness. Mix {}/{}/{}/{} % (Critical/High/Medium/Sheddable); \
         deadlines produce time + {}/{}/{}/{} ms; {} per mille poison messages (dead-lettered). \
         Refusal policies are the defaults: Critical and High backpressure (wait in the broker), \
         Medium and Sheddable deferred to `<topic>.deferred` and drained back when load falls. \
         Layout: **{}**. {} Load phases {:?} each; fault phase {:?} at {}x.\n",
        config.workers,
        config.service_ms,
        config
            .queue_capacity
            .map_or_else(|| "derived".to_owned(), |c| c.to_string()),
        config.mix[0],
        config.mix[1],
        config.mix[2],
        config.mix[3],
        config.windows_ms[0],
        config.windows_ms[1],
        config.windows_ms[2],
        config.windows_ms[3],
        config.poison_permille,
        config.layout.as_str(),
        match config.layout {
            crate::worker::Layout::Mixed => {
                "Kafka: one topic for every tier (the `triage-criticality` header labels \
                 each record), a partition per phase (two in the fault phase), static \
                 membership. RabbitMQ: one priority queue (`x-max-priority` 9, the producer \
                 sets `priority` 9/6/4/1), prefetch 256."
            }
            crate::worker::Layout::PerTier => {
                "Kafka: a topic per tier (`<topic>.<tier>`, mapped by \
                 `criticality.topic_tiers`; the source pauses a shed tier's partitions), a \
                 partition each per phase (two in the fault phase), static membership. \
                 RabbitMQ: a queue per tier (`tier_queues`; a shed tier's queue is not \
                 read), prefetch 256."
            }
        },
        config.phase,
        config.fault_phase,
        config.fault_factor,
    );
    let _ = writeln!(
        s,
        "![goodput per tier against offered load](proving-ground.svg)\n"
    );
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(
        s,
        "| broker | phase | offered msg/s | critical | high | medium | sheddable | unaccounted | duplicate completions | reject cost ns (mean / p50) | r | predicted served | max RSS MiB |"
    );
    let _ = writeln!(
        s,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for b in results {
        for p in &b.phases {
            let g: Vec<String> = p
                .rows
                .iter()
                .map(|r| {
                    if r.offered == 0 {
                        "–".to_owned()
                    } else {
                        format!("{:.1}%", 100.0 * r.goodput_share())
                    }
                })
                .collect();
            let (cost, r, pred) = match (reject_cost(p), cost_ratio(p, b.capacity)) {
                (Some((mean, p50, _)), Some(r)) if p.factor > 0.0 => (
                    format!("{mean:.0} / {p50}"),
                    format!("{r:.5}"),
                    format!("{:.2}%", 100.0 * predicted(r, p.factor)),
                ),
                _ => ("–".into(), "–".into(), "–".into()),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                b.broker.as_str(),
                p.name,
                p.rate,
                g[0],
                g[1],
                g[2],
                g[3],
                p.rec.unaccounted.len(),
                p.rec.duplicate_completions,
                cost,
                r,
                pred,
                p.max_rss_kb as f64 / 1024.0
            );
        }
    }
    let _ = writeln!(
        s,
        "\nGoodput = completed inside the deadline, as a share of what was offered (broker-confirmed). \
         Reject cost: the runtime's `triage_reject_cost_seconds` histogram (wall time of the \
         admit-or-refuse decision for refused messages, sampled 1 in 64), captured by a \
         `metrics` recorder inside each worker process. `r` = mean reject cost / (1 s / measured \
         capacity), the time one success takes of the worker; predicted served = \
         (1 − r·k)/(1 − r) at the phase's factor k (seed 000).\n"
    );
    let _ = writeln!(s, "## Per tier and factor\n");
    let _ = writeln!(
        s,
        "| broker | phase | tier | offered | goodput % | deferred | re-publishes | expired | of which at intake | completed late | confirmed after deadline |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for b in results {
        for p in b.phases.iter().filter(|p| p.factor > 0.0) {
            for (t, r) in p.rows.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {:.1}% | {} | {} | {} | {} | {} | {} |",
                    b.broker.as_str(),
                    p.name,
                    TIERS[t],
                    r.offered,
                    100.0 * r.goodput_share(),
                    r.deferred,
                    r.republished,
                    r.expired,
                    r.expired_at_intake,
                    r.late,
                    r.late_at_broker
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "\nDeferred: ids deferred at least once; re-publishes: every deferral (a copy deferred \
         again counts again); expired at intake: the runtime's \
         `triage_expired_at_intake_total` (expired from headers before queueing, no handler \
         call), a part of expired; confirmed after deadline: the broker confirmed the publish \
         only after the message's deadline, so no consumer could have served it in time (the \
         broker, or the generator sharing the machine, was slow to take it in).\n"
    );
    for b in results {
        let _ = writeln!(s, "## {}\n", b.broker.as_str());
        let _ = writeln!(s, "Measured capacity: {:.0} msg/s.\n", b.capacity);
        for p in &b.phases {
            phase_md(&mut s, p);
        }
    }
    s
}

fn phase_md(s: &mut String, p: &PhaseResult) {
    let _ = writeln!(
        s,
        "### {} ({})\n",
        p.name,
        if p.factor > 0.0 {
            format!("offered {:.0} msg/s", p.rate)
        } else {
            "a backlog served flat out".to_owned()
        }
    );
    let _ = writeln!(
        s,
        "| tier | offered | goodput | goodput % | completed late | expired | at intake | evicted | refused | deferred | re-publishes | dead-lettered | shed | sojourn p50 ms | sojourn p99 ms |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (t, r) in p.rows.iter().enumerate() {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1}% | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} |",
            TIERS[t],
            r.offered,
            r.goodput,
            100.0 * r.goodput_share(),
            r.late,
            r.expired,
            r.expired_at_intake,
            r.evicted,
            r.refused,
            r.deferred,
            r.republished,
            r.dead,
            r.shed,
            r.sojourn_p50_ms,
            r.sojourn_p99_ms
        );
    }
    let cpu_s = p.counters.cpu_ticks as f64 / 100.0;
    let _ = writeln!(
        s,
        "\nReconciliation: {} produced, **{} unaccounted**, {} duplicate completions ({} ids \
         completed more than once), {} copies in the defer store, {} in the dead-letter store, \
         {} ids accounted for by their stored copy alone; {} publishes never confirmed (not \
         counted as offered); settled: {}. Worker CPU {:.1} s; max RSS {:.1} MiB.\n",
        p.rec.produced,
        p.rec.unaccounted.len(),
        p.rec.duplicate_completions,
        p.rec.duplicated_ids,
        p.rec.defer_store,
        p.rec.dead_store,
        p.rec.only_in_defer_store,
        p.produce_failures,
        p.settled,
        cpu_s,
        p.max_rss_kb as f64 / 1024.0
    );
    if !p.rec.unaccounted.is_empty() {
        let shown: Vec<&str> = p
            .rec
            .unaccounted
            .iter()
            .take(20)
            .map(String::as_str)
            .collect();
        let _ = writeln!(s, "Unaccounted ids (first 20): {}\n", shown.join(", "));
    }
    if let Some(r) = &p.restart {
        let _ = writeln!(
            s,
            "Restart with a mixed backlog: {} records accumulated at 3x while no worker ran \
             ({} Critical; deadlines: the backlog's age plus 10x each tier's window), then served \
             while arrivals continued at 1x. Backlog Critical served: {} ({} in time). Time from \
             the worker's start until every backlog Critical record was served: **{}**; a plain \
             FIFO consumer at the measured capacity would reach the last one after about {:.1} s \
             (its position in the backlog / capacity; computed, not run){}. Re-publishes \
             (deferrals, every tier) during the phase: **{}**.\n",
            r.backlog,
            r.backlog_critical,
            r.critical_served,
            r.critical_in_time,
            r.critical_all_served_s
                .map_or("not all served".to_owned(), |t| format!("{t:.1} s")),
            r.fifo_s,
            r.fifo_run.as_ref().map_or(String::new(), |f| format!(
                "; **run**: a plain consumer without triage (the broker's client, the same \
                 tasks and handler, in the order the broker delivers: offsets on Kafka, \
                 priorities on a RabbitMQ priority queue; `worker --fifo`) on a backlog of the same length and mix ({} records, {} \
                 Critical) served every backlog Critical record after **{}** ({} of {} in \
                 time), re-publishing none",
                f.backlog,
                f.backlog_critical,
                f.critical_all_served_s
                    .map_or("not all served".to_owned(), |t| format!("{t:.1} s")),
                f.critical_in_time,
                f.backlog_critical
            )),
            r.republished
        );
    }
    if !p.events.is_empty() {
        let _ = writeln!(s, "Faults:\n");
        for e in &p.events {
            let _ = writeln!(s, "- {e}");
        }
        let _ = writeln!(s);
    }
}

fn chart(path: &Path, results: &[BrokerResult]) -> Result<(), Box<dyn std::error::Error>> {
    let panels = results.len().max(1);
    let root = SVGBackend::new(path, (520 * panels as u32, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, panels));
    let colors = [RED, BLUE, GREEN, BLACK];
    let max_factor = results
        .iter()
        .flat_map(|b| b.phases.iter().map(|p| p.factor))
        .fold(1.0f64, f64::max);
    for (area, b) in areas.iter().zip(results) {
        let mut ch = ChartBuilder::on(area)
            .caption(
                format!("{}: goodput share per tier", b.broker.as_str()),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d((0.6f64..max_factor * 1.25).log_scale(), 0f64..105f64)?;
        ch.configure_mesh()
            .x_desc("offered load (x capacity)")
            .y_desc("goodput, % of offered")
            .x_labels(6)
            .y_labels(8)
            .draw()?;
        for (t, color) in colors.iter().enumerate() {
            let pts: Vec<(f64, f64)> = b
                .phases
                .iter()
                .filter(|p| p.factor > 0.0 && p.events.is_empty() && p.restart.is_none())
                .map(|p| (p.factor, 100.0 * p.rows[t].goodput_share()))
                .collect();
            ch.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(TIERS[t])
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            ch.draw_series(
                pts.iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )?;
        }
        ch.configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
