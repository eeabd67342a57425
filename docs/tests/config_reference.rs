//! The configuration reference (`docs/configuration.md`) against the configuration structs, so
//! that it cannot go stale: every key a struct serializes (its defaults, and every optional key
//! filled in) has a row in its section of the reference, the row's default is the struct's
//! default, and every row names a key that exists.
//!
//! Rows look like ``| `queue.capacity` | messages | `1024` | `1..=2^32` | ... |``: the key, a
//! unit, the default as a TOML literal in backticks (or `none` for an optional key that is
//! absent by default, `required` for one without a default), the range, what it does. A
//! `<tier>` in a key stands for the four tiers, and its default cell gives four values, Critical
//! first, separated by ` / ` (or one value for all four). A section starts at a
//! `<!-- config: NAME -->` line and ends at the next one.
//! The HTTP layer's `TriageConfig` is set in Rust, not TOML: its keys and defaults are read
//! from its `Debug` form, and its defaults are written as `Debug` prints them (`1s`).

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;

use serde::Serialize;
use toml::Value;
use triage::admission::{BucketConfig, BucketsConfig};
use triage::limit::{AimdConfig, Gradient2Config, LimitConfig};
use triage::runtime::RuntimeConfig;
use triage::Criticality;
use triage_amqp::{AmqpSinkConfig, AmqpSourceConfig, TierQueue};
use triage_kafka::{KafkaSinkConfig, KafkaSourceConfig};

const REFERENCE: &str = include_str!("../configuration.md");
const TIERS: [&str; 4] = ["critical", "high", "medium", "sheddable"];

/// One row of the reference: the key as written (maybe with `<tier>`) and its default cell.
#[derive(Debug)]
struct Row {
    key: String,
    default: String,
}

/// The rows of section `name`, by key.
fn section(name: &str) -> BTreeMap<String, Row> {
    let mut rows = BTreeMap::new();
    for (key, cells) in section_cells(name) {
        let row = Row {
            key: key.clone(),
            default: cells[3].clone(),
        };
        assert!(
            rows.insert(key.clone(), row).is_none(),
            "{name}: `{key}` twice"
        );
    }
    rows
}

/// The rows of section `name` as their key and cells (the first cell is the empty text
/// before the first `|`).
fn section_cells(name: &str) -> Vec<(String, Vec<String>)> {
    let marker = format!("<!-- config: {name} -->");
    let start = REFERENCE
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/configuration.md has no `{marker}` section"));
    let text = &REFERENCE[start + marker.len()..];
    let text = &text[..text.find("<!-- config: ").unwrap_or(text.len())];
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<String> = line.split('|').map(|c| c.trim().to_owned()).collect();
        assert!(
            cells.len() >= 7,
            "a row needs key, unit, default, range, what: {line}"
        );
        rows.push((cells[1].trim_matches('`').to_owned(), cells));
    }
    rows
}

