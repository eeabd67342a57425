//! The wire contract: the `triage-*` header names every connector reads and writes, how their
//! values are parsed, and the bounds on what triage writes.
//!
//! Written once here so that a record deferred by the Kafka connector and drained by another
//! process, a message dead-lettered on RabbitMQ, and a follow-up message stamped by a handler
//! all speak the same language. The connectors only map these names and values onto rdkafka's
//! `OwnedHeaders` and lapin's `FieldTable`.
//!
//! Every value is ASCII text (a criticality label or a decimal integer), so any broker's header
//! type can carry it; parsers accept surrounding ASCII whitespace and never allocate.
//!
//! # Examples
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use triage::wire;
//! use triage::Criticality;
//!
//! assert_eq!(wire::parse_criticality(b"high"), Ok(Criticality::High));
//! assert_eq!(wire::parse_count(b" 3 "), Some(3));
//! assert_eq!(
//!     wire::parse_deadline_ms(b"1700000000000"),
//!     Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)),
//! );
//! let long = "x".repeat(5_000);
//! assert_eq!(wire::bound_error(&long).len(), wire::MAX_ERROR_BYTES);
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Criticality, ParseCriticalityError};

/// Criticality as classified at the source, before retry demotion: `critical`, `high`,
/// `medium` or `sheddable`. Read only from trusted topics or queues.
pub const CRITICALITY: &str = "triage-criticality";
/// Handler retries so far, decimal. The runtime demotes one level per retry.
pub const ATTEMPT: &str = "triage-attempt";
/// Times this message has been deferred (re-published to the defer topic or queue), decimal.
/// The runtime stops deferring a message once it reaches `RuntimeConfig::max_deferrals`.
pub const DEFERRALS: &str = "triage-deferrals";
/// Absolute deadline, decimal Unix milliseconds (absent without a deadline).
pub const DEADLINE_MS: &str = "triage-deadline-ms";
/// Why the copy was re-published (`overloaded`, `full`, `evicted`, `shutdown`, `failed`, ...).
pub const REASON: &str = "triage-reason";
/// For a dead letter, the last error's text, at most [`MAX_ERROR_BYTES`] bytes.
pub const ERROR: &str = "triage-error";
/// Kafka: the topic the copy was consumed from.
pub const ORIGIN_TOPIC: &str = "triage-origin-topic";
/// Kafka: the partition the copy was consumed from, decimal.
pub const ORIGIN_PARTITION: &str = "triage-origin-partition";
/// Kafka: the offset the copy was consumed from, decimal.
pub const ORIGIN_OFFSET: &str = "triage-origin-offset";
/// RabbitMQ: the queue the copy was consumed from.
pub const ORIGIN_QUEUE: &str = "triage-origin-queue";

/// Every header name triage writes. When a message is re-published, original headers with one
/// of these names are replaced, never duplicated, so the first occurrence is the current one.
pub const ALL: [&str; 10] = [
    CRITICALITY,
    ATTEMPT,
    DEFERRALS,
    DEADLINE_MS,
    REASON,
    ERROR,
    ORIGIN_TOPIC,
    ORIGIN_PARTITION,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE,
];

/// The longest [`ERROR`] header value triage writes, in bytes. An error text is diagnostic;
/// an unbounded one could make the dead letter itself too large to publish.
pub const MAX_ERROR_BYTES: usize = 1024;

/// Whether `name` is one of triage's headers ([`ALL`]).
pub fn is_triage_header(name: &str) -> bool {
    ALL.contains(&name)
}

/// Parses a [`CRITICALITY`] value; same rules as [`Criticality::from_bytes`].
///
/// # Errors
///
/// [`ParseCriticalityError`] for anything but the four labels (numbers, non-UTF-8, empty).
pub fn parse_criticality(value: &[u8]) -> Result<Criticality, ParseCriticalityError> {
    Criticality::from_bytes(value)
}

/// Parses a non-negative decimal count ([`ATTEMPT`], [`DEFERRALS`]): `None` when the value is
/// not a decimal number that fits `u32` (a count that large is corrupt, not real).
pub fn parse_count(value: &[u8]) -> Option<u32> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 10 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(b - b'0');
    }
    u32::try_from(n).ok()
}

/// Parses a [`DEADLINE_MS`] value (decimal Unix milliseconds, non-negative) into wall-clock
/// time: `None` when it is not such a number.
pub fn parse_deadline_ms(value: &[u8]) -> Option<SystemTime> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    UNIX_EPOCH.checked_add(Duration::from_millis(n))
}

/// Formats a wall-clock deadline as a [`DEADLINE_MS`] value (decimal Unix milliseconds; a time
/// before the epoch is written as `0`, already expired).
pub fn format_deadline_ms(deadline: SystemTime) -> String {
    deadline
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
        .to_string()
}

/// `text` cut to at most [`MAX_ERROR_BYTES`] bytes on a UTF-8 character boundary, for the
/// [`ERROR`] header.
pub fn bound_error(text: &str) -> &str {
    if text.len() <= MAX_ERROR_BYTES {
        return text;
    }
    let mut end = MAX_ERROR_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        assert_eq!(parse_count(b"0"), Some(0));
        assert_eq!(parse_count(b" 42\t"), Some(42));
        assert_eq!(parse_count(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_count(b"4294967296"), None);
        assert_eq!(parse_count(b"-1"), None);
        assert_eq!(parse_count(b""), None);
        assert_eq!(parse_count(b"1e3"), None);
        assert_eq!(parse_count(&[0xff]), None);
    }

    #[test]
    fn deadlines() {
        assert_eq!(parse_deadline_ms(b"0"), Some(UNIX_EPOCH));
        assert_eq!(parse_deadline_ms(b"-5"), None);
        assert_eq!(parse_deadline_ms(b"99999999999999999999"), None);
        let t = UNIX_EPOCH + Duration::from_millis(1_234);
        assert_eq!(format_deadline_ms(t), "1234");
        assert_eq!(parse_deadline_ms(format_deadline_ms(t).as_bytes()), Some(t));
    }

    #[test]
    fn error_bound_keeps_utf8() {
        let text = "é".repeat(MAX_ERROR_BYTES);
        let cut = bound_error(&text);
        assert!(cut.len() <= MAX_ERROR_BYTES && cut.len() >= MAX_ERROR_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(bound_error("short"), "short");
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        for (i, a) in ALL.iter().enumerate() {
            assert!(a.starts_with("triage-"));
            assert!(is_triage_header(a));
            assert!(ALL[i + 1..].iter().all(|b| a != b));
        }
        assert!(!is_triage_header("x-other"));
    }
}
