//! Deserializing bounded integers so that a value out of range in a configuration file is
//! refused with the allowed range, like every other out-of-range value (serde's own errors say
//! only "expected a nonzero usize" or "expected u8"), and reading such errors back as
//! [`ConfigError`](crate::ConfigError)s naming the dotted field.

use std::num::NonZeroUsize;

use serde::de::{Deserialize, Deserializer, Error};

/// The words every range error of a configuration carries between the value and the range.
const OUT_OF_RANGE: &str = " is out of range: allowed ";

/// A count in `1..=MAX`.
///
/// # Errors
///
/// A value that is not an integer, or is out of `1..=MAX`, with the range in the message.
pub(crate) fn count<'de, D, const MAX: usize>(d: D) -> Result<NonZeroUsize, D::Error>
where
    D: Deserializer<'de>,
{
    // TOML integers are i64; a negative count gets the same message as a zero.
    let v = integer(d, || format!("1..={MAX}"))?;
    usize::try_from(v)
        .ok()
        .filter(|n| *n <= MAX)
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| D::Error::custom(format!("{v}{OUT_OF_RANGE}1..={MAX}")))
}

/// A TOML integer, or an error that says which integers the field takes: serde's own says
/// "expected i64", the type of the parser, not of the field.
fn integer<'de, D: Deserializer<'de>>(
    d: D,
    range: impl FnOnce() -> String,
) -> Result<i64, D::Error> {
    i64::deserialize(d).map_err(|e| {
        D::Error::custom(e.to_string().replace(
            "expected i64",
            &format!("expected an integer in {}", range()),
        ))
    })
}

/// An optional budget in bytes, at least 1: the key left out (the struct's default) is no
/// budget; a value is `1..=i64::MAX` (what TOML holds).
///
/// # Errors
///
/// A value that is not an integer, or is below 1, with the range and the way to have no budget
/// in the message (serde's own says only "expected a nonzero usize").
pub(crate) fn budget_bytes<'de, D>(d: D) -> Result<Option<NonZeroUsize>, D::Error>
where
    D: Deserializer<'de>,
{
    let v = integer(d, || format!("1..={}", i64::MAX))?;
    usize::try_from(v)
        .ok()
        .and_then(NonZeroUsize::new)
        .map(Some)
        .ok_or_else(|| {
            D::Error::custom(format!(
                "{v}{OUT_OF_RANGE}1..={} (bytes; leave the key out for no byte budget)",
                i64::MAX
            ))
        })
}

/// An integer in `MIN..=MAX`, of any type that holds that range (`u8`, `u32`, `usize`).
///
/// # Errors
///
/// A value that is not an integer, or is out of `MIN..=MAX`, with the range in the message.
pub(crate) fn int<'de, D, T, const MIN: i64, const MAX: i64>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    let v = integer(d, || format!("{MIN}..={MAX}"))?;
    (MIN..=MAX)
        .contains(&v)
        .then(|| T::try_from(v).ok())
        .flatten()
        .ok_or_else(|| D::Error::custom(format!("{v}{OUT_OF_RANGE}{MIN}..={MAX}")))
}

/// Reads a serde error `message` raised at the dotted `path` back as a range error: the field,
/// the value and the allowed range. The message is `<value> is out of range: allowed <range>`
/// (this module's, or a type's own check such as a weight's, where the value may follow a
/// word: `weight 0`), or `<field> = <value> is out of range: allowed <range>` (a type that
/// checks several fields, such as the concurrency shares), whose field is joined to the part
/// of the path above it. `None` for any other message.
pub(crate) fn out_of_range(path: &str, message: &str) -> Option<(String, String, String)> {
    let (before, allowed) = message.split_once(OUT_OF_RANGE)?;
    let path = path.trim_start_matches('.');
    let (field, value) = match before.split_once(" = ") {
        Some((field, value)) => (join(path, field), value),
        None => (path.to_owned(), before.rsplit(' ').next().unwrap_or(before)),
    };
    Some((field, value.to_owned(), allowed.to_owned()))
}

/// `field` (relative, its first part maybe the last of `path`) under `path`.
fn join(path: &str, field: &str) -> String {
    let first = field.split('.').next().unwrap_or(field);
    match path.rsplit_once('.') {
        _ if path.is_empty() => field.to_owned(),
        Some((parent, last)) if last == first => format!("{parent}.{field}"),
        None if path == first => field.to_owned(),
        _ => format!("{path}.{field}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_errors_are_read_back_with_their_dotted_field() {
        let read = |path, msg| out_of_range(path, msg).unwrap();
        assert_eq!(
            read("expert.queue.capacity", "0 is out of range: allowed 1..=9"),
            ("expert.queue.capacity".into(), "0".into(), "1..=9".into())
        );
        assert_eq!(
            read(
                "expert.queue.weights.high",
                "weight 0 is out of range: allowed 1..=1000"
            ),
            (
                "expert.queue.weights.high".into(),
                "0".into(),
                "1..=1000".into()
            )
        );
        assert_eq!(
            read(
                "expert.shares",
                "shares.high = 2 is out of range: allowed (0, 1]"
            ),
            ("expert.shares.high".into(), "2".into(), "(0, 1]".into())
        );
        assert_eq!(
            read("shares", "shares.high = 2 is out of range: allowed (0, 1]").0,
            "shares.high"
        );
        assert_eq!(out_of_range("workers", "invalid type: string"), None);
    }
}
