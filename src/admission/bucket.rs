//! One token bucket, lock-free for takes: the generic cell rate algorithm (GCRA).

use crate::loom::{AtomicU64, Backoff, Ordering};

/// The bucket's state word: bit 63 is set while a [`set`](TokenBucket::set) rewrites the
/// bucket, bit 62 flips at every `set`, bits 0..62 hold the theoretical arrival time.
const LOCKED: u64 = 1 << 63;
const EPOCH: u64 = 1 << 62;
/// The timestamp bits: 2^62 ns, 146 years from the owner's origin.
const TAT: u64 = EPOCH - 1;
/// The largest clock reading and the largest tolerance kept, in ns (73 years): a timestamp
/// is at most `now + tolerance`, so it always fits the timestamp bits.
const MAX_NOW: u64 = (1 << 61) - 1;
const MAX_TOLERANCE: u64 = (1 << 61) - 1;

/// A token bucket kept as one atomic timestamp.
///
/// # The idea
///
/// GCRA (the ATM Forum's generic cell rate algorithm, also the algorithm behind the `governor`
/// crate) is a token bucket written as a *theoretical arrival time* `tat`: the instant at which
/// the bucket would be full again. Taking a token moves `tat` forward by one `interval` (the
/// time one token takes to refill, `1 / rate`); the token is granted while the new `tat` is at
/// most `burst × interval` (the *tolerance*) ahead of now. So the state a take changes is one
/// `u64`, a token is one compare-and-swap, refill needs no timer, and the fill is
/// `(now + tolerance - max(tat, now)) / tolerance`.
///
/// Times are nanoseconds since an origin chosen by the owner ([`TierBuckets`](super::TierBuckets)
/// reads them from its injectable clock); a reading past 2^61 - 1 (73 years) counts as that.
/// `interval` 0 means no bucket: every token is granted. The tolerance is at most 2^61 - 1 ns:
/// a bucket whose burst would take longer than 73 years to refill holds 73 years of tokens.
///
/// # Reconfiguring a running bucket
///
/// The interval and tolerance live beside the timestamp, and [`set`](TokenBucket::set)
/// changes all three: a take that read the old settings must not commit against the new
/// timestamp, nor a `set` overwrite a take it did not see (that gave the take's token back).
/// So the timestamp word carries two more bits: `set` locks it (takes wait, a few
/// instructions), rewrites the settings, then stores the new timestamp with the epoch bit
/// flipped, so a take that read the word before the `set` fails its compare-and-swap and reads
/// again, even when the new timestamp equals the old one. Readers ([`fill`](TokenBucket::fill),
/// [`tokens`](TokenBucket::tokens)) read the word, the settings, then the word again, and
/// retry if it moved (a seqlock). Every operation is then as if it ran alone, in some order:
/// `tests/loom_bucket.rs` checks it under every interleaving, and `tests/bucket_model.rs`
/// checks that order against a plain token bucket.
///
/// A reader whose clock reading is older than the last take's (read before a concurrent take
/// at a later instant moved `tat`) sees an empty bucket, never a negative count.
#[derive(Debug, Default)]
pub struct TokenBucket {
    /// [`LOCKED`], [`EPOCH`] and the theoretical arrival time, ns since the origin.
    state: AtomicU64,
    /// Nanoseconds per token (`1e9 / rate`); 0 for no bucket.
    interval: AtomicU64,
    /// `burst × interval`, ns, at most [`MAX_TOLERANCE`].
    tolerance: AtomicU64,
}

/// The settings and timestamp of a bucket at one instant (see [`TokenBucket::snapshot`]).
#[derive(Clone, Copy)]
struct Snapshot {
    tat: u64,
    interval: u64,
    tolerance: u64,
}

impl Snapshot {
    /// The nanoseconds of the tolerance in use at `now`: 0 for a full bucket, at most the
    /// tolerance (a `now` older than the last take's reads as empty).
    fn used(&self, now: u64) -> u64 {
        self.tat.saturating_sub(now).min(self.tolerance)
    }
}

impl TokenBucket {
    /// A full bucket of `rate` tokens per second holding at most `burst` (`rate` 0, negative
    /// or NaN: no bucket; `burst` 0 counts as 1).
    pub fn new(rate: f64, burst: u64) -> Self {
        let b = TokenBucket::default();
        b.set(rate, burst, 0);
        b
    }

