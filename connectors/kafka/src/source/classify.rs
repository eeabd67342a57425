//! Criticality and deadline from headers, topic and timestamp: never the payload.
//!
//! The decision must be nearly free (DESIGN §1), so it reads only what the broker already
//! parsed. Labels are trusted only where configured (`trusted_topics`): whoever can write to
//! an untrusted topic must not be able to promote its own messages.
//!
//! Bad input never fails and never panics; it falls back and is counted by reason:
//! - `missing`: a trusted topic's message without the header;
//! - `malformed`: a header value that is not a label (`"abc"`, numbers, non-UTF-8, null);
//! - `duplicate`: the header appears more than once. Treated as malformed rather than
//!   "first wins": two labels disagree or are redundant, either way the producer is broken,
//!   and picking one would silently trust half of it;
//! - `unmapped`: an untrusted topic with no entry in `topic_tiers`;
//! - `bad_deadline`: a deadline header that is not decimal Unix milliseconds (the
//!   timestamp-plus-window deadline is used instead);
//! - `bad_count`: a `triage-attempt` or `triage-deferrals` header that is not a decimal count
//!   (0 is used).
//!
//! After a label problem the topic's tier applies if it has one, else the default tier.
//!
//! On a trusted topic the retry and deferral history travel with the record: `triage-attempt`
//! (retries so far, which the runtime demotes by and counts against `max_retries`) and
//! `triage-deferrals` (deferrals so far, counted against the runtime's maximum) are read into
//! the envelope, so a copy drained back from the defer topic keeps the budget and demotion it
//! had when it was deferred. On any other topic they are ignored like the labels: a producer
//! that may not choose its tier may not spend a record's retry budget either.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use triage::quanta::{Clock, Instant};
use triage::{wire, Criticality, PerTier};

use super::config::KafkaSourceConfig;

/// What a classifier may look at: everything about a record except its payload.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct MessageMeta<'a> {
    /// Topic of the record.
    pub topic: &'a str,
    /// Partition of the record.
    pub partition: i32,
    /// Offset of the record.
    pub offset: i64,
    /// Record key, if any.
    pub key: Option<&'a [u8]>,
    /// Headers in record order, duplicates kept.
    pub headers: &'a [(String, Option<Vec<u8>>)],
    /// Record timestamp, Unix milliseconds.
    pub timestamp_ms: Option<i64>,
}

/// A user classifier: `Some(tier)` decides, `None` falls through to the configured rules.
pub type ClassifyFn = Arc<dyn Fn(&MessageMeta<'_>) -> Option<Criticality> + Send + Sync>;

/// Why a message fell back to a default (the `reason` label of
/// `triage_kafka_unclassified_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnclassifiedReason {
    /// A trusted topic's record without the criticality header.
    Missing,
    /// A criticality header whose value is not a label (including non-UTF-8 and null).
    Malformed,
    /// The criticality header appears more than once.
    Duplicate,
    /// An untrusted topic with no topic tier.
    Unmapped,
    /// A deadline header that is not decimal Unix milliseconds.
    BadDeadline,
    /// A `triage-attempt` or `triage-deferrals` header that is not a decimal count.
    BadCount,
}

impl UnclassifiedReason {
    /// Every reason, in declaration order.
    pub const ALL: [UnclassifiedReason; 6] = [
        UnclassifiedReason::Missing,
        UnclassifiedReason::Malformed,
        UnclassifiedReason::Duplicate,
        UnclassifiedReason::Unmapped,
        UnclassifiedReason::BadDeadline,
        UnclassifiedReason::BadCount,
    ];

