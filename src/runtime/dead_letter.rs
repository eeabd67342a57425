//! The dead-letter part: the dead-letter sink, the room for messages on their way to it, the
//! messages held after their dead letter was refused for good, and how often that is logged.
//! The path itself (retries, publish, reference copy, `Failed`) is in `failure.rs`.

use crate::sync::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::DeadLetterSink;

/// At most one log line per this long about dead letters held after a permanent refusal.
pub(crate) const DEAD_LETTER_LOG_EVERY: Duration = Duration::from_secs(10);

/// The dead-letter sink and the messages on their way to it.
pub(crate) struct DeadLetters<T> {
    pub(crate) sink: Option<Arc<dyn DeadLetterSink<T>>>,
    /// Room for messages in the dead-letter path (`max_dead_lettering`).
    pub(crate) permits: Arc<tokio::sync::Semaphore>,
    /// Messages held unacknowledged after their dead letter was refused for good.
    pub(crate) held: AtomicI64,
    /// When the last line about held dead letters was logged (ns since the runtime's origin;
    /// `u64::MAX` for never).
    pub(crate) logged_at: AtomicU64,
}

impl<T> DeadLetters<T> {
    pub(crate) fn new(sink: Option<Arc<dyn DeadLetterSink<T>>>, max_dead_lettering: usize) -> Self {
        DeadLetters {
            sink,
            permits: Arc::new(tokio::sync::Semaphore::new(max_dead_lettering)),
            held: AtomicI64::new(0),
            logged_at: AtomicU64::new(u64::MAX),
        }
    }

    /// Messages held unacknowledged after their dead letter was refused for good.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed).max(0) as u64
    }

    /// Whether a line about held dead letters may be logged at `now_ns` (ns since the
    /// runtime's origin): one per [`DEAD_LETTER_LOG_EVERY`] at most, whichever thread asks, so
    /// a sink that refuses every message does not flood the log.
    pub(crate) fn may_log(&self, now_ns: u64) -> bool {
        let last = self.logged_at.load(Ordering::Relaxed);
        let every = DEAD_LETTER_LOG_EVERY.as_nanos() as u64;
        if last != u64::MAX && now_ns < last.saturating_add(every) {
            return false;
        }
        self.logged_at
            .compare_exchange(last, now_ns, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Counts a message in `held` for as long as the guard lives.
    pub(crate) fn hold(&self) -> HeldDeadLetter<'_> {
        HeldDeadLetter::new(&self.held)
    }
}

/// Counts a message in `triage_dead_letters_held` for as long as it lives, however its task
/// ends (settled, released at shutdown, or aborted).
pub(crate) struct HeldDeadLetter<'a>(&'a AtomicI64);

impl<'a> HeldDeadLetter<'a> {
    fn new(gauge: &'a AtomicI64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        HeldDeadLetter(gauge)
    }
}

impl Drop for HeldDeadLetter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_at_most() {
        let d: DeadLetters<u32> = DeadLetters::new(None, 1);
        let every = DEAD_LETTER_LOG_EVERY.as_nanos() as u64;
        assert!(d.may_log(5));
        assert!(!d.may_log(5));
        assert!(!d.may_log(5 + every - 1));
        assert!(d.may_log(5 + every));
    }

    #[test]
    fn a_held_dead_letter_is_counted_while_its_guard_lives() {
        let d: DeadLetters<u32> = DeadLetters::new(None, 1);
        let a = d.hold();
        let b = d.hold();
        assert_eq!(d.held(), 2);
        drop(a);
        assert_eq!(d.held(), 1);
        drop(b);
        assert_eq!(d.held(), 0);
    }
}
