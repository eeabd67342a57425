//! Writes the fuzz targets' seed inputs: valid headers of every kind, gRPC timeouts of every
//! unit, deadlines and counts at the edges of their types, AMQP properties as lapin writes
//! them, and configurations at their bounds. Run by `fuzz/run.sh seeds` before the first
//! fuzzing run; libFuzzer grows the corpus from them and `cargo fuzz cmin` keeps what adds
//! coverage.
//!
//! ```text
//! cargo run -p triage-fuzz --example seeds -- fuzz/corpus
//! ```

use std::path::{Path, PathBuf};

use triage_amqp::lapin::protocol::basic::{gen_properties, AMQPProperties};
use triage_amqp::lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

fn main() -> std::io::Result<()> {
    let root = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/corpus".to_owned()),
    );
    let mut written = 0;
    for (target, seeds) in [
        ("wire", wire()),
        ("http_entry", http_entry()),
        ("kafka_classify", kafka()),
        ("amqp_classify", amqp()),
        ("config", config()),
    ] {
        written += write(&root.join(target), &seeds)?;
    }
    println!("{written} seeds under {}", root.display());
    Ok(())
}

/// Writes each seed as `seed-<n>`, keeping whatever else is there.
fn write(dir: &Path, seeds: &[Vec<u8>]) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    for (i, seed) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:03}")), seed)?;
    }
    Ok(seeds.len())
}

/// Header values near every parser's edges.
const VALUES: &[&str] = &[
    "critical",
    " HIGH ",
    "medium\t",
    "sheddable",
    "Critical",
    "urgent",
    "3",
    "0",
    "42",
    " 7 ",
    "4294967295",
    "4294967296",
    "0000000001",
    "-1",
    "+1",
    "1e3",
    "",
    "1700000000000",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999",
    "99999999999999999999",
    "1H",
    "99999999H",
    "99999999M",
    "99999999S",
    "99999999m",
    "99999999u",
    "99999999n",
    "0m",
    "0n",
    "250m",
    "123456789m",
    "10",
    "10x",
    "86400",
    "86401",
    "999999",
    "1000000",
    "Wed, 21 Oct 2015 07:28:00 GMT",
    "triage-criticality",
    "triage-deadline-ms",
];

fn wire() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = VALUES.iter().map(|v| v.as_bytes().to_vec()).collect();
    seeds.push(VALUES.join("\n").into_bytes());
    seeds.push(vec![0xff, 0xfe, b'\n', b'7']);
    seeds.push("é".repeat(1_100).into_bytes());
    // The formatters read numbers from the first 16 bytes.
    for n in [0u64, 1, 999, 1_000_000_000, u64::MAX, 86_400, 86_401] {
        let mut s = n.to_le_bytes().to_vec();
        s.extend_from_slice(&999_999_999u64.to_le_bytes());
        seeds.push(s);
    }
    seeds
}

/// An entry input: the setup byte, then requests.
fn entry(setup: u8, requests: &[&str]) -> Vec<u8> {
    let mut s = vec![setup];
    s.extend_from_slice(requests.join("\n\n").as_bytes());
    s
}

