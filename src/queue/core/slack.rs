//! Deadline-ordered service inside the weighted order: *slack stealing* (Lehoczky and
//! Ramos-Thuel, 1992), the real-time scheduling rule that serves less important work early in
//! the time more important work can spare.
//!
//! The stride order (`scheduler.rs`) serves the tiers by weight, whatever their deadlines. In a
//! burst that serves Critical messages due in a second ahead of Medium ones due in a quarter of
//! it, and the Medium ones expire while the Critical ones had time to wait. So at each pop the
//! tier whose head is due first is served instead of the stride's pick, provided every more
//! important tier's queued work would still be served in time if served after it: the queue
//! steals only slack that is there.
//!
//! The test, for each backlogged tier more important than the one served early, counting from
//! Critical down the items that go before it if the tiers were then served strictly in order:
//! its head must have `(items ahead + 2) × per pop + blocking` of slack left, and its newest
//! item `(items ahead and its own + 1) × per pop + blocking`, both times [`SAFETY`]. *Per pop*
//! is the time one pop takes at the measured capacity (the concurrency limit over the mean
//! handler run); *blocking* is the longest run seen of the tier served early, since a job is
//! not preempted and holds its worker that long at worst (the blocking term of non-preemptive
//! response-time analysis): a tier whose handlers are sometimes slow is taken early only where
//! the more important work can wait that long. Both are set by the runtime
//! ([`Core::set_drain`](super::Core::set_drain)); without them nothing is stolen and the
//! stride order alone decides. A more important tier whose head has no deadline is never
//! passed: nothing says how long it may wait. Items within a tier keep their order.
//!
//! The same test lets a tier past its share of the concurrency limit be served (a pop's
//! *borrowing* tiers): the shares reserve workers for the more important tiers, and a tier
//! whose work can wait does not need them reserved now.

use std::collections::VecDeque;
use std::time::Duration;

use quanta::Instant;

use super::Core;
use crate::queue::Entry;

/// The predicted waits of the more important tiers are doubled before they are compared with
/// their slack: the time per pop is a mean over handler runs that vary, and a steal that turns
/// out to cost a more important message its deadline is the one mistake this must not make.
pub(crate) const SAFETY: u32 = 2;

/// The deadline-ordered service's state: the time one pop takes at the measured capacity, and
/// the longest handler run seen per tier.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Slack {
    /// `Duration::ZERO` while nothing is measured (or the runtime does not derive it): no
    /// steal.
    per_pop: Duration,
    /// Indexed by rank: how long a job of the tier served early may hold a worker, during
    /// which more important work may find none free (the *blocking* term of non-preemptive
    /// response-time analysis).
    longest: [Duration; 4],
}

impl Slack {
    /// Sets the time one pop takes at the measured capacity and each tier's longest run (by
    /// rank); `None` turns stealing off.
    pub(crate) fn set(&mut self, drain: Option<(Duration, [Duration; 4])>) {
        (self.per_pop, self.longest) = drain.unwrap_or_default();
    }

