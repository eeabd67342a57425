//! The metrics every message updates (consumed, admitted, completed, goodput, expired, and the
//! sojourn and handler-latency histograms), counted per thread and added to the exporter's
//! handles by the sampler's tick (and at shutdown), as the refusal and decision counts are: an
//! exporter's handle is a counter every thread writes, so recording on it per message put the
//! metrics among the shared cache lines a message touched (see `crate::sync`). A scrape lags
//! them by one tick at most.
//!
//! A histogram is kept as a count and a sum per bucket of its exporter's (the bounds of
//! `metrics::LATENCY_BUCKETS`) and published as each bucket's new samples at their mean: every
//! bucket's count, the `_count` and the `_sum` are those of the samples, and only the
//! samples' places within one bucket, which a Prometheus histogram does not keep, are lost.

use std::time::Duration;

use crate::runtime::metrics::{Metrics, LATENCY_BUCKETS};
use crate::sync::{Count, Ordering, PerThread};
use crate::Criticality;

/// Buckets of a histogram: one per bound, and one past the last.
const BUCKETS: usize = LATENCY_BUCKETS.len() + 1;

/// The bucket of a duration of `ns` nanoseconds: the first whose bound it does not exceed
/// (Prometheus's `le`).
#[inline]
fn bucket(bounds_ns: &[u64; BUCKETS - 1], ns: u64) -> usize {
    bounds_ns
        .iter()
        .position(|&b| ns <= b)
        .unwrap_or(BUCKETS - 1)
}

/// A histogram's samples per bucket: how many, and their sum in ns.
#[derive(Default)]
struct Hist {
    count: [Count; BUCKETS],
    sum_ns: [Count; BUCKETS],
}

/// One thread's copy.
#[derive(Default)]
struct Counts {
    consumed: [Count; 4],
    admitted: [Count; 4],
    completed: [Count; 4],
    goodput: [Count; 4],
    expired: [Count; 4],
    sojourn: [Hist; 4],
    latency: [Hist; 4],
}

/// What was added to the exporter's handles so far.
#[derive(Default)]
struct Published {
    consumed: [u64; 4],
    admitted: [u64; 4],
    completed: [u64; 4],
    goodput: [u64; 4],
    expired: [u64; 4],
    sojourn: [[(u64, u64); BUCKETS]; 4],
    latency: [[(u64, u64); BUCKETS]; 4],
}

/// The per-message metrics, counted per thread (see the module docs).
pub(crate) struct MetricCounts {
    counts: PerThread<Counts>,
    /// Taken by whoever publishes: each count is added once.
    published: parking_lot::Mutex<Box<Published>>,
    bounds_ns: [u64; BUCKETS - 1],
}

impl Default for MetricCounts {
    fn default() -> Self {
        MetricCounts {
            counts: PerThread::default(),
            published: Default::default(),
            bounds_ns: std::array::from_fn(|i| (LATENCY_BUCKETS[i] * 1e9) as u64),
        }
    }
}

/// Which counter of [`MetricCounts`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counted {
    Consumed,
    Admitted,
    Completed,
    Goodput,
    Expired,
}

impl MetricCounts {
    /// One more `what` of `tier`.
    #[inline]
    pub(crate) fn add(&self, what: Counted, tier: Criticality, n: u64) {
        let c = self.counts.local();
        let counter = match what {
            Counted::Consumed => &c.consumed,
            Counted::Admitted => &c.admitted,
            Counted::Completed => &c.completed,
            Counted::Goodput => &c.goodput,
            Counted::Expired => &c.expired,
        };
        counter[tier.rank()].add(n, Ordering::Relaxed);
    }

    /// Adds a worker's batch of histogram samples to this thread's copy.
    pub(crate) fn add_samples(&self, samples: &mut Samples) {
        if samples.touched == 0 {
            return;
        }
        let c = self.counts.local();
        for (which, hists) in [(0, &c.sojourn), (1, &c.latency)] {
            for (rank, hist) in hists.iter().enumerate() {
                let local = &mut samples.hists[which][rank];
                for (b, slot) in local.iter_mut().enumerate() {
                    let (n, sum) = std::mem::take(slot);
                    if n != 0 {
                        hist.count[b].add(n, Ordering::Relaxed);
                        hist.sum_ns[b].add(sum, Ordering::Relaxed);
                    }
                }
            }
        }
        samples.touched = 0;
    }

