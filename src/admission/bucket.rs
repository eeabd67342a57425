//! One token bucket, lock-free: the generic cell rate algorithm (GCRA).

use std::sync::atomic::{AtomicU64, Ordering};

/// A token bucket kept as one atomic timestamp.
///
/// # The idea
///
/// GCRA (the ATM Forum's generic cell rate algorithm, also the algorithm behind the `governor`
/// crate) is a token bucket written as a *theoretical arrival time* `tat`: the instant at which
/// the bucket would be full again. Taking a token moves `tat` forward by one `interval` (the
/// time one token takes to refill, `1 / rate`); the token is granted while the new `tat` is at
/// most `burst × interval` ahead of now. So the whole state is one `u64`, a token is one
/// compare-and-swap, refill needs no timer, and the fill is
/// `(now + burst × interval - max(tat, now)) / (burst × interval)`.
///
/// Times are nanoseconds since an origin chosen by the owner ([`TierBuckets`](super::TierBuckets)
/// reads them from its injectable clock). `interval` 0 means no bucket: every token is granted.
/// The settings are atomics too, so a running bucket can be reconfigured without a lock.
#[derive(Debug, Default)]
pub struct TokenBucket {
    /// Theoretical arrival time, ns since the origin.
    tat: AtomicU64,
    /// Nanoseconds per token (`1e9 / rate`); 0 for no bucket.
    interval: AtomicU64,
    /// `burst × interval`, ns.
    tolerance: AtomicU64,
}

impl TokenBucket {
    /// A full bucket of `rate` tokens per second holding at most `burst` (`rate` 0: no
    /// bucket).
    pub fn new(rate: f64, burst: u64) -> Self {
        let b = TokenBucket::default();
        b.set(rate, burst, 0);
        b
    }

    /// Changes the rate and burst at `now_ns`, keeping the fill ratio: a bucket half full
    /// stays half full, so a reconfiguration neither grants a burst nor starves a tier.
    pub fn set(&self, rate: f64, burst: u64, now_ns: u64) {
        let fill = self.fill(now_ns);
        let interval = if rate > 0.0 {
            ((1e9 / rate).round() as u64).max(1)
        } else {
            0
        };
        let tolerance = interval.saturating_mul(burst.max(1));
        self.interval.store(interval, Ordering::Relaxed);
        self.tolerance.store(tolerance, Ordering::Relaxed);
        // Full at `now` when tat <= now; the fill is kept by setting tat to the matching point.
        let empty_ns = ((1.0 - fill) * tolerance as f64) as u64;
        self.tat
            .store(now_ns.saturating_add(empty_ns), Ordering::Relaxed);
    }

    /// Whether the bucket limits anything.
    pub fn is_limited(&self) -> bool {
        self.interval.load(Ordering::Relaxed) != 0
    }

    /// Takes one token at `now_ns`: `true` if granted. Lock-free (one compare-and-swap,
    /// retried only under contention), allocation-free.
    pub fn try_take(&self, now_ns: u64) -> bool {
        let interval = self.interval.load(Ordering::Relaxed);
        if interval == 0 {
            return true;
        }
        let tolerance = self.tolerance.load(Ordering::Relaxed);
        let limit = now_ns.saturating_add(tolerance);
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let next = tat.max(now_ns).saturating_add(interval);
            if next > limit {
                return false;
            }
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(actual) => tat = actual,
            }
        }
    }

    /// Gives back one token taken with [`try_take`](TokenBucket::try_take) that was not used
    /// (the message was refused later for another reason).
    pub fn refund(&self) {
        let interval = self.interval.load(Ordering::Relaxed);
        if interval == 0 {
            return;
        }
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                Some(tat.saturating_sub(interval))
            });
    }

    /// Tokens available at `now_ns` over the burst, in `0.0..=1.0` (1.0 for no bucket).
    pub fn fill(&self, now_ns: u64) -> f64 {
        let tolerance = self.tolerance.load(Ordering::Relaxed);
        if self.interval.load(Ordering::Relaxed) == 0 || tolerance == 0 {
            return 1.0;
        }
        let tat = self.tat.load(Ordering::Acquire).max(now_ns);
        let used = tat - now_ns;
        (1.0 - used as f64 / tolerance as f64).clamp(0.0, 1.0)
    }

    /// Whole tokens available at `now_ns` (`u64::MAX` for no bucket).
    pub fn tokens(&self, now_ns: u64) -> u64 {
        let interval = self.interval.load(Ordering::Relaxed);
        if interval == 0 {
            return u64::MAX;
        }
        let tolerance = self.tolerance.load(Ordering::Relaxed);
        let tat = self.tat.load(Ordering::Acquire).max(now_ns);
        (now_ns.saturating_add(tolerance) - tat) / interval
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