fn http_entry() -> Vec<Vec<u8>> {
    // Setup: slots-1 (bits 0-1), queue age (2), capacity 1/2/4/64 (3-4), rate gate (5),
    // step 0/1ms/50ms/2s (6-7).
    const ONE_SLOT: u8 = 0;
    const FOUR_SLOTS_QUEUE_64: u8 = 0b0001_1011;
    const QUEUE_AGE: u8 = 0b0000_0100;
    const RATE: u8 = 0b0010_0000;
    const STEP_50MS: u8 = 0b1000_0000;
    const STEP_2S: u8 = 0b1100_0000;
    let mut seeds = vec![
        entry(
            ONE_SLOT,
            &[
                "x/checkout",
                "x/search",
                "x/api",
                "x/recommendations",
                "x/other",
            ],
        ),
        entry(ONE_SLOT, &["h/checkout", "x/search", "x/checkout"]),
        entry(
            0b0000_1000,
            &[
                "h/api",
                "x/recommendations",
                "x/api",
                "x/checkout",
                "x/search",
            ],
        ),
        entry(
            FOUR_SLOTS_QUEUE_64 | QUEUE_AGE | STEP_50MS,
            &[
                "h/api",
                "h/api",
                "h/api",
                "h/api",
                "x/recommendations",
                "x/checkout",
                "x/search",
            ],
        ),
        entry(
            ONE_SLOT | STEP_2S,
            &["h/checkout", "x/api\ngrpc-timeout: 100m", "x/search"],
        ),
        entry(
            RATE,
            &[
                "x/api",
                "x/api",
                "x/api",
                "x/recommendations",
                "x/recommendations",
            ],
        ),
        entry(
            ONE_SLOT,
            &["x/healthz", "h/checkout", "x/readyz", "x/metrics"],
        ),
        entry(
            0b0000_1001,
            &["h/api", "d/api", "d/checkout", "x/search", "d/api"],
        ),
        entry(
            ONE_SLOT | STEP_50MS,
            &["d/api", "h/checkout", "d/recommendations", "x/api"],
        ),
        entry(
            ONE_SLOT,
            &[
                "x/api\nx-internal: 1\ntriage-criticality: critical",
                "x/api\ntriage-criticality: critical",
                "x/checkout\ntriage-attempt: 2",
                "x/checkout\ntriage-attempt: 4294967295",
                "x/checkout\nx-internal: yes\ntriage-criticality: urgent",
                "x/checkout-report",
            ],
        ),
        entry(
            ONE_SLOT,
            &[
                "x/api\n~500",
                "x/api\n~-500",
                "x/api\n~0",
                "x/api\n~3600000",
            ],
        ),
        entry(
            ONE_SLOT,
            &[
                "x/api\ntriage-deadline-ms: 1700000000000",
                "x/api\ntriage-deadline-ms: abc",
                "x/api\ntriage-deadline-ms: -5\ngrpc-timeout: 1S",
                "x/api\nx-request-id: a\nx-request-id: b",
            ],
        ),
    ];
    // gRPC timeouts of every unit, in range of the clock.
    for unit in ["H", "M", "S", "m", "u", "n"] {
        seeds.push(entry(
            ONE_SLOT | STEP_50MS,
            &[
                "h/api",
                &format!("x/svc.Api/Call\ncontent-type: application/grpc\ngrpc-timeout: 10{unit}"),
                &format!(
                    "x/svc.Api/Call\ncontent-type: application/grpc+proto\ngrpc-timeout: 0{unit}"
                ),
            ],
        ));
    }
    seeds
}

/// A Kafka input: setup, timestamp, wall clock, lines.
fn kafka_input(setup: u8, timestamp: i64, wall_ms: u64, lines: &[&[u8]]) -> Vec<u8> {
    let mut s = vec![setup];
    s.extend_from_slice(&timestamp.to_le_bytes());
    s.extend_from_slice(&wall_ms.to_le_bytes());
    s.extend_from_slice(&lines.join(&b'\n'));
    s
}

fn kafka() -> Vec<Vec<u8>> {
    // Setup: topic trusted/mapped/other/both (bits 0-1), ordering (2-3), timestamp (4), key
    // (5), windows default/none/a year/1 ms (6-7).
    const TS: u8 = 0b1_0000;
    const KEY: u8 = 0b10_0000;
    const KEY_MODE: u8 = 0b1000;
    let now = 1_700_000_000_000i64;
    let wall = 1_700_000_000_000u64;
    let mut seeds = Vec::new();
    for topic in 0..4u8 {
        seeds.push(kafka_input(
            topic | TS,
            now,
            wall,
            &[b"triage-criticality: critical"],
        ));
        seeds.push(kafka_input(
            topic | TS | KEY | KEY_MODE,
            now - 600_000,
            wall,
            &[
                b"account-17",
                b"triage-criticality: high",
                b"triage-deadline-ms: 1700000060000",
                b"triage-attempt: 2",
                b"triage-deferrals: 1",
            ],
        ));
    }
    for value in VALUES {
        let header = format!("triage-deadline-ms: {value}");
        seeds.push(kafka_input(TS, now, wall, &[header.as_bytes()]));
        let label = format!("triage-criticality: {value}");
        seeds.push(kafka_input(
            0,
            now,
            wall,
            &[label.as_bytes(), b"triage-attempt: 4294967295"],
        ));
    }
    seeds.push(kafka_input(
        TS,
        now,
        wall,
        &[b"triage-criticality: high", b"triage-criticality: high"],
    ));
    seeds.push(kafka_input(TS, now, wall, &[b"triage-criticality"]));
    seeds.push(kafka_input(
        TS,
        now,
        wall,
        &[b"triage-crit\0icality: critical"],
    ));
    seeds.push(kafka_input(TS | 0b1000_0000, i64::MAX, wall, &[]));
    seeds.push(kafka_input(TS | 0b1100_0000, i64::MIN, u64::MAX, &[]));
    seeds.push(kafka_input(
        TS | KEY | 0b0100,
        -1,
        0,
        &[b"", b"\xff\xfe: \xff"],
    ));
    seeds
}

