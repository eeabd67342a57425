//! The committer thread: commits the settled watermark every `commit_interval_ms`, one
//! synchronous commit at a time, and makes the final commit at shutdown.
//!
//! Why a thread of its own and synchronous commits: librdkafka reports the result of an
//! application's asynchronous `rd_kafka_commit` only to a C `offset_commit_cb`, which rdkafka
//! does not install (it listens for events), so an asynchronous commit is fire-and-forget:
//! nothing confirms it, a failed one is not retried on purpose, and while the coordinator is
//! unreachable librdkafka queues every one of them (the rejoin after the outage then waits for
//! all of them). A synchronous commit here has its result, never overlaps the next one, and
//! blocks neither the poll thread nor the group protocol. The commit on revocation stays on
//! the poll thread, inside the rebalance callback, as librdkafka documents.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::CommitTrigger;

use super::client::{close_elsewhere, SharedClient};
use super::offsets::{Committed, Offsets};

/// What the poll thread asks of the committer.
pub(crate) enum Request {
    /// Commit now (shutdown), reply whether everything settled is committed, then stop.
    Final(SyncSender<bool>),
}

pub(crate) struct Committer {
    pub(crate) client: SharedClient,
    pub(crate) offsets: Arc<Offsets>,
    pub(crate) interval: Duration,
    pub(crate) requests: Receiver<Request>,
}

impl Committer {
    pub(crate) fn run(self) {
        loop {
            match self.requests.recv_timeout(self.interval) {
                Err(RecvTimeoutError::Timeout) => {
                    self.commit(CommitTrigger::Interval);
                }
                Ok(Request::Final(reply)) => {
                    let done = self.commit(CommitTrigger::Shutdown) != Committed::Failed;
                    let _ = reply.send(done);
                    return;
                }
                // The poll thread is gone without a final commit (it panicked): stop.
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn commit(&self, trigger: CommitTrigger) -> Committed {
        // Clone the client out of its share: the commit may take as long as the coordinator
        // does, and the poll thread must be able to replace the client meanwhile.
        let consumer = Arc::clone(&self.client.lock());
        let result = self.offsets.commit(&consumer, trigger);
        if !Arc::ptr_eq(&consumer, &self.client.lock()) {
            // Replaced while this commit waited: if this is the last reference, closing the
            // old client (which polls until closed) must not delay the next commit.
            close_elsewhere(consumer);
        }
        result
    }
}
