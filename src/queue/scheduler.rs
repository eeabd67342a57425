//! Stride scheduling over the four tiers (Waldspurger & Weihl, 1995).
//!
//! Each tier has a *pass*; serving a tier advances its pass by its *stride*, `SCALE / weight`,
//! and the backlogged tier with the smallest pass is served next (ties go to the more critical
//! tier). With every tier backlogged, a tier of weight `w` gets exactly `w / W` of the dequeues
//! over each round of `W = sum(weights)` dequeues, and the service interleaves: weights 8/4/2/1
//! serve Critical every other dequeue rather than eight in a row as deficit round robin would.
//!
//! A tier that goes idle must not bank credit, or it would burst past the others when it comes
//! back. So a tier that becomes backlogged starts at `max(its pass, virtual time)`, where virtual
//! time is the pass of the last tier served (start-time fair queuing's rule). This is what keeps
//! a tier from starving while the others come and go.
//!
//! The same holds for a tier that is backlogged but left out of a pop by its mask (the runtime
//! masks a tier that has used its share of the concurrency limit): while excluded it is not
//! competing, so it is treated as idle, and when it becomes eligible again its pass is raised to
//! the virtual time. Without this, 1,000 pops restricted to Critical left every lower tier
//! hundreds of strides of credit, served in a burst ahead of a backlogged Critical.
//!
//! **Bound on waiting.** Between two services of a backlogged tier `i`, each other tier `j` is
//! served at most `ceil(w_j / w_i) + 1` times, so `i` is skipped for at most
//! `sum over j != i of (ceil(w_j / w_i) + 1)` consecutive dequeues: 17 for Sheddable under
//! 8/4/2/1 (14 when every tier stays backlogged). Tested in `tests/queue_fairness.rs`.

use crate::Criticality;

/// `lcm(1..=16) * 1024`: strides are exact for every weight dividing 720720 (all of 1..=16,
/// and the common ratios), and within 0.1% for the rest of `1..=1000`.
const SCALE: u64 = 720_720 * 1024;

/// Rebase passes once virtual time passes this, far from overflow (a pass grows by at most
/// `SCALE` < 2^30 per dequeue).
const REBASE_AT: u64 = 1 << 62;

/// What every pick and charge touches first (`repr(C)`: one cache line with the queue's
/// counters, see `Core`).
#[derive(Clone, Debug)]
#[repr(C)]
pub(crate) struct Stride {
    /// Indexed by rank.
    pass: [u64; 4],
    vtime: u64,
    /// Tiers that were candidates (backlogged and in the mask) at the last pick: a tier not
    /// among them is activated when it becomes one.
    eligible: u8,
    /// Indexed by rank.
    stride: [u64; 4],
}

impl Stride {
    pub(crate) fn new(weights: [u32; 4]) -> Self {
        let mut s = Stride {
            pass: [0; 4],
            vtime: 0,
            eligible: 0,
            stride: [0; 4],
        };
        s.set_weights(weights);
        // Start each tier half a stride in, so the first round interleaves like every other
        // round instead of serving each tier once in order.
        for rank in 0..Criticality::COUNT {
            s.pass[rank] = s.stride[rank] / 2;
        }
        s
    }

    /// Weights indexed by rank; passes are kept so a live change takes effect smoothly.
    pub(crate) fn set_weights(&mut self, weights: [u32; 4]) {
        for (stride, w) in self.stride.iter_mut().zip(weights) {
            *stride = SCALE / u64::from(w.max(1));
        }
    }

    /// A tier went from empty to backlogged.
    #[inline]
    pub(crate) fn activate(&mut self, rank: usize) {
        if self.pass[rank] < self.vtime {
            self.pass[rank] = self.vtime;
        }
    }

