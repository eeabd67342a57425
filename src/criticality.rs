//! The criticality ladder: four fixed levels, retries demoted one level.
//!
//! After Google SRE's criticality classes as described in the load-shedding literature
//! (the load-shedding literature on criticality ladders): four levels, not twenty, because every level added is a level
//! nobody maintains. A retry is worth strictly less than a first attempt, so it is demoted one
//! level; under load first attempts win and retries lose, which helps the system recover.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How much a message matters, from most to least: `Critical > High > Medium > Sheddable`.
///
/// The ordering is the derived `Ord`: `Criticality::Critical > Criticality::Sheddable`.
/// A criticality is assigned by a trusted classifier at the source, never by whoever is least
/// trusted.
///
/// # Examples
///
/// ```
/// use triage::Criticality;
///
/// let c: Criticality = "high".parse()?;
/// assert!(c > Criticality::Medium);
/// assert_eq!(c.demote(), Criticality::Medium);
/// assert_eq!(Criticality::Sheddable.demote(), Criticality::Sheddable);
/// # Ok::<(), triage::ParseCriticalityError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Criticality {
    /// Background, prefetch, analytics, backfill, retries: shed first.
    Sheddable = 0,
    /// Someone will notice if it is late.
    Medium = 1,
    /// Someone is blocked on it.
    High = 2,
    /// Someone is blocked and money is involved: shed last.
    Critical = 3,
}

impl Criticality {
    /// Every level, most critical first.
    pub const ALL: [Criticality; 4] = [
        Criticality::Critical,
        Criticality::High,
        Criticality::Medium,
        Criticality::Sheddable,
    ];

    /// Number of levels on the ladder (4).
    pub const COUNT: usize = 4;

    /// Position on the ladder, `0` for `Sheddable` up to `3` for `Critical`: the index of
    /// per-tier arrays throughout the crate.
    #[inline]
    pub const fn rank(self) -> usize {
        self as usize
    }

    /// The level at `rank` (`0` = `Sheddable` .. `3` = `Critical`), or `None` past the ladder.
    #[inline]
    pub const fn from_rank(rank: usize) -> Option<Criticality> {
        match rank {
            0 => Some(Criticality::Sheddable),
            1 => Some(Criticality::Medium),
            2 => Some(Criticality::High),
            3 => Some(Criticality::Critical),
            _ => None,
        }
    }

    /// One level lower, for a retry; `Sheddable` stays `Sheddable`.
    #[inline]
    #[must_use]
    pub const fn demote(self) -> Criticality {
        match self {
            Criticality::Critical => Criticality::High,
            Criticality::High => Criticality::Medium,
            Criticality::Medium | Criticality::Sheddable => Criticality::Sheddable,
        }
    }

    /// The level after `attempt` retries: demoted once per attempt, floored at `Sheddable`.
    ///
    /// `attempt` counts retries, so attempt 0 (the first delivery) keeps the level.
    #[inline]
    #[must_use]
    pub const fn demoted_by(self, attempt: u32) -> Criticality {
        let rank = self
            .rank()
            .saturating_sub(if attempt > 3 { 3 } else { attempt as usize });
        match Criticality::from_rank(rank) {
            Some(c) => c,
            None => Criticality::Sheddable,
        }
    }

