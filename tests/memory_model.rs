//! Model test of the memory budget: arbitrary sequences of messages entering and leaving,
//! waiting and offered again, with sizes anywhere in `u64` (a header or a producer may claim
//! any), and live reconfigurations, run against [`MemoryBudget`] and against a plain list of
//! the messages alive summed in 128 bits. Every reading and decision must match after each
//! step, and nothing may panic. Also: any configuration, valid or not, either validates to
//! limits within the budget, ordered by tier, or is refused naming its field; applied
//! unvalidated, it never panics.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use triage::admission::{MemoryBudget, MemoryConfig, MAX_BUDGET_BYTES};
use triage::{Criticality, PerTier};

#[derive(Clone, Debug)]
enum Action {
    Add(u64),
    /// The `n`-th alive message (modulo their number) leaves.
    Remove(usize),
    /// It starts waiting (held or parked).
    Wait(usize),
    /// It is offered again.
    Offer(usize),
    Apply(Option<u64>),
}

/// Mostly small sizes, some of the budget's order, and now and then one so large that a few
/// add up past `u64::MAX`.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        10 => 1..200u64,
        3 => 200..3_000u64,
        1 => Just(0u64),
        1 => (u64::MAX / 2)..=u64::MAX,
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => size().prop_map(Action::Add),
        4 => any::<usize>().prop_map(Action::Remove),
        2 => any::<usize>().prop_map(Action::Wait),
        2 => any::<usize>().prop_map(Action::Offer),
        1 => proptest::option::of(prop_oneof![1..5_000u64, Just(MAX_BUDGET_BYTES)]).prop_map(Action::Apply),
    ]
}

/// The rules, as plainly as possible: the messages alive with their waiting flag, and the
/// sizes added since the window started afresh.
struct Model {
    alive: Vec<(u64, bool)>,
    budget: Option<u64>,
    /// Sizes (non-zero) added since the last reconfiguration, in order.
    sized: Vec<u64>,
    peak: u128,
}

impl Model {
    fn held(&self) -> u128 {
        self.alive.iter().map(|&(s, _)| u128::from(s)).sum()
    }
    fn waiting(&self) -> u128 {
        self.alive
            .iter()
            .filter(|&&(_, w)| w)
            .map(|&(s, _)| u128::from(s))
            .sum()
    }
    fn working(&self) -> u128 {
        self.held() - self.waiting()
    }
    /// The largest of the messages since the start of the previous window: windows are
    /// `LARGEST_WINDOW` messages long, counted from the last reconfiguration.
    fn largest(&self) -> u64 {
        let w = MemoryBudget::LARGEST_WINDOW as usize;
        let n = self.sized.len();
        if n == 0 {
            return 0;
        }
        let current = (n - 1) / w;
        let from = current.saturating_sub(1) * w;
        self.sized[from..].iter().copied().max().unwrap_or(0)
    }
    fn limit(&self, tier: Criticality) -> Option<u64> {
        MemoryConfig {
            budget_bytes: self.budget,
            ..MemoryConfig::default()
        }
        .limit_bytes(tier)
    }
    fn admits(&self, tier: Criticality, size: u64) -> bool {
        match self.limit(tier) {
            None => true,
            Some(limit) => {
                self.working() <= u128::from(limit) || self.working() <= u128::from(size)
            }
        }
    }
    fn may_pull(&self) -> bool {
        match self.budget {
            None => true,
            Some(b) => {
                self.held() == 0 || self.held() + u128::from(self.largest()) <= u128::from(b)
            }
        }
    }
}

