//! Every metric this crate records, through the [`metrics`] facade.
//!
//! One module names them all so a dashboard can be written from this page. Counters only
//! increase. None is recorded per message on the reject path; [`UNCLASSIFIED_TOTAL`] is
//! incremented once per batch of consumed records (by the batch's count), [`STALE_ACKS_TOTAL`]
//! once per stale disposition.
//!
//! | name | kind | labels | meaning |
//! | --- | --- | --- | --- |
//! | `triage_kafka_committed_offset` | gauge | `topic`, `partition` | last position committed by this process (next offset to consume) |
//! | `triage_kafka_commits_total` | counter | `trigger` (`interval`, `revoke`, `shutdown`) | offset commits that succeeded |
//! | `triage_kafka_commits_failed_total` | counter | `trigger` | offset commits that failed or timed out (retried at the next interval) |
//! | `triage_kafka_unclassified_total` | counter | `reason` (`missing`, `malformed`, `duplicate`, `unmapped`, `bad_deadline`, `bad_count`) | messages whose label could not be used: they got the configured default |
//! | `triage_kafka_rebalances_total` | counter | `kind` (`assign`, `revoke`, `error`) | rebalance callbacks |
//! | `triage_kafka_stale_acks_total` | counter | | dispositions for a partition no longer owned (ignored, never stored) |
//! | `triage_kafka_pauses_total` | counter | `cause` (`runtime`, `buffer`) | times the assignment was paused |
//! | `triage_kafka_client_restarts_total` | counter | `reason` (`fatal`) | consumer clients replaced after a fatal error |
//! | `triage_kafka_revoke_released_total` | counter | | records of revoked partitions the runtime held (queued or parked) and handed back unprocessed at the revocation |
//! | `triage_kafka_revoke_wait_exceeded_total` | counter | | revocations that let their partitions go while handlers of theirs still ran (`revoke_wait_ms` ran out): key order may break across members |
//! | `triage_kafka_published_total` | counter | `destination` (`defer`, `dead_letter`, `dead_letter_reference`), `result` (`ok`, `rejected`, `not_confirmed`, `unavailable`) | sink publishes by outcome |

use metrics::{counter, gauge, Unit};

/// Gauge: last committed position per partition.
pub const COMMITTED_OFFSET: &str = "triage_kafka_committed_offset";
/// Counter: successful offset commits, by trigger.
pub const COMMITS_TOTAL: &str = "triage_kafka_commits_total";
/// Counter: failed offset commits, by trigger.
pub const COMMITS_FAILED_TOTAL: &str = "triage_kafka_commits_failed_total";
/// Counter: messages that fell back to the default tier, by reason.
pub const UNCLASSIFIED_TOTAL: &str = "triage_kafka_unclassified_total";
/// Counter: rebalance callbacks, by kind.
pub const REBALANCES_TOTAL: &str = "triage_kafka_rebalances_total";
/// Counter: dispositions ignored because their partition was revoked.
pub const STALE_ACKS_TOTAL: &str = "triage_kafka_stale_acks_total";
/// Counter: assignment pauses, by cause.
pub const PAUSES_TOTAL: &str = "triage_kafka_pauses_total";
/// Counter: consumer clients replaced after a fatal error, by reason.
pub const CLIENT_RESTARTS_TOTAL: &str = "triage_kafka_client_restarts_total";
/// Counter: sink publishes, by destination and result.
pub const PUBLISHED_TOTAL: &str = "triage_kafka_published_total";
/// Counter: records of revoked partitions handed back unprocessed at the revocation.
pub const REVOKE_RELEASED_TOTAL: &str = "triage_kafka_revoke_released_total";
/// Counter: revocations whose wait for running handlers ran out.
pub const REVOKE_WAIT_EXCEEDED_TOTAL: &str = "triage_kafka_revoke_wait_exceeded_total";

/// Every metric's `# HELP` text, beside its name: `(name, is_gauge, help)`.
const HELP: [(&str, bool, &str); 11] = [
    (
        COMMITTED_OFFSET,
        true,
        "Last position committed by this process (the next offset to consume), by topic and partition.",
    ),
    (
        COMMITS_TOTAL,
        false,
        "Offset commits that succeeded, by trigger (interval, revoke, shutdown).",
    ),
    (
        COMMITS_FAILED_TOTAL,
        false,
        "Offset commits that failed or timed out (retried at the next interval), by trigger.",
    ),
    (
        UNCLASSIFIED_TOTAL,
        false,
        "Messages whose criticality label could not be used and got the default tier, by reason.",
    ),
    (
        REBALANCES_TOTAL,
        false,
        "Consumer-group rebalance callbacks, by kind (assign, revoke, error).",
    ),
    (
        STALE_ACKS_TOTAL,
        false,
        "Dispositions for a partition no longer owned by this process (ignored, never stored).",
    ),
    (
        PAUSES_TOTAL,
        false,
        "Times the assignment was paused, by cause (runtime, buffer).",
    ),
    (
        CLIENT_RESTARTS_TOTAL,
        false,
        "Consumer clients replaced after a fatal librdkafka error, by reason.",
    ),
    (
        PUBLISHED_TOTAL,
        false,
        "Defer and dead-letter publishes, by destination and result.",
    ),
    (
        REVOKE_RELEASED_TOTAL,
        false,
        "Records of revoked partitions the runtime held (queued or parked), handed back unprocessed at the revocation for the next owner.",
    ),
    (
        REVOKE_WAIT_EXCEEDED_TOTAL,
        false,
        "Revocations that let their partitions go while handlers of theirs still ran (revoke_wait_ms ran out): key order may break across members.",
    ),
];

