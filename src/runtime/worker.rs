//! The workers: long-lived tasks, one per configured worker, each taking a batch of items from
//! the queue and serving them one after another.
//!
//! # What a served message costs, and why
//!
//! A worker pays once per batch what does not depend on the message: the queue's lock, the
//! tier mask of the concurrency shares, the wake-up of an intake waiting for room, the clock
//! read that stamps the batch's sojourns, and the counters (accumulated in a [`Tally`] and
//! added once, to its thread's copies: see `crate::sync`). Per message it pays the deadline
//! check, one clock read (a handler's end is the next one's start), the handler, and the
//! disposition. Its slot of the concurrency limit is passed from one item of a batch to the
//! next when the next one's tier may use it, rather than released and taken again: a
//! worker runs one handler at a time, and the in-flight count is a line every worker writes.
//! Nothing is allocated per message in steady state: the handler's future is awaited in place
//! (the worker is generic over the handler, so its future is not boxed), and the payload's
//! shared handle for the [`Job`] reuses the allocation of the previous message's once the
//! handler let go of it (see [`Item::share_reusing`]).
//!
//! # How big a batch
//!
//! Items a worker took are not in the queue: no other worker can serve them, and a more
//! critical item pushed meanwhile is served by another worker, not before them. So a batch is
//! kept small in time: a worker takes more than one item only while its handler calls have
//! finished at their first poll (no waiting inside the handler) and their mean service time
//! leaves the whole batch under [`BATCH_BUDGET`]. With a handler that waits for anything (I/O,
//! a timer), batches are of one item, as before batches existed. If a handler call does wait
//! while the worker still holds items, the worker puts them back at the head of their tiers
//! ([`WfqQueue::requeue`](crate::queue::WfqQueue)) before waiting, so no item waits behind a
//! slow call while another worker could serve it.
//!
//! # Hook points
//!
//! [`Inner::dispatch_check`] is the one place a popped item is checked before the handler sees
//! it (its deadline, exactly; its circuit); [`Inner::settle`] the one place a disposition is
//! recorded (observer, ledger, acknowledgement).

use crate::sync::Ordering;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt;
use quanta::Instant;

use crate::ledger::Disposition;
use crate::limit::PermitRef;
use crate::queue::Dequeued;
use crate::runtime::engine::Inner;
use crate::runtime::item::Item;
use crate::runtime::metric_counts::{Counted, Samples};
use crate::runtime::{Ack, AckRef, AckSink, HandlerError, Job, LoadLevel};
use crate::Criticality;

/// Most items a worker takes from the queue at once.
pub(crate) const MAX_BATCH: usize = 32;

/// The handler time a batch may hold, by the worker's recent mean: what an item taken in a batch
/// may wait behind the others of its batch.
const BATCH_BUDGET: Duration = Duration::from_micros(50);

/// Handler calls in a row that finished at their first poll before a worker takes batches.
const SYNC_STREAK: u32 = 8;

/// Counters a worker adds to the shared metrics, the ledger and the runtime's accounts once
/// per batch rather than once per message.
#[derive(Default)]
struct Tally {
    completed: [u64; 4],
    goodput: [u64; 4],
    expired: [u64; 4],
    served: u64,
    busy_ns: u64,
    /// The longest handler run of the batch per tier (rank), ns.
    longest_run_ns: [u64; 4],
    /// Completed messages settled with [`Item::settle_later`], per original tier (rank):
    /// recorded in the ledger at the flush, before their acks are resolved.
    settled: [u64; 4],
    /// Of those, finished inside their deadline.
    settled_goodput: [u64; 4],
    /// Their payload bytes, out of the memory budget after their acks (in 128 bits: sizes
    /// come from outside, and a batch's may add up past `u64::MAX`).
    settled_bytes: u128,
}

