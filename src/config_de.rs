//! Deserializing counts that must be at least 1, so that a zero in a configuration file is
//! refused with the allowed range, like every other out-of-range value (serde's own error for
//! a `NonZeroUsize` says only "expected a nonzero usize").

use std::num::NonZeroUsize;

use serde::de::{Deserialize, Deserializer, Error};

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
    let v = i64::deserialize(d)?;
    usize::try_from(v)
        .ok()
        .filter(|n| *n <= MAX)
        .and_then(NonZeroUsize::new)
        .ok_or_else(|| D::Error::custom(format!("{v} is out of range: allowed 1..={MAX}")))
}
