//! Cheap time for the queue's hot path.
//!
//! Every push stamps its item and every pop compares a deadline, so reading the clock is a
//! large share of the queue's cost: `quanta::Clock::now` is a TSC read and a scaling, about
//! 10 ns here. `Clock::recent` is one atomic load of a time refreshed every millisecond by
//! quanta's upkeep thread. Queue ages are compared with cut-offs of tens of milliseconds, so
//! 1 ms of staleness changes no admission decision, and the queue stamps items and measures
//! ages with recent time whenever the upkeep thread runs.
//!
//! Deadlines stay exact (an item whose deadline has passed is never served), yet most pops
//! read no clock: a deadline at or before recent time has passed; one more than
//! [`DEADLINE_WINDOW`] after it has not, since recent time lags the true time by less than
//! that; only a deadline inside the window is checked against a precise read. Items without a
//! deadline cost no clock read at all. With a mock clock, `recent` is the mock's value, so
//! tests stay exact.
//!
//! What this gives up: the guarantee rests on the upkeep thread refreshing recent time at
//! least once per window. The window is four refresh periods, so a refresh may be late by
//! three milliseconds (the thread descheduled on a loaded machine) before an item whose
//! deadline passed within that lag could be served as ready.

use std::sync::OnceLock;
use std::time::Duration;

/// How often the upkeep thread refreshes recent time.
pub(crate) const RESOLUTION: Duration = Duration::from_millis(1);

/// A deadline later than recent time by more than this has not passed (see the module docs):
/// the resolution, plus three refreshes of slack for a late upkeep thread.
pub(crate) const DEADLINE_WINDOW: Duration = Duration::from_millis(4);

static UPKEEP: OnceLock<bool> = OnceLock::new();

/// Starts quanta's upkeep thread once per process; `true` when recent time is maintained.
pub(crate) fn recent_time_available() -> bool {
    // Loom models only its own threads: no upkeep thread, every read is a clock read.
    if cfg!(loom) {
        return false;
    }
    *UPKEEP.get_or_init(|| match quanta::Upkeep::new(RESOLUTION).start() {
        Ok(handle) => {
            // The thread serves every queue for the life of the process.
            std::mem::forget(handle);
            true
        }
        // Someone else runs it: recent time is maintained.
        Err(quanta::Error::UpkeepRunning) => true,
        Err(_) => false,
    })
}
