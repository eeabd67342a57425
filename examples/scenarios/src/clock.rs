//! Virtual time: tokio's paused clock drives every timer (arrivals, service times, the
//! runtime's ticks), and a quanta mock clock, which triage reads for deadlines, queue ages and
//! latencies, follows it a millisecond at a time.
//!
//! The mock starts an hour after its own zero, so that a backlog can carry deadlines and
//! publish times in the past.

use std::time::Duration;

use triage::quanta::Clock;

/// How far past the mock's zero the run starts.
pub const EPOCH: Duration = Duration::from_secs(3600);

/// A quanta clock for the run and the task that moves it.
#[derive(Debug)]
pub struct RunClock {
    /// The clock the runtime, the generator and the handlers read.
    pub clock: Clock,
    follower: Option<tokio::task::JoinHandle<()>>,
}

impl RunClock {
    /// A mock clock that follows tokio's (paused) clock: it moves by what tokio's clock moved,
    /// on a task of its own that wakes every millisecond. Call inside the tokio runtime.
    pub fn following_tokio() -> Self {
        let (clock, mock) = Clock::mock();
        mock.increment(EPOCH);
        let start = tokio::time::Instant::now();
        let follower = tokio::spawn(async move {
            let mut seen = Duration::ZERO;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            loop {
                tick.tick().await;
                let now = start.elapsed();
                mock.increment(now - seen);
                seen = now;
            }
        });
        RunClock {
            clock,
            follower: Some(follower),
        }
    }

    /// The system clock, for the real-time cross-check.
    pub fn system() -> Self {
        RunClock {
            clock: Clock::new(),
            follower: None,
        }
    }
}

impl Drop for RunClock {
    fn drop(&mut self) {
        if let Some(f) = self.follower.take() {
            f.abort();
        }
    }
}