impl Tally {
    /// Adds the counts to the shared ones, then resolves `acks` (the settled messages'), then
    /// counts those messages out of the runtime: in the order one message's settlement takes
    /// (ledger, acknowledgement, `alive`), so a reader who sees a message acknowledged sees it
    /// in the ledger, and `wait_idle` sees nothing alive before every disposition is recorded.
    fn flush<T>(
        &mut self,
        inner: &Inner<T>,
        samples: &mut Samples,
        acks: &mut Vec<Ack>,
        tokens: &mut Vec<AckRef>,
    ) {
        let metrics = &inner.accounts.metric_counts;
        let ledger = &inner.accounts.ledger;
        metrics.add_samples(samples);
        let mut settled = 0;
        for tier in Criticality::ALL {
            let r = tier.rank();
            if self.completed[r] > 0 {
                metrics.add(Counted::Completed, tier, self.completed[r]);
            }
            if self.goodput[r] > 0 {
                metrics.add(Counted::Goodput, tier, self.goodput[r]);
            }
            if self.expired[r] > 0 {
                metrics.add(Counted::Expired, tier, self.expired[r]);
            }
            if self.settled[r] > 0 {
                ledger.record_n(tier, Disposition::Completed, self.settled[r]);
                settled += self.settled[r];
            }
            if self.settled_goodput[r] > 0 {
                ledger.record_goodput_n(tier, self.settled_goodput[r]);
            }
        }
        if self.served > 0 {
            let measured = inner.signals.measured.local();
            measured.served.add(self.served, Ordering::Relaxed);
            measured.busy_ns.add(self.busy_ns, Ordering::Relaxed);
            for (longest, run) in measured.longest_run_ns.iter().zip(self.longest_run_ns) {
                // Written only when a longer run is seen: rarely, once runs are known.
                if run > longest.load(Ordering::Relaxed) {
                    longest.set(run);
                }
            }
        }
        resolve_completed(acks, tokens);
        if settled > 0 {
            // The bytes before `alive`: `wait_idle` reads the budget once nothing is alive.
            inner.accounts.memory.remove_sum(self.settled_bytes);
            inner.accounts.leave(settled as i64);
        }
        *self = Tally::default();
    }
}

/// Resolves `acks` as completed, in order, with one [`AckSink::resolve_all`] call per run of
/// acks to the same sink (one per batch with one source), so a connector takes its lock once
/// per batch. `tokens` is scratch, reused from batch to batch.
fn resolve_completed(acks: &mut Vec<Ack>, tokens: &mut Vec<AckRef>) {
    let mut current: Option<Arc<dyn AckSink>> = None;
    for ack in acks.drain(..) {
        let Some((sink, token)) = ack.into_parts() else {
            continue;
        };
        match &current {
            Some(cur) if Arc::ptr_eq(cur, &sink) => {}
            _ => {
                if let Some(cur) = current.replace(sink) {
                    cur.resolve_all(tokens, Disposition::Completed);
                    tokens.clear();
                }
            }
        }
        tokens.push(token);
    }
    if let Some(cur) = current {
        cur.resolve_all(tokens, Disposition::Completed);
        tokens.clear();
    }
}

/// What a worker keeps between messages.
struct Local<T> {
    /// The current batch, in reverse serving order (served by `pop`).
    batch: Vec<Dequeued<Item<T>>>,
    /// The last served payload's shared handle, reused for the next one when nobody kept it.
    spare: Option<Arc<T>>,
    tally: Tally,
    /// Sojourns and handler run times since the last flush, added to the thread's histogram
    /// counts there (emptied, kept for reuse).
    samples: Box<Samples>,
    /// The acks of the messages the tally settled, resolved at its flush.
    acks: Vec<Ack>,
    /// Scratch for the acks' tokens at the flush (`resolve_completed`).
    tokens: Vec<AckRef>,
    /// Handler calls in a row that finished at their first poll.
    streak: u32,
    /// Mean handler time, exponentially weighted (1/8), ns.
    mean_ns: u64,
    /// Where this worker publishes the message it runs, for a recall to wait for it.
    running: crate::runtime::recalls::Running,
}