fn amqp_input(setup: u8, now_ms: u64, props: &AMQPProperties) -> Vec<u8> {
    let mut s = vec![setup];
    s.extend_from_slice(&now_ms.to_le_bytes());
    let written = cookie_factory::gen_simple(gen_properties(props), Vec::new())
        .expect("lapin writes its own properties");
    s.extend_from_slice(&written);
    s
}

fn amqp() -> Vec<Vec<u8>> {
    // Setup: trusted (bit 0), tier source (1-2), use_expiration (3), windows (4-5), bands (6-7).
    const TRUSTED: u8 = 1;
    const EXPIRATION: u8 = 0b1000;
    const WINDOW_CRITICAL: u8 = 0b1_0000;
    let now = 1_700_000_000_000u64;
    let with = |name: &str, value: AMQPValue| {
        let mut h = FieldTable::default();
        h.insert(ShortString::from(name), value);
        AMQPProperties::default().with_headers(h)
    };
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    let mut props = vec![
        AMQPProperties::default(),
        AMQPProperties::default().with_priority(0),
        AMQPProperties::default().with_priority(9),
        AMQPProperties::default().with_priority(255),
        with("triage-criticality", text("critical")),
        with("triage-criticality", text("urgent")),
        with("triage-criticality", AMQPValue::LongInt(3)),
        with(
            "triage-criticality",
            AMQPValue::ShortString(ShortString::from("high")),
        ),
        with(
            "triage-criticality",
            AMQPValue::ByteArray(vec![0xff, 0xfe].into()),
        ),
        with("triage-attempt", AMQPValue::LongLongInt(i64::MAX)),
        with("triage-attempt", text("2")),
        with("triage-deferrals", AMQPValue::ShortShortInt(-1)),
        with("triage-deadline-ms", AMQPValue::LongLongInt(i64::MAX)),
        with("triage-deadline-ms", AMQPValue::Timestamp(u64::MAX)),
        with("triage-deadline-ms", text("99999999999999")),
        with("triage-deadline-ms", text("1700000000500")),
        with("triage-deadline-ms", AMQPValue::Double(1.5)),
        AMQPProperties::default()
            .with_timestamp(1_700_000_000)
            .with_priority(9),
        AMQPProperties::default().with_timestamp(u64::MAX),
        AMQPProperties::default().with_expiration(ShortString::from("250")),
        AMQPProperties::default()
            .with_expiration(ShortString::from("18446744073709551615"))
            .with_timestamp(1_700_000_000),
    ];
    let mut all = FieldTable::default();
    for (name, value) in [
        ("triage-criticality", text("high")),
        ("triage-attempt", AMQPValue::LongInt(1)),
        ("triage-deferrals", text(" 3 ")),
        (
            "triage-deadline-ms",
            AMQPValue::LongLongInt(1_700_000_060_000),
        ),
    ] {
        all.insert(ShortString::from(name), value);
    }
    props.push(
        AMQPProperties::default()
            .with_headers(all)
            .with_priority(4)
            .with_timestamp(1_700_000_000)
            .with_expiration(ShortString::from("60000")),
    );
    let mut seeds = Vec::new();
    for (i, p) in props.iter().enumerate() {
        let setup = match i % 4 {
            0 => 0,
            1 => TRUSTED,
            2 => TRUSTED | EXPIRATION | WINDOW_CRITICAL,
            _ => EXPIRATION | 0b10_0000,
        };
        seeds.push(amqp_input(setup, now, p));
        seeds.push(amqp_input(setup ^ TRUSTED, now, p));
    }
    seeds
}

