//! Criticality, attempt and deadline of a delivery, from its properties and headers only.
//!
//! The body is never read: deciding must cost next to nothing (DESIGN.md §1), and the body
//! is whatever the least trusted publisher sent. Every input is treated as hostile: wrong
//! types, huge numbers and invalid UTF-8 give the default, never a panic.

use std::time::Duration;

use lapin::types::AMQPValue;
use lapin::BasicProperties;
use triage::quanta::Instant;
use triage::{wire, Criticality};

use super::classify_config::{ClassifyConfig, DeadlineConfig};
use crate::metrics::Unclassified;

/// What the classifier read from one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Classified {
    pub(crate) criticality: Criticality,
    /// Set when `criticality` is the default tier, with why.
    pub(crate) unclassified: Option<Unclassified>,
    pub(crate) attempt: u32,
    /// Earlier deferrals (`triage-deferrals`), 0 without the header.
    pub(crate) deferrals: u32,
    /// Absolute deadline, Unix milliseconds.
    pub(crate) deadline_unix_ms: Option<u64>,
}

/// The classification rules of one source, resolved once from its config.
#[derive(Clone, Debug)]
pub(crate) struct Classifier {
    classify: ClassifyConfig,
    deadline: DeadlineConfig,
    /// Whether the consumed queue is in `trusted_queues`: decided once, not per message.
    trusted: bool,
    /// The tier of every delivery: `fixed_tier`, or the tier of a queue per tier.
    fixed: Option<Criticality>,
}

impl Classifier {
    /// The rules for deliveries of `queue`; `tier` is the queue's tier when the source reads
    /// a queue per tier (it wins over everything else).
    pub(crate) fn new(
        classify: ClassifyConfig,
        deadline: DeadlineConfig,
        queue: &str,
        tier: Option<Criticality>,
    ) -> Self {
        let trusted = classify.trusted_queues.iter().any(|q| q == queue);
        let fixed = tier.or(classify.fixed_tier);
        Classifier {
            classify,
            deadline,
            trusted,
            fixed,
        }
    }

    /// Classifies a delivery received at `now_unix_ms`.
    pub(crate) fn classify(&self, props: &BasicProperties, now_unix_ms: u64) -> Classified {
        let headers = props.headers().as_ref();
        let header = |name: &str| headers.and_then(|h| h.inner().get(name));

        let (criticality, unclassified) = match (
            self.fixed,
            self.trusted.then(|| header(wire::CRITICALITY)).flatten(),
            *props.priority(),
        ) {
            (Some(fixed), _, _) => (fixed, None),
            (None, Some(value), _) => match tier_from_value(value) {
                Ok(c) => (c, None),
                Err(reason) => (self.classify.default_tier, Some(reason)),
            },
            (None, None, Some(priority)) => (self.classify.priority.map(priority), None),
            (None, None, None) => (self.classify.default_tier, Some(Unclassified::Missing)),
        };

        let counted = |name: &str| header(name).and_then(count).unwrap_or(0);
        let attempt = counted(wire::ATTEMPT);
        let deferrals = counted(wire::DEFERRALS);

        let deadline_unix_ms = header(wire::DEADLINE_MS)
            .and_then(deadline_ms)
            .or_else(|| self.derived_deadline(props, criticality, now_unix_ms));

        Classified {
            criticality,
            unclassified,
            attempt,
            deferrals,
            deadline_unix_ms,
        }
    }