/// A TOML value rendered as a literal, for comparison with a default cell.
fn literal(v: &Value) -> String {
    match v {
        Value::Table(t) => {
            let items: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", Value::String(k.clone()), literal(v)))
                .collect();
            if items.is_empty() {
                "{}".into()
            } else {
                format!("{{ {} }}", items.join(", "))
            }
        }
        Value::Array(a) => format!("[{}]", a.iter().map(literal).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// Every leaf key path of `v` with its literal. Arrays are leaves, and so is a table whose
/// path is a row of the reference (a map-valued field such as librdkafka's `properties`).
fn leaves(
    v: &Value,
    prefix: &str,
    rows: &BTreeMap<String, Row>,
    out: &mut BTreeMap<String, String>,
) {
    match v {
        Value::Table(t) if prefix.is_empty() || !rows.contains_key(prefix) => {
            for (k, v) in t {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &path, rows, out);
            }
        }
        _ => {
            out.insert(prefix.to_owned(), literal(v));
        }
    }
}

fn toml_leaves(value: &impl Serialize, rows: &BTreeMap<String, Row>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    leaves(
        &Value::try_from(value).expect("serializes to TOML"),
        "",
        rows,
        &mut out,
    );
    out
}

/// The row for `path`: exact, or with a tier replaced by `<tier>` (and its index).
fn row_of<'a>(rows: &'a BTreeMap<String, Row>, path: &str) -> Option<(&'a Row, Option<usize>)> {
    if let Some(row) = rows.get(path) {
        return Some((row, None));
    }
    path.split('.').enumerate().find_map(|(i, part)| {
        let tier = TIERS.iter().position(|t| *t == part)?;
        let mut parts: Vec<&str> = path.split('.').collect();
        parts[i] = "<tier>";
        rows.get(&parts.join(".")).map(|row| (row, Some(tier)))
    })
}

/// The default a cell states: the backticked literal or the first word, of the `tier`-th
/// ` / `-separated part for a `<tier>` row (one part: the same for every tier). Digits' `_` separators are dropped, and spaces.
fn stated(cell: &str, tier: Option<usize>) -> String {
    let parts: Vec<&str> = cell.split(" / ").collect();
    let part = match tier {
        // One value for a `<tier>` row: the same for every tier.
        Some(_) if parts.len() == 1 => cell,
        Some(i) => parts
            .get(i)
            .unwrap_or_else(|| panic!("a <tier> default needs one or four values: {cell}")),
        None => cell,
    };
    let part = part.trim();
    let value = match part.strip_prefix('`') {
        Some(rest) => rest.split('`').next().unwrap_or_default(),
        None => part.split_whitespace().next().unwrap_or_default(),
    };
    normalize(value)
}

fn normalize(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        let digits = i > 0
            && chars[i - 1].is_ascii_digit()
            && chars.get(i + 1).is_some_and(|n| n.is_ascii_digit());
        if c.is_whitespace() || (*c == '_' && digits) {
            continue;
        }
        out.push(*c);
    }
    out
}

/// Checks section `name` against a struct: `defaults` must be stated as they are, each key of
/// `present` (an optional section given with its own defaults) as it is there, and any other
/// key of `optional` (every optional key filled in) as `none` or `required`.
fn check(
    name: &str,
    rows: &BTreeMap<String, Row>,
    defaults: &BTreeMap<String, String>,
    present: &BTreeMap<String, String>,
    optional: &BTreeMap<String, String>,
) {
    let mut errors = Vec::new();
    let mut used = BTreeSet::new();
    let all: BTreeSet<&String> = defaults
        .keys()
        .chain(present.keys())
        .chain(optional.keys())
        .collect();
    for path in all {
        let Some((row, tier)) = row_of(rows, path) else {
            errors.push(format!("`{path}` has no row in the `{name}` section"));
            continue;
        };
        used.insert(row.key.clone());
        let expected = match (defaults.get(path), present.get(path)) {
            (Some(v), _) | (None, Some(v)) => vec![normalize(v)],
            (None, None) => vec!["none".to_owned(), "required".to_owned()],
        };
        let got = stated(&row.default, tier);
        if !expected.contains(&got) {
            errors.push(format!(
                "`{path}`: the reference says {got:?}, the default is {}",
                expected.join(" or ")
            ));
        }
    }
    for key in rows.keys().filter(|k| !used.contains(*k)) {
        errors.push(format!(
            "the row `{key}` of `{name}` is no field of the struct"
        ));
    }
    assert!(
        errors.is_empty(),
        "docs/configuration.md, section `{name}`, disagrees with the code:\n  {}",
        errors.join("\n  ")
    );
}

fn bucket() -> BucketConfig {
    BucketConfig {
        rate: Some(1.0),
        share: Some(0.5),
        burst: Some(1),
    }
}

