//! Errors of the RabbitMQ connector.

use thiserror::Error;

/// What went wrong talking to RabbitMQ or setting the connector up.
///
/// `Display` is lowercase and short; the broker's own error is the
/// [`source`](std::error::Error::source).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// The configuration is out of range.
    #[error("invalid configuration")]
    Config(#[from] triage::ConfigError),
    /// Opening the connection failed (broker down, refused, bad URI or credentials).
    #[error("cannot connect to the broker")]
    Connect(#[source] lapin::Error),
    /// Opening the channel or setting it up (qos, declare, confirm, consume) failed.
    #[error("cannot set up the channel: {step}")]
    Setup {
        /// The AMQP method that failed, e.g. `queue.declare`.
        step: &'static str,
        /// The broker's or the client's error.
        #[source]
        source: lapin::Error,
    },
    /// The connector was shut down.
    #[error("connector is shut down")]
    Closed,
}

impl AmqpError {
    pub(crate) fn setup(step: &'static str) -> impl FnOnce(lapin::Error) -> AmqpError {
        move |source| AmqpError::Setup { step, source }
    }
}
