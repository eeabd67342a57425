//! Recovery after an overload step, read from the shed level sampled during the run
//! (`Runtime::load().shed_tiers()`: 0 when every tier is admitted).

use std::time::Duration;

/// How the shed level behaved around a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Time from the step's end until every tier was admitted again (0 if none was shed at
    /// its end); `None`: not within the run.
    pub readmitted_after: Option<Duration>,
    /// Direction changes of the shed level from the step's end to the end of the run.
    pub changes_after: u32,
    /// Direction changes from the step's start to its end.
    pub changes_during: u32,
    /// The highest level seen.
    pub peak: u8,
}

/// Direction changes in a sequence of levels (flat stretches do not count).
fn direction_changes(levels: impl Iterator<Item = u8>) -> u32 {
    let mut last: Option<u8> = None;
    let mut dir = 0i8;
    let mut changes = 0;
    for l in levels {
        if let Some(p) = last {
            let d = match l.cmp(&p) {
                std::cmp::Ordering::Greater => 1,
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
            };
            if d != 0 {
                if dir != 0 && d != dir {
                    changes += 1;
                }
                dir = d;
            }
        }
        last = Some(l);
    }
    changes
}

/// Recovery from `series` (time since start, level) for a step from `start` to `end`.
pub fn recovery(series: &[(Duration, u8)], start: Duration, end: Duration) -> Recovery {
    let readmitted_after = series
        .iter()
        .find(|(t, l)| *t >= end && *l == 0)
        .map(|(t, _)| *t - end);
    Recovery {
        readmitted_after,
        changes_after: direction_changes(series.iter().filter(|(t, _)| *t >= end).map(|p| p.1)),
        changes_during: direction_changes(
            series
                .iter()
                .filter(|(t, _)| *t >= start && *t < end)
                .map(|p| p.1),
        ),
        peak: series.iter().map(|p| p.1).max().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_turns_not_steps() {
        assert_eq!(direction_changes([0, 1, 2, 2, 3, 1, 0].into_iter()), 1);
        assert_eq!(direction_changes([0, 2, 0, 2, 0].into_iter()), 3);
        assert_eq!(direction_changes([3, 3, 3].into_iter()), 0);
    }

    #[test]
    fn readmission_is_timed_from_the_end_of_the_step() {
        let ms = Duration::from_millis;
        let s = [
            (ms(0), 0),
            (ms(10), 2),
            (ms(20), 2),
            (ms(30), 1),
            (ms(40), 0),
        ];
        let r = recovery(&s, ms(5), ms(20));
        assert_eq!(r.readmitted_after, Some(ms(20)));
        assert_eq!(r.peak, 2);
        assert_eq!(r.changes_after, 0);
    }
}
