//! A short form of `examples/overload`: the same run, seconds long, asserting the ledger
//! balance and the ordering of goodput by tier. On tokio's paused clock, with the runtime's
//! clock following it: the handlers' service time, the arrivals and the deadlines are virtual,
//! so the run is the same however busy the machine is.

mod common;
#[path = "../examples/overload/src/sim.rs"]
mod sim;

use std::time::Duration;

use triage::Criticality;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn three_x_overload_keeps_critical_goodput_and_the_ledger_balanced() {
    // The example's runtime and mix, but shed tiers re-admitted after 150 ms instead of
    // 500 ms and Medium useful for 2 s instead of 250 ms: a refused message is deferred only
    // while a drain could be expected to bring it back before its deadline (`recover_ms` plus
    // the time shedding has lasted, and the time the backlog ahead takes to clear), so
    // Medium's refusals early in the overload are deferred (and, the overload lasting 3 s,
    // mostly expire on their way back), and none of Sheddable's 100 ms window is.
    let mut base = triage::runtime::RuntimeConfig {
        workers: 8.try_into().unwrap(),
        ..triage::runtime::RuntimeConfig::default()
    };
    base.expert.poll_interval_ms = 1;
    base.expert.queue.capacity = 256.try_into().unwrap();
    base.expert.admission.recover_ms = 150;
    let mut windows = sim::Params::default().windows;
    windows[Criticality::Medium] = Duration::from_secs(2);
    let params = sim::Params {
        windows,
        duration: Duration::from_secs(3),
        recovery: Duration::from_secs(2),
        base: Some(base),
        clock: Some(common::following_tokio()),
        ..sim::Params::default()
    };
    let out = sim::run(&params).await;
    println!("{}", sim::table("triage", &out.triage));
    println!("{}", sim::table("fifo", &out.fifo));
    println!("{}", out.stats);

    assert!(out.balances, "ledger does not balance:\n{}", out.stats);
    assert_eq!(out.stats.alive, 0);
    let t = out.stats.ledger.total();
    assert_eq!(t.consumed, t.settled() + t.released);

    // Memory stays bounded whatever the offered load: the excess waits in the broker.
    assert!(
        out.max_alive <= out.alive_bound,
        "{} > {}",
        out.max_alive,
        out.alive_bound
    );
    // Goodput share is ordered by tier: Critical >= High >= Medium >= Sheddable.
    let share = |c: Criticality| out.triage[c].goodput_share();
    let ladder = [
        Criticality::Critical,
        Criticality::High,
        Criticality::Medium,
        Criticality::Sheddable,
    ];
    for pair in ladder.windows(2) {
        assert!(
            share(pair[0]) >= share(pair[1]),
            "{} {:.3} < {} {:.3}",
            pair[0],
            share(pair[0]),
            pair[1],
            share(pair[1])
        );
    }
    // Sheddable is what gives way, and Critical does better than under a plain FIFO: at
    // least 99.9% in time (the bar the proving ground holds it to at 3x).
    assert!(share(Criticality::Sheddable) < 0.5);
    assert!(share(Criticality::Critical) > out.fifo[Criticality::Critical].goodput_share());
    assert!(
        share(Criticality::Critical) >= 0.999,
        "{}",
        share(Criticality::Critical)
    );
    // Recovery: once load falls, every tier is admitted again with no manual step. After that
    // the deferred work drained back may shed Sheddable for a moment (its cut-off is 20 ms of
    // queue age, and the drain pulls whenever workers are idle), never a tier above it.
    let levels = &out.recovery_shed_levels;
    let reopened = levels.iter().position(|&l| l == 0);
    assert!(
        reopened.is_some(),
        "never re-admitted every tier: {levels:?}"
    );
    assert!(
        levels[reopened.unwrap_or(0)..].iter().all(|&l| l <= 1),
        "shed more than Sheddable after recovering: {levels:?}"
    );
    for tier in Criticality::ALL {
        assert!(
            out.recovery[tier].admitted > 0,
            "{tier} not admitted during recovery"
        );
    }
    // Deferred copies keep their tier: a Medium message deferred at 3x is consumed again as
    // Medium when it is drained back (it used to come back as Sheddable), and every copy ended
    // completed or expired at intake (its deadline is kept), none left behind.
    let medium = out.stats.ledger.tier(Criticality::Medium);
    let offered_medium =
        out.triage[Criticality::Medium].offered + out.recovery[Criticality::Medium].offered;
    assert!(
        medium.deferred > 0,
        "nothing deferred at 3x:\n{}",
        out.stats
    );
    assert_eq!(
        medium.consumed,
        offered_medium + medium.deferred,
        "Medium's drained copies not consumed as Medium:\n{}",
        out.stats
    );
    assert_eq!(out.deferred_left, 0);
    // Sheddable's 100 ms window is shorter than the 150 ms a shed level takes to come down, so
    // no Sheddable message is worth a copy: each refused one is shed at once.
    assert_eq!(
        out.stats.ledger.tier(Criticality::Sheddable).deferred,
        0,
        "a copy that could only expire:\n{}",
        out.stats
    );
    assert_eq!(
        out.drained.published,
        out.stats.ledger.total().deferred,
        "a deferral without its copy:\n{}",
        out.stats
    );
    assert_eq!(
        out.drained.completed + out.drained.expired + out.drained.deferred + out.drained.shed,
        out.drained.published,
        "a deferred copy left unsettled: {:?}",
        out.drained
    );
}