/// The runtime's reference is in two sections: the settings only the user can say (each with
/// the reason it cannot be derived, at most 15 of them), then the expert group (`expert.*`).
#[test]
fn runtime_config() {
    let user = section("runtime");
    let expert = section("runtime-expert");
    let mut errors = Vec::new();
    for (key, cells) in section_cells("runtime") {
        if key.starts_with("expert.") {
            errors.push(format!("`{key}` is in the user's section"));
        }
        if cells.get(6).is_none_or(|why| why.len() < 10) {
            errors.push(format!("`{key}` does not say why it cannot be derived"));
        }
    }
    if let Some(key) = expert.keys().find(|k| !k.starts_with("expert.")) {
        errors.push(format!("`{key}` is in the expert section"));
    }
    assert!(
        user.len() <= 15,
        "{} settings in the user's section: at most 15",
        user.len()
    );
    assert!(errors.is_empty(), "{}", errors.join("\n"));

    let mut rows = user;
    rows.extend(expert);
    let defaults = toml_leaves(&RuntimeConfig::default(), &rows);
    let mut present = BTreeMap::new();
    for limit in [
        LimitConfig::Aimd(AimdConfig::default()),
        LimitConfig::Gradient2(Gradient2Config::default()),
    ] {
        let mut config = RuntimeConfig::default();
        config.expert.limit = Some(limit);
        for (k, v) in toml_leaves(&config, &rows) {
            if !defaults.contains_key(&k) {
                if let Some(before) = present.insert(k.clone(), v.clone()) {
                    assert!(
                        k == "expert.limit.kind" || before == v,
                        "{k}: {before} and {v}"
                    );
                }
            }
        }
    }
    // `limit.kind` has no default: the section is absent by default (fixed at `workers`).
    present.remove("expert.limit.kind");
    let mut full = RuntimeConfig::default();
    full.expert.limit = Some(LimitConfig::Fixed { limit: 8 });
    full.expert.queue.max_bytes = NonZeroUsize::new(1);
    full.memory.budget_bytes = Some(1);
    full.buckets = BucketsConfig {
        capacity: Some(1.0),
        critical: Some(bucket()),
        high: Some(bucket()),
        medium: Some(bucket()),
        sheddable: Some(bucket()),
        ..BucketsConfig::default()
    };
    let mut optional = toml_leaves(&full, &rows);
    let mut gradient = RuntimeConfig::default();
    gradient.expert.limit = Some(LimitConfig::Gradient2(Gradient2Config {
        queue_size: Some(4),
        ..Gradient2Config::default()
    }));
    optional.extend(toml_leaves(&gradient, &rows));
    optional.retain(|k, _| !defaults.contains_key(k) && !present.contains_key(k));
    check("runtime", &rows, &defaults, &present, &optional);
}

#[test]
fn kafka_source_config() {
    let rows = section("kafka-source");
    let defaults = toml_leaves(&KafkaSourceConfig::default(), &rows);
    let mut full = KafkaSourceConfig::default();
    full.deadline.window_ms.critical = Some(1);
    full.revoke_wait_ms = Some(1);
    full.criticality
        .topic_tiers
        .insert("t".into(), Criticality::High);
    let mut optional = toml_leaves(&full, &rows);
    optional.retain(|k, _| !defaults.contains_key(k));
    check(
        "kafka-source",
        &rows,
        &defaults,
        &BTreeMap::new(),
        &optional,
    );
}

#[test]
fn kafka_sink_config() {
    let rows = section("kafka-sink");
    let defaults = toml_leaves(&KafkaSinkConfig::new("127.0.0.1:9092", ""), &rows);
    let mut full = KafkaSinkConfig::new("127.0.0.1:9092", "");
    full.properties.insert("linger.ms".into(), "5".into());
    let mut optional = toml_leaves(&full, &rows);
    optional.retain(|k, _| !defaults.contains_key(k));
    check("kafka-sink", &rows, &defaults, &BTreeMap::new(), &optional);
}

#[test]
fn amqp_source_config() {
    let rows = section("amqp-source");
    let defaults = toml_leaves(&AmqpSourceConfig::default(), &rows);
    let mut full = AmqpSourceConfig {
        tier_queues: vec![TierQueue::new("q", Criticality::High)],
        ..AmqpSourceConfig::default()
    };
    full.declare.max_priority = Some(1);
    full.declare.dead_letter_exchange = Some(String::new());
    full.declare.dead_letter_routing_key = Some(String::new());
    full.classify.fixed_tier = Some(Criticality::High);
    full.connection_name = Some(String::new());
    full.deadline.timestamp_window_ms = triage::PerTier::splat(Some(1));
    let mut optional = toml_leaves(&full, &rows);
    optional.retain(|k, _| !defaults.contains_key(k));
    check("amqp-source", &rows, &defaults, &BTreeMap::new(), &optional);
}

