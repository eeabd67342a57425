//! Cheap time for the queue's hot path, and an upkeep thread that sleeps while nothing reads it.
//!
//! Every push stamps its item and every pop compares a deadline, so reading the clock is a
//! large share of the queue's cost: `quanta::Clock::now` is a TSC read and a scaling, about
//! 10 ns here. [`recent`] is an atomic load of a time refreshed every millisecond by an upkeep
//! thread (quanta's global recent time, which `Clock::recent` reads). Queue ages are compared
//! with cut-offs of tens of milliseconds, so 1 ms of staleness changes no admission decision.
//!
//! Deadlines stay exact (an item whose deadline has passed is never served), yet most pops
//! read no clock: a deadline at or before recent time has passed; one more than
//! [`DEADLINE_WINDOW`] after it has not, since recent time lags the true time by less than
//! that; only a deadline inside the window is checked against a precise read. Items without a
//! deadline cost no clock read at all. With a mock clock, `recent` is the mock's value, so
//! tests stay exact.
//!
//! # The upkeep parks when unused
//!
//! A thread woken every millisecond costs CPU whether or not anything is queued: quanta's own
//! `Upkeep` measured 41 ms of CPU per second (4% of a core) in an idle Kafka worker on this
//! project's VMs, where arming a timer is a VM exit. So the upkeep thread here counts the
//! ticks in which nothing read [`recent`], and after [`PARK_AFTER_TICKS`] of them (100 ms) it
//! parks. A read that finds it parked reads the precise clock instead (never the stale recent
//! time) and wakes it; until the thread has refreshed recent time again, reads stay precise.
//! An idle worker then costs no periodic wake-up at all; a busy one pays what it paid before,
//! plus one load of [`STATE`] per read, which in steady state is a compare against a cached
//! line.
//!
//! The protocol is one atomic byte ([`UpkeepState`]): bit `USED` (set by a read, cleared by
//! each tick), bit `PARKED` (set by the thread with a compare-and-swap from "running, unused",
//! so a read that marked it used in between keeps it running), bit `WAKING` (set by the first
//! read that finds it parked, which unparks it). The thread publishes the refreshed time
//! before it clears `PARKED` with a release store, so a read that sees it running (acquire)
//! also sees the refresh. `tests/loom_queue.rs` checks that no wake-up is lost.
//!
//! What this gives up: the guarantee rests on the upkeep thread refreshing recent time at
//! least once per window while it runs. The window is four refresh periods, so a refresh may
//! be late by three milliseconds (the thread descheduled on a loaded machine) before an item
//! whose deadline passed within that lag could be served as ready. The first read after an
//! idle spell pays a precise read and a wake-up (a futex call).

// Under loom the protocol is only modelled (`loom_tests`): no thread, no static state.
#![cfg_attr(loom, allow(dead_code))]

#[cfg(not(loom))]
use std::sync::OnceLock;
use std::time::Duration;

use quanta::{Clock, Instant};

use crate::loom::{AtomicU8, Ordering};

/// How often the upkeep thread refreshes recent time.
pub(crate) const RESOLUTION: Duration = Duration::from_millis(1);

/// A deadline later than recent time by more than this has not passed (see the module docs):
/// the resolution, plus three refreshes of slack for a late upkeep thread.
pub(crate) const DEADLINE_WINDOW: Duration = Duration::from_millis(4);

/// Ticks without a read of recent time after which the upkeep thread parks: 100 ms at
/// [`RESOLUTION`].
pub(crate) const PARK_AFTER_TICKS: u32 = 100;

/// A read of recent time happened since the last tick.
const USED: u8 = 1;
/// The upkeep thread is parked (or about to): recent time is stale.
const PARKED: u8 = 2;
/// A read found it parked and woke it; it has not refreshed recent time yet.
const WAKING: u8 = 4;
/// No upkeep thread (not started, failed to start, or under loom): every read is precise.
const STOPPED: u8 = 8;

/// What a read of recent time should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// Recent time is fresh: read it.
    Recent,
    /// Recent time may be stale: read the precise clock.
    Precise,
    /// As `Precise`, and this reader found the thread parked first: it must unpark it.
    PreciseAndWake,
}

/// The upkeep thread's state shared with every reader (see the module docs).
#[derive(Debug)]
pub(crate) struct UpkeepState {
    state: AtomicU8,
}

impl UpkeepState {
    /// A state with no thread: every read is precise until [`resume`](Self::resume).
    #[cfg(any(test, loom))]
    pub(crate) fn stopped() -> Self {
        UpkeepState {
            state: AtomicU8::new(STOPPED),
        }
    }