/// Gives every metric above its `# HELP` text on the installed recorder (a no-op without
/// one). Called when a source or sink is built, so a recorder installed before that (as
/// `triage::observe::serve` is) has the descriptions.
pub(crate) fn describe() {
    metrics::with_recorder(|recorder| {
        for (name, is_gauge, help) in HELP {
            if is_gauge {
                recorder.describe_gauge(name.into(), None, help.into());
            } else {
                recorder.describe_counter(name.into(), Some(Unit::Count), help.into());
            }
        }
    });
}

/// What caused an offset commit (the `trigger` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CommitTrigger {
    Interval,
    Revoke,
    Shutdown,
}

impl CommitTrigger {
    fn as_str(self) -> &'static str {
        match self {
            CommitTrigger::Interval => "interval",
            CommitTrigger::Revoke => "revoke",
            CommitTrigger::Shutdown => "shutdown",
        }
    }
}

pub(crate) fn committed(topic: &str, partition: i32, position: u64) {
    // f64 is exact for offsets below 2^53, far beyond any real partition.
    gauge!(COMMITTED_OFFSET, "topic" => topic.to_owned(), "partition" => partition.to_string())
        .set(position as f64);
}

pub(crate) fn commit(trigger: CommitTrigger, ok: bool) {
    let name = if ok {
        COMMITS_TOTAL
    } else {
        COMMITS_FAILED_TOTAL
    };
    counter!(name, "trigger" => trigger.as_str()).increment(1);
}

/// `n` messages fell back for `reason` (the label of an `UnclassifiedReason`; counted per
/// batch of records, not per record).
pub(crate) fn unclassified(reason: &'static str, n: u64) {
    counter!(UNCLASSIFIED_TOTAL, "reason" => reason).increment(n);
}

pub(crate) fn rebalance(kind: &'static str) {
    counter!(REBALANCES_TOTAL, "kind" => kind).increment(1);
}

pub(crate) fn stale_ack_n(n: u64) {
    counter!(STALE_ACKS_TOTAL).increment(n);
}

pub(crate) fn pause(cause: &'static str) {
    counter!(PAUSES_TOTAL, "cause" => cause).increment(1);
}

pub(crate) fn client_restart(reason: &'static str) {
    counter!(CLIENT_RESTARTS_TOTAL, "reason" => reason).increment(1);
}

pub(crate) fn published(destination: &'static str, result: &'static str) {
    counter!(PUBLISHED_TOTAL, "destination" => destination, "result" => result).increment(1);
}

pub(crate) fn revoke_released(n: u64) {
    counter!(REVOKE_RELEASED_TOTAL).increment(n);
}

pub(crate) fn revoke_wait_exceeded() {
    counter!(REVOKE_WAIT_EXCEEDED_TOTAL).increment(1);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::io::Write;
    use std::process::{Command, Stdio};

    use super::*;

    /// Every metric of this crate, recorded once through a Prometheus recorder, passes
    /// `promtool check metrics` (HELP on every family, Prometheus' naming rules); the HELP
    /// list and the docs' table name the same metrics. Fails when promtool is missing: the
    /// suite installs it (`tests/tools.sh`).
    #[test]
    fn every_metric_has_help_and_passes_promtool() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            committed("t", 0, 1);
            commit(CommitTrigger::Interval, true);
            commit(CommitTrigger::Revoke, false);
            unclassified("missing", 1);
            rebalance("assign");
            stale_ack_n(1);
            pause("runtime");
            client_restart("fatal");
            published("defer", "ok");
            revoke_released(1);
            revoke_wait_exceeded();
        });
        let scrape = handle.render();
        let helped: BTreeSet<&str> = HELP.iter().map(|(n, _, _)| *n).collect();
        let documented: BTreeSet<&str> = include_str!("metrics.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        assert_eq!(helped, documented);
        let families: BTreeSet<&str> = scrape
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert_eq!(families, helped, "{scrape}");
        for (name, _, _) in HELP {
            assert!(
                scrape.contains(&format!("# HELP {name} ")),
                "{name}:\n{scrape}"
            );
        }
        let mut child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run promtool ({e}): install it with tests/tools.sh")
            });
        child
            .stdin
            .take()
            .unwrap()
            .write_all(scrape.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}\n{scrape}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
