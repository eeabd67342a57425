//! Pins `Send`/`Sync` of every public type and of the source's futures.

use triage::runtime::Source;
use triage_amqp::*;

fn send<T: Send>() {}
fn send_sync<T: Send + Sync>() {}
fn send_future<F: std::future::Future + Send>(_: &F) {}

#[test]
fn public_types_are_send_and_sync() {
    send::<AmqpSource>();
    send_sync::<AmqpDeferSink>();
    send_sync::<AmqpMessage>();
    send_sync::<AmqpError>();
    send_sync::<AmqpSourceConfig>();
    send_sync::<AmqpSinkConfig>();
    send_sync::<AmqpSourceStats>();
    send_sync::<ReconnectConfig>();
    send_sync::<PriorityMapping>();
}

#[allow(dead_code)]
fn source_futures_are_send(source: &mut AmqpSource) {
    send_future(&source.next());
    send_future(&source.shutdown());
}
