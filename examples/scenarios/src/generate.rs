//! The producer: publishes the scenario's arrivals into a broker, a Poisson count per
//! millisecond of tokio's clock, each message recorded in the tally.

use std::time::Duration;

use parking_lot::Mutex;
use triage::admission::cohort;
use triage::quanta::{Clock, Instant};

use crate::arrival::poisson;
use crate::broker::SimBroker;
use crate::hash;
use crate::msg::Msg;
use crate::scenario::Scenario;
use crate::tally::Tally;

fn offer(sc: &Scenario, rng: &mut fastrand::Rng, tally: &Mutex<Tally>, published: Instant) -> Msg {
    let tier = sc.mix.tier(rng.f64());
    let key = sc.hot_key.map(|h| {
        if rng.f64() < h.share {
            0
        } else {
            1 + rng.u64(0..h.others)
        }
    });
    let size = sc.sizes.map_or(0, |z| {
        if rng.f64() < z.large_share {
            z.large
        } else {
            z.small
        }
    });
    tally.lock().offer(|id| {
        // Each tier's users are its own: a user is (tier, index), hashed for its cohort.
        let user = key.unwrap_or_else(|| hash::bits(sc.seed, 5, id) % u64::from(sc.users.max(1)));
        let user_bits =
            key.unwrap_or_else(|| hash::bits(sc.seed, 6, (tier.rank() as u64) << 32 | user));
        Msg {
            id,
            tier,
            published,
            deadline: published + sc.mix.windows[tier],
            to_b: sc.outcomes.bound_for_b(sc.seed, id),
            size,
            key,
            resubmits: 0,
            user,
            cohort: cohort(user_bits, 0),
        }
    })
}

/// Publishes the backlog (if any) at once, then the arrivals until the scenario's end.
pub async fn generate(sc: &Scenario, broker: &SimBroker, tally: &Mutex<Tally>, clock: &Clock) {
    let mut rng = fastrand::Rng::with_seed(sc.seed);
    let per_ms = sc.capacity_per_s() / 1000.0;
    if let Some(backlog) = sc.backlog {
        let n = (backlog.as_secs_f64() * sc.capacity_per_s()) as u64;
        let now = clock.now();
        for i in 0..n {
            let age = backlog.mul_f64(1.0 - (i as f64 + 0.5) / n as f64);
            let msg = offer(sc, &mut rng, tally, now - age);
            broker.publish(msg, msg.tier, 0);
        }
    }
    let ms = sc.duration().as_millis() as u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for k in 0..ms {
        tick.tick().await;
        let lambda = sc.arrival.factor_at(Duration::from_millis(k)) * per_ms;
        let n = poisson(&mut rng, lambda);
        let now = clock.now();
        for _ in 0..n {
            let msg = offer(sc, &mut rng, tally, now);
            broker.publish(msg, msg.tier, 0);
        }
    }
}