impl<T> Local<T> {
    fn flush(&mut self, inner: &Inner<T>) {
        self.tally
            .flush(inner, &mut self.samples, &mut self.acks, &mut self.tokens);
    }

    fn batch_size(&self) -> usize {
        if self.streak < SYNC_STREAK {
            return 1;
        }
        let budget = BATCH_BUDGET.as_nanos() as u64;
        (budget / self.mean_ns.max(1)).clamp(1, MAX_BATCH as u64) as usize
    }

    fn learn(&mut self, latency_ns: u64, at_first_poll: bool) {
        self.streak = if at_first_poll {
            self.streak.saturating_add(1)
        } else {
            0
        };
        self.mean_ns = if self.mean_ns == u64::MAX {
            latency_ns
        } else {
            // Wrapping is impossible: both terms are below 2^63 for any real latency.
            (self.mean_ns * 7 + latency_ns) / 8
        };
    }
}

/// One worker, for the life of the runtime: pops batches and serves them until the queue is
/// closed and empty.
pub(crate) async fn run<T, H, F>(inner: Arc<Inner<T>>, handler: Arc<H>)
where
    T: Send + Sync + 'static,
    H: Fn(Job<T>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    let mut local = Local {
        batch: Vec::with_capacity(MAX_BATCH),
        spare: None,
        tally: Tally::default(),
        samples: Box::default(),
        acks: Vec::with_capacity(MAX_BATCH),
        tokens: Vec::with_capacity(MAX_BATCH),
        streak: 0,
        mean_ns: u64::MAX,
        running: inner.recalls.for_worker(),
    };
    // The slot of the concurrency limit the last handler ran in, kept for the next item of the
    // batch when its handler finished at once (see `serve`).
    let mut kept: Option<PermitRef<'_>> = None;
    loop {
        let max = local.batch_size();
        if !inner.next_batch(&mut local.batch, max).await {
            return;
        }
        local.batch.reverse();
        // One clock read per batch: the sojourns end here, and the first handler starts here.
        let mut now = inner.clock.now();
        while let Some(d) = local.batch.pop() {
            let last = local.batch.is_empty();
            match d {
                Dequeued::Expired(e) => {
                    let item = e.into_inner();
                    local.tally.expired[item.original.rank()] += 1;
                    if last {
                        local.flush(&inner);
                    }
                    inner.settle(item, Disposition::Expired);
                }
                Dequeued::Ready(e) => {
                    let sojourn = e.sojourn(now);
                    let enqueued_at = e.enqueued_at();
                    let item = e.into_inner();
                    let counts = &inner.accounts.metric_counts;
                    local.samples.sojourn(counts, item.tier(), sojourn);
                    now = serve(
                        &inner,
                        &*handler,
                        &mut local,
                        &mut kept,
                        item,
                        enqueued_at,
                        now,
                    )
                    .await;
                }
            }
        }
        // Released before the worker waits for more: a slot is held only while a handler runs
        // or the next item of its batch follows at once.
        kept = None;
        local.flush(&inner);
    }
}

