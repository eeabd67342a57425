//! Loom models of the token bucket's state word (`src/admission/bucket.rs`): takes, refunds
//! and readers racing a live `set` (a reconfiguration), and a reader racing a take made at a
//! later instant than its clock reading. Loom runs every interleaving of the atomics; each
//! model asserts that the outcome is one that the operations, run one at a time in some order,
//! would give.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test --test loom_bucket --release
//! ```
//!
//! Built only under `cfg(loom)` (see `src/loom.rs`); the normal suite skips this file (its
//! threaded stress twin is `tests/bucket_concurrency.rs`).
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use triage::admission::TokenBucket;

const S: u64 = 1_000_000_000;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// A take racing a `set` to the same settings is never erased: one token of two is left,
/// whichever ran first.
#[test]
fn a_set_to_the_same_settings_keeps_a_racing_take() {
    model(|| {
        let b = Arc::new(TokenBucket::new(1.0, 2));
        let taker = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.try_take(0))
        };
        b.set(1.0, 2, 0);
        assert!(taker.join().unwrap());
        assert_eq!(b.tokens(0), 1);
    });
}

/// A take racing a `set` to other settings counts before it (one of two used, scaled to two
/// of four left) or after it (the set keeps four of four, the take leaves three): nothing
/// else, whatever the interleaving.
#[test]
fn a_take_racing_a_new_rate_counts_before_or_after_it() {
    model(|| {
        let b = Arc::new(TokenBucket::new(1.0, 2));
        let taker = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.try_take(0))
        };
        b.set(2.0, 4, 0);
        assert!(taker.join().unwrap());
        let left = b.tokens(0);
        assert!(left == 2 || left == 3, "{left} tokens left");
    });
}

/// Two takes of the last token: exactly one is granted.
#[test]
fn two_takes_of_the_last_token_grant_one() {
    model(|| {
        let b = Arc::new(TokenBucket::new(1.0, 1));
        let other = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.try_take(0))
        };
        let mine = b.try_take(0);
        let theirs = other.join().unwrap();
        assert!(mine ^ theirs, "granted {mine} and {theirs}");
        assert_eq!(b.tokens(0), 0);
    });
}

/// A reader racing a `set` from a burst of 1 to a burst of 4 on an empty bucket (the fill, 0,
/// is kept) reads no token: it never mixes the new tolerance with the old timestamp (which
/// reads 3 tokens).
#[test]
fn a_reader_racing_a_set_reads_one_configuration() {
    model(|| {
        let b = Arc::new(TokenBucket::new(1.0, 1));
        assert!(b.try_take(0));
        let reader = {
            let b = Arc::clone(&b);
            thread::spawn(move || (b.tokens(0), b.fill(0)))
        };
        b.set(1.0, 4, 0);
        assert_eq!(reader.join().unwrap(), (0, 0.0));
        assert_eq!(b.tokens(0), 0);
    });
}

/// A refund racing a `set` to the same settings is kept: the bucket ends full.
#[test]
fn a_refund_racing_a_set_is_kept() {
    model(|| {
        let b = Arc::new(TokenBucket::new(1.0, 2));
        assert!(b.try_take(0));
        let refunder = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.refund())
        };
        b.set(1.0, 2, 0);
        refunder.join().unwrap();
        assert_eq!(b.tokens(0), 2);
    });
}

/// A take racing a `set` that removes the bucket is granted; the bucket is unlimited after.
#[test]
fn a_take_racing_the_removal_of_its_bucket_is_granted() {
    model(|| {
        let b = Arc::new(TokenBucket::new(1.0, 1));
        assert!(b.try_take(0));
        let taker = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.try_take(0))
        };
        b.set(0.0, 1, 0);
        // Before the removal the bucket was empty (refused); after it, unlimited (granted).
        let _ = taker.join().unwrap();
        assert!(!b.is_limited());
        assert_eq!(b.tokens(0), u64::MAX);
    });
}

/// A reader whose clock reading (0) is older than a racing take's (5 s): the take moves the
/// timestamp past the reader's `now + tolerance`, and the reader sees an empty bucket, never a
/// wrapped count. (The clock is outside loom's model, so the readings are given: in
/// `TierBuckets` the reader reads the clock, then the bucket, and a take between the two is
/// this case; `tests/bucket_concurrency.rs` runs it on a real clock.)
#[test]
fn a_reader_behind_a_later_take_reads_no_tokens() {
    model(|| {
        let b = Arc::new(TokenBucket::new(10.0, 1));
        let taker = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.try_take(5 * S))
        };
        let reader = {
            let b = Arc::clone(&b);
            thread::spawn(move || (b.tokens(0), b.fill(0)))
        };
        let (tokens, fill) = reader.join().unwrap();
        assert!(taker.join().unwrap());
        assert!(
            tokens <= 1 && (0.0..=1.0).contains(&fill),
            "{tokens} tokens, fill {fill}"
        );
        assert_eq!(b.tokens(5 * S), 0);
        assert_eq!(b.tokens(5 * S + S / 10), 1);
    });
}
