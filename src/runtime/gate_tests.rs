//! The gate's rules, on a fake: each check in its order, and what each one asks.

use super::*;
use Criticality::*;
use Denied::Refused;

/// Every check admits, unless told otherwise; counts the tokens taken.
struct Fake {
    expired: bool,
    circuit: bool,
    forced: u8,
    shed: u8,
    busy: bool,
    memory: bool,
    full: bool,
    waits: bool,
    tokens: u32,
    asked: Vec<&'static str>,
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            expired: false,
            circuit: true,
            forced: 0,
            shed: 0,
            busy: true,
            memory: true,
            full: false,
            waits: true,
            tokens: 1,
            asked: Vec::new(),
        }
    }
}

impl Checks for Fake {
    fn expired(&self) -> bool {
        self.expired
    }
    fn circuit_admits(&mut self) -> bool {
        self.asked.push("circuit");
        self.circuit
    }
    fn forced_level(&self) -> u8 {
        self.forced
    }
    fn shed_admits(&self, tier: Criticality) -> bool {
        admits_at(self.shed, tier)
    }
    fn workers_busy(&self) -> bool {
        self.busy
    }
    fn memory_admits(&mut self, _: Criticality) -> bool {
        self.asked.push("memory");
        self.memory
    }
    fn looks_full_for(&self, _: Criticality) -> bool {
        self.full
    }
    fn waits_when_refused(&self) -> bool {
        self.waits
    }
    fn take_token(&mut self, tier: Criticality) -> Option<Grant> {
        self.asked.push("token");
        (self.tokens > 0).then(|| {
            self.tokens -= 1;
            Grant::Own(tier)
        })
    }
}

fn pulled(tier: Criticality) -> Offered {
    Offered {
        tier,
        origin: Origin::Pulled,
    }
}

fn pushed(tier: Criticality) -> Offered {
    Offered {
        tier,
        origin: Origin::Pushed,
    }
}

#[test]
fn everything_admits_and_one_token_is_taken() {
    let mut f = Fake::default();
    assert_eq!(decide(pulled(High), &mut f), Ok(Grant::Own(High)));
    assert_eq!(f.tokens, 0);
    assert_eq!(f.asked, ["circuit", "memory", "token"]);
}

#[test]
fn an_expired_message_is_denied_first_and_nothing_else_is_asked() {
    // Every check refuses too: expiry answers, before any check that could spend something
    // on a useless message (a circuit's probe, the memory budget, a token).
    let mut f = Fake {
        expired: true,
        circuit: false,
        forced: 4,
        shed: 4,
        memory: false,
        full: true,
        ..Fake::default()
    };
    assert_eq!(decide(pulled(Critical), &mut f), Err(Denied::Expired));
    assert!(f.asked.is_empty(), "{:?}", f.asked);
    assert_eq!(f.tokens, 1);
    // Pushed work too.
    let mut f = Fake {
        expired: true,
        ..Fake::default()
    };
    assert_eq!(decide(pushed(Sheddable), &mut f), Err(Denied::Expired));
}

#[test]
fn the_checks_refuse_in_their_order() {
    // Every check refuses: the first one answers, and nothing after it is asked.
    let all = || Fake {
        circuit: false,
        forced: 4,
        shed: 4,
        memory: false,
        full: true,
        tokens: 0,
        ..Fake::default()
    };
    let mut f = all();
    assert_eq!(
        decide(pulled(Critical), &mut f),
        Err(Refused(Refusal::Circuit))
    );
    assert_eq!(f.asked, ["circuit"]);
    let mut f = Fake {
        circuit: true,
        ..all()
    };
    assert_eq!(
        decide(pulled(Critical), &mut f),
        Err(Refused(Refusal::Forced))
    );
    let mut f = Fake {
        circuit: true,
        forced: 0,
        ..all()
    };
    assert_eq!(
        decide(pulled(Critical), &mut f),
        Err(Refused(Refusal::Overloaded))
    );
    assert_eq!(f.asked, ["circuit"]);
    let mut f = Fake {
        circuit: true,
        forced: 0,
        shed: 0,
        ..all()
    };
    assert_eq!(
        decide(pulled(Critical), &mut f),
        Err(Refused(Refusal::Memory))
    );
    let mut f = Fake {
        circuit: true,
        forced: 0,
        shed: 0,
        memory: true,
        ..all()
    };
    assert_eq!(
        decide(pulled(Critical), &mut f),
        Err(Refused(Refusal::Full))
    );
    assert_eq!(
        f.asked,
        ["circuit", "memory"],
        "no token spent on a refusal"
    );
    let mut f = Fake {
        circuit: true,
        forced: 0,
        shed: 0,
        memory: true,
        full: false,
        ..all()
    };
    assert_eq!(
        decide(pulled(Critical), &mut f),
        Err(Refused(Refusal::Rate))
    );
}

#[test]
fn the_levels_refuse_a_bottom_prefix_of_the_ladder() {
    for level in 0..=4u8 {
        for tier in Criticality::ALL {
            let mut f = Fake {
                forced: level,
                tokens: 1,
                ..Fake::default()
            };
            let refused = tier.rank() < level as usize;
            assert_eq!(
                decide(pulled(tier), &mut f).err(),
                refused.then_some(Refused(Refusal::Forced)),
                "forced {level} {tier:?}"
            );
            let mut f = Fake {
                shed: level,
                ..Fake::default()
            };
            assert_eq!(
                decide(pulled(tier), &mut f).err(),
                refused.then_some(Refused(Refusal::Overloaded)),
                "shed {level} {tier:?}"
            );
        }
    }
}

#[test]
fn a_shed_tier_is_admitted_while_the_workers_lack_work() {
    let mut f = Fake {
        shed: 4,
        busy: false,
        ..Fake::default()
    };
    assert!(decide(pulled(Critical), &mut f).is_ok());
}

#[test]
fn pushed_work_is_not_refused_by_the_shed_level_nor_the_queue_hint() {
    let mut f = Fake {
        shed: 4,
        full: true,
        ..Fake::default()
    };
    assert!(decide(pushed(Sheddable), &mut f).is_ok());
    // The forced level refuses pushed work too.
    let mut f = Fake {
        forced: 4,
        ..Fake::default()
    };
    assert_eq!(
        decide(pushed(Critical), &mut f),
        Err(Refused(Refusal::Forced))
    );
}

#[test]
fn the_queue_hint_refuses_only_what_would_wait() {
    let mut f = Fake {
        full: true,
        waits: false,
        ..Fake::default()
    };
    // A Drop or Defer tier goes to the push, which refuses or evicts under the lock.
    assert!(decide(pulled(Medium), &mut f).is_ok());
}