/// Serves one popped item: the dispatch check, a slot, the handler, the disposition. `now` is a
/// clock reading taken just before (the batch's, or the previous handler's end); returns the
/// reading taken at the end of this one.
async fn serve<'a, T, H, F>(
    inner: &'a Arc<Inner<T>>,
    handler: &H,
    local: &mut Local<T>,
    kept: &mut Option<PermitRef<'a>>,
    mut item: Item<T>,
    enqueued_at: Instant,
    mut now: Instant,
) -> Instant
where
    T: Send + Sync + 'static,
    H: Fn(Job<T>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    // Closed when shutdown begins (one atomic load, where the stop token takes a lock).
    if inner.queue.is_closed() {
        // Taken before shutdown began, not started: as if it were still queued.
        inner.shutdown_item(item);
        return now;
    }
    let tier = item.tier();
    // The previous handler's slot, if this item's tier may use it: passed on rather than
    // released and taken again. Else released here. (Branches rather than a chain of
    // `Option` combinators, which moved the slot through byte-wide temporaries the next read
    // had to wait for.)
    let passed = kept.take().and_then(|slot| slot.pass_to(tier).ok());
    // The pop applied the tier mask of the shares (`worker_mask`); another worker may have
    // taken the last slot since. With work-conserving shares a popped item borrows an idle
    // slot rather than sitting on it until its share frees; else it waits within its share.
    let permit = if let Some(p) = passed {
        p
    } else if let Some(p) = inner.limit.try_acquire_ref(tier) {
        p
    } else if let Some(p) = inner
        .config()
        .expert
        .work_conserving
        .then(|| inner.limit.try_acquire_ref_up_to(tier, inner.limit.limit()))
        .flatten()
    {
        p
    } else {
        // Nothing the tally holds waits behind a slot (nor is lost if the worker is dropped
        // here at shutdown).
        local.flush(inner);
        let p = inner.limit.acquire_ref(tier).await;
        now = inner.clock.now();
        p
    };
    // Published before the check reads the recall generation (see `recall.rs`).
    local.running.enter(&item);
    let call = match inner.dispatch_check(&mut item, now) {
        Ok(call) => call,
        Err(barred) => {
            inner.dispatch_barred(item, barred);
            local.running.leave();
            drop(permit);
            if local.batch.is_empty() {
                local.flush(inner);
            }
            return now;
        }
    };
    let job = Job {
        payload: item.share_reusing(&mut local.spare),
        criticality: tier,
        original: item.original,
        attempt: item.attempt,
        deadline: item.deadline(),
        enqueued_at,
        load: LoadLevel(inner.load_level()),
        brownout: inner.live.brownout(),
        clock: inner.clock.clone(),
    };
    let started = now;
    // A panic while building the future, or while polling it, is a failure like any other.
    // The future is wrapped where it is built, not moved into its wrapper after: a move just
    // after it is built reads its state back while the stores that wrote it are in flight.
    let built = std::panic::catch_unwind(AssertUnwindSafe(|| {
        AssertUnwindSafe(handler(job)).catch_unwind()
    }));
    let (outcome, at_first_poll) = match built {
        Ok(fut) => {
            let mut fut = std::pin::pin!(fut);
            match futures_util::poll!(fut.as_mut()) {
                Poll::Ready(outcome) => (outcome, true),
                Poll::Pending => {
                    // The handler waits: what this worker still holds goes back to the queue,
                    // for the other workers, rather than waiting behind this call.
                    inner.requeue(&mut local.batch, tier);
                    local.flush(inner);
                    (fut.await, false)
                }
            }
        }
        Err(panic) => (Err(panic), true),
    };
    let finished = inner.clock.now();
    let latency = finished.saturating_duration_since(started);
    let latency_ns = latency.as_nanos() as u64;
    local.learn(latency_ns, at_first_poll);
    let counts = &inner.accounts.metric_counts;
    local.samples.latency(counts, tier, latency);
    let _ = permit.sample(latency, false);
    // Kept for the next item of the batch, if its handler finished at once and nothing awaits
    // before that item (a failure's retry or dead letter may); released otherwise.
    if at_first_poll && !local.batch.is_empty() && matches!(outcome, Ok(Ok(()))) {
        *kept = Some(permit);
    } else {
        drop(permit);
    }
    local.tally.served += 1;
    local.tally.busy_ns += latency_ns;
    let longest = &mut local.tally.longest_run_ns[tier.rank()];
    *longest = (*longest).max(latency_ns);
    inner.record_downstream(call, &outcome);
    match outcome {
        Ok(Ok(())) => {
            let r = item.original.rank();
            local.tally.completed[r] += 1;
            let in_time = item.deadline().is_none_or(|d| finished <= d);
            if in_time {
                local.tally.goodput[r] += 1;
            }
            if inner.observer.is_none() && item.key.is_none() {
                // Nothing to call, no key to release: recorded with the batch (see `Tally`).
                let settled = item.settle_later();
                local.tally.settled[r] += 1;
                local.tally.settled_goodput[r] += u64::from(in_time);
                local.tally.settled_bytes += u128::from(settled.bytes);
                local.acks.extend(settled.ack);
                if let Some(spare) = settled.payload {
                    local.spare = Some(spare);
                }
                if local.acks.len() >= MAX_BATCH {
                    local.flush(inner);
                }
            } else {
                if in_time {
                    item.accounts().ledger.record_goodput(item.original);
                }
                // Counted before the disposition, so a reader who sees the message settled
                // sees its counters too.
                local.flush(inner);
                if let Some(spare) = inner.settle(item, Disposition::Completed) {
                    local.spare = Some(spare);
                }
            }
        }
        Ok(Err(err)) => {
            local.flush(inner);
            let retry = err.is_retryable();
            inner.failed(item, retry, "failed", err.to_string()).await;
        }
        Err(_) => {
            local.flush(inner);
            inner.accounts.metrics.panics.increment(1);
            inner
                .failed(item, true, "panicked", "handler panicked".to_owned())
                .await;
        }
    }
    // Settled (a keyed one at once, so its acknowledgement is in), or handed to a retry.
    local.running.leave();
    finished
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records each call: `resolve_all`'s slice as one entry, `resolve` as a slice of one.
    #[derive(Default)]
    struct Calls(Mutex<Vec<(u8, Vec<u64>)>>);

    struct Sink(u8, Arc<Calls>);

    impl AckSink for Sink {
        fn resolve(&self, token: AckRef, disposition: Disposition) {
            assert_eq!(disposition, Disposition::Completed);
            self.1
                 .0
                .lock()
                .unwrap()
                .push((self.0, vec![token.position]));
        }

        fn resolve_all(&self, tokens: &[AckRef], disposition: Disposition) {
            assert_eq!(disposition, Disposition::Completed);
            let positions = tokens.iter().map(|t| t.position).collect();
            self.1 .0.lock().unwrap().push((self.0, positions));
        }
    }

    fn at(position: u64) -> AckRef {
        AckRef {
            stream: 0,
            position,
            epoch: 1,
        }
    }

    #[test]
    fn a_batch_is_resolved_with_one_call_per_run_of_the_same_sink() {
        let calls = Arc::new(Calls::default());
        let a: Arc<dyn AckSink> = Arc::new(Sink(b'a', Arc::clone(&calls)));
        let b: Arc<dyn AckSink> = Arc::new(Sink(b'b', Arc::clone(&calls)));
        let mut acks = vec![
            Ack::new(Arc::clone(&a), at(1)),
            Ack::new(Arc::clone(&a), at(2)),
            Ack::noop(),
            Ack::new(Arc::clone(&a), at(3)),
            Ack::new(Arc::clone(&b), at(4)),
            Ack::new(Arc::clone(&b), at(5)),
            Ack::new(Arc::clone(&a), at(6)),
        ];
        let mut tokens = Vec::new();
        resolve_completed(&mut acks, &mut tokens);
        assert!(acks.is_empty() && tokens.is_empty());
        assert_eq!(
            *calls.0.lock().unwrap(),
            vec![(b'a', vec![1, 2, 3]), (b'b', vec![4, 5]), (b'a', vec![6]),]
        );
        // Every handle was taken apart, none released on drop: only the test's own references
        // remain.
        assert_eq!(Arc::strong_count(&a), 1);
        assert_eq!(Arc::strong_count(&b), 1);
    }

    #[test]
    fn the_default_resolve_all_resolves_each_in_order() {
        struct One(Arc<Calls>);
        impl AckSink for One {
            fn resolve(&self, token: AckRef, _: Disposition) {
                self.0 .0.lock().unwrap().push((0, vec![token.position]));
            }
        }
        let calls = Arc::new(Calls::default());
        One(Arc::clone(&calls)).resolve_all(&[at(7), at(8)], Disposition::Completed);
        assert_eq!(*calls.0.lock().unwrap(), vec![(0, vec![7]), (0, vec![8])]);
    }
}
