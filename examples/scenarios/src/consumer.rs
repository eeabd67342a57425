//! What consumes a scenario's messages.

use triage::runtime::RuntimeConfig;

/// A consumer to compare. Every triage column is a [`RuntimeConfig`] (the scenario's workers
/// and memory budget applied on top), so another way of configuring the runtime is one more
/// value here.
#[derive(Clone, Debug)]
pub enum Consumer {
    /// A plain bounded FIFO: the same workers pulling in order from a channel of `capacity`
    /// messages, serving everything, retrying a failed call at once up to three times.
    Fifo {
        /// The channel's capacity, messages.
        capacity: usize,
    },
    /// The triage runtime with this configuration.
    Triage(Box<RuntimeConfig>),
}

impl Consumer {
    /// The FIFO with a channel of 256 messages (README's first command's).
    pub fn fifo() -> Self {
        Consumer::Fifo { capacity: 256 }
    }

    /// Triage with today's defaults.
    pub fn defaults() -> Self {
        Consumer::Triage(Box::default())
    }
}