    /// Changes the rate (tokens per second) and burst (tokens) at `now_ns`, keeping the fill
    /// ratio: a bucket half full stays half full, so a reconfiguration neither grants a burst
    /// nor starves a tier. The part in use is scaled down to the nanosecond (a fill between
    /// two nanoseconds rounds toward full); the same settings again change nothing. Takes
    /// racing it wait for it (a few instructions) and are counted before or after it, never
    /// lost.
    pub fn set(&self, rate: f64, burst: u64, now_ns: u64) {
        let interval = if rate > 0.0 {
            ((1e9 / rate).round() as u64).max(1)
        } else {
            0
        };
        let tolerance = interval.saturating_mul(burst.max(1)).min(MAX_TOLERANCE);
        let word = self.lock();
        let old = Snapshot {
            tat: word & TAT,
            interval: self.interval.load(Ordering::Relaxed),
            tolerance: self.tolerance.load(Ordering::Relaxed),
        };
        let now = now_ns.min(MAX_NOW);
        // A bucket that had none (or a zero tolerance) is full: a new bucket starts full.
        let used = if old.interval == 0 || old.tolerance == 0 {
            0
        } else {
            let scaled =
                u128::from(old.used(now)) * u128::from(tolerance) / u128::from(old.tolerance);
            u64::try_from(scaled).unwrap_or(tolerance).min(tolerance)
        };
        self.interval.store(interval, Ordering::Release);
        self.tolerance.store(tolerance, Ordering::Release);
        // Full at `now` when tat <= now; the fill is kept by setting tat to the matching point
        // (below 2^62: both terms are below 2^61).
        self.state
            .store(((word & EPOCH) ^ EPOCH) | (now + used), Ordering::Release);
    }

    /// Sets [`LOCKED`] on the state word once no other `set` holds it; returns the word as it
    /// was (unlocked).
    fn lock(&self) -> u64 {
        let backoff = Backoff::new();
        let mut word = self.state.load(Ordering::Relaxed);
        loop {
            if word & LOCKED != 0 {
                backoff.snooze();
                word = self.state.load(Ordering::Relaxed);
                continue;
            }
            match self.state.compare_exchange_weak(
                word,
                word | LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return word,
                Err(actual) => word = actual,
            }
        }
    }

    /// The state word once no `set` holds it.
    #[inline]
    fn unlocked(&self) -> u64 {
        let word = self.state.load(Ordering::Acquire);
        if word & LOCKED == 0 {
            return word;
        }
        let backoff = Backoff::new();
        loop {
            backoff.snooze();
            let word = self.state.load(Ordering::Acquire);
            if word & LOCKED == 0 {
                return word;
            }
        }
    }

    /// The settings read after `word`: consistent with it as long as the word has not moved
    /// (a `set` between them locks the word and flips its epoch; the settings' Release stores
    /// and these Acquire loads make a later look at the word see that).
    #[inline]
    fn settings(&self, word: u64) -> Snapshot {
        Snapshot {
            tat: word & TAT,
            interval: self.interval.load(Ordering::Acquire),
            tolerance: self.tolerance.load(Ordering::Acquire),
        }
    }

    /// The timestamp and settings at one instant: read, then checked unchanged (a seqlock).
    fn snapshot(&self) -> Snapshot {
        let mut word = self.unlocked();
        loop {
            let snapshot = self.settings(word);
            let again = self.state.load(Ordering::Acquire);
            if again == word {
                return snapshot;
            }
            word = if again & LOCKED == 0 {
                again
            } else {
                self.unlocked()
            };
        }
    }

    /// Whether the bucket limits anything.
    pub fn is_limited(&self) -> bool {
        self.interval.load(Ordering::Relaxed) != 0
    }

