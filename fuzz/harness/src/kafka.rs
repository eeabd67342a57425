//! The Kafka source's classification of a record (`triage-kafka`, `source::fuzzing`): its topic,
//! key, headers and timestamp as a producer wrote them, the mapping of its deadline onto the
//! clock, its ordering key and its size.
//!
//! Input:
//! - byte 0, the setup: bits 0-1 the record's topic (`trusted`, trusted to label; `mapped`,
//!   untrusted with a topic tier of High; `other`, untrusted and unmapped; `both`, trusted with
//!   a topic tier of Sheddable); bits 2-3 the ordering (unordered, partition, key, key with
//!   null keys ordered per partition); bit 4 the record has a timestamp; bit 5 it has a key;
//!   bits 6-7 the deadline windows (the defaults, none, a year for every tier, 1 ms for every
//!   tier);
//! - bytes 1-8 the record timestamp (Unix milliseconds, `i64` little-endian, any value);
//! - bytes 9-16 the wall clock's reading (Unix milliseconds modulo 10^13, about the year 2286);
//! - then lines: the key first (when the setup gives one), then one header per line, `name:
//!   value`, or a bare `name` for a null value. Names are read as the source reads them from
//!   librdkafka: up to the first NUL, converted lossily to UTF-8.
//!
//! Invariants, from the source's documented rules (module `classify`):
//! - a label is honoured only on a trusted topic, from exactly one header that parses; anything
//!   else gives the topic's tier or the default, with the documented problem counted;
//! - `triage-attempt`, `triage-deferrals` and the deadline header are read only on a trusted
//!   topic; elsewhere they are 0 and the deadline comes from the timestamp and window;
//! - the deadline on the clock is never before the clock's now; a deadline already passed is
//!   now; one ahead lies exactly that far ahead (held at most, never panicking, when it is too
//!   far for the clock);
//! - the ordering key follows the mode; the size is the sum of key, payload and headers.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use triage::ordering::{NullKeyOrdering, OrderingConfig, OrderingMode};
use triage::quanta::Clock;
use triage::{wire, Criticality, PerTier};
use triage_kafka::source::fuzzing::{self, Classification};
use triage_kafka::source::UnclassifiedReason;
use triage_kafka::{KafkaMessage, KafkaSourceConfig};

use crate::input::{header, lines, Input};

const TOPICS: [&str; 4] = ["trusted", "mapped", "other", "both"];

/// A year: the longest deadline window the configuration allows.
const YEAR_MS: u64 = 31_536_000_000;

/// Runs the target on one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let setup = input.byte();
    let timestamp = input.u64() as i64;
    let wall_ms = input.u64() % 10_000_000_000_000;
    let mut lines = lines(input.rest());

    let topic = TOPICS[usize::from(setup & 0b11)];
    let mut config = KafkaSourceConfig::new("localhost:9092", "g", TOPICS);
    config.criticality.trusted_topics = vec!["trusted".into(), "both".into()];
    config
        .criticality
        .topic_tiers
        .insert("mapped".into(), Criticality::High);
    config
        .criticality
        .topic_tiers
        .insert("both".into(), Criticality::Sheddable);
    config.deadline.window_ms = match setup >> 6 {
        0 => config.deadline.window_ms,
        1 => PerTier::splat(None),
        2 => PerTier::splat(Some(YEAR_MS)),
        _ => PerTier::splat(Some(1)),
    };
    config.ordering = match (setup >> 2) & 0b11 {
        0 => OrderingConfig::new(OrderingMode::Unordered),
        1 => OrderingConfig::new(OrderingMode::Partition),
        2 => OrderingConfig::new(OrderingMode::Key),
        _ => OrderingConfig {
            mode: OrderingMode::Key,
            null_key: NullKeyOrdering::Partition,
        },
    };
    config
        .validate()
        .expect("the harness's configuration is valid");
    let timestamp_ms = (setup & 0b1_0000 != 0).then_some(timestamp);
    let key = (setup & 0b10_0000 != 0).then(|| lines.next().unwrap_or_default().to_vec());
    let headers: Vec<(String, Option<Vec<u8>>)> = lines
        .map(|line| {
            let (name, value) = header(line);
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            (
                String::from_utf8_lossy(name).into_owned(),
                value.map(<[u8]>::to_vec),
            )
        })
        .collect();

    let (clock, mock) = Clock::mock();
    mock.increment(Duration::from_secs(86_400));
    let now = clock.now();
    let wall = UNIX_EPOCH + Duration::from_millis(wall_ms);
    let meta = fuzzing::meta(topic, 0, 0, key.as_deref(), &headers, timestamp_ms);
    let got = fuzzing::classify(&config, None, &meta, now, wall);

    check_classification(&config, topic, &headers, timestamp_ms, &got);
    check_deadline(&got, now, wall);
    check_ordering(&config, topic, key.as_deref());

    let message = KafkaMessage {
        topic: Arc::from(topic),
        partition: 0,
        offset: 0,
        key: key.clone(),
        payload: Some(vec![0; usize::from(setup)]),
        headers: headers.clone(),
        timestamp_ms,
    };
    let sum = key.as_ref().map_or(0, Vec::len)
        + usize::from(setup)
        + headers
            .iter()
            .map(|(n, v)| n.len() + v.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
    assert_eq!(message.size_bytes(), sum);
}