    /// Adds to the exporter's handles what was counted since the last call.
    pub(crate) fn publish(&self, metrics: &Metrics) {
        let mut p = self.published.lock();
        let p = &mut **p;
        for tier in Criticality::ALL {
            let r = tier.rank();
            let m = &metrics.tiers[tier];
            for (counter, field, published) in [
                (&m.consumed, 0, &mut p.consumed[r]),
                (&m.admitted, 1, &mut p.admitted[r]),
                (&m.completed, 2, &mut p.completed[r]),
                (&m.goodput, 3, &mut p.goodput[r]),
                (&m.expired, 4, &mut p.expired[r]),
            ] {
                let now = self.counts.sum(|c| {
                    &[
                        &c.consumed,
                        &c.admitted,
                        &c.completed,
                        &c.goodput,
                        &c.expired,
                    ][field][r]
                });
                if now != *published {
                    counter.increment(now.wrapping_sub(*published));
                    *published = now;
                }
            }
            for (histogram, which, published) in [
                (&m.sojourn, 0, &mut p.sojourn[r]),
                (&m.latency, 1, &mut p.latency[r]),
            ] {
                for (b, published) in published.iter_mut().enumerate() {
                    let n = self.counts.sum(|c| &hist(c, which, r).count[b]);
                    if n == published.0 {
                        continue;
                    }
                    let sum = self.counts.sum(|c| &hist(c, which, r).sum_ns[b]);
                    let (dn, dsum) = (n.wrapping_sub(published.0), sum.wrapping_sub(published.1));
                    let mean = Duration::from_nanos(dsum / dn.max(1)).as_secs_f64();
                    histogram.record_many(mean, usize::try_from(dn).unwrap_or(usize::MAX));
                    *published = (n, sum);
                }
            }
        }
    }
}

/// Histogram `which` (0 sojourn, 1 latency) of tier rank `r` in a copy.
fn hist(c: &Counts, which: usize, r: usize) -> &Hist {
    if which == 0 {
        &c.sojourn[r]
    } else {
        &c.latency[r]
    }
}

/// A worker's histogram samples since its last flush, in plain integers: added to its
/// thread's copy once per batch ([`MetricCounts::add_samples`]).
pub(crate) struct Samples {
    /// `[sojourn, latency][tier rank][bucket]`: how many, their sum in ns.
    hists: [[[(u64, u64); BUCKETS]; 4]; 2],
    /// Whether any was added since the last flush.
    touched: u8,
}

impl Default for Samples {
    fn default() -> Self {
        Samples {
            hists: [[[(0, 0); BUCKETS]; 4]; 2],
            touched: 0,
        }
    }
}

impl Samples {
    /// A sojourn (time queued) of a message of `tier`.
    #[inline]
    pub(crate) fn sojourn(&mut self, counts: &MetricCounts, tier: Criticality, d: Duration) {
        self.add(counts, 0, tier, d);
    }

    /// A handler's run time, for a message of `tier`.
    #[inline]
    pub(crate) fn latency(&mut self, counts: &MetricCounts, tier: Criticality, d: Duration) {
        self.add(counts, 1, tier, d);
    }

    #[inline]
    fn add(&mut self, counts: &MetricCounts, which: usize, tier: Criticality, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let slot = &mut self.hists[which][tier.rank()][bucket(&counts.bounds_ns, ns)];
        slot.0 += 1;
        slot.1 = slot.1.wrapping_add(ns);
        self.touched = 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_goes_to_the_first_bucket_it_does_not_exceed() {
        let counts = MetricCounts::default();
        let b = &counts.bounds_ns;
        assert_eq!(bucket(b, 0), 0);
        assert_eq!(bucket(b, 500_000), 0);
        assert_eq!(bucket(b, 500_001), 1);
        assert_eq!(bucket(b, 10_000_000_000), BUCKETS - 2);
        assert_eq!(bucket(b, 10_000_000_001), BUCKETS - 1);
    }

    #[test]
    fn samples_are_published_once_per_bucket_at_their_mean() {
        let counts = MetricCounts::default();
        let mut samples = Samples::default();
        for us in [100, 300] {
            samples.latency(&counts, Criticality::High, Duration::from_micros(us));
        }
        samples.latency(&counts, Criticality::High, Duration::from_millis(2));
        counts.add_samples(&mut samples);
        assert_eq!(samples.touched, 0);
        let high = Criticality::High.rank();
        assert_eq!(counts.counts.sum(|c| &hist(c, 1, high).count[0]), 2);
        assert_eq!(counts.counts.sum(|c| &hist(c, 1, high).sum_ns[0]), 400_000);
        assert_eq!(counts.counts.sum(|c| &hist(c, 1, high).count[2]), 1);
        counts.add(Counted::Completed, Criticality::High, 3);
        // Publishing twice adds each count once (no recorder here: the handles are no-ops).
        let metrics = Metrics::register();
        counts.publish(&metrics);
        counts.publish(&metrics);
        let p = counts.published.lock();
        assert_eq!(p.completed[Criticality::High.rank()], 3);
        assert_eq!(p.latency[Criticality::High.rank()][0], (2, 400_000));
    }
}
