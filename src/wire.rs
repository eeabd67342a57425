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

use quanta::Instant;

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
/// The downstream a message is bound for, for circuit-breaker-aware admission: a convention
/// for producers that know it, read by a mapping such as
/// `|m: &KafkaMessage| m.header_str(wire::DOWNSTREAM)` given to
/// [`RuntimeBuilder::downstream`](crate::runtime::RuntimeBuilder::downstream). Triage never
/// writes it (not in [`ALL`]), and a re-published copy keeps it as it was.
pub const DOWNSTREAM: &str = "triage-downstream";
/// Why the copy was re-published (`overloaded`, `full`, `evicted`, `shutdown`, `failed`, ...);
/// on an HTTP or gRPC refusal by `triage-tower`, why it was refused (`capacity`, `expired`,
/// `rate`, `circuit`).
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

/// HTTP and gRPC: an id the caller gives each logical request and keeps across its retries, so
/// that a service can count how many shed requests come back (the retry-reappearance ratio of
/// `triage-tower`). The de facto name; triage never writes it on a broker message.
pub const REQUEST_ID: &str = "x-request-id";
/// gRPC: the caller's timeout, relative (see [`parse_grpc_timeout`]). Read by `triage-tower` as
/// a request's deadline when [`DEADLINE_MS`] is absent.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// gRPC: the status code of a response, decimal (`14` UNAVAILABLE, `8` RESOURCE_EXHAUSTED).
pub const GRPC_STATUS: &str = "grpc-status";
/// gRPC: the human-readable message of a non-OK status.
pub const GRPC_MESSAGE: &str = "grpc-message";
/// gRPC: the server's pushback, decimal milliseconds before the client may retry (gRPC's
/// retry design, proposal A6); written beside [`RETRY_AFTER`] on a refused gRPC call.
pub const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
/// HTTP: how long the caller should wait before it tries again, in whole seconds (RFC 9110
/// section 10.2.3; see [`parse_retry_after`] and [`format_retry_after`]).
pub const RETRY_AFTER: &str = "retry-after";

/// The longest [`RETRY_AFTER`] triage parses or writes: one day. A longer value is more likely
/// corrupt than meant, and a client must not sleep for ever on it.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// The furthest ahead a deadline from outside (a header, a relative timeout) is kept: one
/// year. A longer one is held to it, so that no value a client sends can overflow the clock's
/// arithmetic; a request or message that may wait a year has, for overload control, no
/// deadline.
pub const MAX_DEADLINE_AHEAD: Duration = Duration::from_secs(365 * 86_400);

/// The instant `ahead` after `now`, saturating: `ahead` is held to [`MAX_DEADLINE_AHEAD`]. The
/// one way to turn time left that came from outside (a [`DEADLINE_MS`] minus the wall clock, a
/// [`GRPC_TIMEOUT`], a broker's TTL) into a deadline on the clock, where `now + ahead` would
/// panic for a large enough value. Never panics: from an instant so late that even the held
/// value does not fit (within a year of the clock's end, which no clock reaches), the latest
/// instant found by halving `ahead` is returned.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use triage::wire;
///
/// let (clock, _mock) = triage::quanta::Clock::mock();
/// let now = clock.now();
/// assert_eq!(wire::deadline_after(now, Duration::from_millis(250)) - now, Duration::from_millis(250));
/// // 99999999H, a valid grpc-timeout: held to a year, no panic.
/// let far = wire::parse_grpc_timeout(b"99999999H").unwrap();
/// assert_eq!(wire::deadline_after(now, far) - now, wire::MAX_DEADLINE_AHEAD);
/// ```
#[inline]
pub fn deadline_after(now: Instant, ahead: Duration) -> Instant {
    let mut ahead = ahead.min(MAX_DEADLINE_AHEAD);
    loop {
        if let Some(at) = now.checked_add(ahead) {
            return at;
        }
        if ahead.is_zero() {
            return now;
        }
        ahead /= 2;
    }
}

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
/// not a decimal number (empty, signed, non-digits). A number above `u32::MAX`, however many
/// digits, saturates to `u32::MAX`: it is at least that many retries, so it must demote at
/// least as far as the largest count does, never read as a first attempt.
pub fn parse_count(value: &[u8]) -> Option<u32> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u32, |n, &b| {
        n.saturating_mul(10).saturating_add(u32::from(b - b'0'))
    }))
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

