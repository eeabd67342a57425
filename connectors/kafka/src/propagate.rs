//! Stamping follow-up records for the next hop: the job's criticality and deadline as Kafka
//! headers, in the core's wire contract ([`triage::wire`]).

use rdkafka::message::{Header, OwnedHeaders};
use triage::runtime::Propagation;

/// Appends `propagation`'s headers ([`triage::wire::CRITICALITY`] and, with a deadline,
/// [`triage::wire::DEADLINE_MS`]) to `headers`, for a record produced from a handler: a
/// consume-transform-produce stage is two lines, and a stage reading the output topic as a
/// trusted topic (`criticality.trusted_topics`) classifies each record at the criticality it
/// inherited and expires it, unhandled, once the original deadline has passed.
///
/// Start from headers without triage's own (a copy that kept an original
/// `triage-criticality` would carry two, and the reader takes the first).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use triage::runtime::{HandlerError, Job};
/// use triage_kafka::rdkafka::message::OwnedHeaders;
/// use triage_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
/// use triage_kafka::KafkaMessage;
///
/// async fn stage(job: Job<KafkaMessage>, producer: &FutureProducer) -> Result<(), HandlerError> {
///     let out = job.payload().payload.clone().unwrap_or_default();
///     let headers = triage_kafka::stamp(OwnedHeaders::new(), &job.propagation());
///     producer
///         .send(FutureRecord::<(), _>::to("orders.enriched").payload(&out).headers(headers), Duration::from_secs(5))
///         .await
///         .map(drop)
///         .map_err(|(e, _)| HandlerError::downstream("kafka", e))
/// }
/// # let _ = stage;
/// ```
pub fn stamp(headers: OwnedHeaders, propagation: &Propagation) -> OwnedHeaders {
    propagation.headers().fold(headers, |acc, (name, value)| {
        acc.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        })
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::message::Headers;
    use triage::runtime::Job;
    use triage::{wire, Criticality};

    use super::*;

    #[test]
    fn stamps_criticality_and_deadline() {
        let clock = triage::quanta::Clock::new();
        let job = Job::detached(
            (),
            Criticality::Critical,
            Some(clock.now() + Duration::from_secs(3)),
            clock,
        );
        let p = job.propagation().lower_to(Criticality::High).unwrap();
        let base = OwnedHeaders::new().insert(Header {
            key: "trace",
            value: Some("t1"),
        });
        let h = stamp(base, &p);
        assert_eq!(h.count(), 3);
        assert_eq!(h.get(1).key, wire::CRITICALITY);
        assert_eq!(h.get(1).value, Some(&b"high"[..]));
        assert_eq!(h.get(2).key, wire::DEADLINE_MS);
        let at = wire::parse_deadline_ms(h.get(2).value.unwrap()).unwrap();
        assert_eq!(
            Some(at),
            p.deadline().map(|d| {
                // Millisecond precision on the wire.
                std::time::UNIX_EPOCH
                    + Duration::from_millis(
                        d.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64,
                    )
            })
        );
    }
}
