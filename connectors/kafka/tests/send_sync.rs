//! Pins `Send`/`Sync` for every public type (no broker needed).

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

#[test]
fn public_types_are_send_and_sync() {
    send::<triage_kafka::KafkaSource>();
    send_sync::<triage_kafka::KafkaDeferSink>();
    send_sync::<triage_kafka::KafkaMessage>();
    send_sync::<triage_kafka::KafkaSourceConfig>();
    send_sync::<triage_kafka::KafkaSinkConfig>();
    send_sync::<triage_kafka::KafkaSourceBuilder>();
    send_sync::<triage_kafka::Error>();
    send_sync::<triage_kafka::source::SourceStats>();
    send_sync::<triage_kafka::source::StatsHandle>();
    send_sync::<triage_kafka::source::UnclassifiedReason>();
    send_sync::<triage_kafka::source::MessageMeta<'static>>();
}
