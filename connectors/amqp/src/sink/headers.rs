//! The properties of a re-published message: the original ones, its headers copied once,
//! plus the triage headers.

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use triage::runtime::Republish;
use triage::wire::{
    self, ATTEMPT, CRITICALITY, DEADLINE_MS, DEFERRALS, ERROR, ORIGIN_QUEUE, REASON,
};

use crate::AmqpMessage;

/// Properties for the copy of `message`: everything of the original except `expiration`
/// (the copy's TTL would restart on re-publish; the deadline travels in
/// `triage-deadline-ms`) and `user_id` (the broker refuses one that is not the publishing
/// connection's user), persistent, with the original headers plus the triage headers of the
/// [`wire`] contract, every value as text (a label or a decimal number).
pub(crate) fn republish_properties(message: &AmqpMessage, info: &Republish) -> BasicProperties {
    let original = message.properties();
    // A map keyed by name: copying the table once and overwriting the triage keys leaves
    // every original header exactly once and every triage header exactly once.
    let mut headers: FieldTable = original.headers().clone().unwrap_or_default();
    let mut set = |name: &str, value: &str| {
        headers.insert(
            ShortString::from(name),
            AMQPValue::LongString(LongString::from(value)),
        );
    };
    set(CRITICALITY, info.criticality.as_str());
    set(ATTEMPT, &info.attempt.to_string());
    set(DEFERRALS, &info.deferrals.to_string());
    set(REASON, info.reason);
    if !message.queue().is_empty() {
        set(ORIGIN_QUEUE, message.queue());
    }
    if let Some(deadline) = info.deadline {
        set(DEADLINE_MS, &wire::format_deadline_ms(deadline));
    }
    if let Some(error) = &info.error {
        set(ERROR, wire::bound_error(error));
    }
    if info.deadline.is_none() {
        remove(&mut headers, DEADLINE_MS);
    }
    if info.error.is_none() {
        remove(&mut headers, ERROR);
    }

    let mut props = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2);
    if let Some(v) = original.content_type() {
        props = props.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        props = props.with_content_encoding(v.clone());
    }
    if let Some(v) = original.priority() {
        props = props.with_priority(*v);
    }
    if let Some(v) = original.correlation_id() {
        props = props.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        props = props.with_reply_to(v.clone());
    }
    if let Some(v) = original.message_id() {
        props = props.with_message_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        props = props.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        props = props.with_type(v.clone());
    }
    if let Some(v) = original.app_id() {
        props = props.with_app_id(v.clone());
    }
    if let Some(v) = original.cluster_id() {
        props = props.with_cluster_id(v.clone());
    }
    props
}

fn remove(headers: &mut FieldTable, name: &str) {
    if headers.contains_key(name) {
        let kept = headers
            .inner()
            .iter()
            .filter(|(k, _)| k.as_str() != name)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<std::collections::BTreeMap<_, _>>();
        *headers = FieldTable::from(kept);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use triage::Criticality;

    use super::*;

    fn republish(error: Option<&str>) -> Republish {
        Republish {
            criticality: Criticality::High,
            attempt: 2,
            deferrals: 3,
            deadline: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
            reason: if error.is_some() {
                "failed"
            } else {
                "overloaded"
            },
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn copies_headers_once_and_adds_triage_headers() {
        let mut h = FieldTable::default();
        h.insert("tenant".into(), AMQPValue::LongString("acme".into()));
        h.insert("triage-attempt".into(), AMQPValue::LongInt(1));
        let msg = AmqpMessage::new(b"x".to_vec())
            .with_properties(
                BasicProperties::default()
                    .with_headers(h)
                    .with_priority(6)
                    .with_message_id("m-1".into())
                    .with_expiration("5000".into())
                    .with_user_id("someone".into()),
            )
            .with_queue("orders");
        let props = republish_properties(&msg, &republish(None));
        let headers = props.headers().clone().unwrap();
        let get = |k: &str| headers.inner().get(k).cloned();
        assert_eq!(get("tenant"), Some(AMQPValue::LongString("acme".into())));
        let text = |v: &str| Some(AMQPValue::LongString(v.into()));
        assert_eq!(get(ATTEMPT), text("2"));
        assert_eq!(get(DEFERRALS), text("3"));
        assert_eq!(get(CRITICALITY), Some(AMQPValue::LongString("high".into())));
        assert_eq!(
            get(REASON),
            Some(AMQPValue::LongString("overloaded".into()))
        );
        assert_eq!(
            get(ORIGIN_QUEUE),
            Some(AMQPValue::LongString("orders".into()))
        );
        assert_eq!(get(DEADLINE_MS), text("1700000000123"));
        assert_eq!(get(ERROR), None);
        assert_eq!(headers.inner().len(), 7);
        assert_eq!(props.delivery_mode(), &Some(2));
        assert_eq!(props.priority(), &Some(6));
        assert_eq!(props.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
        assert_eq!(props.expiration(), &None);
        assert_eq!(props.user_id(), &None);
    }

    #[test]
    fn dead_letters_carry_a_bounded_error() {
        let long = "é".repeat(2_000);
        let props = republish_properties(&AmqpMessage::new(Vec::new()), &republish(Some(&long)));
        let headers = props.headers().clone().unwrap();
        let Some(AMQPValue::LongString(e)) = headers.inner().get(ERROR) else {
            panic!("no error header");
        };
        assert!(e.as_bytes().len() <= wire::MAX_ERROR_BYTES);
        assert!(e.as_bytes().len() >= wire::MAX_ERROR_BYTES - 1);
        assert!(std::str::from_utf8(e.as_bytes()).is_ok());
        assert_eq!(headers.inner().get(ORIGIN_QUEUE), None);
    }
}
