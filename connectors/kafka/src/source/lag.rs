//! The lag probe: how many records wait in the broker for this consumer, measured off the
//! hot path.
//!
//! `Source::lag` is read by the runtime's sampler a few times a second to estimate the arrival
//! rate (the lag's trend plus the rate of pulling), so it must never block. A thread of its
//! own measures, every `lag_interval_ms`, the sum over the assigned partitions of the high
//! watermark minus the consumer's position, and stores it in an atomic; `lag()` adds the
//! records already consumed from the broker but not yet pulled by the runtime (the hand-off
//! channel and the poll thread's overflow), which are as much waiting work as the broker's.
//!
//! Why a query (`fetch_watermarks`, one `ListOffsets` per partition) rather than the high
//! watermark librdkafka caches from fetch responses or reports in its statistics: a paused
//! partition is not fetched, so its cached high watermark freezes exactly when the backlog
//! grows (the source pauses under backpressure, and `pause_tiers` pauses whole tiers).
//!
//! A partition the consumer has not read from since its assignment has no position yet; it
//! starts from the group's committed offset, else from `auto.offset.reset` (earliest: the low
//! watermark; otherwise the high watermark, no lag), so that is what is counted for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::client::SharedClient;
use super::context::SourceContext;
use super::poll::Control;

/// `broker` before the first measurement.
const UNKNOWN: u64 = u64::MAX;
/// How often the probe checks the stop flag while waiting for the next measurement.
const STOP_CHECK: Duration = Duration::from_millis(50);

/// The last measurement, shared with the source handle.
#[derive(Debug)]
pub(crate) struct Lag {
    /// Records waiting in the broker (high watermark minus position, summed), or `UNKNOWN`.
    broker: AtomicU64,
}

impl Default for Lag {
    fn default() -> Self {
        Lag {
            broker: AtomicU64::new(UNKNOWN),
        }
    }
}

impl Lag {
    /// The last measurement, `None` before the first one.
    pub(crate) fn broker(&self) -> Option<u64> {
        match self.broker.load(Ordering::Relaxed) {
            UNKNOWN => None,
            n => Some(n),
        }
    }
}

pub(crate) struct LagProbe {
    pub(crate) client: SharedClient,
    pub(crate) control: Arc<Control>,
    pub(crate) lag: Arc<Lag>,
    pub(crate) interval: Duration,
    /// Bound on each broker query.
    pub(crate) timeout: Duration,
    /// Whether a partition without a committed offset starts at the earliest record.
    pub(crate) from_earliest: bool,
}

impl LagProbe {
    pub(crate) fn run(self) {
        while !self.control.stop.load(Ordering::Acquire) {
            let consumer = Arc::clone(&self.client.lock());
            // A failed measurement (broker away) keeps the last value: stale rather than wrong.
            let n = self
                .measure(&consumer)
                .map_or(UNKNOWN, |n| n.min(UNKNOWN - 1));
            self.lag.broker.store(n, Ordering::Relaxed);
            drop(consumer);
            let next = Instant::now() + self.interval;
            while Instant::now() < next {
                if self.control.stop.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(STOP_CHECK.min(self.interval));
            }
        }
    }

    fn measure(&self, consumer: &BaseConsumer<SourceContext>) -> Option<u64> {
        let positions = consumer.position().ok()?;
        // No assignment yet (or during a rebalance): unknown, not zero. A zero followed by the
        // real figure would read as a burst of arrivals.
        if positions.count() == 0 {
            return None;
        }
        let mut unknown = TopicPartitionList::new();
        let mut total: u64 = 0;
        let mut pending = Vec::new();
        for e in positions.elements() {
            let (low, high) = consumer
                .fetch_watermarks(e.topic(), e.partition(), self.timeout)
                .ok()?;
            match e.offset() {
                Offset::Offset(pos) => total = add_behind(total, high, pos),
                _ => {
                    unknown.add_partition(e.topic(), e.partition());
                    pending.push((low, high));
                }
            }
        }
        if pending.is_empty() {
            return Some(total);
        }
        let committed = consumer.committed_offsets(unknown, self.timeout).ok()?;
        for (e, (low, high)) in committed.elements().iter().zip(pending) {
            let start = match e.offset() {
                Offset::Offset(o) => o,
                _ if self.from_earliest => low,
                _ => high,
            };
            total = add_behind(total, high, start);
        }
        Some(total)
    }
}

/// Records from `position` up to the high watermark (0 past it).
fn behind(high: i64, position: i64) -> u64 {
    u64::try_from(high.saturating_sub(position)).unwrap_or(0)
}

/// `total` plus the records from `position` up to `high`: the watermarks are the broker's, so
/// the sum saturates (three partitions each reported `i64::MAX` behind would pass `u64::MAX`).
fn add_behind(total: u64, high: i64, position: i64) -> u64 {
    total.saturating_add(behind(high, position))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behind_never_negative() {
        assert_eq!(behind(100, 30), 70);
        assert_eq!(behind(100, 100), 0);
        assert_eq!(behind(5, 9), 0);
        assert_eq!(Lag::default().broker(), None);
    }

    #[test]
    fn watermarks_from_the_broker_sum_saturating() {
        // Whatever the broker reports: a position at i64::MIN, a high watermark at i64::MAX,
        // on three partitions.
        let total = (0..3).fold(0, |t, _| add_behind(t, i64::MAX, i64::MIN));
        assert_eq!(total, u64::MAX);
        assert_eq!(add_behind(add_behind(0, 100, 30), 10, 0), 80);
    }
}