    /// Lowercase name, used as the metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            UnclassifiedReason::Missing => "missing",
            UnclassifiedReason::Malformed => "malformed",
            UnclassifiedReason::Duplicate => "duplicate",
            UnclassifiedReason::Unmapped => "unmapped",
            UnclassifiedReason::BadDeadline => "bad_deadline",
            UnclassifiedReason::BadCount => "bad_count",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for UnclassifiedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of classifying one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Classified {
    pub(crate) criticality: Criticality,
    /// Absolute deadline, Unix milliseconds.
    pub(crate) deadline_ms: Option<i64>,
    /// Label problem, if any (counted by the caller).
    pub(crate) tier_problem: Option<UnclassifiedReason>,
    /// Deadline problem, if any (counted by the caller).
    pub(crate) deadline_problem: Option<UnclassifiedReason>,
    /// Retries so far (`triage-attempt` on a trusted topic, else 0).
    pub(crate) attempt: u32,
    /// Deferrals so far (`triage-deferrals` on a trusted topic, else 0).
    pub(crate) deferrals: u32,
    /// A count header that could not be read, if any (counted by the caller).
    pub(crate) count_problem: Option<UnclassifiedReason>,
}

/// The configured rules, compiled once.
pub(crate) struct Classifier {
    header: String,
    deadline_header: String,
    trusted: HashSet<String>,
    topic_tiers: BTreeMap<String, Criticality>,
    default_tier: Criticality,
    window_ms: PerTier<Option<u64>>,
    user: Option<ClassifyFn>,
}

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classifier")
            .field("header", &self.header)
            .field("trusted", &self.trusted)
            .field("default_tier", &self.default_tier)
            .field("user", &self.user.is_some())
            .finish_non_exhaustive()
    }
}

impl Classifier {
    pub(crate) fn new(config: &KafkaSourceConfig, user: Option<ClassifyFn>) -> Self {
        Classifier {
            header: config.criticality.header.clone(),
            deadline_header: config.deadline.header.clone(),
            trusted: config.criticality.trusted_topics.iter().cloned().collect(),
            topic_tiers: config.criticality.topic_tiers.clone(),
            default_tier: config.criticality.default_tier,
            window_ms: config.deadline.window_ms,
            user,
        }
    }

    pub(crate) fn classify(&self, meta: &MessageMeta<'_>) -> Classified {
        let trusted = self.trusted.contains(meta.topic);
        let (criticality, tier_problem) = self.tier(meta, trusted);
        let (deadline_ms, deadline_problem) = self.deadline(meta, trusted, criticality);
        let (attempt, attempt_problem) = count(meta, trusted, wire::ATTEMPT);
        let (deferrals, deferrals_problem) = count(meta, trusted, wire::DEFERRALS);
        let count_problem = attempt_problem.or(deferrals_problem);
        Classified {
            criticality,
            deadline_ms,
            tier_problem,
            deadline_problem,
            attempt,
            deferrals,
            count_problem,
        }
    }

    fn tier(
        &self,
        meta: &MessageMeta<'_>,
        trusted: bool,
    ) -> (Criticality, Option<UnclassifiedReason>) {
        if let Some(c) = self.user.as_ref().and_then(|f| f(meta)) {
            return (c, None);
        }
        let topic_tier = self.topic_tiers.get(meta.topic).copied();
        let fallback = topic_tier.unwrap_or(self.default_tier);
        if !trusted {
            let problem = topic_tier.is_none().then_some(UnclassifiedReason::Unmapped);
            return (fallback, problem);
        }
        let mut found = meta.headers.iter().filter(|(n, _)| *n == self.header);
        match (found.next(), found.next()) {
            (None, _) => match topic_tier {
                Some(t) => (t, None),
                None => (self.default_tier, Some(UnclassifiedReason::Missing)),
            },
            (Some(_), Some(_)) => (fallback, Some(UnclassifiedReason::Duplicate)),
            (Some((_, value)), None) => match value.as_deref().map(wire::parse_criticality) {
                Some(Ok(c)) => (c, None),
                _ => (fallback, Some(UnclassifiedReason::Malformed)),
            },
        }
    }

    fn deadline(
        &self,
        meta: &MessageMeta<'_>,
        trusted: bool,
        tier: Criticality,
    ) -> (Option<i64>, Option<UnclassifiedReason>) {
        let mut problem = None;
        if trusted {
            if let Some((_, value)) = meta
                .headers
                .iter()
                .find(|(n, _)| *n == self.deadline_header)
            {
                match value.as_deref().and_then(parse_unix_ms) {
                    Some(ms) => return (Some(ms), None),
                    None => problem = Some(UnclassifiedReason::BadDeadline),
                }
            }
        }
        let window = self.window_ms[tier].and_then(|w| i64::try_from(w).ok());
        let implicit = match (meta.timestamp_ms, window) {
            (Some(ts), Some(w)) => Some(ts.saturating_add(w)),
            _ => None,
        };
        (implicit, problem)
    }
}