    /// Whether stealing is on.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        !self.per_pop.is_zero()
    }

    /// The tier to serve: `picked`, the stride's pick among `candidates` (`None` when there are
    /// none), or the tier among `candidates | borrowing` (both backlogged) whose head is due
    /// first, if the test of the module docs passes for every more important tier in
    /// `backlog`. `None` when neither.
    pub(crate) fn choose<T>(
        &self,
        tiers: &[VecDeque<Entry<T>>; 4],
        backlog: u8,
        pool: u8,
        picked: Option<usize>,
        now: Instant,
    ) -> Option<usize> {
        if !self.on() || (picked.is_some() && pool & pool.wrapping_sub(1) == 0) {
            return picked;
        }
        let mut due: Option<(usize, Instant)> = None;
        let mut rest = pool;
        while rest != 0 {
            let rank = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let head = tiers[rank].front().and_then(Entry::deadline);
            if let Some(d) = head.filter(|d| *d > now) {
                if due.is_none_or(|(_, first)| d < first) {
                    due = Some((rank, d));
                }
            }
        }
        match due {
            Some((rank, _)) if Some(rank) != picked && self.spares(tiers, backlog, rank, now) => {
                Some(rank)
            }
            _ => picked,
        }
    }

    /// Whether every backlogged tier more important than `rank` keeps its deadlines if one item
    /// of `rank` is served first, holding a worker for as long as its tier's longest run, and
    /// the tiers are then served strictly in order.
    fn spares<T>(
        &self,
        tiers: &[VecDeque<Entry<T>>; 4],
        backlog: u8,
        rank: usize,
        now: Instant,
    ) -> bool {
        // The item served first, and how long it may hold its worker.
        let mut ahead: u32 = 1;
        let blocking = self.longest[rank];
        for h in (rank + 1..tiers.len()).rev() {
            if backlog & (1 << h) == 0 {
                continue;
            }
            let queue = &tiers[h];
            let (Some(head), Some(newest)) = (queue.front(), queue.back()) else {
                continue;
            };
            let Some(head_due) = head.deadline() else {
                return false;
            };
            let len = u32::try_from(queue.len()).unwrap_or(u32::MAX);
            let wait = |items: u32| {
                let queued = self.per_pop.saturating_mul(items);
                queued.saturating_add(blocking).saturating_mul(SAFETY)
            };
            if head_due.saturating_duration_since(now) < wait(ahead.saturating_add(1)) {
                return false;
            }
            ahead = ahead.saturating_add(len);
            if let Some(d) = newest.deadline() {
                if d.saturating_duration_since(now) < wait(ahead) {
                    return false;
                }
            }
        }
        true
    }
}

