//! Lifecycle: stopping (shutdown began), killing (the grace ran out, or the runtime was
//! dropped), the tasks that own messages outside the queue (deferrals, dead letters, holds,
//! retries), and the sources still pulling.

use crate::sync::AtomicUsize;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What shutdown and drop act on.
pub(crate) struct Lifecycle {
    /// Stop taking new work (shutdown began).
    pub(crate) stop: CancellationToken,
    /// Deferral, dead-letter, hold and retry tasks, so shutdown can wait for them.
    pub(crate) tasks: TaskTracker,
    /// Ends every task of `tasks` at its next poll, dropping what it holds (which releases
    /// its message): when shutdown's grace runs out, or the runtime is dropped.
    pub(crate) kill: CancellationToken,
    /// Sources still being pulled (not finished, not stopped).
    pub(crate) pulling: AtomicUsize,
}

impl Lifecycle {
    pub(crate) fn new() -> Self {
        Lifecycle {
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            kill: CancellationToken::new(),
            pulling: AtomicUsize::new(0),
        }
    }

    /// Spawns a task that owns messages: tracked (shutdown waits for it) and killable
    /// (`kill` drops it, releasing its messages unacknowledged, never recording them twice:
    /// a message is settled inside the task or released by the drop, not both).
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks
            .spawn(self.kill.clone().run_until_cancelled_owned(task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_killed_task_drops_what_it_owns_and_shutdown_sees_it_end() {
        let lifecycle = Lifecycle::new();
        let (owned, dropped) = tokio::sync::oneshot::channel::<()>();
        lifecycle.spawn(async move {
            let _owned = owned;
            std::future::pending::<()>().await
        });
        lifecycle.tasks.close();
        assert_eq!(lifecycle.tasks.len(), 1);
        lifecycle.kill.cancel();
        lifecycle.tasks.wait().await;
        // The sender was dropped with the task, never used.
        assert!(dropped.await.is_err());
    }
}