/// Parses a [`GRPC_TIMEOUT`] value: 1 to 8 ASCII digits followed by a unit, `H` hours, `M`
/// minutes, `S` seconds, `m` milliseconds, `u` microseconds or `n` nanoseconds (the gRPC over
/// HTTP/2 specification). `None` for anything else.
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let value = value.trim_ascii();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, &b| n * 10 + u64::from(b - b'0'));
    // At most 8 digits, so no product overflows; saturating all the same, as every sum or
    // product fed by a header is.
    Some(match unit {
        b'H' => Duration::from_secs(n.saturating_mul(3600)),
        b'M' => Duration::from_secs(n.saturating_mul(60)),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Parses a [`RETRY_AFTER`] value in its delta-seconds form (`"3"`): `None` for an HTTP-date
/// (which triage never writes) or anything else; values above [`MAX_RETRY_AFTER`] are capped
/// to it.
pub fn parse_retry_after(value: &[u8]) -> Option<Duration> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Past 6 significant digits the value is above the cap anyway; no need to parse it.
    let zeros = digits.iter().take_while(|&&b| b == b'0').count();
    let digits = &digits[zeros..];
    if digits.len() > 6 {
        return Some(MAX_RETRY_AFTER);
    }
    let secs = digits
        .iter()
        .fold(0u64, |n, &b| n * 10 + u64::from(b - b'0'));
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Formats a wait as a [`RETRY_AFTER`] value: whole seconds, rounded up (a client told `0`
/// would come back at once), at least 1 and at most [`MAX_RETRY_AFTER`].
pub fn format_retry_after(wait: Duration) -> String {
    let wait = wait.min(MAX_RETRY_AFTER);
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1).to_string()
}

/// A header value triage writes for the next hop, formatted without allocating: a
/// criticality label ([`criticality_value`]) or decimal Unix milliseconds
/// ([`deadline_value`]). ASCII, at most 20 bytes.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use triage::{wire, Criticality};
///
/// assert_eq!(wire::criticality_value(Criticality::High).as_str(), "high");
/// let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
/// assert_eq!(wire::deadline_value(at).as_bytes(), b"1700000000123");
/// assert_eq!(wire::parse_deadline_ms(wire::deadline_value(at).as_bytes()), Some(at));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeaderValue {
    buf: [u8; 20],
    len: u8,
}

impl HeaderValue {
    fn from_ascii(text: &[u8]) -> Self {
        let mut buf = [0u8; 20];
        let len = text.len().min(buf.len());
        buf[..len].copy_from_slice(&text[..len]);
        HeaderValue {
            buf,
            len: len as u8,
        }
    }

    /// The value's bytes, as written on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    /// The value as text (always ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl std::fmt::Debug for HeaderValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for HeaderValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The [`CRITICALITY`] value of `criticality` (its lowercase label).
pub fn criticality_value(criticality: Criticality) -> HeaderValue {
    HeaderValue::from_ascii(criticality.as_str().as_bytes())
}

/// The [`DEADLINE_MS`] value of a wall-clock deadline: decimal Unix milliseconds, `0` for a
/// time before the epoch (already expired). The same text as [`format_deadline_ms`].
pub fn deadline_value(deadline: SystemTime) -> HeaderValue {
    let mut ms = deadline
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (ms % 10) as u8;
        ms /= 10;
        if ms == 0 {
            break;
        }
    }
    HeaderValue::from_ascii(&digits[i..])
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
        assert_eq!(parse_count(b"4294967296"), Some(u32::MAX));
        assert_eq!(parse_count(b"18446744073709551615"), Some(u32::MAX));
        assert_eq!(parse_count("9".repeat(40).as_bytes()), Some(u32::MAX));
        assert_eq!(parse_count(b"0000000000003"), Some(3));
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
    fn grpc_timeouts() {
        assert_eq!(
            parse_grpc_timeout(b"250m"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout(b"3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout(b"7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(parse_grpc_timeout(b"123456789m"), None, "at most 8 digits");
        assert_eq!(parse_grpc_timeout(b"m"), None);
        assert_eq!(parse_grpc_timeout(b"10"), None, "a unit is required");
        assert_eq!(parse_grpc_timeout(b"10x"), None);
        assert_eq!(parse_grpc_timeout(b"-1S"), None);
    }

    #[test]
    fn retry_after() {
        assert_eq!(parse_retry_after(b" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(b"0"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(b"99999999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after(b"Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after(b""), None);
        assert_eq!(format_retry_after(Duration::from_millis(1)), "1");
        assert_eq!(format_retry_after(Duration::ZERO), "1");
        assert_eq!(format_retry_after(Duration::from_millis(2_001)), "3");
        assert_eq!(format_retry_after(Duration::from_secs(2)), "2");
        assert_eq!(format_retry_after(Duration::MAX), "86400");
        let wait = Duration::from_secs(7);
        assert_eq!(
            parse_retry_after(format_retry_after(wait).as_bytes()),
            Some(wait)
        );
    }

    #[test]
    fn retry_after_with_leading_zeros_is_its_value() {
        // Seven digits or more are above the cap only when the leading ones are not zeros.
        assert_eq!(
            parse_retry_after(b"0000000001"),
            Some(Duration::from_secs(1))
        );
        assert_eq!(parse_retry_after(b"0000000"), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(b"000000000000000000000086400"),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(
            parse_retry_after(b"0000000086399"),
            Some(Duration::from_secs(86_399))
        );
        assert_eq!(parse_retry_after(b"0001000000"), Some(MAX_RETRY_AFTER));
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

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        /// Header values as a client may send them: anything, and the shapes near the parsers'
        /// edges (long digit runs, a unit after them, signs and spaces).
        fn header_value() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..32),
                "[ \t]?[0-9]{0,25}[HMSmun]?[ \t]?".prop_map(String::into_bytes),
                "[-+]?[0-9]{1,20}".prop_map(String::into_bytes),
            ]
        }

        proptest! {
            /// Every parser takes any bytes without panicking, and what it returns is within
            /// its documented bounds.
            #[test]
            fn parsers_take_any_bytes(value in header_value()) {
                let _ = parse_criticality(&value);
                if let Some(n) = parse_count(&value) {
                    prop_assert_eq!(parse_count(n.to_string().as_bytes()), Some(n));
                }
                if let Some(at) = parse_deadline_ms(&value) {
                    prop_assert!(at >= UNIX_EPOCH);
                    prop_assert_eq!(parse_deadline_ms(format_deadline_ms(at).as_bytes()), Some(at));
                }
                if let Some(wait) = parse_retry_after(&value) {
                    prop_assert!(wait <= MAX_RETRY_AFTER);
                }
                let _ = parse_grpc_timeout(&value);
            }

            /// A larger decimal count never parses to a smaller one: a count too large for
            /// `u32` saturates instead of reading as "no count" (a first attempt).
            #[test]
            fn counts_are_monotonic(a in "[0-9]{1,30}", b in "[0-9]{1,30}") {
                let (pa, pb) = (parse_count(a.as_bytes()), parse_count(b.as_bytes()));
                prop_assert!(pa.is_some() && pb.is_some());
                let value = |s: &str| s.trim_start_matches('0').to_owned();
                let (va, vb) = (value(&a), value(&b));
                // Compare the numbers exactly, as digit strings without leading zeros.
                if (va.len(), &va) <= (vb.len(), &vb) {
                    prop_assert!(pa <= pb, "{} -> {:?} but {} -> {:?}", a, pa, b, pb);
                } else {
                    prop_assert!(pa >= pb, "{} -> {:?} but {} -> {:?}", a, pa, b, pb);
                }
            }

            /// A deadline from any header, on a clock at any reading, is an instant at or after
            /// now and at most `MAX_DEADLINE_AHEAD` later: `now + ahead` never panics.
            #[test]
            fn deadlines_from_outside_saturate(
                value in header_value(),
                clock_ns in prop_oneof![0..u64::MAX / 2, u64::MAX - 1_000_000_000_000..=u64::MAX],
                wall_ms in 0u64..4_000_000_000_000,
            ) {
                let (clock, mock) = quanta::Clock::mock();
                mock.increment(Duration::from_nanos(clock_ns));
                let now = clock.now();
                let wall = UNIX_EPOCH + Duration::from_millis(wall_ms);
                let from_deadline = parse_deadline_ms(&value)
                    .map(|d| d.duration_since(wall).unwrap_or(Duration::ZERO));
                let from_timeout = parse_grpc_timeout(&value);
                for ahead in [from_deadline, from_timeout].into_iter().flatten() {
                    let at = deadline_after(now, ahead);
                    prop_assert!(at >= now);
                    let got = at.duration_since(now);
                    prop_assert!(got <= ahead.min(MAX_DEADLINE_AHEAD));
                    if now.checked_add(MAX_DEADLINE_AHEAD).is_some() {
                        prop_assert_eq!(got, ahead.min(MAX_DEADLINE_AHEAD));
                    }
                }
            }
        }

        #[test]
        fn the_reported_headers_saturate() {
            let (clock, mock) = quanta::Clock::mock();
            mock.increment(Duration::from_secs(1));
            let now = clock.now();
            let grpc = parse_grpc_timeout(b"99999999H").unwrap();
            assert_eq!(grpc, Duration::from_secs(99_999_999 * 3600));
            assert_eq!(deadline_after(now, grpc) - now, MAX_DEADLINE_AHEAD);
            let ms = parse_deadline_ms(b"99999999999999").unwrap();
            let ahead = ms.duration_since(UNIX_EPOCH).unwrap();
            assert_eq!(deadline_after(now, ahead) - now, MAX_DEADLINE_AHEAD);
            assert_eq!(deadline_after(now, Duration::MAX) - now, MAX_DEADLINE_AHEAD);
            // A clock at its very end: the latest instant that fits, never a panic.
            let (clock, mock) = quanta::Clock::mock();
            mock.increment(Duration::from_nanos(u64::MAX - 5));
            let end = clock.now();
            let at = deadline_after(end, Duration::from_secs(1));
            assert!(at >= end && at - end <= Duration::from_nanos(5));
        }
    }
}