/// The first value of header `name`: `None` when absent, `Some(None)` when null.
fn first<'a>(headers: &'a [(String, Option<Vec<u8>>)], name: &str) -> Option<Option<&'a [u8]>> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_deref())
}

fn check_classification(
    config: &KafkaSourceConfig,
    topic: &str,
    headers: &[(String, Option<Vec<u8>>)],
    timestamp_ms: Option<i64>,
    got: &Classification,
) {
    let trusted = config.criticality.trusted_topics.iter().any(|t| t == topic);
    let topic_tier = config.criticality.topic_tiers.get(topic).copied();
    let fallback = topic_tier.unwrap_or(config.criticality.default_tier);

    // The tier.
    let labels: Vec<_> = headers
        .iter()
        .filter(|(n, _)| *n == config.criticality.header)
        .collect();
    let (tier, problem) = if !trusted {
        (
            fallback,
            topic_tier.is_none().then_some(UnclassifiedReason::Unmapped),
        )
    } else {
        match labels.as_slice() {
            [] => match topic_tier {
                Some(t) => (t, None),
                None => (fallback, Some(UnclassifiedReason::Missing)),
            },
            [(_, value)] => match value.as_deref().map(wire::parse_criticality) {
                Some(Ok(c)) => (c, None),
                _ => (fallback, Some(UnclassifiedReason::Malformed)),
            },
            _ => (fallback, Some(UnclassifiedReason::Duplicate)),
        }
    };
    assert_eq!(
        (got.criticality, got.tier_problem),
        (tier, problem),
        "tier on {topic}"
    );
    if !trusted {
        // Whatever the headers say, never above the topic's own tier.
        assert!(got.criticality <= fallback);
    }

    // The counts.
    let count = |name: &str| -> (u32, bool) {
        if !trusted {
            return (0, false);
        }
        match first(headers, name) {
            None => (0, false),
            Some(value) => match value.and_then(wire::parse_count) {
                Some(n) => (n, false),
                None => (0, true),
            },
        }
    };
    let (attempt, bad_attempt) = count(wire::ATTEMPT);
    let (deferrals, bad_deferrals) = count(wire::DEFERRALS);
    assert_eq!((got.attempt, got.deferrals), (attempt, deferrals), "counts");
    assert_eq!(
        got.count_problem,
        (bad_attempt || bad_deferrals).then_some(UnclassifiedReason::BadCount)
    );

    // The deadline: a trusted header that parses, else timestamp plus the tier's window.
    let header = trusted
        .then(|| first(headers, &config.deadline.header))
        .flatten();
    let explicit = header.map(|v| {
        v.and_then(wire::parse_deadline_ms)
            .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok())
    });
    let implicit = timestamp_ms
        .zip(config.deadline.window_ms[tier])
        .map(|(ts, w)| ts.saturating_add(i64::try_from(w).unwrap_or(i64::MAX)));
    match explicit {
        Some(Some(ms)) => {
            assert_eq!(got.deadline_ms, Some(ms), "the deadline header");
            assert_eq!(got.deadline_problem, None);
        }
        Some(None) => {
            assert_eq!(got.deadline_ms, implicit, "a bad deadline header");
            assert_eq!(got.deadline_problem, Some(UnclassifiedReason::BadDeadline));
        }
        None => {
            assert_eq!(got.deadline_ms, implicit, "the timestamp's window");
            assert_eq!(got.deadline_problem, None);
        }
    }
}

fn check_deadline(got: &Classification, now: triage::quanta::Instant, wall: SystemTime) {
    let Some(ms) = got.deadline_ms else {
        assert_eq!(got.deadline, None);
        return;
    };
    let target = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let ahead = target.duration_since(wall).unwrap_or(Duration::ZERO);
    match got.deadline {
        Some(at) => {
            assert!(at >= now, "a deadline before now");
            let mapped = at.duration_since(now);
            if ahead <= Duration::from_secs(365 * 86_400) {
                assert_eq!(mapped, ahead, "deadline {ms} ms, wall {wall:?}");
            } else {
                assert!(mapped <= ahead, "held further than it was");
            }
        }
        // Only for a deadline too far for the clock.
        None => assert!(
            now.checked_add(ahead).is_none() || ahead > Duration::from_secs(365 * 86_400),
            "a deadline {ahead:?} ahead lost"
        ),
    }
}

fn check_ordering(config: &KafkaSourceConfig, topic: &str, key: Option<&[u8]>) {
    let o = config.ordering;
    let got = o.key_of((topic, 0), key);
    let other = o.key_of((topic, 0), Some(b"another key"));
    let elsewhere = o.key_of((topic, 1), key);
    match (o.mode, key, o.null_key) {
        (OrderingMode::Unordered, _, _) | (OrderingMode::Key, None, NullKeyOrdering::Unordered) => {
            assert_eq!(got, None)
        }
        (OrderingMode::Partition, _, _) => {
            assert!(got.is_some());
            assert_eq!(got, other, "partition mode ignores the key");
            assert_ne!(got, elsewhere, "partitions are apart");
        }
        (OrderingMode::Key, _, _) => {
            assert!(got.is_some());
            assert_eq!(got, o.key_of((topic, 0), key), "stable");
        }
    }
}