/// The count in header `name` of a record on a trusted topic: 0 when absent or untrusted, 0
/// and a problem when it is not a decimal count (a count cannot be partly trusted).
fn count(meta: &MessageMeta<'_>, trusted: bool, name: &str) -> (u32, Option<UnclassifiedReason>) {
    if !trusted {
        return (0, None);
    }
    match meta.headers.iter().find(|(n, _)| n == name) {
        None => (0, None),
        Some((_, value)) => match value.as_deref().and_then(wire::parse_count) {
            Some(n) => (n, None),
            None => (0, Some(UnclassifiedReason::BadCount)),
        },
    }
}

/// A deadline header's value ([`wire::parse_deadline_ms`]) as Unix milliseconds.
fn parse_unix_ms(bytes: &[u8]) -> Option<i64> {
    let at = wire::parse_deadline_ms(bytes)?;
    i64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()
}

/// One reading of the monotonic clock and the wall clock together: maps wall-clock deadlines
/// onto the clock's instants. Read once per batch of records, not per record: the two clocks
/// advance together, so the mapping does not depend on when it was read (only on the wall
/// clock being stepped meanwhile, as any reading does).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Anchor {
    now: Instant,
    wall: SystemTime,
}

impl Anchor {
    /// Reads both clocks.
    pub(crate) fn read(clock: &Clock) -> Self {
        Self::at(clock.now(), SystemTime::now())
    }

    /// The anchor of two readings taken together.
    pub(crate) fn at(now: Instant, wall: SystemTime) -> Self {
        Anchor { now, wall }
    }