    /// How a read of recent time should go. One load in steady state.
    #[inline]
    pub(crate) fn read(&self) -> Read {
        if self.state.load(Ordering::Acquire) == USED {
            return Read::Recent;
        }
        self.read_slow()
    }

    #[cold]
    fn read_slow(&self) -> Read {
        let s = self.state.load(Ordering::Acquire);
        if s & STOPPED != 0 {
            return Read::Precise;
        }
        if s & PARKED == 0 {
            // Running and not yet marked used this tick: mark it, unless it parked meanwhile.
            let prev = self.state.fetch_or(USED, Ordering::AcqRel);
            if prev & PARKED == 0 {
                return Read::Recent;
            }
        }
        let prev = self.state.fetch_or(USED | WAKING, Ordering::AcqRel);
        if prev & PARKED != 0 && prev & WAKING == 0 {
            Read::PreciseAndWake
        } else {
            Read::Precise
        }
    }

    /// The upkeep thread, after refreshing recent time: clears `USED` and counts `idle` ticks
    /// without a read. Returns `true` when the thread has marked itself parked and must park
    /// until [`wants_resume`](Self::wants_resume).
    pub(crate) fn tick(&self, idle: &mut u32) -> bool {
        let prev = self.state.fetch_and(!USED, Ordering::AcqRel);
        if prev & USED != 0 {
            *idle = 0;
            return false;
        }
        *idle = idle.saturating_add(1);
        if *idle < PARK_AFTER_TICKS {
            return false;
        }
        // Only from "running, unused": a read that marked it used since the fetch_and above
        // read recent time while it was fresh, and keeps the thread running.
        self.state
            .compare_exchange(0, PARKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The parked thread: whether a read has asked it to resume.
    pub(crate) fn wants_resume(&self) -> bool {
        self.state.load(Ordering::Acquire) & WAKING != 0
    }

    /// The thread, after refreshing recent time (on start, or once woken): reads may use
    /// recent time again. Release: a read that sees this sees the refresh.
    pub(crate) fn resume(&self) {
        self.state.store(USED, Ordering::Release);
    }
}

/// The process's upkeep state: a plain static, so that a read costs one load and no
/// initialisation check.
#[cfg(not(loom))]
static STATE: UpkeepState = UpkeepState {
    state: AtomicU8::new(STOPPED),
};

/// The upkeep thread, to unpark (`None` when it could not be spawned: every read then stays
/// precise).
#[cfg(not(loom))]
static THREAD: OnceLock<Option<std::thread::Thread>> = OnceLock::new();

/// Starts the upkeep thread once per process. Until its first refresh (and for good if it
/// cannot be spawned) [`recent`] reads the precise clock.
pub(crate) fn start_upkeep() {
    // Loom models only its own threads: no upkeep thread, every read is a clock read.
    #[cfg(not(loom))]
    THREAD.get_or_init(|| {
        std::thread::Builder::new()
            .name("triage-clock".into())
            .spawn(|| run(&STATE))
            .ok()
            .map(|handle| handle.thread().clone())
    });
}

/// The upkeep thread's loop: refresh, sleep a tick, park when unused.
#[cfg(not(loom))]
fn run(state: &UpkeepState) {
    let clock = Clock::new();
    quanta::set_recent(clock.now());
    state.resume();
    let mut idle = 0;
    loop {
        std::thread::sleep(RESOLUTION);
        quanta::set_recent(clock.now());
        if state.tick(&mut idle) {
            while !state.wants_resume() {
                std::thread::park();
            }
            quanta::set_recent(clock.now());
            state.resume();
            idle = 0;
        }
    }
}

/// Now, cheaply: `clock`'s recent time while the upkeep thread keeps it fresh, else a precise
/// read (waking the thread if it was parked). For a mock clock, the mock's time either way.
#[inline]
pub(crate) fn recent(clock: &Clock) -> Instant {
    #[cfg(not(loom))]
    match STATE.read() {
        Read::Recent => clock.recent(),
        Read::Precise => clock.now(),
        Read::PreciseAndWake => wake(clock),
    }
    #[cfg(loom)]
    clock.now()
}

#[cfg(not(loom))]
#[cold]
#[inline(never)]
fn wake(clock: &Clock) -> Instant {
    if let Some(Some(t)) = THREAD.get() {
        t.unpark();
    }
    clock.now()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The state machine, one step at a time: reads keep it running, 100 idle ticks park it,
    /// a read while parked is precise and the first one wakes it, and it is recent again once
    /// resumed.
    #[test]
    fn parks_when_unused_and_reads_stay_precise_until_resumed() {
        let s = UpkeepState::stopped();
        assert_eq!(s.read(), Read::Precise, "no thread: precise");
        s.resume();
        assert_eq!(s.read(), Read::Recent);
        let mut idle = 0;
        assert!(!s.tick(&mut idle), "used this tick");
        assert_eq!(idle, 0);
        // A read after a tick cleared USED marks it again and is recent.
        assert_eq!(s.read(), Read::Recent);
        assert!(!s.tick(&mut idle));
        for n in 1..PARK_AFTER_TICKS {
            assert!(!s.tick(&mut idle), "parked after {n} idle ticks");
        }
        assert!(
            s.tick(&mut idle),
            "parks after {PARK_AFTER_TICKS} idle ticks"
        );
        assert!(!s.wants_resume());
        assert_eq!(s.read(), Read::PreciseAndWake, "the first read wakes it");
        assert!(s.wants_resume());
        assert_eq!(s.read(), Read::Precise, "woken, not yet refreshed: precise");
        s.resume();
        assert_eq!(s.read(), Read::Recent);
    }

    /// A read between the tick's clear and its park keeps the thread running.
    #[test]
    fn a_read_before_the_park_keeps_it_running() {
        let s = UpkeepState::stopped();
        s.resume();
        let mut idle = PARK_AFTER_TICKS;
        s.state.fetch_and(!USED, Ordering::AcqRel);
        // The read lands after the fetch_and of the next tick would have seen nothing...
        assert_eq!(s.read(), Read::Recent);
        // ...so that tick counts it as used and does not park.
        assert!(!s.tick(&mut idle));
        assert_eq!(idle, 0);
    }

    /// The real thread: after an idle spell three times the park delay, a read is not stale.
    /// Recent time frozen when the thread parked would be at least 200 ms behind a precise
    /// read taken before it; a running thread's is within a few milliseconds, so the bound
    /// (100 ms) separates the two without timing anything.
    #[test]
    fn a_read_after_an_idle_spell_is_not_stale() {
        start_upkeep();
        let clock = Clock::new();
        for _ in 0..3 {
            // Other tests in this process may keep it running; the property holds either way.
            std::thread::sleep(Duration::from_millis(300));
            let before = clock.now();
            let read = recent(&clock);
            assert!(
                read + Duration::from_millis(100) >= before,
                "recent time {:?} behind a precise read taken before it",
                before.duration_since(read)
            );
        }
    }
}

/// The park/wake protocol under loom: every interleaving of the upkeep thread's ticks (each
/// one idle enough to park) with a reader's reads. Run with
/// `RUSTFLAGS="--cfg loom" cargo test --lib --release queue::time`.
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::atomic::{AtomicBool, AtomicU32};
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// No wake-up is lost (a parked thread is woken by the next read, or loom reports a
    /// deadlock), and a read that finds the thread running after it woke it sees the refresh
    /// that followed the wake (the release/acquire pair of `resume` and `read`).
    #[test]
    fn a_parked_upkeep_is_woken_and_its_refresh_seen() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let state = Arc::new(UpkeepState::stopped());
            let refreshes = Arc::new(AtomicU32::new(0));
            let done = Arc::new(AtomicBool::new(false));
            state.resume();
            let upkeep = {
                let (state, refreshes, done) = (
                    Arc::clone(&state),
                    Arc::clone(&refreshes),
                    Arc::clone(&done),
                );
                thread::spawn(move || {
                    for _ in 0..2 {
                        // Idle enough that an unused tick parks.
                        let mut idle = PARK_AFTER_TICKS - 1;
                        if state.tick(&mut idle) {
                            while !state.wants_resume() {
                                thread::park();
                            }
                            // The refresh, published before `resume` as `run` does.
                            refreshes.fetch_add(1, Ordering::Relaxed);
                            state.resume();
                        }
                    }
                    done.store(true, Ordering::Release);
                })
            };
            let mut woke = 0;
            while !done.load(Ordering::Acquire) {
                match state.read() {
                    Read::Recent => assert!(
                        refreshes.load(Ordering::Relaxed) >= woke,
                        "recent time read before the refresh that followed a wake"
                    ),
                    Read::Precise => {}
                    Read::PreciseAndWake => {
                        woke += 1;
                        upkeep.thread().unpark();
                    }
                }
                thread::yield_now();
            }
            upkeep.join().unwrap();
        });
    }
}