#[test]
fn amqp_sink_config() {
    let rows = section("amqp-sink");
    let defaults = toml_leaves(&AmqpSinkConfig::new("amqp://127.0.0.1:5672/%2f", ""), &rows);
    let mut full = AmqpSinkConfig::new("amqp://127.0.0.1:5672/%2f", "");
    full.routing_key = Some(String::new());
    full.connection_name = Some(String::new());
    let mut optional = toml_leaves(&full, &rows);
    optional.retain(|k, _| !defaults.contains_key(k));
    check("amqp-sink", &rows, &defaults, &BTreeMap::new(), &optional);
}

/// Leaf paths of a pretty `Debug` form (`{:#?}`) with their values, lists and tuple structs
/// collapsed onto one line; `skip` names subtrees documented elsewhere.
fn debug_leaves(debug: &str, skip: &[&str]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<String> = Vec::new();
    let mut lines = debug.lines().skip(1).peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with('}') {
            stack.pop();
            continue;
        }
        let Some((key, value)) = trimmed.split_once(": ") else {
            continue;
        };
        let path = stack
            .iter()
            .map(String::as_str)
            .chain([key])
            .collect::<Vec<_>>()
            .join(".");
        if value.ends_with('{') {
            stack.push(key.to_owned());
            if skip.contains(&path.as_str()) {
                out.insert(path, value.trim_end_matches('{').trim().to_owned());
                let depth = line.len() - line.trim_start().len();
                for l in lines.by_ref() {
                    if l.len() - l.trim_start().len() == depth && l.trim().starts_with('}') {
                        stack.pop();
                        break;
                    }
                }
            }
            continue;
        }
        let mut value = value.trim_end_matches(',').to_owned();
        if value.ends_with('[') || value.ends_with('(') {
            let close = if value.ends_with('[') { ']' } else { ')' };
            let mut items = Vec::new();
            for l in lines.by_ref() {
                let t = l.trim().trim_end_matches(',');
                if t.starts_with(close) {
                    break;
                }
                items.push(t.to_owned());
            }
            value = if close == ']' {
                format!("[{}]", items.join(", "))
            } else {
                format!("{}{})", value, items.join(", "))
            };
        }
        out.insert(path, value);
    }
    out
}

#[test]
fn tower_config() {
    let rows = section("tower");
    let debug = format!("{:#?}", triage_tower::TriageConfig::default());
    let defaults = debug_leaves(&debug, &["queue"]);
    assert!(defaults.contains_key("retry_after_jitter"), "{defaults:?}");
    check(
        "tower",
        &rows,
        &defaults,
        &BTreeMap::new(),
        &BTreeMap::new(),
    );
}

/// The checker itself: a key without a row, a wrong default and a row for no field are each
/// reported.
#[test]
fn the_check_reports_what_disagrees() {
    let rows: BTreeMap<String, Row> = [("a", "`1`"), ("gone", "`2`")]
        .into_iter()
        .map(|(k, d)| {
            (
                k.to_owned(),
                Row {
                    key: k.to_owned(),
                    default: d.to_owned(),
                },
            )
        })
        .collect();
    let defaults: BTreeMap<String, String> = [
        ("a".to_owned(), "3".to_owned()),
        ("new".to_owned(), "4".to_owned()),
    ]
    .into();
    let err = std::panic::catch_unwind(|| {
        check("test", &rows, &defaults, &BTreeMap::new(), &BTreeMap::new())
    })
    .expect_err("disagreements are reported");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("`new` has no row"), "{msg}");
    assert!(
        msg.contains("`a`: the reference says \"1\", the default is 3"),
        "{msg}"
    );
    assert!(msg.contains("the row `gone`"), "{msg}");
}
