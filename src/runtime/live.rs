//! The live levels: what a reconfiguration changes besides the configuration itself, read
//! lock-free on the hot path (the operator's forced shed and brownout levels), and the
//! reconfigurations' own count (the generation, the refused).
//!
//! Each level lives here and only here. [`RuntimeConfig::forced_shed_level`] and
//! [`RuntimeConfig::brownout_level`] are what the operator asks for: [`Live::set_levels`]
//! takes them when a configuration is applied (at start, over the defaults, through the same
//! path as a live reconfiguration), and everything else (the gate, the intakes, the workers,
//! the policy step, the gauges) reads the level from here, never from the configuration.

use crate::sync::{AtomicU64, AtomicU8, Ordering};

use crate::runtime::RuntimeConfig;

/// What a live reconfiguration changes besides the configuration itself, read lock-free on
/// the hot path.
#[derive(Debug)]
pub(crate) struct Live {
    /// 0 while the parts are built, 1 once the configuration is applied at start, one more
    /// per applied reconfiguration.
    generation: AtomicU64,
    /// Reconfigurations and reloads refused (`triage_config_refused_total`).
    refused: AtomicU64,
    /// `RuntimeConfig::forced_shed_level`.
    forced_level: AtomicU8,
    /// When the forced level last rose from 0 (ns since the runtime's origin; `u64::MAX`
    /// while it is 0): how long the operator has kept tiers refused, which is how long the
    /// drains have been closed by it.
    forced_since_ns: AtomicU64,
    /// `RuntimeConfig::brownout_level`.
    brownout: AtomicU8,
    /// One reconfiguration at a time.
    serial: parking_lot::Mutex<()>,
}

impl Live {
    /// The levels of the defaults (none forced, full service), before any configuration is
    /// applied: the starting configuration's levels come through [`set_levels`](Self::set_levels).
    pub(crate) fn new() -> Self {
        Live {
            generation: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            forced_level: AtomicU8::new(0),
            forced_since_ns: AtomicU64::new(u64::MAX),
            brownout: AtomicU8::new(0),
            serial: parking_lot::Mutex::new(()),
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Acquire)
    }

    /// The operator's forced shed level: tiers with `rank() < level` are refused.
    #[inline]
    pub(crate) fn forced_level(&self) -> u8 {
        self.forced_level.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn brownout(&self) -> u8 {
        self.brownout.load(Ordering::Relaxed)
    }

    /// How long the forced level has been above 0 at `now_ns` (ns since the runtime's
    /// origin); `None` while it is 0.
    pub(crate) fn forced_for(&self, now_ns: u64) -> Option<std::time::Duration> {
        let since = self.forced_since_ns.load(Ordering::Relaxed);
        (since != u64::MAX && self.forced_level() > 0)
            .then(|| std::time::Duration::from_nanos(now_ns.saturating_sub(since)))
    }

    /// Takes the levels of `config` (phase 2 of applying it, at start or live) at `now_ns` (ns
    /// since the runtime's origin): the one place they are read from a configuration. A forced
    /// level rising from 0 starts its episode; one that stays above 0, whatever its value,
    /// continues it (the drains stay closed throughout).
    pub(crate) fn set_levels(&self, config: &RuntimeConfig, now_ns: u64) {
        let was = self
            .forced_level
            .swap(config.forced_shed_level, Ordering::Relaxed);
        if config.forced_shed_level == 0 {
            self.forced_since_ns.store(u64::MAX, Ordering::Relaxed);
        } else if was == 0 {
            self.forced_since_ns.store(now_ns, Ordering::Relaxed);
        }
        self.brownout
            .store(config.brownout_level, Ordering::Relaxed);
    }

    /// One more applied reconfiguration: the new generation.
    pub(crate) fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// One more refused reconfiguration.
    pub(crate) fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::AcqRel);
    }

    /// One reconfiguration at a time: held while one is checked and applied, and while the
    /// configuration and its generation are read together.
    pub(crate) fn serial(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.serial.lock()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn levels(forced: u8, brownout: u8) -> RuntimeConfig {
        RuntimeConfig {
            forced_shed_level: forced,
            brownout_level: brownout,
            ..RuntimeConfig::default()
        }
    }

    #[test]
    fn a_forced_episode_starts_when_the_level_rises_from_0_and_lasts_while_above() {
        let live = Live::new();
        assert_eq!(live.forced_for(10), None);
        live.set_levels(&levels(1, 2), 100);
        assert_eq!((live.forced_level(), live.brownout()), (1, 2));
        assert_eq!(live.forced_for(350), Some(Duration::from_nanos(250)));
        // Raised further: the same episode.
        live.set_levels(&levels(3, 0), 200);
        assert_eq!(live.forced_for(350), Some(Duration::from_nanos(250)));
        // Lifted: over; raised again: a new one.
        live.set_levels(&levels(0, 0), 300);
        assert_eq!(live.forced_for(350), None);
        live.set_levels(&levels(2, 0), 400);
        assert_eq!(live.forced_for(450), Some(Duration::from_nanos(50)));
    }

    #[test]
    fn the_levels_start_at_the_defaults_and_come_from_an_applied_configuration() {
        let live = Live::new();
        assert_eq!((live.forced_level(), live.brownout()), (0, 0));
        // Starting with a level: applied at the start, its episode starts then.
        live.set_levels(&levels(2, 1), 0);
        assert_eq!((live.forced_level(), live.brownout()), (2, 1));
        assert_eq!(live.forced_for(40), Some(Duration::from_nanos(40)));
    }

    #[test]
    fn the_generation_counts_the_applied_and_the_refused_apart() {
        let live = Live::new();
        assert_eq!(live.generation(), 0);
        assert_eq!(live.next_generation(), 1);
        assert_eq!(live.next_generation(), 2);
        live.count_refused();
        assert_eq!((live.generation(), live.refused()), (2, 1));
    }
}
