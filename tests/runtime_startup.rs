//! What a runtime refuses to start or attach with, naming the setting: a configuration out of
//! range, a `defer` policy without a defer sink, one sink for deferrals and dead letters, a
//! source that relies on a dead-letter sink the runtime does not have.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{config, ok_handler};
use triage::runtime::{MemoryBroker, MemorySink, RefusalPolicy, Runtime, RuntimeConfig};

/// Every refusal names the dotted key and its range, whether serde or `validate` finds it, and
/// whether the file is in the new layout or the one before the expert group.
#[test]
fn invalid_config_names_the_field_and_range() {
    let cases = [
        (
            "[expert.queue.weights]\ncritical = -1\nhigh = 4\nmedium = 2\nsheddable = 1",
            "expert.queue.weights.critical = -1 is out of range: allowed 1..=1000",
        ),
        (
            // The layout before the expert group: named as written, and where it lives now.
            "[queue.weights]\ncritical = 8\nhigh = 0\nmedium = 2\nsheddable = 1",
            "queue.weights.high = 0 is out of range: allowed 1..=1000 (the setting is now \
             `expert.queue.weights.high`",
        ),
        (
            "[expert.queue.admission.cutoff_ms]\ncritical = 400\nhigh = 500\nmedium = 80\n\
             sheddable = 20",
            "expert.queue.admission.cutoff_ms.high = 500 is out of range: allowed 1..=400",
        ),
        (
            "[queue]\ncapacity = 0",
            "queue.capacity = 0 is out of range: allowed 1..=4294967296 (the setting is now \
             `expert.queue.capacity`",
        ),
        (
            "workers = 0",
            "workers = 0 is out of range: allowed 1..=100000",
        ),
        (
            "[expert]\nmax_held = 200000",
            "expert.max_held = 200000 is out of range: allowed 1..=100000",
        ),
        (
            "max_deferring = -3",
            "max_deferring = -3 is out of range: allowed 1..=100000 (the setting is now \
             `expert.max_deferring`",
        ),
        (
            "[expert]\nmax_dead_lettering = 0",
            "expert.max_dead_lettering = 0 is out of range: allowed 1..=100000",
        ),
        (
            "[retry]\nmax_retries = 1000",
            "retry.max_retries = 1000 is out of range: allowed 0..=100",
        ),
        (
            "[expert.limit]\nkind = \"aimd\"\nbackoff_ratio = 1.5",
            "expert.limit.backoff_ratio = 1.5 is out of range",
        ),
        (
            "[expert.queue.admission]\nexit_ratio = 1.0",
            "expert.queue.admission.exit_ratio = 1 is out of range",
        ),
        (
            "[expert.shares]\ncritical = 1.0\nhigh = 0.9\nmedium = 0.95\nsheddable = 0.5",
            "expert.shares.medium = 0.95 is out of range: allowed (0, 0.9 (shares.high)]",
        ),
        ("bogus = 1", "bogus: unknown field `bogus`"),
        ("[expert]\nbogus = 1", "expert.bogus: unknown field `bogus`"),
    ];
    for (text, expected) in cases {
        let err = RuntimeConfig::from_toml(text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text:?}: {err}");
    }
}

/// A `defer` written out without a defer sink would shed what it promises to keep: refused
/// at start-up, naming the tier. The default (`defer_or_drop`) still starts without one.
#[tokio::test(flavor = "current_thread")]
async fn a_defer_policy_without_a_defer_sink_is_refused_at_start() {
    let policies = |medium: &str| {
        format!(
            "[policy]\ncritical = \"backpressure\"\nhigh = \"backpressure\"\n\
             medium = \"{medium}\"\nsheddable = \"defer_or_drop\""
        )
    };
    let c = RuntimeConfig::from_toml(&policies("defer")).unwrap();
    let err = Runtime::builder(c.clone())
        .start(ok_handler)
        .unwrap_err()
        .to_string();
    assert!(err.contains("policy.medium = defer"), "{err}");
    assert!(err.contains("no defer sink"), "{err}");
    let rt = Runtime::builder(c)
        .defer_sink(Arc::new(MemorySink::new()))
        .start(ok_handler)
        .unwrap();
    rt.shutdown(Duration::from_secs(1)).await;

    let c = RuntimeConfig::default();
    assert_eq!(c.policy.sheddable, RefusalPolicy::DeferOrDrop);
    let rt = Runtime::builder(c).start(ok_handler).unwrap();
    rt.shutdown(Duration::from_secs(1)).await;
    let c = RuntimeConfig::from_toml(&policies("drop")).unwrap();
    assert_eq!(c.policy.sheddable, RefusalPolicy::DeferOrDrop);
    let rt = Runtime::builder(c).start(ok_handler).unwrap();
    rt.shutdown(Duration::from_secs(1)).await;
}

/// The same sink for deferrals and dead letters would drain dead letters back as deferred
/// work: refused at start-up.
#[tokio::test(flavor = "current_thread")]
async fn one_sink_for_deferrals_and_dead_letters_is_refused_at_start() {
    let sink = Arc::new(MemorySink::new());
    let err = Runtime::builder(config(1, 8))
        .defer_sink(Arc::clone(&sink))
        .dead_letter_sink(Arc::clone(&sink))
        .start(ok_handler)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dead_letter_sink"), "{err}");
}

/// A source that acknowledges failed messages because the dead-letter sink keeps them.
struct NeedsDeadLetters(triage::runtime::MemorySource<u32>);

impl triage::runtime::Source for NeedsDeadLetters {
    type Payload = u32;

    async fn next(&mut self) -> Option<triage::runtime::Envelope<u32>> {
        self.0.next().await
    }

    fn needs_dead_letter_sink(&self) -> Option<&'static str> {
        Some("dead_letter_via_sink")
    }
}

/// A source that relies on a dead-letter sink is refused by a runtime without one, with an
/// error naming the source's setting; accepted by one with a sink.
#[tokio::test(flavor = "current_thread")]
async fn a_source_that_relies_on_a_dead_letter_sink_is_refused_without_one() {
    let broker = MemoryBroker::new();
    let mut rt = Runtime::builder(config(1, 8)).start(ok_handler).unwrap();
    let err = rt
        .try_attach(NeedsDeadLetters(broker.source()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("dead_letter_via_sink = true"), "{err}");
    assert!(err.contains("dead-letter sink"), "{err}");
    rt.shutdown(Duration::from_secs(1)).await;
    let mut rt = Runtime::builder(config(1, 8))
        .dead_letter_sink(Arc::new(MemorySink::new()))
        .start(ok_handler)
        .unwrap();
    rt.try_attach(NeedsDeadLetters(broker.source())).unwrap();
    rt.shutdown(Duration::from_secs(1)).await;
}