    /// Lowercase name, as used in headers, config files and metric labels.
    #[inline]
    pub const fn as_str(self) -> &'static str {
        match self {
            Criticality::Critical => "critical",
            Criticality::High => "high",
            Criticality::Medium => "medium",
            Criticality::Sheddable => "sheddable",
        }
    }

    /// Parses a label from raw header bytes without allocating.
    ///
    /// Accepts the names `critical`, `high`, `medium`, `sheddable` in any ASCII case with
    /// surrounding ASCII whitespace. Numbers are refused on purpose: "0" means the most
    /// important in some conventions and the least in others (AMQP priorities), so a numeric
    /// mapping belongs to the connector's configuration, not to the ladder.
    ///
    /// # Errors
    ///
    /// [`ParseCriticalityError`] when the bytes are not one of those labels (including
    /// non-UTF-8 bytes, empty input, or an input longer than any label).
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::Criticality;
    ///
    /// assert_eq!(Criticality::from_bytes(b" CRITICAL "), Ok(Criticality::Critical));
    /// assert!(Criticality::from_bytes(b"3").is_err());
    /// assert!(Criticality::from_bytes(b"abc").is_err());
    /// assert!(Criticality::from_bytes(&[0xff, 0xfe]).is_err());
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<Criticality, ParseCriticalityError> {
        let trimmed = bytes.trim_ascii();
        Criticality::ALL
            .into_iter()
            .find(|c| trimmed.eq_ignore_ascii_case(c.as_str().as_bytes()))
            .ok_or(ParseCriticalityError { len: bytes.len() })
    }
}

impl fmt::Display for Criticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Criticality {
    type Err = ParseCriticalityError;

    /// Same rules as [`Criticality::from_bytes`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Criticality::from_bytes(s.as_bytes())
    }
}

/// A criticality label that is not on the ladder.
///
/// Callers map it to a configured default (usually `Medium`) and count it; the label itself is
/// not kept, so the error costs no allocation on the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseCriticalityError {
    len: usize,
}

impl ParseCriticalityError {
    /// Length in bytes of the rejected input.
    pub fn input_len(&self) -> usize {
        self.len
    }
}

impl fmt::Display for ParseCriticalityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown criticality ({} bytes): expected critical, high, medium or sheddable",
            self.len
        )
    }
}

impl std::error::Error for ParseCriticalityError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_is_the_ladder() {
        assert!(Criticality::Critical > Criticality::High);
        assert!(Criticality::High > Criticality::Medium);
        assert!(Criticality::Medium > Criticality::Sheddable);
        for (i, c) in Criticality::ALL.iter().rev().enumerate() {
            assert_eq!(c.rank(), i);
            assert_eq!(Criticality::from_rank(i), Some(*c));
        }
        assert_eq!(Criticality::from_rank(4), None);
    }

    #[test]
    fn demotion_floors_at_sheddable() {
        assert_eq!(Criticality::Critical.demote(), Criticality::High);
        assert_eq!(Criticality::High.demote(), Criticality::Medium);
        assert_eq!(Criticality::Medium.demote(), Criticality::Sheddable);
        assert_eq!(Criticality::Sheddable.demote(), Criticality::Sheddable);
        assert_eq!(Criticality::Critical.demoted_by(0), Criticality::Critical);
        assert_eq!(Criticality::Critical.demoted_by(2), Criticality::Medium);
        assert_eq!(
            Criticality::Critical.demoted_by(u32::MAX),
            Criticality::Sheddable
        );
        assert_eq!(Criticality::High.demoted_by(1), Criticality::Medium);
    }

    #[test]
    fn parses_names_digits_and_refuses_the_rest() {
        assert_eq!("critical".parse(), Ok(Criticality::Critical));
        assert_eq!("High".parse(), Ok(Criticality::High));
        assert_eq!("\tmedium\n".parse(), Ok(Criticality::Medium));
        assert_eq!("SHEDDABLE".parse(), Ok(Criticality::Sheddable));
        for bad in ["", "abc", "0", "4", "criticall", "crit", "high,low"] {
            let err = bad.parse::<Criticality>().unwrap_err();
            assert_eq!(err.input_len(), bad.len());
        }
        assert!(Criticality::from_bytes(&[0xc3, 0x28]).is_err());
        let msg = "x".parse::<Criticality>().unwrap_err().to_string();
        assert!(msg.starts_with("unknown criticality"), "{msg}");
    }

    #[test]
    fn display_round_trips() {
        for c in Criticality::ALL {
            assert_eq!(c.to_string().parse::<Criticality>(), Ok(c));
        }
    }
}