    /// Takes one token at `now_ns`: `true` if granted. Lock-free against other takes (one
    /// compare-and-swap, retried only under contention; a concurrent [`set`](Self::set) is
    /// waited for), allocation-free.
    pub fn try_take(&self, now_ns: u64) -> bool {
        // No bucket: granted without touching the shared timestamp.
        if self.interval.load(Ordering::Relaxed) == 0 {
            return true;
        }
        let now = now_ns.min(MAX_NOW);
        let mut word = self.unlocked();
        loop {
            let s = self.settings(word);
            if s.interval == 0 {
                return true;
            }
            let next = s.tat.max(now).saturating_add(s.interval);
            if next > now + s.tolerance {
                // Refused on settings read with this word: final if the word has not moved.
                let again = self.state.load(Ordering::Acquire);
                if again == word {
                    return false;
                }
                word = if again & LOCKED == 0 {
                    again
                } else {
                    self.unlocked()
                };
                continue;
            }
            match self.state.compare_exchange_weak(
                word,
                (word & EPOCH) | next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) if actual & LOCKED == 0 => word = actual,
                Err(_) => word = self.unlocked(),
            }
        }
    }

    /// Gives back one token taken with [`try_take`](TokenBucket::try_take) that was not used
    /// (the message was refused later for another reason). A bucket reconfigured since takes
    /// it back at its new interval; one removed since takes nothing back.
    pub fn refund(&self) {
        if self.interval.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut word = self.unlocked();
        loop {
            let s = self.settings(word);
            if s.interval == 0 {
                return;
            }
            match self.state.compare_exchange_weak(
                word,
                (word & EPOCH) | s.tat.saturating_sub(s.interval),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) if actual & LOCKED == 0 => word = actual,
                Err(_) => word = self.unlocked(),
            }
        }
    }

    /// Tokens available at `now_ns` over the burst, in `0.0..=1.0` (1.0 for no bucket).
    pub fn fill(&self, now_ns: u64) -> f64 {
        let s = self.snapshot();
        if s.interval == 0 || s.tolerance == 0 {
            return 1.0;
        }
        let used = s.used(now_ns.min(MAX_NOW));
        (1.0 - used as f64 / s.tolerance as f64).clamp(0.0, 1.0)
    }

    /// Whole tokens available at `now_ns`, at most the burst (`u64::MAX` for no bucket).
    pub fn tokens(&self, now_ns: u64) -> u64 {
        let s = self.snapshot();
        if s.interval == 0 {
            return u64::MAX;
        }
        (s.tolerance - s.used(now_ns.min(MAX_NOW))) / s.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn starts_full_and_grants_the_burst_then_the_rate() {
        let b = TokenBucket::new(10.0, 5);
        assert_eq!(b.tokens(0), 5);
        assert!((0..5).all(|_| b.try_take(0)));
        assert!(!b.try_take(0));
        assert_eq!(b.fill(0), 0.0);
        // One token per 100 ms.
        assert!(!b.try_take(S / 10 - 1));
        assert!(b.try_take(S / 10));
        assert!(!b.try_take(S / 10));
        // A long quiet spell refills to the burst, not beyond.
        assert_eq!(b.tokens(100 * S), 5);
        assert_eq!(b.fill(100 * S), 1.0);
    }

    #[test]
    fn refund_gives_the_token_back() {
        let b = TokenBucket::new(1.0, 1);
        assert!(b.try_take(0));
        assert!(!b.try_take(0));
        b.refund();
        assert!(b.try_take(0));
    }

    /// A reader whose clock reading is older than the last take's (read before a concurrent
    /// take moved the bucket): no tokens, never a wrapped count (it read 184,467,440,737,095,514
    /// of a burst of 1; a debug build panicked).
    #[test]
    fn a_reading_older_than_the_last_take_has_no_tokens() {
        let b = TokenBucket::new(10.0, 1);
        assert!(b.try_take(5 * S));
        assert_eq!(b.tokens(0), 0);
        assert_eq!(b.fill(0), 0.0);
        assert_eq!(b.tokens(5 * S), 0);
        assert_eq!(b.tokens(5 * S + S / 10), 1);
    }

    #[test]
    fn reconfiguring_keeps_the_fill() {
        let b = TokenBucket::new(100.0, 100);
        for _ in 0..50 {
            assert!(b.try_take(0));
        }
        assert!((b.fill(0) - 0.5).abs() < 1e-9);
        b.set(10.0, 10, 0);
        assert!((b.fill(0) - 0.5).abs() < 1e-9);
        assert_eq!(b.tokens(0), 5);
        b.set(0.0, 1, 0);
        assert!(!b.is_limited());
        assert!(b.try_take(0));
    }
}
