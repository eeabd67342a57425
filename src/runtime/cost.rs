//! The reject path's sampled cost, kept off the reject path.
//!
//! A refusal must allocate nothing. A `metrics` histogram does not promise that: the
//! Prometheus exporter appends each sample to a bucket of blocks that grows until the next
//! scrape, so recording there from the refuse path allocated a block every few thousand
//! refusals. The refuse path stores its sample in a fixed ring of atomics instead, and the
//! runtime's sampler moves the ring's samples into `triage_reject_cost_seconds` once per
//! admission tick (and once more at shutdown).

use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

/// Slots in the ring: at one sample per 64 refusals and a 100 ms tick, 256 slots hold the
/// samples of 163,840 refusals a second before the newest overwrite unread ones (a lost
/// sample, never a wrong one).
const SLOTS: usize = 256;

/// A lossy, fixed-size ring of reject-cost samples in ns, written by any thread with one
/// relaxed store and read by one drainer.
///
/// Each slot holds `ns + 1`, or 0 when empty; the drainer empties slots with `swap(0)`, so a
/// sample is read at most once whatever the interleaving, and no slot is ever half-written
/// (one `u64` store). A writer that overwrites an unread sample loses that sample.
pub(crate) struct CostSamples {
    slots: [AtomicU64; SLOTS],
    /// Refusals so far: which of them is sampled.
    refusals: AtomicU64,
}

/// Refusals between two samples of the reject path's cost: two clock reads per sample, under
/// 1 ns per refusal on average, and enough samples for a percentile at a few hundred refusals.
pub(crate) const SAMPLE_EVERY: u64 = 64;

/// While a sample is due, one decision in this many (per thread) is timed. The clock is read
/// when a decision starts, before anyone knows whether it ends in a refusal: were every
/// decision timed while a sample is due, a runtime that refuses nothing (a sample due until
/// its next refusal) would read the clock once per admitted message for nothing.
pub(crate) const TIME_ONE_IN: u32 = 8;

thread_local! {
    /// Decisions this thread made while a sample was due (see [`TIME_ONE_IN`]).
    static DUE_DECISIONS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl CostSamples {
    pub(crate) fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            refusals: AtomicU64::new(0),
        }
    }

    /// Whether a sample is due: the next timed refusal is stored.
    #[inline]
    fn due(&self) -> bool {
        self.refusals.load(Ordering::Relaxed) % SAMPLE_EVERY == 0
    }

    /// Whether the next decision is timed: while a sample is due, one decision in
    /// [`TIME_ONE_IN`] on this thread; a sample is due once every [`SAMPLE_EVERY`] refusals.
    #[inline]
    pub(crate) fn sampling(&self) -> bool {
        self.due()
            && DUE_DECISIONS.with(|n| {
                let next = n.get().wrapping_add(1);
                n.set(next);
                next % TIME_ONE_IN == 0
            })
    }

    /// Counts one refusal and stores its cost, if it was timed (see [`sampling`](Self::sampling)).
    /// A refusal that was not timed while a sample was due leaves the count as it is: the
    /// sample stays due, for the next timed refusal.
    #[inline]
    pub(crate) fn refused(&self, cost: Option<Duration>) {
        if cost.is_none() && self.due() {
            return;
        }
        let seq = self.refusals.fetch_add(1, Ordering::Relaxed);
        if let Some(cost) = cost {
            self.record(seq / SAMPLE_EVERY, cost);
        }
    }

    /// Stores one sample in the slot of `seq` (any counter that moves between samples).
    pub(crate) fn record(&self, seq: u64, cost: Duration) {
        let ns = u64::try_from(cost.as_nanos()).unwrap_or(u64::MAX - 1);
        self.slots[(seq as usize) % SLOTS].store(ns.saturating_add(1), Ordering::Relaxed);
    }

    /// Empties the ring, calling `f` with each sample stored since the last drain.
    pub(crate) fn drain(&self, mut f: impl FnMut(Duration)) {
        for slot in &self.slots {
            let v = slot.swap(0, Ordering::Relaxed);
            if v != 0 {
                f(Duration::from_nanos(v - 1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_refusal_in_sample_every_is_timed() {
        let s = CostSamples::new();
        let mut timed = 0;
        // A sample is due at the first refusal: the next decision in `TIME_ONE_IN` is timed
        // (this test's thread has made none before), then `SAMPLE_EVERY - 1` are not.
        let cycle = u64::from(TIME_ONE_IN) + SAMPLE_EVERY - 1;
        for _ in 0..cycle * 3 {
            let sampling = s.sampling();
            timed += u64::from(sampling);
            s.refused(sampling.then_some(Duration::from_nanos(100)));
        }
        assert_eq!(timed, 3);
        assert_eq!(s.refusals.load(Ordering::Relaxed), 3 * SAMPLE_EVERY);
        let mut got = Vec::new();
        s.drain(|d| got.push(d.as_nanos()));
        assert_eq!(got, vec![100, 100, 100]);
    }

    #[test]
    fn admitted_decisions_read_the_clock_only_one_in_time_one_in() {
        let s = CostSamples::new();
        // Nothing refused: a sample stays due, and one decision in `TIME_ONE_IN` is timed.
        let timed = (0..TIME_ONE_IN * 10).filter(|_| s.sampling()).count();
        assert_eq!(timed, 10);
    }

    #[test]
    fn each_sample_is_drained_once() {
        let s = CostSamples::new();
        s.record(0, Duration::from_nanos(0));
        s.record(1, Duration::from_nanos(150));
        s.record(2, Duration::from_micros(3));
        let mut got = Vec::new();
        s.drain(|d| got.push(d.as_nanos()));
        assert_eq!(got, vec![0, 150, 3_000]);
        let mut again = 0;
        s.drain(|_| again += 1);
        assert_eq!(again, 0);
    }

    #[test]
    fn a_full_ring_keeps_the_newest_sample_of_each_slot() {
        let s = CostSamples::new();
        for seq in 0..(SLOTS as u64 * 2) {
            s.record(seq, Duration::from_nanos(seq));
        }
        let mut got = Vec::new();
        s.drain(|d| got.push(d.as_nanos() as u64));
        assert_eq!(got.len(), SLOTS);
        assert!(got.iter().all(|&ns| ns >= SLOTS as u64), "{got:?}");
    }

    #[test]
    fn concurrent_writers_lose_no_sample_below_the_ring_size() {
        let s = std::sync::Arc::new(CostSamples::new());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let s = std::sync::Arc::clone(&s);
                std::thread::spawn(move || {
                    for i in 0..(SLOTS as u64 / 4) {
                        s.record(t * (SLOTS as u64 / 4) + i, Duration::from_nanos(7));
                    }
                })
            })
            .collect();
        let mut drained = 0;
        while threads.iter().any(|t| !t.is_finished()) {
            s.drain(|_| drained += 1);
        }
        for t in threads {
            t.join().unwrap();
        }
        s.drain(|_| drained += 1);
        assert_eq!(drained, SLOTS);
    }
}
