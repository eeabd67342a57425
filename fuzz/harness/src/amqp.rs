//! The RabbitMQ source's classification of a delivery (`triage-amqp`, `fuzzing`): its basic
//! properties in their wire form, parsed by lapin's own parser (as the client reads a content
//! header from the socket), then classified and given a deadline on the clock.
//!
//! Input:
//! - byte 0, the setup: bit 0 the queue is trusted to label; bits 1-2 the tier source (none, a
//!   `fixed_tier` of Sheddable, a queue per tier at Critical, none); bit 3 `use_expiration`;
//!   bits 4-5 the timestamp windows (none, Critical 400 ms, a year for every tier, 1 ms for
//!   every tier); bits 6-7 the priority bands (the default 2/4/7, or 0/1/2, 100/200/254,
//!   0/127/254);
//! - bytes 1-8 the wall clock's reading (Unix milliseconds modulo 10^13);
//! - the rest: AMQP 0-9-1 basic properties as on the wire (a 16-bit flag word, then each
//!   property present; headers as a field table). Input lapin refuses is refused before any
//!   classification, as the client refuses such a frame.
//!
//! Invariants, from the source's documented rules (module `classify`):
//! - a fixed tier (or the queue's tier) wins; the `triage-criticality` header counts only on a
//!   trusted queue (a string naming a tier, else the default); then the priority bands; then
//!   the default: so an untrusted delivery is classified the same with or without the header;
//! - counts are decimal text or AMQP integers, saturating at `u32::MAX`, else 0;
//! - the deadline header (an integer or decimal text) wins; else the earliest of timestamp plus
//!   window and, with `use_expiration`, the TTL from the timestamp or from receipt, all
//!   saturating;
//! - the deadline on the clock is never before the clock's now; one ahead lies exactly that
//!   far ahead (held at most, never panicking, when too far for the clock).

use std::time::Duration;

use triage::quanta::{Clock, Instant};
use triage::{wire, Criticality, PerTier};
use triage_amqp::fuzzing::{self, Classification};
use triage_amqp::lapin::protocol::basic::{parse_properties, AMQPProperties};
use triage_amqp::lapin::types::{AMQPValue, FieldTable};
use triage_amqp::{ClassifyConfig, DeadlineConfig, PriorityMapping};

use crate::input::Input;

const QUEUE: &str = "orders";

/// Runs the target on one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let setup = input.byte();
    let now_unix_ms = input.u64() % 10_000_000_000_000;
    let Ok((_, props)) = parse_properties(input.rest()) else {
        return;
    };

    let mut classify = ClassifyConfig::default();
    if setup & 1 != 0 {
        classify.trusted_queues.push(QUEUE.into());
    }
    let mut queue_tier = None;
    match (setup >> 1) & 0b11 {
        1 => classify.fixed_tier = Some(Criticality::Sheddable),
        2 => queue_tier = Some(Criticality::Critical),
        _ => {}
    }
    let (sheddable_max, medium_max, high_max) = match setup >> 6 {
        0 => (2, 4, 7),
        1 => (0, 1, 2),
        2 => (100, 200, 254),
        _ => (0, 127, 254),
    };
    classify.priority = PriorityMapping {
        sheddable_max,
        medium_max,
        high_max,
    };
    classify.priority.validate().expect("valid bands");
    let deadline = DeadlineConfig {
        use_expiration: setup & 0b1000 != 0,
        timestamp_window_ms: match (setup >> 4) & 0b11 {
            0 => PerTier::splat(None),
            1 => PerTier::new(Some(400), None, None, None),
            2 => PerTier::splat(Some(31_536_000_000)),
            _ => PerTier::splat(Some(1)),
        },
    };

    let (clock, mock) = Clock::mock();
    mock.increment(Duration::from_secs(86_400));
    let now = clock.now();
    let got = fuzzing::classify(
        classify.clone(),
        deadline.clone(),
        QUEUE,
        queue_tier,
        &props,
        now,
        now_unix_ms,
    );

    let trusted = setup & 1 != 0;
    let header = |name: &str| props.headers().as_ref().and_then(|h| h.inner().get(name));

    // The tier.
    let (tier, unclassified) = match (
        queue_tier.or(classify.fixed_tier),
        trusted.then(|| header(wire::CRITICALITY)).flatten(),
        *props.priority(),
    ) {
        (Some(fixed), _, _) => (fixed, None),
        (None, Some(value), _) => match label(value) {
            Ok(c) => (c, None),
            Err(reason) => (classify.default_tier, Some(reason)),
        },
        (None, None, Some(p)) => (classify.priority.map(p), None),
        (None, None, None) => (classify.default_tier, Some("missing")),
    };
    assert_eq!(
        (got.criticality, got.unclassified),
        (tier, unclassified),
        "tier of {props:?}"
    );
    if !trusted {
        // The header changes nothing where it is not trusted.
        let without = fuzzing::classify(
            classify,
            deadline.clone(),
            QUEUE,
            queue_tier,
            &without_label(&props),
            now,
            now_unix_ms,
        );
        assert_eq!(without.criticality, got.criticality);
    }

    // The counts.
    let count = |name: &str| header(name).and_then(count).unwrap_or(0);
    assert_eq!(
        (got.attempt, got.deferrals),
        (count(wire::ATTEMPT), count(wire::DEFERRALS)),
        "counts of {props:?}"
    );

    // The deadline.
    let explicit = header(wire::DEADLINE_MS).and_then(deadline_ms);
    let sent_ms = props.timestamp().map(|s| s.saturating_mul(1_000));
    let from_window = sent_ms
        .zip(deadline.timestamp_window_ms[tier])
        .map(|(t, w)| t.saturating_add(w));
    let from_ttl = props
        .expiration()
        .as_ref()
        .filter(|_| deadline.use_expiration)
        .and_then(|e| e.as_str().trim().parse::<u64>().ok())
        .map(|ttl| sent_ms.unwrap_or(now_unix_ms).saturating_add(ttl));
    let derived = match (from_window, from_ttl) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    assert_eq!(
        got.deadline_unix_ms,
        explicit.or(derived),
        "deadline of {props:?}"
    );
    check_deadline(&got, now, now_unix_ms);
}

