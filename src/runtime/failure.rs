//! Failures: a failed or panicked handler call is retried with backoff and demotion, then goes
//! to the dead-letter path. A dead letter is published before the message is recorded
//! `Failed`; a sink that refuses it for good gets a reference copy, and a message whose
//! reference copy is refused too is held unacknowledged, counted and logged, and tried again
//! rarely (the dead-letter part, `dead_letter.rs`, keeps the sink and those counts).

use std::sync::Arc;

use crate::ledger::Disposition;
use crate::runtime::dead_letter::HeldDeadLetter;
use crate::runtime::engine::{Inner, Offer};
use crate::runtime::item::Item;
use crate::runtime::DeadLetterSink;

/// The `triage-reason` of a reference copy published in place of a refused dead letter.
const DEAD_LETTER_REJECTED: &str = "dead_letter_rejected";

fn bound(mut text: String) -> String {
    let len = crate::wire::bound_error(&text).len();
    text.truncate(len);
    text
}

impl<T: Send + Sync + 'static> Inner<T> {
    pub(crate) async fn failed(
        self: &Arc<Self>,
        mut item: Item<T>,
        retryable: bool,
        reason: &'static str,
        error: String,
    ) {
        if retryable && item.attempt < self.config().retry.max_retries {
            item.attempt += 1;
            self.accounts.metrics.tiers[item.tier()]
                .retries
                .increment(1);
            let backoff = self.retry_backoff(&item);
            let this = Arc::clone(self);
            self.spawn(async move {
                tokio::select! {
                    _ = this.lifecycle.stop.cancelled() => return drop(item),
                    _ = tokio::time::sleep(backoff) => {}
                }
                if let Offer::Hold(held) | Offer::Evicted(held) | Offer::CircuitHold(held) =
                    this.offer(item)
                {
                    this.hold_until_queued(held).await;
                }
            });
            return;
        }
        self.dead_letter(item, reason, error).await;
    }

    /// The wait before retrying `item`: the configured backoff (exponential, full jitter), but
    /// never more than half of what is left of its deadline after a mean handler run. A retry
    /// that starts after the deadline could only expire, and one that starts at it has no
    /// time to be queued and served, so a backoff set for a downstream's sake would otherwise
    /// throw away every retry of a message with a short deadline (a Sheddable message due in
    /// 100 ms, retried after up to 200 ms). The breaker, not the backoff, is what spares a
    /// downstream that fails for load.
    fn retry_backoff(&self, item: &Item<T>) -> std::time::Duration {
        let cap = item
            .deadline()
            .map_or(std::time::Duration::MAX, |deadline| {
                deadline
                    .saturating_duration_since(self.clock.now())
                    .saturating_sub(self.signals.mean_service())
                    / 2
            });
        self.config().expert.retry.backoff_within(item.attempt, cap)
    }

    /// Records `Failed` at once without a dead-letter sink; with one, hands the message to a
    /// dead-lettering task, so the caller (a worker) is free at once. Waits only while
    /// `max_dead_lettering` messages are already in the dead-letter path; released
    /// unacknowledged if shutdown begins meanwhile.
    pub(crate) async fn dead_letter(
        self: &Arc<Self>,
        item: Item<T>,
        reason: &'static str,
        error: String,
    ) {
        let Some(sink) = self.dead_letters.sink.clone() else {
            return self.fail(item);
        };
        let permit = tokio::select! {
            biased;
            permit = Arc::clone(&self.dead_letters.permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                // Never closed; were it, the message would be released, never lost.
                Err(_) => return drop(item),
            },
            _ = self.lifecycle.stop.cancelled() => return drop(item),
        };
        let this = Arc::clone(self);
        self.spawn(async move {
            this.dead_letter_until_done(sink, item, reason, error).await;
            drop(permit);
        });
    }

    pub(crate) fn fail(self: &Arc<Self>, item: Item<T>) {
        self.accounts.metrics.tiers[item.original]
            .failed
            .increment(1);
        self.settle(item, Disposition::Failed);
    }

    /// Publishes the dead letter and only then records `Failed` (the policy is on
    /// [`DeadLetterSink`]): transient errors are retried with the retry backoff; a permanent
    /// one is answered with a reference copy; if that is refused for good too, the message is
    /// held unacknowledged, counted and logged, and tried again after the longest backoff.
    /// Released unacknowledged when shutdown begins while it waits.
    pub(crate) async fn dead_letter_until_done(
        self: Arc<Self>,
        sink: Arc<dyn DeadLetterSink<T>>,
        item: Item<T>,
        reason: &'static str,
        error: String,
    ) {
        let metrics = &self.accounts.metrics;
        let info = self.republish_info(&item, reason, Some(error));
        let mut held: Option<HeldDeadLetter<'_>> = None;
        let mut attempt = 0u32;
        loop {
            let wait = match sink.publish(item.payload(), &info).await {
                Ok(()) => break,
                Err(e) if e.is_permanent() => {
                    let original = info.error.as_deref().unwrap_or_default();
                    let text = format!("dead letter refused for good: {e}; {reason}: {original}");
                    let reference =
                        self.republish_info(&item, DEAD_LETTER_REJECTED, Some(bound(text)));
                    match sink.publish_reference(item.payload(), &reference).await {
                        Ok(()) => {
                            metrics.dead_letter_references.increment(1);
                            break;
                        }
                        Err(r) if r.is_permanent() => {
                            if held.is_none() {
                                metrics.dead_letter_rejected.increment(1);
                                held = Some(self.dead_letters.hold());
                            }
                            self.log_dead_letter_held(&e, &r);
                            // Refused for good, as far as anyone can tell: a topic created or a
                            // limit raised later lets it through, so it is tried again, rarely.
                            self.config().expert.retry.max_backoff()
                        }
                        Err(_) => {
                            metrics.dead_letter_retries.increment(1);
                            attempt = attempt.saturating_add(1);
                            self.config().expert.retry.backoff(attempt)
                        }
                    }
                }
                Err(_) => {
                    metrics.dead_letter_retries.increment(1);
                    attempt = attempt.saturating_add(1);
                    self.config().expert.retry.backoff(attempt)
                }
            };
            tokio::select! {
                // Released unacknowledged: redelivered after a restart, never lost.
                _ = self.lifecycle.stop.cancelled() => return drop(item),
                _ = tokio::time::sleep(wait) => {}
            }
        }
        drop(held);
        self.fail(item);
    }

    /// One warning per [`DEAD_LETTER_LOG_EVERY`](super::dead_letter::DEAD_LETTER_LOG_EVERY) at most: a sink that refuses every message
    /// must not flood the log.
    pub(crate) fn log_dead_letter_held(
        &self,
        full: &crate::runtime::SinkError,
        reference: &crate::runtime::SinkError,
    ) {
        if self.dead_letters.may_log(self.now_ns()) {
            tracing::warn!(
                held = self.dead_letters.held(),
                "dead letter refused for good ({full}) and its reference copy too ({reference}): \
                 the message is held unacknowledged, its source position kept, and tried again \
                 every {:?}",
                self.config().expert.retry.max_backoff()
            );
        }
    }
}
