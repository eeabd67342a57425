//! Stamping follow-up messages for the next hop: the job's criticality and deadline as AMQP
//! headers, in the core's wire contract ([`triage::wire`]).

use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use triage::runtime::Propagation;

/// Sets `propagation`'s headers in `headers` ([`triage::wire::CRITICALITY`] and, with a
/// deadline, [`triage::wire::DEADLINE_MS`], as long strings), replacing any of the same name:
/// a stage consuming the output queue as a trusted queue (`classify.trusted_queues`)
/// classifies each message at the criticality it inherited and expires it, unhandled, once
/// the original deadline has passed.
pub fn stamp(headers: &mut FieldTable, propagation: &Propagation) {
    for (name, value) in propagation.headers() {
        headers.insert(
            name.into(),
            AMQPValue::LongString(LongString::from(value.as_bytes())),
        );
    }
}

/// `properties` with `propagation`'s headers set (see [`stamp`]), the others kept: for
/// `basic_publish` from a handler, so a consume-transform-publish stage is two lines.
///
/// # Examples
///
/// ```no_run
/// use triage::runtime::{HandlerError, Job};
/// use triage_amqp::lapin::options::BasicPublishOptions;
/// use triage_amqp::lapin::{BasicProperties, Channel};
/// use triage_amqp::AmqpMessage;
///
/// async fn stage(job: Job<AmqpMessage>, channel: &Channel) -> Result<(), HandlerError> {
///     let props = triage_amqp::stamped(BasicProperties::default(), &job.propagation());
///     channel
///         .basic_publish("", "orders.enriched", BasicPublishOptions::default(), job.payload().body(), props)
///         .await
///         .map(drop)
///         .map_err(|e| HandlerError::downstream("rabbitmq", e))
/// }
/// # let _ = stage;
/// ```
pub fn stamped(properties: BasicProperties, propagation: &Propagation) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    stamp(&mut headers, propagation);
    properties.with_headers(headers)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use triage::runtime::Job;
    use triage::{wire, Criticality};

    use super::*;

    #[test]
    fn stamps_and_replaces() {
        let clock = triage::quanta::Clock::new();
        let job = Job::detached(
            (),
            Criticality::High,
            Some(clock.now() + Duration::from_secs(3)),
            clock,
        );
        let mut old = FieldTable::default();
        old.insert(
            wire::CRITICALITY.into(),
            AMQPValue::LongString("critical".into()),
        );
        old.insert("trace".into(), AMQPValue::LongString("t1".into()));
        let props = stamped(
            BasicProperties::default().with_headers(old),
            &job.propagation(),
        );
        let h = props.headers().clone().unwrap();
        assert_eq!(h.inner().len(), 3);
        let text = |k: &str| match h.inner().get(k) {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(text(wire::CRITICALITY), "high");
        assert_eq!(text("trace"), "t1");
        assert!(wire::parse_deadline_ms(text(wire::DEADLINE_MS).as_bytes()).is_some());
    }
}
