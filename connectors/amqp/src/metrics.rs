//! Every metric the connector records, in one place.
//!
//! Names are under `triage_amqp_`, recorded through the [`metrics`] facade (a no-op until the
//! application installs a recorder). Counters only increase. The same counts are kept in
//! process as [`AmqpSourceStats`] so that tests and health checks can
//! read them without a recorder.
//!
//! | name | labels | what it counts |
//! | --- | --- | --- |
//! | `triage_amqp_deliveries_total` | `queue` | deliveries taken from the consumer |
//! | `triage_amqp_redelivered_total` | `queue` | of those, deliveries with the `redelivered` flag (processed normally) |
//! | `triage_amqp_unclassified_total` | `queue`, `reason` | deliveries given the default tier: `missing` (no priority and no trusted header), `unknown` (a header naming no tier), `malformed` (a header of the wrong type or not UTF-8) |
//! | `triage_amqp_oversize_total` | `queue` | deliveries above `max_payload_bytes`, rejected to the dead-letter exchange unseen |
//! | `triage_amqp_acks_total` | `queue`, `disposition` | deliveries settled with `basic.ack` (completed, deferred, expired, shed, and failed when dead-lettered through a sink) |
//! | `triage_amqp_ack_frames_total` | `queue` | `basic.ack` frames sent (one `multiple` frame settles many deliveries) |
//! | `triage_amqp_rejects_total` | `queue` | deliveries settled with `basic.reject(requeue = false)`: to the queue's dead-letter exchange |
//! | `triage_amqp_requeues_total` | `queue` | deliveries released without a disposition, `basic.nack(requeue = true)` |
//! | `triage_amqp_stale_settles_total` | `queue` | settles ignored because the delivery's channel is gone (the broker redelivers it) |
//! | `triage_amqp_duplicate_settles_total` | `queue` | second settles of one delivery, ignored |
//! | `triage_amqp_settle_errors_total` | `queue` | settle frames the client could not send (channel closing); the broker redelivers |
//! | `triage_amqp_connect_attempts_total` | `queue` | connection attempts of the consumer, the first one included, each one counted (successes plus failures) |
//! | `triage_amqp_reconnects_total` | `queue` | consumer channels opened after the first one |
//! | `triage_amqp_connect_failures_total` | `queue` | failed connection or channel set-up attempts |
//! | `triage_amqp_dropped_buffered_total` | `queue` | deliveries lapin still buffered from a closed channel, dropped unseen (the broker already requeued them) |
//! | `triage_amqp_handed_back_total` | `queue` | deliveries released from the source's own buffer (paused, or a tier queue not read) after waiting a share of the consumer timeout, `basic.nack(requeue = true)`, unseen by the runtime |
//! | `triage_amqp_published_total` | `queue`, `outcome` | defer and dead-letter publishes: `confirmed`, `nacked`, `returned`, `timeout`, `unavailable`, `too_large` (refused before sending) |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metrics::{Counter, Unit};
use triage::ledger::Disposition;

