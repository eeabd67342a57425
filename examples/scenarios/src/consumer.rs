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

    /// Triage with the defaults before the zero-configuration controller: the prefetch, service
    /// by weight alone, whatever the deadlines (see [`previous_defaults`]).
    pub fn previous_defaults() -> Self {
        Consumer::Triage(Box::new(previous_defaults()))
    }

    /// Triage with `RuntimeConfig::default()`: the zero-configuration default.
    pub fn zero_config() -> Self {
        Consumer::Triage(Box::default())
    }
}

/// The defaults as they were before the zero-configuration controller, kept reproducible:
/// `RuntimeConfig::default()` with the expert switch `expert.admission.derive_bounds` off.
pub fn previous_defaults() -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.expert.admission.derive_bounds = false;
    c
}
