//! The operator's files in `deploy/`: the Prometheus rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`), the Grafana dashboard's queries parse, and both
//! name only metrics the code emits, and the sample `prometheus.yml` passes `promtool check
//! config`. The checks that need promtool are skipped, with a line on the terminal naming
//! `tests/tools.sh` (which installs it, Debian's `prometheus` package), when it is missing;
//! `tests/run.sh` installs it and sets `TRIAGE_REQUIRE_TOOLS=1`, under which a missing
//! promtool fails them instead.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether promtool can run. When it cannot, a test is skipped with a line written straight
/// to the terminal (not captured by the test harness, so `cargo test` shows it), unless
/// `TRIAGE_REQUIRE_TOOLS` is set (`tests/run.sh`): then it fails, naming the fix.
fn promtool_available(test: &str) -> bool {
    match Command::new("promtool").arg("--version").output() {
        Ok(_) => true,
        Err(e) if std::env::var_os("TRIAGE_REQUIRE_TOOLS").is_some() => {
            panic!(
                "cannot run promtool ({e}): install it with tests/tools.sh (Debian's prometheus)"
            )
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: cannot run promtool ({e}); tests/tools.sh installs it \
                 (Debian's prometheus), and tests/run.sh runs this test for real"
            );
            false
        }
    }
}

/// Runs promtool with `args` in `dir`; its exit code and everything it printed.
fn promtool(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install it with tests/tools.sh (Debian's prometheus)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Metric names from the tables in the modules that name them (`//! | `name` | ...`).
fn emitted_metrics() -> BTreeSet<String> {
    [
        include_str!("../src/runtime/metrics/mod.rs"),
        include_str!("../connectors/kafka/src/metrics.rs"),
        include_str!("../connectors/amqp/src/metrics.rs"),
    ]
    .iter()
    .flat_map(|src| src.lines())
    .filter_map(|l| l.trim_start().strip_prefix("//! | `"))
    .filter_map(|l| l.split('`').next())
    .map(str::to_owned)
    .collect()
}

/// Every `triage_...` metric name in `text`, without the histogram series suffixes. Recorded
/// names (`job:triage_...`) and name regexes (`triage_amqp_(a|b)_total`) are not metric names.
fn referenced_metrics(text: &str, histograms: &BTreeSet<String>) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("triage_").map(|i| i + from) {
        let end = text[i..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |e| i + e);
        let before = if i == 0 { b' ' } else { bytes[i - 1] };
        let name = &text[i..end];
        let recorded = before == b':' || before == b'_' || before.is_ascii_alphanumeric();
        if !recorded && !name.ends_with('_') && !text[end..].starts_with('(') {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| histograms.contains(*b)))
                .unwrap_or(name);
            names.insert(base.to_owned());
        }
        from = end;
    }
    names
}

#[test]
fn rules_pass_promtool_check_and_their_unit_tests() {
    if !promtool_available("rules_pass_promtool_check_and_their_unit_tests") {
        return;
    }
    let dir = root().join("deploy/prometheus");
    let (code, out) = promtool(&dir, &["check", "rules", "triage.rules.yml"]);
    assert_eq!(code, 0, "promtool check rules:\n{out}");
    let (code, out) = promtool(&dir, &["test", "rules", "triage.rules.test.yml"]);
    assert_eq!(code, 0, "promtool test rules:\n{out}");
}

#[test]
fn rules_and_dashboard_name_only_emitted_metrics() {
    let emitted = emitted_metrics();
    assert!(emitted.contains("triage_goodput_total"), "{emitted:?}");
    assert!(
        emitted.contains("triage_kafka_committed_offset"),
        "{emitted:?}"
    );
    assert!(emitted.contains("triage_amqp_acks_total"), "{emitted:?}");
    let histograms: BTreeSet<String> = [
        "triage_sojourn_seconds",
        "triage_handler_latency_seconds",
        "triage_reject_cost_seconds",
    ]
    .map(str::to_owned)
    .into();
    for file in [
        "deploy/prometheus/triage.rules.yml",
        "deploy/prometheus/triage.rules.test.yml",
        "deploy/grafana/triage.json",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let referenced = referenced_metrics(&text, &histograms);
        assert!(!referenced.is_empty(), "{file}");
        let unknown: Vec<&String> = referenced.difference(&emitted).collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics nobody emits: {unknown:?}"
        );
    }
}

#[test]
fn dashboard_shows_what_an_operator_needs_and_its_queries_parse() {
    let text = std::fs::read_to_string(root().join("deploy/grafana/triage.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    let all = exprs.join("\n");
    for needed in [
        "triage_goodput_total",
        "triage_shed_total",
        "triage_deferred_total",
        "triage_queue_depth",
        "triage_queue_age_seconds",
        "histogram_quantile(0.99, sum by (tier, le) (rate(triage_sojourn_seconds_bucket",
        "triage_concurrency_limit",
        "triage_reject_cost_seconds",
        "by (tier, reason)",
    ] {
        assert!(all.contains(needed), "the dashboard lacks {needed}");
    }
    if !promtool_available("dashboard_shows_what_an_operator_needs_and_its_queries_parse") {
        return;
    }
    // Grafana's variables replaced by what they stand for, each query checked by promtool as
    // the expression of a recording rule.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e.replace("$__rate_interval", "5m").replace("$job", ".*");
        rules.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: '{}'\n",
            e.replace('\'', "''")
        ));
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(dir.join("dashboard.rules.yml"), rules).unwrap();
    let (code, out) = promtool(&dir, &["check", "rules", "dashboard.rules.yml"]);
    assert_eq!(code, 0, "dashboard queries:\n{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{out}"
    );
}

/// The sample scrape configuration is valid and loads the rules beside it, checked from the
/// repository's root as the operations guide runs it.
#[test]
fn sample_prometheus_config_passes_promtool_check_config() {
    if !promtool_available("sample_prometheus_config_passes_promtool_check_config") {
        return;
    }
    let (code, out) = promtool(
        &root(),
        &["check", "config", "deploy/prometheus/prometheus.yml"],
    );
    assert_eq!(code, 0, "promtool check config:\n{out}");
    assert!(out.contains("1 rule files found"), "{out}");
}