fn saturated(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn config() -> impl Strategy<Value = MemoryConfig> {
    let threshold = prop_oneof![
        4 => 0.0..=1.0f64,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(-0.5f64),
        1 => Just(1.5f64),
        1 => Just(0.0f64),
    ];
    (
        proptest::option::of(prop_oneof![
            Just(0u64),
            1..10_000u64,
            Just(MAX_BUDGET_BYTES),
            Just(MAX_BUDGET_BYTES + 1),
            Just(u64::MAX),
            any::<u64>(),
        ]),
        proptest::array::uniform4(threshold),
    )
        .prop_map(|(budget_bytes, [c, h, m, s])| MemoryConfig {
            budget_bytes,
            thresholds: PerTier::new(c, h, m, s),
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/memory_model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_budget_follows_the_model(
        budget in proptest::option::of(1..5_000u64),
        actions in proptest::collection::vec(action(), 1..400),
    ) {
        let b = MemoryBudget::new(&MemoryConfig { budget_bytes: budget, ..MemoryConfig::default() });
        let mut m = Model { alive: Vec::new(), budget, sized: Vec::new(), peak: 0 };
        for action in actions {
            match action {
                Action::Add(size) => {
                    b.add(size);
                    m.alive.push((size, false));
                    if size != 0 {
                        m.sized.push(size);
                    }
                    m.peak = m.peak.max(m.held());
                }
                Action::Remove(i) if !m.alive.is_empty() => {
                    let (size, waiting) = m.alive.remove(i % m.alive.len());
                    b.remove(size, waiting);
                }
                Action::Wait(i) if !m.alive.is_empty() => {
                    let i = i % m.alive.len();
                    if !m.alive[i].1 {
                        m.alive[i].1 = true;
                        b.mark_waiting(m.alive[i].0);
                    }
                }
                Action::Offer(i) if !m.alive.is_empty() => {
                    let i = i % m.alive.len();
                    if m.alive[i].1 {
                        m.alive[i].1 = false;
                        b.unmark_waiting(m.alive[i].0);
                    }
                }
                Action::Apply(budget) => {
                    b.apply(&MemoryConfig { budget_bytes: budget, ..MemoryConfig::default() });
                    m.budget = budget;
                    m.sized.clear();
                }
                _ => {}
            }
            prop_assert_eq!(b.held(), saturated(m.held()));
            prop_assert_eq!(b.waiting(), saturated(m.waiting()));
            prop_assert_eq!(b.working(), saturated(m.working()));
            prop_assert_eq!(b.peak(), saturated(m.peak));
            prop_assert_eq!(b.largest(), m.largest());
            prop_assert_eq!(b.budget(), m.budget);
            prop_assert_eq!(b.may_pull(), m.may_pull());
            for tier in Criticality::ALL {
                for probe in [1u64, 100, u64::MAX] {
                    prop_assert_eq!(b.admits(tier, probe), m.admits(tier, probe), "{} {}", tier, probe);
                }
            }
        }
        // Every byte leaves with its message.
        for (size, waiting) in m.alive.drain(..) {
            b.remove(size, waiting);
        }
        prop_assert_eq!((b.held(), b.waiting(), b.working()), (0, 0, 0));
        prop_assert!(b.may_pull());
    }

    /// Any configuration validates to limits within the budget, ordered from Critical down,
    /// or is refused naming a field of the table; applied unvalidated it never panics.
    #[test]
    fn any_configuration_validates_to_ordered_limits_or_names_its_field(config in config()) {
        match config.validate() {
            Ok(()) => {
                let budget = config.budget_bytes;
                prop_assert!(budget.is_none_or(|b| (1..=MAX_BUDGET_BYTES).contains(&b)));
                let limits: Vec<Option<u64>> =
                    Criticality::ALL.iter().map(|&t| config.limit_bytes(t)).collect();
                for (limit, next) in limits.iter().zip(&limits[1..]) {
                    prop_assert!(next <= limit, "{:?}", limits);
                }
                for limit in limits.into_iter().flatten() {
                    prop_assert!(budget.is_some_and(|b| limit <= b));
                }
            }
            Err(e) => {
                let field = e.field().to_string();
                prop_assert!(
                    field == "budget_bytes" || field.starts_with("thresholds."),
                    "{}", field
                );
            }
        }
        let b = MemoryBudget::new(&config);
        b.add(u64::MAX);
        b.add(1);
        let _ = (b.admits(Criticality::Sheddable, 1), b.may_pull(), b.working());
        b.remove(u64::MAX, false);
        b.remove(1, false);
        prop_assert_eq!(b.held(), 0);
    }
}