impl<T> Core<T> {
    /// The tier a pop serves: the stride's pick among the backlogged tiers of `mask`, or one of
    /// `mask | borrowing` due first, where deadline-ordered service takes it (see the module
    /// docs; never with `borrowing` `None`). `None` when neither.
    #[inline]
    pub(super) fn next_tier(
        &mut self,
        mask: u8,
        borrowing: Option<u8>,
        now: Instant,
    ) -> Option<usize> {
        let picked = self.sched.pick(self.backlog & mask);
        let Some(borrowing) = borrowing.filter(|_| self.slack.on()) else {
            return picked;
        };
        let pool = self.backlog & (mask | borrowing);
        let rank = self
            .slack
            .choose(&self.tiers, self.backlog, pool, picked, now)?;
        if Some(rank) != picked {
            // Served out of the weighted order: charged from the virtual time, like a tier that
            // has just become backlogged, so it banks no credit for later.
            self.sched.activate(rank);
        }
        Some(rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Meta;
    use crate::Criticality;

    /// Tiers by rank (Sheddable first), each a list of deadlines in ms from `now` (`None`: no
    /// deadline), oldest first.
    fn tiers(now: Instant, by_rank: [&[Option<u64>]; 4]) -> ([VecDeque<Entry<u32>>; 4], u8) {
        let mut tiers: [VecDeque<Entry<u32>>; 4] = Default::default();
        let mut backlog = 0;
        for (rank, due) in by_rank.iter().enumerate() {
            for d in *due {
                let tier = Criticality::from_rank(rank).expect("a rank below 4");
                let meta =
                    Meta::new(tier).deadline_opt(d.map(|ms| now + Duration::from_millis(ms)));
                tiers[rank].push_back(Entry::new(0, meta, now));
                backlog |= 1 << rank;
            }
        }
        (tiers, backlog)
    }

    fn slack(per_pop_ms: u64) -> Slack {
        let mut s = Slack::default();
        s.set(Some((
            Duration::from_millis(per_pop_ms),
            [Duration::ZERO; 4],
        )));
        s
    }

    #[test]
    fn a_tier_with_slow_runs_is_taken_early_only_where_the_wait_covers_them() {
        let now = Instant::recent();
        // Sheddable due in 50 ms; ten Critical items due in 100 ms: at 1 ms a pop, Critical's
        // newest needs (1 + 10) x 1 ms plus Sheddable's longest run, doubled.
        let (t, backlog) = tiers(now, [&[Some(50)], &[], &[], &[Some(100); 10]]);
        let ms = Duration::from_millis;
        let mut s = Slack::default();
        s.set(Some((ms(1), [ms(30), ms(0), ms(0), ms(0)])));
        assert_eq!(s.choose(&t, backlog, backlog, Some(3), now), Some(0));
        s.set(Some((ms(1), [ms(40), ms(0), ms(0), ms(0)])));
        assert_eq!(s.choose(&t, backlog, backlog, Some(3), now), Some(3));
    }

    #[test]
    fn the_head_due_first_goes_first_when_the_more_important_work_can_wait() {
        let now = Instant::recent();
        // Sheddable due in 50 ms; ten Critical items due in a second.
        let (t, backlog) = tiers(now, [&[Some(50)], &[], &[], &[Some(1_000); 10]]);
        // The stride picked Critical (rank 3); Sheddable is due first and Critical can wait:
        // its head needs (1 + 1) x 1 ms x 2, its newest (1 + 10) x 1 ms x 2.
        assert_eq!(slack(1).choose(&t, backlog, backlog, Some(3), now), Some(0));
        // Off (nothing measured): the stride's pick.
        assert_eq!(
            Slack::default().choose(&t, backlog, backlog, Some(3), now),
            Some(3)
        );
        // At 100 ms a pop, ten Critical items take 2.2 s doubled: Critical cannot wait.
        assert_eq!(
            slack(100).choose(&t, backlog, backlog, Some(3), now),
            Some(3)
        );
    }

    #[test]
    fn work_without_a_deadline_is_never_passed() {
        let now = Instant::recent();
        let (t, backlog) = tiers(now, [&[Some(50)], &[], &[None], &[Some(1_000)]]);
        assert_eq!(slack(1).choose(&t, backlog, backlog, Some(3), now), Some(3));
        // Below the tier served early, work without a deadline is not in the way.
        let (t, backlog) = tiers(now, [&[None], &[Some(50)], &[], &[Some(1_000)]]);
        assert_eq!(slack(1).choose(&t, backlog, backlog, Some(3), now), Some(1));
    }

    #[test]
    fn the_newest_item_of_a_more_important_tier_counts_the_whole_tier_ahead() {
        let now = Instant::recent();
        // High's head has time, but its newest, behind 30 items at 1 ms doubled, does not.
        let mut high = vec![Some(1_000)];
        high.extend([Some(40); 29]);
        let (t, backlog) = tiers(now, [&[Some(20)], &[], &high, &[]]);
        assert_eq!(slack(1).choose(&t, backlog, backlog, Some(2), now), Some(2));
        // With 10 items behind it, it does.
        let (t, backlog) = tiers(now, [&[Some(20)], &[], &high[..10], &[]]);
        assert_eq!(slack(1).choose(&t, backlog, backlog, Some(2), now), Some(0));
    }

    #[test]
    fn a_borrowing_tier_is_served_only_out_of_the_weighted_order() {
        let now = Instant::recent();
        let (t, backlog) = tiers(now, [&[Some(50)], &[], &[], &[Some(1_000)]]);
        // Sheddable is past its share (not a candidate): served only because it is due first
        // and Critical can wait.
        assert_eq!(slack(1).choose(&t, backlog, 0b1001, Some(3), now), Some(0));
        // Alone and borrowing, with nothing more important queued: served.
        let (t, backlog) = tiers(now, [&[Some(50)], &[], &[], &[]]);
        assert_eq!(slack(1).choose(&t, backlog, 0b0001, None, now), Some(0));
        // Behind Critical work that cannot wait: not served, even with a worker idle.
        let (t, backlog) = tiers(now, [&[Some(50)], &[], &[], &[Some(3)]]);
        assert_eq!(slack(1).choose(&t, backlog, 0b0001, None, now), None);
    }

    #[test]
    fn a_head_past_its_deadline_is_not_taken_for_due_first() {
        let now = Instant::recent();
        let later = now + Duration::from_millis(100);
        // Sheddable's head passed its deadline at `later`; Medium is due next.
        let (t, backlog) = tiers(now, [&[Some(50)], &[Some(500)], &[], &[Some(1_000)]]);
        assert_eq!(
            slack(1).choose(&t, backlog, backlog, Some(3), later),
            Some(1)
        );
    }
}