    fn derived_deadline(
        &self,
        props: &BasicProperties,
        criticality: Criticality,
        now_unix_ms: u64,
    ) -> Option<u64> {
        // AMQP timestamps are seconds.
        let sent_ms = props.timestamp().map(|s| s.saturating_mul(1_000));
        let window = self.deadline.timestamp_window_ms[criticality];
        let from_window = sent_ms.zip(window).map(|(t, w)| t.saturating_add(w));
        let from_ttl = if self.deadline.use_expiration {
            props
                .expiration()
                .as_ref()
                .and_then(|e| e.as_str().trim().parse::<u64>().ok())
                .map(|ttl| sent_ms.unwrap_or(now_unix_ms).saturating_add(ttl))
        } else {
            None
        };
        match (from_window, from_ttl) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The instant on the clock matching wall-clock deadline `at_unix_ms`, for a clock that read
/// `now` while the wall clock read `now_unix_ms`, by [`wire::deadline_after`], the one mapping
/// of a deadline from outside onto the clock: a deadline already passed maps to `now` (expired
/// at the first look); one further ahead than [`wire::MAX_DEADLINE_AHEAD`] (any publisher can
/// write `i64::MAX`) is held to it.
pub(crate) fn deadline_at(now: Instant, now_unix_ms: u64, at_unix_ms: u64) -> Instant {
    wire::deadline_after(
        now,
        Duration::from_millis(at_unix_ms.saturating_sub(now_unix_ms)),
    )
}

fn tier_from_value(value: &AMQPValue) -> Result<Criticality, Unclassified> {
    let bytes = match value {
        AMQPValue::LongString(s) => s.as_bytes(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes(),
        AMQPValue::ByteArray(b) => b.as_slice(),
        _ => return Err(Unclassified::Malformed),
    };
    if std::str::from_utf8(bytes).is_err() {
        return Err(Unclassified::Malformed);
    }
    wire::parse_criticality(bytes).map_err(|_| Unclassified::Unknown)
}

/// A count ([`wire::ATTEMPT`], [`wire::DEFERRALS`]): an AMQP integer (what AMQP publishers
/// write; a huge one saturates) or decimal text (what triage writes, [`wire::parse_count`]).
fn count(value: &AMQPValue) -> Option<u32> {
    match text(value) {
        Some(bytes) => wire::parse_count(bytes),
        None => integer(value).map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    }
}

/// A [`wire::DEADLINE_MS`] value in Unix milliseconds: an AMQP integer or decimal text
/// ([`wire::parse_deadline_ms`]).
fn deadline_ms(value: &AMQPValue) -> Option<u64> {
    match text(value) {
        Some(bytes) => {
            let at = wire::parse_deadline_ms(bytes)?;
            let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
            u64::try_from(ms).ok()
        }
        None => integer(value),
    }
}

fn text(value: &AMQPValue) -> Option<&[u8]> {
    match value {
        AMQPValue::LongString(s) => Some(s.as_bytes()),
        AMQPValue::ShortString(s) => Some(s.as_str().as_bytes()),
        _ => None,
    }
}

/// A non-negative integer from any AMQP integer type.
fn integer(value: &AMQPValue) -> Option<u64> {
    let signed = |n: i64| u64::try_from(n).ok();
    match value {
        AMQPValue::ShortShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::Timestamp(n) => Some(*n),
        AMQPValue::ShortShortInt(n) => signed(i64::from(*n)),
        AMQPValue::ShortInt(n) => signed(i64::from(*n)),
        AMQPValue::LongInt(n) => signed(i64::from(*n)),
        AMQPValue::LongLongInt(n) => signed(*n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldTable, LongString};

    use super::*;

    fn classifier(trusted: bool) -> Classifier {
        let mut c = ClassifyConfig::default();
        if trusted {
            c.trusted_queues.push("q".into());
        }
        let mut d = DeadlineConfig::default();
        d.timestamp_window_ms.critical = Some(400);
        Classifier::new(c, d, "q", None)
    }

    fn with_header(name: &str, value: AMQPValue) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert(name.into(), value);
        BasicProperties::default().with_headers(h)
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    #[test]
    fn priority_bands_by_default() {
        let c = classifier(false);
        let tiers: Vec<_> = [0u8, 2, 3, 4, 5, 7, 8, 255]
            .iter()
            .map(|&p| {
                c.classify(&BasicProperties::default().with_priority(p), 0)
                    .criticality
            })
            .collect();
        use Criticality::*;
        assert_eq!(
            tiers,
            [Sheddable, Sheddable, Medium, Medium, High, High, Critical, Critical]
        );
    }

    #[test]
    fn a_fixed_tier_overrides_priority_and_header() {
        let mut c = ClassifyConfig::default();
        c.trusted_queues.push("q".into());
        c.fixed_tier = Some(Criticality::Sheddable);
        let c = Classifier::new(c, DeadlineConfig::default(), "q", None);
        for props in [
            BasicProperties::default().with_priority(255),
            with_header("triage-criticality", text("Critical")),
            BasicProperties::default(),
        ] {
            let got = c.classify(&props, 0);
            assert_eq!(got.criticality, Criticality::Sheddable);
            assert_eq!(got.unclassified, None);
        }
    }

    #[test]
    fn header_only_on_trusted_queues() {
        let props = with_header("triage-criticality", text("Critical")).with_priority(0);
        assert_eq!(
            classifier(true).classify(&props, 0).criticality,
            Criticality::Critical
        );
        assert_eq!(
            classifier(false).classify(&props, 0).criticality,
            Criticality::Sheddable
        );
    }

    #[test]
    fn missing_unknown_and_malformed_get_the_default_and_a_reason() {
        let c = classifier(true);
        let cases = [
            (BasicProperties::default(), Unclassified::Missing),
            (
                with_header("triage-criticality", text("urgent")),
                Unclassified::Unknown,
            ),
            (
                with_header("triage-criticality", AMQPValue::LongInt(3)),
                Unclassified::Malformed,
            ),
            (
                with_header(
                    "triage-criticality",
                    AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
                ),
                Unclassified::Malformed,
            ),
        ];
        for (props, reason) in cases {
            let out = c.classify(&props, 0);
            assert_eq!(out.criticality, Criticality::Medium);
            assert_eq!(out.unclassified, Some(reason));
        }
    }

    #[test]
    fn deadline_header_then_timestamp_window_then_expiration() {
        let c = classifier(false);
        let explicit = with_header("triage-deadline-ms", AMQPValue::LongLongInt(1_234))
            .with_timestamp(10)
            .with_priority(9);
        assert_eq!(c.classify(&explicit, 0).deadline_unix_ms, Some(1_234));
        let as_text = with_header("triage-deadline-ms", text(" 99 "));
        assert_eq!(c.classify(&as_text, 0).deadline_unix_ms, Some(99));

        // Critical window 400 ms after a timestamp of 10 s.
        let ts = BasicProperties::default()
            .with_timestamp(10)
            .with_priority(9);
        assert_eq!(c.classify(&ts, 0).deadline_unix_ms, Some(10_400));
        // Medium has no window: no deadline from the timestamp alone.
        let medium = BasicProperties::default()
            .with_timestamp(10)
            .with_priority(3);
        assert_eq!(c.classify(&medium, 0).deadline_unix_ms, None);
        // The expiration counts from the timestamp, and the earliest wins.
        let both = ts.clone().with_expiration("100".into());
        assert_eq!(c.classify(&both, 0).deadline_unix_ms, Some(10_100));
        // Without a timestamp, from receipt.
        let ttl = BasicProperties::default().with_expiration("250".into());
        assert_eq!(c.classify(&ttl, 5_000).deadline_unix_ms, Some(5_250));
    }

    #[test]
    fn attempt_and_deferrals_as_triage_writes_them_or_as_amqp_integers() {
        let c = classifier(false);
        let mut h = FieldTable::default();
        h.insert(wire::ATTEMPT.into(), text("2"));
        h.insert(wire::DEFERRALS.into(), text(" 3 "));
        let got = c.classify(&BasicProperties::default().with_headers(h), 0);
        assert_eq!((got.attempt, got.deferrals), (2, 3));
        let mut h = FieldTable::default();
        h.insert(wire::DEFERRALS.into(), AMQPValue::LongInt(4));
        h.insert(wire::ATTEMPT.into(), text("-1"));
        let got = c.classify(&BasicProperties::default().with_headers(h), 0);
        assert_eq!((got.attempt, got.deferrals), (0, 4));
        let none = c.classify(&BasicProperties::default(), 0);
        assert_eq!((none.attempt, none.deferrals), (0, 0));
    }

    #[test]
    fn deadlines_map_onto_the_clock_saturating() {
        let (clock, mock) = triage::quanta::Clock::mock();
        mock.increment(Duration::from_secs(86_400));
        let now = clock.now();
        let wall = 1_700_000_000_000;
        assert_eq!(
            deadline_at(now, wall, wall + 250),
            now + Duration::from_millis(250)
        );
        // Already passed: now, expired at the first look.
        assert_eq!(deadline_at(now, wall, 5), now);
        assert_eq!(deadline_at(now, wall, wall), now);
        // Any publisher may write these: held to the furthest a deadline from outside goes.
        for at in [u64::MAX, i64::MAX as u64, 99_999_999_999_999] {
            assert_eq!(
                deadline_at(now, wall, at).duration_since(now),
                wire::MAX_DEADLINE_AHEAD,
                "{at}"
            );
        }
    }

    #[test]
    fn hostile_numbers_never_panic() {
        let c = classifier(true);
        for v in [
            AMQPValue::LongLongInt(-1),
            AMQPValue::LongLongInt(i64::MAX),
            AMQPValue::Timestamp(u64::MAX),
            text("-5"),
            text("1e9"),
            AMQPValue::Void,
            AMQPValue::Double(1.5),
        ] {
            let mut h = FieldTable::default();
            h.insert("triage-deadline-ms".into(), v.clone());
            h.insert("triage-attempt".into(), v);
            let props = BasicProperties::default()
                .with_headers(h)
                .with_timestamp(u64::MAX)
                .with_expiration("18446744073709551615".into());
            // Must not panic; the values themselves are whatever saturation gives.
            let _ = c.classify(&props, u64::MAX);
        }
        let big = with_header("triage-attempt", AMQPValue::LongLongInt(i64::MAX));
        assert_eq!(c.classify(&big, 0).attempt, u32::MAX);
    }
}
