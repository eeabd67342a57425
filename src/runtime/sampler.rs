//! The sampler: on a timer, it measures the signals (arrival, capacity, lag, the work waiting)
//! into pull-based admission, stores the shed level and the backlog's clearing time the gate
//! and the deferral part read, and sets the gauges. Nothing here runs per message.

use crate::sync::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::admission::{PullAdmission, PullSample};
use crate::runtime::engine::Inner;
use crate::Criticality;

impl<T: Send + Sync + 'static> Inner<T> {
    /// Gauges and the admission clock, on a timer: nothing here runs per message.
    pub(crate) async fn sampler(self: Arc<Self>) {
        let mut every = Duration::from_millis(self.config().expert.admission.tick_ms);
        let mut pull = PullAdmission::new(&self.config().expert.admission);
        let mut generation = self.live.generation();
        // What the queue's deadline order was last given (`None`: service by weight alone).
        let mut drain: Option<(Duration, [Duration; 4])> = None;
        loop {
            // A live reconfiguration: the state machine keeps its window and level.
            if self.live.generation() != generation {
                let config = self.config();
                generation = self.live.generation();
                pull.reconfigure(&config.expert.admission);
                every = Duration::from_millis(config.expert.admission.tick_ms);
            }
            tokio::select! {
                _ = self.lifecycle.stop.cancelled() => {
                    self.flush_reject_costs();
                    self.accounts.publish_counts();
                    return;
                }
                _ = tokio::time::sleep(every) => {}
            }
            self.flush_reject_costs();
            self.accounts.publish_counts();
            self.sweep_patience();
            let period = crate::admission::rotation_period();
            if self.accounts.cohort_period.load(Ordering::Relaxed) != period {
                self.accounts.cohort_period.store(period, Ordering::Relaxed);
            }
            let lag = self.signals.lag();
            let measured = &self.signals.measured;
            let sample = PullSample {
                at: self.clock.now().saturating_duration_since(self.origin),
                lag,
                pulled: std::array::from_fn(|r| measured.sum(|m| &m.pulled[r])),
                served: measured.sum(|m| &m.served),
                busy: Duration::from_nanos(measured.sum(|m| &m.busy_ns)),
                limit: self.limit.limit(),
                waiting: (self.queue.len() as u64)
                    .saturating_add(self.signals.held.load(Ordering::Relaxed).max(0) as u64),
                with_deadline: std::array::from_fn(|r| {
                    measured.sum(|m| &m.pulled_with_deadline[r])
                }),
                slack: std::array::from_fn(|r| {
                    Duration::from_micros(measured.sum(|m| &m.slack_us[r]))
                }),
            };
            let cohort_pulled = std::array::from_fn(|r| {
                std::array::from_fn(|c| measured.sum(|m| &m.cohort_pulled.0[r][c]))
            });
            pull.observe_cohorts(sample.at, &cohort_pulled);
            let level = pull.observe(&sample);
            self.derive(&pull, &mut drain);
            // The work ahead of a drain: the sources' lag and what is pulled and waiting.
            let ahead = sample.lag.unwrap_or(0).saturating_add(sample.waiting);
            let clear_ns = match pull.capacity() {
                Some(capacity) if ahead > 0 && capacity > 0.0 => {
                    (ahead as f64 / capacity * 1e9).min(u64::MAX as f64) as u64
                }
                _ => 0,
            };
            self.signals
                .backlog_clear_ns
                .store(clear_ns, Ordering::Relaxed);
            self.sample_toolbox();
            tracing::trace!(
                level,
                arrival = pull.arrival_rate(),
                capacity = pull.capacity(),
                lag = sample.lag,
                wait = ?pull.predicted_wait(),
                "pull-based admission tick"
            );
            let was = self.signals.set_shed(level, pull.admitted_set());
            if level == 0 {
                self.signals
                    .shedding_since_ns
                    .store(u64::MAX, Ordering::Relaxed);
            } else if was == 0 {
                self.signals
                    .shedding_since_ns
                    .store(self.recent_ns(), Ordering::Relaxed);
            }
            let m = &self.accounts.metrics;
            let depths = self.queue.depths();
            let ages = self.queue.ages();
            self.queue.refresh_admission();
            for tier in Criticality::ALL {
                m.tiers[tier].depth.set(depths[tier] as f64);
                m.tiers[tier].age.set(ages[tier].as_secs_f64());
            }
            m.shed_level.set(f64::from(level));
            m.cohorts_admitted.set(f64::from(pull.admitted_cohorts()));
            m.arrival_rate.set(pull.arrival_rate());
            m.capacity.set(pull.capacity().unwrap_or(0.0));
            m.lag.set(lag.map_or(-1.0, |l| l as f64));
            m.in_flight.set(self.limit.in_flight() as f64);
            m.limit.set(self.limit.limit() as f64);
            m.held.set(self.signals.held.load(Ordering::Relaxed) as f64);
            m.circuits_open.set(self.breakers.open_count() as f64);
            m.circuits_opened.absolute(self.breakers.opened_total());
            m.breaker_untracked.absolute(self.breakers.untracked());
            m.dead_letters_held
                .set(self.dead_letters.held.load(Ordering::Relaxed) as f64);
            m.ordering_keys.set(self.keys.keys_in_flight() as f64);
            m.ordering_parked.set(self.keys.parked() as f64);
            m.ordering_longest_wait
                .set(self.keys.longest_wait(self.clock.now()).as_secs_f64());
        }
    }

    /// Applies what the runtime derives from `pull`'s measurements, unless the expert switch
    /// `derive_bounds` is off: how far the intake pulls ahead and looks past busy ordering keys
    /// (`admission::derived_lookahead`), and the time per pop that orders the queue's service
    /// by deadline, with each tier's longest handler run (`WfqQueue::set_drain`; the workers
    /// pop by weight alone while a message is parked behind a busy key, see `dispatch.rs`).
    /// `drain` is what was applied before.
    fn derive(&self, pull: &PullAdmission, drain: &mut Option<(Duration, [Duration; 4])>) {
        let config = self.config();
        let derive = config.expert.admission.derive_bounds;
        let lookahead = derive
            .then(|| crate::admission::derived_lookahead(pull, self.prefetch()))
            .flatten()
            .map_or(0, |l| l as u64);
        self.signals.lookahead.store(lookahead, Ordering::Relaxed);
        // Half the queue at most, so that pulling ahead never fills it: a full queue refuses.
        let half = config.expert.queue.capacity.get() as u64 / 2;
        self.signals
            .pull_ahead
            .store(lookahead.min(half), Ordering::Relaxed);
        let per_pop = derive
            .then(|| pull.capacity().filter(|c| *c > 0.0))
            .flatten()
            .map(|c| Duration::from_secs_f64((1.0 / c).min(1.0)));
        let measured = &self.signals.measured;
        let longest: [Duration; 4] =
            std::array::from_fn(|r| Duration::from_nanos(measured.max(|m| &m.longest_run_ns[r])));
        let next = per_pop.map(|p| (p, longest));
        if next != *drain {
            self.queue.set_drain(next);
            *drain = next;
        }
    }

    /// Moves the reject path's sampled costs into `triage_reject_cost_seconds` (the
    /// exporter's histogram may allocate; the refuse path must not).
    pub(crate) fn flush_reject_costs(&self) {
        let histogram = &self.accounts.metrics.reject_cost;
        self.reject_costs
            .drain(|cost| histogram.record(cost.as_secs_f64()));
    }
}