    /// The instant on the clock matching wall-clock `deadline_ms` (Unix milliseconds): `now +
    /// (deadline - wall now)`, by [`wire::deadline_after`], the one mapping of a deadline from
    /// outside onto the clock. A deadline already passed maps to `now` (expired at the first
    /// look); one further ahead than [`wire::MAX_DEADLINE_AHEAD`] is held to it.
    pub(crate) fn deadline(&self, deadline_ms: i64) -> Instant {
        let target = UNIX_EPOCH + Duration::from_millis(u64::try_from(deadline_ms).unwrap_or(0));
        let ahead = target.duration_since(self.wall).unwrap_or(Duration::ZERO);
        wire::deadline_after(self.now, ahead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta<'a>(topic: &'a str, headers: &'a [(String, Option<Vec<u8>>)]) -> MessageMeta<'a> {
        MessageMeta {
            topic,
            partition: 0,
            offset: 0,
            key: None,
            headers,
            timestamp_ms: Some(1_000),
        }
    }

    type Headers = Vec<(String, Option<Vec<u8>>)>;

    fn h(name: &str, value: &[u8]) -> (String, Option<Vec<u8>>) {
        (name.to_owned(), Some(value.to_vec()))
    }

    fn classifier() -> Classifier {
        let mut c = KafkaSourceConfig::new("b:1", "g", ["t", "u", "v"]);
        c.criticality.trusted_topics = vec!["t".into()];
        c.criticality
            .topic_tiers
            .insert("v".into(), Criticality::High);
        Classifier::new(&c, None)
    }

    #[test]
    fn trusted_header_decides() {
        let c = classifier();
        let hs = [h("triage-criticality", b"critical")];
        let r = c.classify(&meta("t", &hs));
        assert_eq!(
            (r.criticality, r.tier_problem),
            (Criticality::Critical, None)
        );
        // Critical has no implicit window.
        assert_eq!(r.deadline_ms, None);
    }

    #[test]
    fn untrusted_header_is_ignored() {
        let c = classifier();
        let hs = [h("triage-criticality", b"critical")];
        let r = c.classify(&meta("u", &hs));
        assert_eq!(r.criticality, Criticality::Medium);
        assert_eq!(r.tier_problem, Some(UnclassifiedReason::Unmapped));
        assert_eq!(c.classify(&meta("v", &hs)).criticality, Criticality::High);
        assert_eq!(r.deadline_ms, Some(1_000 + 900_000));
    }

    #[test]
    fn bad_labels_fall_back_counted() {
        let c = classifier();
        let cases: [(Headers, UnclassifiedReason); 5] = [
            (vec![], UnclassifiedReason::Missing),
            (
                vec![h("triage-criticality", b"abc")],
                UnclassifiedReason::Malformed,
            ),
            (
                vec![h("triage-criticality", &[0xff, 0xfe])],
                UnclassifiedReason::Malformed,
            ),
            (
                vec![("triage-criticality".into(), None)],
                UnclassifiedReason::Malformed,
            ),
            (
                vec![
                    h("triage-criticality", b"high"),
                    h("triage-criticality", b"high"),
                ],
                UnclassifiedReason::Duplicate,
            ),
        ];
        for (hs, reason) in cases {
            let r = c.classify(&meta("t", &hs));
            assert_eq!(r.criticality, Criticality::Medium);
            assert_eq!(r.tier_problem, Some(reason));
        }
    }

    #[test]
    fn deadline_header_or_timestamp_window() {
        let c = classifier();
        let hs = [
            h("triage-criticality", b"high"),
            h("triage-deadline-ms", b"5000"),
        ];
        assert_eq!(c.classify(&meta("t", &hs)).deadline_ms, Some(5000));
        let hs = [
            h("triage-criticality", b"high"),
            h("triage-deadline-ms", b"-5"),
        ];
        let r = c.classify(&meta("t", &hs));
        assert_eq!(r.deadline_problem, Some(UnclassifiedReason::BadDeadline));
        assert_eq!(r.deadline_ms, Some(1_000 + 300_000));
    }

    #[test]
    fn retry_history_only_from_trusted_topics() {
        let c = classifier();
        let hs = [
            h("triage-criticality", b"high"),
            h("triage-attempt", b"2"),
            h("triage-deferrals", b" 1 "),
        ];
        let r = c.classify(&meta("t", &hs));
        assert_eq!((r.attempt, r.deferrals, r.count_problem), (2, 1, None));
        // Untrusted: an arbitrary producer may not spend the retry budget.
        let r = c.classify(&meta("u", &hs));
        assert_eq!((r.attempt, r.deferrals, r.count_problem), (0, 0, None));
        // Absent: a first delivery.
        let r = c.classify(&meta("t", &hs[..1]));
        assert_eq!((r.attempt, r.deferrals, r.count_problem), (0, 0, None));
        let bad = [h("triage-attempt", b"-1"), h("triage-deferrals", b"3")];
        let r = c.classify(&meta("t", &bad));
        assert_eq!(
            (r.attempt, r.deferrals, r.count_problem),
            (0, 3, Some(UnclassifiedReason::BadCount))
        );
    }

    #[test]
    fn user_classifier_first() {
        let mut cfg = KafkaSourceConfig::new("b:1", "g", ["t"]);
        cfg.criticality.trusted_topics = vec!["t".into()];
        let c = Classifier::new(
            &cfg,
            Some(Arc::new(|m: &MessageMeta<'_>| {
                (m.offset == 0).then_some(Criticality::Sheddable)
            })),
        );
        assert_eq!(
            c.classify(&meta("t", &[])).criticality,
            Criticality::Sheddable
        );
    }

    #[test]
    fn deadline_instants_saturate() {
        let (clock, _mock) = Clock::mock();
        let now = clock.now();
        let anchor = Anchor::read(&clock);
        assert_eq!(anchor.deadline(0), now);
        assert_eq!(anchor.deadline(-1), now);
        // Any producer may write these: held to the furthest a deadline from outside goes.
        for far in [i64::MAX, 99_999_999_999_999] {
            assert_eq!(
                anchor.deadline(far).duration_since(now),
                wire::MAX_DEADLINE_AHEAD
            );
        }
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let soon = anchor.deadline(wall + 60_000);
        let ahead = soon.duration_since(now);
        assert!(ahead <= Duration::from_secs(60) && ahead >= Duration::from_secs(50));
    }
}