/// Every metric's `# HELP` text, beside its name (all are counters).
const HELP: [(&str, &str); 17] = [
    (
        "triage_amqp_deliveries_total",
        "Deliveries taken from the consumer, by queue.",
    ),
    (
        "triage_amqp_redelivered_total",
        "Deliveries that carried the redelivered flag (processed normally), by queue.",
    ),
    (
        "triage_amqp_unclassified_total",
        "Deliveries given the default tier, by queue and reason (missing, unknown, malformed).",
    ),
    (
        "triage_amqp_oversize_total",
        "Deliveries above max_payload_bytes, rejected to the dead-letter exchange unseen, by queue.",
    ),
    (
        "triage_amqp_acks_total",
        "Deliveries settled with basic.ack, by queue and disposition.",
    ),
    (
        "triage_amqp_ack_frames_total",
        "basic.ack frames sent (one multiple frame settles many deliveries), by queue.",
    ),
    (
        "triage_amqp_rejects_total",
        "Deliveries settled with basic.reject without requeue (to the dead-letter exchange), by queue.",
    ),
    (
        "triage_amqp_requeues_total",
        "Deliveries released without a disposition (basic.nack with requeue), by queue.",
    ),
    (
        "triage_amqp_stale_settles_total",
        "Settles ignored because the delivery's channel is gone (the broker redelivers it), by queue.",
    ),
    (
        "triage_amqp_duplicate_settles_total",
        "Second settles of one delivery, ignored, by queue.",
    ),
    (
        "triage_amqp_settle_errors_total",
        "Settle frames the client could not send (channel closing; the broker redelivers), by queue.",
    ),
    (
        "triage_amqp_connect_attempts_total",
        "Connection attempts of the consumer, the first included (successes plus failures), by queue.",
    ),
    (
        "triage_amqp_reconnects_total",
        "Consumer channels opened after the first one, by queue.",
    ),
    (
        "triage_amqp_connect_failures_total",
        "Failed connection or channel set-up attempts, by queue.",
    ),
    (
        "triage_amqp_dropped_buffered_total",
        "Deliveries still buffered from a closed channel, dropped unseen (the broker already requeued them), by queue.",
    ),
    (
        "triage_amqp_handed_back_total",
        "Deliveries released from the source's own buffer after waiting a share of the consumer timeout (basic.nack with requeue), unseen by the runtime, by queue.",
    ),
    (
        "triage_amqp_published_total",
        "Defer and dead-letter publishes, by queue and outcome (confirmed, nacked, returned, timeout, unavailable).",
    ),
];

/// Gives every metric above its `# HELP` text on the installed recorder (a no-op without
/// one). Called when a source or sink is created, so a recorder installed before that (as
/// `triage::observe::serve` is) has the descriptions.
pub(crate) fn describe() {
    metrics::with_recorder(|recorder| {
        for (name, help) in HELP {
            recorder.describe_counter(name.into(), Some(Unit::Count), help.into());
        }
    });
}

/// Counts of one [`AmqpSource`](crate::AmqpSource), read with
/// [`AmqpSource::stats`](crate::AmqpSource::stats).
///
/// Every field only increases over the source's life (reconnects included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AmqpSourceStats {
    /// Deliveries taken from the consumer.
    pub deliveries: u64,
    /// Deliveries that carried the `redelivered` flag.
    pub redelivered: u64,
    /// Deliveries given the default tier.
    pub unclassified: u64,
    /// Deliveries above `max_payload_bytes`, rejected unseen.
    pub oversize: u64,
    /// Deliveries settled with `basic.ack`.
    pub acked: u64,
    /// `basic.ack` frames sent.
    pub ack_frames: u64,
    /// Deliveries rejected to the dead-letter exchange.
    pub rejected: u64,
    /// Deliveries released and requeued.
    pub requeued: u64,
    /// Settles ignored because their channel is gone.
    pub stale_settles: u64,
    /// Second settles of a delivery, ignored.
    pub duplicate_settles: u64,
    /// Settle frames that could not be sent.
    pub settle_errors: u64,
    /// Connection attempts, the first one included: `1 + reconnects + connect_failures`
    /// once no attempt is in progress.
    pub connect_attempts: u64,
    /// Channels opened after the first.
    pub reconnects: u64,
    /// Failed connection or set-up attempts.
    pub connect_failures: u64,
    /// Deliveries still buffered from a channel that had closed, not handed out.
    pub dropped_buffered: u64,
    /// Deliveries released from the source's own buffer after waiting a share of the consumer
    /// timeout (also counted in `requeued`).
    pub handed_back: u64,
}

