//! The core's wire contract (`triage::wire`): every parser on arbitrary bytes, against a
//! reference model computed in `u128`, and every formatter read back by its parser.
//!
//! Input: any bytes. The parsers run on the whole input and on each of its lines; the
//! formatters run on numbers read from the input's first bytes.

use std::time::{Duration, UNIX_EPOCH};

use triage::{wire, Criticality};

use crate::input::{lines, Input};

/// Runs the target on one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    parsers(data);
    for line in lines(data) {
        parsers(line);
    }
    formatters(data);
}

/// The digits of `value` (ASCII whitespace trimmed) as a number, or `None` when it is not a
/// non-empty run of ASCII digits. Saturates at `u128::MAX` (never reached by what is checked).
fn decimal(value: &[u8]) -> Option<u128> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u128, |n, &b| {
        n.saturating_mul(10).saturating_add(u128::from(b - b'0'))
    }))
}

fn parsers(value: &[u8]) {
    let trimmed = value.trim_ascii();

    match wire::parse_criticality(value) {
        Ok(c) => {
            assert!(
                trimmed.eq_ignore_ascii_case(c.as_str().as_bytes()),
                "criticality {c} from {value:?}"
            );
            assert_eq!(wire::criticality_value(c).as_bytes(), c.as_str().as_bytes());
        }
        Err(_) => assert!(
            Criticality::ALL
                .iter()
                .all(|c| !trimmed.eq_ignore_ascii_case(c.as_str().as_bytes())),
            "label refused: {value:?}"
        ),
    }

    // A count is a decimal number, any number of digits, saturating at u32::MAX (a count
    // that large is at least that many retries).
    let count = decimal(value).map(|n| n.min(u128::from(u32::MAX)));
    assert_eq!(
        wire::parse_count(value).map(u128::from),
        count,
        "count from {value:?}"
    );
    if let Some(n) = wire::parse_count(value) {
        assert_eq!(wire::parse_count(n.to_string().as_bytes()), Some(n));
    }

    // Decimal Unix milliseconds that fit u64, at most 19 digits (20 cannot be written by
    // triage: u64::MAX milliseconds has 20 digits but is refused as corrupt beyond 19).
    let ms = decimal(value);
    match wire::parse_deadline_ms(value) {
        Some(at) => {
            let n = ms.unwrap_or_else(|| panic!("deadline from non-decimal {value:?}"));
            let since = at
                .duration_since(UNIX_EPOCH)
                .expect("deadline before the epoch");
            assert_eq!(since.as_millis(), n, "deadline from {value:?}");
            assert_eq!(wire::format_deadline_ms(at), n.to_string());
            assert_eq!(
                wire::deadline_value(at).as_bytes(),
                n.to_string().as_bytes()
            );
            assert_eq!(
                wire::parse_deadline_ms(wire::deadline_value(at).as_bytes()),
                Some(at)
            );
        }
        None => assert!(
            !(ms.is_some_and(|n| n <= u128::from(u64::MAX)) && trimmed.len() <= 19),
            "deadline refused: {value:?}"
        ),
    }

    // gRPC: 1 to 8 digits and a unit, exactly.
    let reference = trimmed.split_last().and_then(|(&unit, digits)| {
        let nanos_per: u128 = match unit {
            b'H' => 3_600_000_000_000,
            b'M' => 60_000_000_000,
            b'S' => 1_000_000_000,
            b'm' => 1_000_000,
            b'u' => 1_000,
            b'n' => 1,
            _ => return None,
        };
        if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        decimal(digits).map(|n| n * nanos_per)
    });
    match wire::parse_grpc_timeout(value) {
        Some(d) => assert_eq!(Some(d.as_nanos()), reference, "grpc-timeout {value:?}"),
        None => assert_eq!(reference, None, "grpc-timeout refused: {value:?}"),
    }

    // Retry-After: delta-seconds, capped at a day.
    match wire::parse_retry_after(value) {
        Some(d) => {
            let n = decimal(value).unwrap_or_else(|| panic!("retry-after from {value:?}"));
            assert_eq!(
                u128::from(d.as_secs()),
                n.min(u128::from(wire::MAX_RETRY_AFTER.as_secs()))
            );
            assert_eq!(d.subsec_nanos(), 0);
        }
        None => assert_eq!(decimal(value), None, "retry-after refused: {value:?}"),
    }

    let text = String::from_utf8_lossy(value);
    let cut = wire::bound_error(&text);
    assert!(text.starts_with(cut));
    assert!(cut.len() <= wire::MAX_ERROR_BYTES);
    if text.len() > wire::MAX_ERROR_BYTES {
        // Cut on the last character boundary at or before the bound: at most 3 bytes short.
        assert!(
            cut.len() > wire::MAX_ERROR_BYTES - 4,
            "{} of {}",
            cut.len(),
            text.len()
        );
    } else {
        assert_eq!(cut.len(), text.len());
    }
    assert_eq!(
        wire::is_triage_header(&text),
        wire::ALL.contains(&text.as_ref())
    );
}

fn formatters(data: &[u8]) {
    let mut input = Input::new(data);
    let a = input.u64();
    let b = input.u64();

    // Retry-After: whole seconds, rounded up, 1 ..= a day; read back as written.
    let wait = Duration::new(a, (b % 1_000_000_000) as u32);
    let text = wire::format_retry_after(wait);
    let secs: u64 = text.parse().expect("retry-after is decimal");
    let capped = wait.min(wire::MAX_RETRY_AFTER);
    let up = capped.as_secs() + u64::from(capped.subsec_nanos() > 0);
    assert_eq!(secs, up.max(1), "retry-after for {wait:?}");
    assert_eq!(
        wire::parse_retry_after(text.as_bytes()),
        Some(Duration::from_secs(secs))
    );

    // Deadlines: any instant after the epoch the system clock can hold, to the millisecond.
    if let Some(at) = UNIX_EPOCH.checked_add(Duration::from_millis(a)) {
        assert_eq!(wire::format_deadline_ms(at), a.to_string());
        assert_eq!(
            wire::deadline_value(at).as_bytes(),
            a.to_string().as_bytes()
        );
        let back = wire::parse_deadline_ms(wire::deadline_value(at).as_bytes());
        if a.to_string().len() <= 19 {
            assert_eq!(back, Some(at));
        }
    }

    // Counts.
    let n = a as u32;
    assert_eq!(wire::parse_count(n.to_string().as_bytes()), Some(n));
}
