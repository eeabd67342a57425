//! A handler call as both consumers make it: wait the message's service time, then succeed
//! (recorded in the tally) or fail as the outcome process says.

use std::sync::Arc;

use parking_lot::Mutex;
use triage::quanta::Clock;

use crate::msg::Msg;
use crate::scenario::Scenario;
use crate::service::{Outcomes, ServiceTime};
use crate::tally::Tally;

/// What a handler needs to serve a message.
#[derive(Debug)]
pub struct Work {
    seed: u64,
    service: ServiceTime,
    outcomes: Outcomes,
    tally: Arc<Mutex<Tally>>,
    clock: Clock,
    start: tokio::time::Instant,
}

impl Work {
    /// Work of `scenario`, recording completions in `tally` on `clock`; the service time's
    /// slow-down is timed from now on tokio's clock.
    pub fn new(scenario: &Scenario, tally: Arc<Mutex<Tally>>, clock: Clock) -> Self {
        Work {
            seed: scenario.seed,
            service: scenario.service,
            outcomes: scenario.outcomes,
            tally,
            clock,
            start: tokio::time::Instant::now(),
        }
    }

    /// Serves attempt `attempt` of `msg`: `true` when it succeeded.
    pub async fn serve(&self, msg: &Msg, attempt: u32) -> bool {
        let took = self
            .service
            .draw(self.seed, msg.id, attempt, self.start.elapsed());
        tokio::time::sleep(took).await;
        if self.outcomes.fails(self.seed, msg.id, attempt, msg.to_b) {
            return false;
        }
        let now = self.clock.now();
        self.tally.lock().complete(msg.id, now);
        true
    }
}