macro_rules! counters {
    ($($field:ident => $name:literal),* $(,)?) => {
        /// The atomics behind [`AmqpSourceStats`] plus the facade's handles, registered once
        /// per source so the hot path does not look names up.
        #[derive(Debug)]
        pub(crate) struct SourceMetrics {
            $(pub(crate) $field: Stat,)*
            acked: AtomicU64,
            unclassified: AtomicU64,
            acks_by_disposition: [Counter; Disposition::ALL.len()],
            unclassified_missing: Counter,
            unclassified_unknown: Counter,
            unclassified_malformed: Counter,
        }

        impl SourceMetrics {
            pub(crate) fn new(queue: &str) -> Arc<Self> {
                describe();
                let q = queue.to_owned();
                Arc::new(SourceMetrics {
                    $($field: Stat::new(metrics::counter!($name, "queue" => q.clone())),)*
                    acked: AtomicU64::new(0),
                    unclassified: AtomicU64::new(0),
                    acks_by_disposition: Disposition::ALL.map(|d| {
                        metrics::counter!("triage_amqp_acks_total", "queue" => q.clone(), "disposition" => d.as_str())
                    }),
                    unclassified_missing: metrics::counter!("triage_amqp_unclassified_total", "queue" => q.clone(), "reason" => "missing"),
                    unclassified_unknown: metrics::counter!("triage_amqp_unclassified_total", "queue" => q.clone(), "reason" => "unknown"),
                    unclassified_malformed: metrics::counter!("triage_amqp_unclassified_total", "queue" => q, "reason" => "malformed"),
                })
            }

            pub(crate) fn snapshot(&self) -> AmqpSourceStats {
                AmqpSourceStats {
                    $($field: self.$field.get(),)*
                    acked: self.acked.load(Ordering::Relaxed),
                    unclassified: self.unclassified.load(Ordering::Relaxed),
                }
            }
        }
    };
}

counters! {
    deliveries => "triage_amqp_deliveries_total",
    redelivered => "triage_amqp_redelivered_total",
    oversize => "triage_amqp_oversize_total",
    ack_frames => "triage_amqp_ack_frames_total",
    rejected => "triage_amqp_rejects_total",
    requeued => "triage_amqp_requeues_total",
    stale_settles => "triage_amqp_stale_settles_total",
    duplicate_settles => "triage_amqp_duplicate_settles_total",
    settle_errors => "triage_amqp_settle_errors_total",
    connect_attempts => "triage_amqp_connect_attempts_total",
    reconnects => "triage_amqp_reconnects_total",
    connect_failures => "triage_amqp_connect_failures_total",
    dropped_buffered => "triage_amqp_dropped_buffered_total",
    handed_back => "triage_amqp_handed_back_total",
}

/// Why a delivery got the default tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unclassified {
    Missing,
    Unknown,
    Malformed,
}

impl SourceMetrics {
    pub(crate) fn acked(&self, disposition: Disposition, n: u64) {
        self.acks_by_disposition[disposition_index(disposition)].increment(n);
        self.acked.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn unclassified(&self, reason: Unclassified) {
        match reason {
            Unclassified::Missing => self.unclassified_missing.increment(1),
            Unclassified::Unknown => self.unclassified_unknown.increment(1),
            Unclassified::Malformed => self.unclassified_malformed.increment(1),
        }
        self.unclassified.fetch_add(1, Ordering::Relaxed);
    }
}

fn disposition_index(d: Disposition) -> usize {
    Disposition::ALL.iter().position(|&x| x == d).unwrap_or(0)
}

/// One counter: an atomic for [`AmqpSourceStats`] and the facade's handle.
#[derive(Debug)]
pub(crate) struct Stat {
    value: AtomicU64,
    counter: Counter,
}

impl Stat {
    fn new(counter: Counter) -> Self {
        Stat {
            value: AtomicU64::new(0),
            counter,
        }
    }

    pub(crate) fn add(&self, n: u64) {
        // Relaxed: these are statistics, read without ordering against other memory.
        self.value.fetch_add(n, Ordering::Relaxed);
        self.counter.increment(n);
    }

    pub(crate) fn incr(&self) {
        self.add(1);
    }

    pub(crate) fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// Records one defer or dead-letter publish outcome.
pub(crate) fn published(queue: &str, outcome: &'static str) {
    metrics::counter!("triage_amqp_published_total", "queue" => queue.to_owned(), "outcome" => outcome)
        .increment(1);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::io::Write;
    use std::process::{Command, Stdio};

    use super::*;

    /// Every metric of this crate, registered through a Prometheus recorder, has HELP and
    /// passes `promtool check metrics`; the HELP list and the docs' table name the same
    /// metrics. Fails when promtool is missing: the suite installs it (`tests/tools.sh`).
    #[test]
    fn every_metric_has_help_and_passes_promtool() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let m = SourceMetrics::new("q");
            m.deliveries.incr();
            m.acked(Disposition::Completed, 1);
            m.unclassified(Unclassified::Missing);
            published("q.deferred", "confirmed");
        });
        let scrape = handle.render();
        let helped: BTreeSet<&str> = HELP.iter().map(|(n, _)| *n).collect();
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