    /// The tier to serve next among `candidates`: bit `rank` set per tier that is backlogged
    /// and allowed by the pop's mask. A candidate that was not one at the previous pick starts
    /// at the virtual time, like a tier that has just become backlogged.
    #[inline]
    pub(crate) fn pick(&mut self, candidates: u8) -> Option<usize> {
        let mut newly = candidates & !self.eligible;
        self.eligible = candidates;
        while newly != 0 {
            let rank = newly.trailing_zeros() as usize;
            newly &= newly - 1;
            self.activate(rank);
        }
        if candidates == 0 {
            return None;
        }
        if candidates & (candidates - 1) == 0 {
            // One candidate (a queue that keeps up holds one tier at a time): nothing to compare.
            return Some(candidates.trailing_zeros() as usize);
        }
        // From the top so that ties go to the more critical tier; only the set bits.
        let mut rest = candidates;
        let mut best = 7 - rest.leading_zeros() as usize;
        rest &= !(1 << best);
        while rest != 0 {
            let rank = 7 - rest.leading_zeros() as usize;
            rest &= !(1 << rank);
            if self.pass[rank] < self.pass[best] {
                best = rank;
            }
        }
        Some(best)
    }

    /// `rank` was served.
    #[inline]
    pub(crate) fn charge(&mut self, rank: usize) {
        self.vtime = self.pass[rank];
        self.pass[rank] += self.stride[rank];
        if self.vtime >= REBASE_AT {
            self.rebase();
        }
    }

    /// Takes back the charge of `rank`'s last service: the item it served was handed back
    /// unserved (see `Core::requeue_front`). Refunds go in the reverse order of the charges.
    #[inline]
    pub(crate) fn refund(&mut self, rank: usize) {
        self.pass[rank] = self.pass[rank].saturating_sub(self.stride[rank]);
    }

    /// After the refunds of every charge since a service of `rank`: virtual time as that
    /// service left it, so the order goes on as if the refunded services never happened.
    #[inline]
    pub(crate) fn restore_vtime(&mut self, rank: usize) {
        self.vtime = self.pass[rank].saturating_sub(self.stride[rank]);
    }

    #[cold]
    fn rebase(&mut self) {
        let base = self.vtime;
        for p in &mut self.pass {
            *p = p.saturating_sub(base);
        }
        self.vtime = 0;
    }

    #[cfg(test)]
    pub(crate) fn set_vtime_for_test(&mut self, v: u64) {
        self.vtime = v;
        for p in &mut self.pass {
            *p = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(weights: [u32; 4], n: usize) -> Vec<usize> {
        let mut s = Stride::new(weights);
        (0..n)
            .map(|_| {
                let r = s.pick(0b1111).unwrap();
                s.charge(r);
                r
            })
            .collect()
    }

    #[test]
    fn shares_are_exact_per_round_and_interleaved() {
        // weights by rank: sheddable 1, medium 2, high 4, critical 8
        let seq = run([1, 2, 4, 8], 15);
        let count = |r| seq.iter().filter(|x| **x == r).count();
        assert_eq!([count(0), count(1), count(2), count(3)], [1, 2, 4, 8]);
        // Critical never waits more than one dequeue, from the first round on.
        for w in run([1, 2, 4, 8], 150).windows(3) {
            assert!(w.contains(&3), "{seq:?}");
        }
    }

    #[test]
    fn idle_tier_does_not_bank_credit() {
        let mut s = Stride::new([1, 2, 4, 8]);
        // Only critical is served for a long time.
        for _ in 0..10_000 {
            let r = s.pick(0b1000).unwrap();
            s.charge(r);
        }
        s.activate(0);
        // Sheddable comes back: it gets its share, not 10,000 dequeues in a row.
        let mut run_len = 0;
        loop {
            let r = s.pick(0b1001).unwrap();
            s.charge(r);
            if r != 0 {
                break;
            }
            run_len += 1;
        }
        assert!(run_len <= 1, "sheddable burst of {run_len}");
    }

    #[test]
    fn rebase_keeps_the_schedule() {
        let mut s = Stride::new([1, 2, 4, 8]);
        s.set_vtime_for_test(REBASE_AT - 1);
        let mut seq = Vec::new();
        for _ in 0..30 {
            let r = s.pick(0b1111).unwrap();
            s.charge(r);
            seq.push(r);
        }
        assert!(s.vtime < REBASE_AT);
        let count = |r| seq.iter().filter(|x| **x == r).count();
        assert_eq!([count(0), count(1), count(2), count(3)], [2, 4, 8, 16]);
    }

    #[test]
    fn nothing_backlogged_picks_nothing() {
        assert_eq!(Stride::new([1, 1, 1, 1]).pick(0), None);
    }
}