fn config() -> Vec<Vec<u8>> {
    let raw = |text: &str| {
        let mut s = vec![1u8];
        s.extend_from_slice(text.as_bytes());
        s
    };
    let paths = triage_fuzz::config::paths();
    let index = |path: &str| {
        paths
            .iter()
            .position(|p| p == path)
            .unwrap_or_else(|| panic!("no key {path}")) as u8
    };
    let edge = |v: i64| {
        triage_fuzz::config::EDGE_INTEGERS
            .iter()
            .position(|e| *e == v)
            .unwrap_or_else(|| panic!("no edge {v}")) as u8
    };
    let word = |w: &str| {
        triage_fuzz::config::WORDS
            .iter()
            .position(|e| *e == w)
            .unwrap_or_else(|| panic!("no word {w}")) as u8
    };
    // Edits: (path, kind, value); kind 1 an edge integer, 5 a word, 4 a boolean.
    let edits = |traffic: u8, configs: &[&[(&str, u8, u8)]]| {
        let mut s = vec![0u8, traffic];
        for (i, edits) in configs.iter().enumerate() {
            if i > 0 {
                s.push(0xff);
            }
            for (path, kind, value) in *edits {
                s.extend_from_slice(&[index(path), *kind, *value]);
            }
        }
        s
    };
    let mut seeds = vec![
        raw(""),
        raw("workers = 4\n[queue]\ncapacity = 8\n[limit]\nkind = \"aimd\"\n"),
        raw("[retry]\nmax_retries = 100\nbase_backoff_ms = 3600000\nmax_backoff_ms = 3600000\n"),
        raw("[breaker]\nrecovery_ms = 3600000\n[admission]\nrecover_ms = 600000\n"),
        raw("forced_shed_level = 3\nbrownout_level = 255\n[policy]\nmedium = \"drop\"\n"),
        raw("[queue]\ncapacity = 0\n"),
        raw(&toml::to_string(&triage::runtime::RuntimeConfig::default()).unwrap_or_default()),
    ];
    let traffic = 0b0011_0100; // 4 messages, 100 ms steps
    seeds.push(edits(
        traffic,
        &[
            &[],
            &[("forced_shed_level", 1, edge(2))],
            &[("forced_shed_level", 1, edge(0))],
        ],
    ));
    seeds.push(edits(traffic, &[&[], &[("workers", 1, edge(16))]]));
    seeds.push(edits(
        traffic,
        &[
            &[("expert.limit.kind", 5, word("gradient2"))],
            &[
                ("expert.limit.kind", 5, word("fixed")),
                ("expert.limit.limit", 1, edge(2)),
            ],
        ],
    ));
    seeds.push(edits(
        0b0111_1000,
        &[
            &[
                ("expert.retry.base_backoff_ms", 1, edge(3_600_000)),
                ("expert.retry.max_backoff_ms", 1, edge(3_600_000)),
            ],
            &[("retry.max_retries", 1, edge(100))],
        ],
    ));
    seeds.push(edits(
        traffic,
        &[
            &[
                ("expert.breaker.recovery_ms", 1, edge(3_600_000)),
                ("expert.breaker.min_calls", 1, edge(1)),
            ],
            &[("expert.breaker.window_ms", 1, edge(i64::MAX))],
        ],
    ));
    seeds.push(edits(
        traffic,
        &[
            &[
                ("expert.admission.recover_ms", 1, edge(600_000)),
                ("expert.admission.tick_ms", 1, edge(1)),
            ],
            &[("expert.admission.window_ms", 1, edge(u32::MAX as i64 + 1))],
        ],
    ));
    seeds.push(edits(
        traffic,
        &[
            &[("expert.queue.capacity", 1, edge(2))],
            &[
                ("expert.queue.capacity", 1, edge(1)),
                ("policy.critical", 5, word("drop")),
            ],
        ],
    ));
    seeds.push(edits(
        traffic,
        &[
            &[("memory.budget_bytes", 1, edge(1_000))],
            &[("memory.budget_bytes", 1, edge(i64::MAX))],
        ],
    ));
    seeds.push(edits(
        traffic,
        &[
            &[
                ("buckets.medium.rate", 3, 2),
                ("buckets.medium.burst", 1, edge(1)),
            ],
            &[("buckets.medium.burst", 1, edge(u32::MAX as i64))],
        ],
    ));
    seeds.push(edits(
        traffic,
        &[
            &[
                ("expert.share_reserve_ms", 1, edge(600_000)),
                ("expert.poll_interval_ms", 1, edge(60_000)),
            ],
            &[("expert.defer_cooldown_ms", 1, edge(3_600_000))],
        ],
    ));
    seeds.push(edits(
        traffic,
        &[
            &[],
            &[("policy.medium", 5, word("defer"))],
            &[("expert.max_deferring", 1, edge(1))],
        ],
    ));
    seeds
}