fn label(value: &AMQPValue) -> Result<Criticality, &'static str> {
    let bytes = match value {
        AMQPValue::LongString(s) => s.as_bytes(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes(),
        AMQPValue::ByteArray(b) => b.as_slice(),
        _ => return Err("malformed"),
    };
    if std::str::from_utf8(bytes).is_err() {
        return Err("malformed");
    }
    wire::parse_criticality(bytes).map_err(|_| "unknown")
}

fn text(value: &AMQPValue) -> Option<&[u8]> {
    match value {
        AMQPValue::LongString(s) => Some(s.as_bytes()),
        AMQPValue::ShortString(s) => Some(s.as_str().as_bytes()),
        _ => None,
    }
}

/// A non-negative integer of any AMQP integer type.
fn integer(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::ShortShortUInt(n) => Some(u64::from(n)),
        AMQPValue::ShortUInt(n) => Some(u64::from(n)),
        AMQPValue::LongUInt(n) => Some(u64::from(n)),
        AMQPValue::Timestamp(n) => Some(n),
        AMQPValue::ShortShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::ShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongLongInt(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

fn count(value: &AMQPValue) -> Option<u32> {
    match text(value) {
        Some(bytes) => wire::parse_count(bytes),
        None => integer(value).map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    }
}

fn deadline_ms(value: &AMQPValue) -> Option<u64> {
    match text(value) {
        Some(bytes) => wire::parse_deadline_ms(bytes)
            .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| u64::try_from(d.as_millis()).ok()),
        None => integer(value),
    }
}

/// `props` without the `triage-criticality` header.
fn without_label(props: &AMQPProperties) -> AMQPProperties {
    let Some(headers) = props.headers() else {
        return props.clone();
    };
    let mut table = FieldTable::default();
    for (name, value) in headers.inner() {
        if name.as_str() != wire::CRITICALITY {
            table.insert(name.clone(), value.clone());
        }
    }
    props.clone().with_headers(table)
}

fn check_deadline(got: &Classification, now: Instant, now_unix_ms: u64) {
    let Some(at) = got.deadline_unix_ms else {
        assert_eq!(got.deadline, None);
        return;
    };
    let ahead = Duration::from_millis(at.saturating_sub(now_unix_ms));
    match got.deadline {
        Some(d) => {
            assert!(d >= now, "a deadline before now");
            let mapped = d.duration_since(now);
            if ahead <= Duration::from_secs(365 * 86_400) {
                assert_eq!(mapped, ahead, "deadline {at} ms at {now_unix_ms} ms");
            } else {
                assert!(mapped <= ahead, "held further than it was");
            }
        }
        None => assert!(
            now.checked_add(ahead).is_none() || ahead > Duration::from_secs(365 * 86_400),
            "a deadline {ahead:?} ahead lost"
        ),
    }
}
