//! The headers of a re-published record: the original ones exactly once each, then triage's.
//!
//! Original headers keep their order and duplicates, except headers named like one of
//! triage's (a record deferred twice, or drained and deferred again): those are replaced,
//! never duplicated, so a consumer reading the first `triage-attempt` reads the current one.
//! The origin headers name where *this* copy was consumed from.

use std::time::UNIX_EPOCH;

use rdkafka::message::{Header, OwnedHeaders};
use triage::runtime::Republish;

use crate::KafkaMessage;

/// Criticality as classified at the source, before retry demotion (`critical`, `high`, ...).
pub const CRITICALITY: &str = "triage-criticality";
/// Retries so far, decimal.
pub const ATTEMPT: &str = "triage-attempt";
/// Absolute deadline, decimal Unix milliseconds (absent without a deadline).
pub const DEADLINE_MS: &str = "triage-deadline-ms";
/// Why it was re-published (`overloaded`, `full`, `evicted`, `shutdown`, `failed`, ...).
pub const REASON: &str = "triage-reason";
/// Topic the copy was consumed from.
pub const ORIGIN_TOPIC: &str = "triage-origin-topic";
/// Partition the copy was consumed from, decimal.
pub const ORIGIN_PARTITION: &str = "triage-origin-partition";
/// Offset the copy was consumed from, decimal.
pub const ORIGIN_OFFSET: &str = "triage-origin-offset";
/// For a dead letter, the last error's text.
pub const ERROR: &str = "triage-error";

/// Every header triage writes; originals with these names are replaced.
pub const ALL: [&str; 8] = [
    CRITICALITY,
    ATTEMPT,
    DEADLINE_MS,
    REASON,
    ORIGIN_TOPIC,
    ORIGIN_PARTITION,
    ORIGIN_OFFSET,
    ERROR,
];

/// The header list of the copy of `msg`, as `(name, value)` pairs in order.
pub(crate) fn republish_headers(
    msg: &KafkaMessage,
    info: &Republish,
) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out: Vec<(String, Option<Vec<u8>>)> = msg
        .headers
        .iter()
        .filter(|(name, _)| !ALL.contains(&name.as_str()))
        .cloned()
        .collect();
    let mut add = |name: &str, value: String| out.push((name.to_owned(), Some(value.into_bytes())));
    add(CRITICALITY, info.criticality.as_str().to_owned());
    add(ATTEMPT, info.attempt.to_string());
    if let Some(ms) = info
        .deadline
        .and_then(|d| d.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis())
    {
        add(DEADLINE_MS, ms.to_string());
    }
    add(REASON, info.reason.to_owned());
    add(ORIGIN_TOPIC, msg.topic.clone());
    add(ORIGIN_PARTITION, msg.partition.to_string());
    add(ORIGIN_OFFSET, msg.offset.to_string());
    if let Some(err) = &info.error {
        add(ERROR, err.clone());
    }
    out
}

pub(crate) fn to_owned_headers(headers: &[(String, Option<Vec<u8>>)]) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |acc, (key, value)| {
            acc.insert(Header {
                key: key.as_str(),
                value: value.as_deref(),
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use triage::Criticality;

    use super::*;

    #[test]
    fn originals_once_triage_replaced() {
        let msg = KafkaMessage {
            topic: "orders".into(),
            partition: 2,
            offset: 41,
            key: None,
            payload: None,
            headers: vec![
                ("a".into(), Some(b"1".to_vec())),
                ("triage-attempt".into(), Some(b"0".to_vec())),
                ("a".into(), None),
                ("triage-reason".into(), Some(b"full".to_vec())),
            ],
            timestamp_ms: None,
        };
        let info = Republish {
            criticality: Criticality::High,
            attempt: 1,
            deferrals: 0,
            deadline: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(5000)),
            reason: "overloaded",
            error: None,
        };
        let h = republish_headers(&msg, &info);
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "a",
                "a",
                CRITICALITY,
                ATTEMPT,
                DEADLINE_MS,
                REASON,
                ORIGIN_TOPIC,
                ORIGIN_PARTITION,
                ORIGIN_OFFSET
            ]
        );
        assert_eq!(h[1].1, None);
        assert_eq!(h[3].1.as_deref(), Some(&b"1"[..]));
        assert_eq!(h[4].1.as_deref(), Some(&b"5000"[..]));
        assert_eq!(h[8].1.as_deref(), Some(&b"41"[..]));
    }
}
