//! The headers of a re-published record: the original ones exactly once each, then triage's.
//!
//! Original headers keep their order and duplicates, except headers named like one of
//! triage's (a record deferred twice, or drained and deferred again): those are replaced,
//! never duplicated, so a consumer reading the first `triage-attempt` reads the current one.
//! The origin headers name where *this* copy was consumed from.

use rdkafka::message::{Header, OwnedHeaders};
use triage::runtime::Republish;
use triage::wire;

use crate::KafkaMessage;

/// The header list of the copy of `msg`, as `(name, value)` pairs in order.
pub(crate) fn republish_headers(
    msg: &KafkaMessage,
    info: &Republish,
) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out: Vec<(String, Option<Vec<u8>>)> = msg
        .headers
        .iter()
        .filter(|(name, _)| !wire::is_triage_header(name))
        .cloned()
        .collect();
    out.extend(triage_headers(msg, info));
    out
}

/// Triage's headers alone, without the original ones: what a reference copy keeps when the
/// original headers are what made the record too large.
pub(crate) fn triage_headers(
    msg: &KafkaMessage,
    info: &Republish,
) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::with_capacity(9);
    let mut add = |name: &str, value: String| out.push((name.to_owned(), Some(value.into_bytes())));
    add(wire::CRITICALITY, info.criticality.as_str().to_owned());
    add(wire::ATTEMPT, info.attempt.to_string());
    add(wire::DEFERRALS, info.deferrals.to_string());
    if let Some(deadline) = info.deadline {
        add(wire::DEADLINE_MS, wire::format_deadline_ms(deadline));
    }
    add(wire::REASON, info.reason.to_owned());
    add(wire::ORIGIN_TOPIC, msg.topic.to_string());
    add(wire::ORIGIN_PARTITION, msg.partition.to_string());
    add(wire::ORIGIN_OFFSET, msg.offset.to_string());
    if let Some(err) = &info.error {
        add(wire::ERROR, wire::bound_error(err).to_owned());
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
    use wire::*;

    use super::*;

    fn info(deferrals: u32, error: Option<String>) -> Republish {
        Republish {
            criticality: Criticality::High,
            attempt: 1,
            deferrals,
            deadline: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(5000)),
            reason: if error.is_some() {
                "failed"
            } else {
                "overloaded"
            },
            error,
        }
    }

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
                ("triage-deferrals".into(), Some(b"1".to_vec())),
            ],
            timestamp_ms: None,
        };
        let h = republish_headers(&msg, &info(2, None));
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "a",
                "a",
                CRITICALITY,
                ATTEMPT,
                DEFERRALS,
                DEADLINE_MS,
                REASON,
                ORIGIN_TOPIC,
                ORIGIN_PARTITION,
                ORIGIN_OFFSET
            ]
        );
        assert_eq!(h[1].1, None);
        assert_eq!(h[3].1.as_deref(), Some(&b"1"[..]));
        assert_eq!(
            h[4].1.as_deref(),
            Some(&b"2"[..]),
            "the copy's deferral count"
        );
        assert_eq!(h[5].1.as_deref(), Some(&b"5000"[..]));
        assert_eq!(h[9].1.as_deref(), Some(&b"41"[..]));
    }

    #[test]
    fn error_header_is_bounded() {
        let msg = KafkaMessage {
            topic: "orders".into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: None,
            headers: vec![],
            timestamp_ms: None,
        };
        let h = republish_headers(&msg, &info(0, Some("é".repeat(10_000))));
        let (name, value) = h.last().unwrap();
        assert_eq!(name, ERROR);
        let value = std::str::from_utf8(value.as_deref().unwrap()).unwrap();
        assert_eq!(value, "é".repeat(MAX_ERROR_BYTES / 2));
    }
}
