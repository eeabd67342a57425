//! Pins `Send` and `Sync` for the public types, so a change that loses them fails here.

#![allow(dead_code)]

use triage::admission::{
    BorrowChain, BreakerConfig, Breakers, BucketConfig, BucketsConfig, Call, CircuitBreaker,
    CircuitState, CohortSet, Decision, DecisionCounts, Decisions, Grant, MemoryBudget,
    MemoryConfig, TierBuckets, TokenBucket,
};
use triage::ledger::{AckTracker, Ledger, LedgerSnapshot};
use triage::limit::{ConcurrencyLimit, Limiter, Permit, TierShares};
use triage::ordering::{Arrival, KeyGate, NullKeyOrdering, OrderingConfig, OrderingMode};
use triage::queue::{Dequeued, Entry, Evictions, PushError, QueueStats, WfqConfig, WfqQueue};
use triage::runtime::{
    Ack, ConfigHandle, Envelope, HandlerError, Job, MemoryBroker, MemorySink, MemorySource, Recall,
    ReconfigureError, Reconfigured, Report, Runtime, RuntimeConfig, RuntimeStats, SinkError,
    SubmitError,
};
use triage::{ConfigError, Criticality, PerTier};

fn send<T: Send>() {}
fn sync<T: Sync>() {}
fn send_sync<T: Send + Sync>() {}

/// Not `Sync`, to show the queue only needs `T: Send`.
struct Cell(std::cell::Cell<u32>);

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Criticality>();
    send_sync::<CohortSet>();
    send_sync::<PerTier<u64>>();
    send_sync::<ConfigError>();
    send_sync::<WfqConfig>();
    send_sync::<WfqQueue<Cell>>();
    send::<Entry<Cell>>();
    send::<Dequeued<Cell>>();
    send::<Evictions<Cell>>();
    send::<PushError<Cell>>();
    send_sync::<PushError<u32>>();
    send_sync::<QueueStats>();
    send_sync::<Ledger>();
    send_sync::<LedgerSnapshot>();
    send_sync::<AckTracker<(String, i32)>>();
    send_sync::<ConcurrencyLimit>();
    send_sync::<Permit>();
    send_sync::<Limiter>();
    send_sync::<TierShares>();
    send_sync::<Ack>();
    send::<Envelope<Vec<u8>>>();
    send_sync::<Job<Vec<u8>>>();
    send_sync::<HandlerError>();
    send_sync::<SinkError>();
    send::<SubmitError<Vec<u8>>>();
    send_sync::<MemoryBroker<Vec<u8>>>();
    send::<MemorySource<Vec<u8>>>();
    send_sync::<MemorySink<Vec<u8>>>();
    send_sync::<Runtime<Vec<u8>>>();
    send_sync::<RuntimeConfig>();
    send_sync::<RuntimeStats>();
    send_sync::<Report>();
    send_sync::<OrderingMode>();
    send_sync::<NullKeyOrdering>();
    send_sync::<OrderingConfig>();
    send_sync::<KeyGate<Cell>>();
    send::<Arrival<Cell>>();
    send_sync::<ConfigHandle>();
    send_sync::<Recall>();
    send_sync::<Reconfigured>();
    send_sync::<ReconfigureError>();
    send_sync::<BreakerConfig>();
    send_sync::<Breakers>();
    send_sync::<CircuitBreaker>();
    send_sync::<CircuitState>();
    send_sync::<Call>();
    send_sync::<TokenBucket>();
    send_sync::<TierBuckets>();
    send_sync::<Grant>();
    send_sync::<BucketConfig>();
    send_sync::<BucketsConfig>();
    send_sync::<BorrowChain>();
    send_sync::<MemoryBudget>();
    send_sync::<MemoryConfig>();
    send_sync::<Decision>();
    send_sync::<DecisionCounts>();
    send_sync::<Decisions>();
    let _ = sync::<Criticality>;
}
