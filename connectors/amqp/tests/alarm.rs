//! A broker resource alarm (`connection.blocked`) while the sink publishes: the publish fails
//! within the confirm timeout instead of hanging, and the sink reports itself unhealthy until
//! the alarm clears.
//!
//! Sets the broker's memory high watermark to almost nothing, which blocks every publisher on
//! the broker: run it alone, under the exclusive broker lock
//! (`flock -x /tmp/brokers.lock cargo test -p triage-amqp --test alarm`). Its own test binary
//! with one test, so nothing else of this crate runs meanwhile; a guard restores the
//! watermark even if the test fails.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use triage::runtime::{DeferSink, Republish, SinkError};
use triage::Criticality;
use triage_amqp::{AmqpDeferSink, AmqpMessage, AmqpSinkConfig};

fn ctl(args: &[&str]) -> String {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .expect("rabbitmqctl");
    assert!(out.status.success(), "rabbitmqctl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Puts the memory watermark back as it was, on drop.
struct RestoreWatermark(String);

impl Drop for RestoreWatermark {
    fn drop(&mut self) {
        ctl(&["set_vm_memory_high_watermark", &self.0]);
    }
}

fn republish() -> Republish {
    Republish {
        criticality: Criticality::Medium,
        attempt: 0,
        deferrals: 1,
        deadline: None,
        reason: "overloaded",
        error: None,
    }
}

/// The test's own bound on a publish that must not hang (the sink's is 2 s).
const HANG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_connection_fails_the_publish_within_the_confirm_timeout() {
    let (_conn, ch) = admin().await;
    let dq = rand_queue("alarm");
    let mut cfg = AmqpSinkConfig::new(uri(), &dq);
    cfg.confirm_timeout_ms = 2_000;
    let sink = AmqpDeferSink::connect(cfg).await.unwrap();
    let msg = AmqpMessage::new(b"copy".to_vec());
    DeferSink::publish(&sink, &msg, &republish()).await.unwrap();
    assert!(sink.is_healthy());

    let watermark = ctl(&["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."]);
    // A relative watermark prints as a float; anything else is restored as the default.
    let restore = if watermark.parse::<f64>().is_ok() {
        watermark
    } else {
        "0.4".to_owned()
    };
    let guard = RestoreWatermark(restore);
    ctl(&["set_vm_memory_high_watermark", "0.0000001"]);
    assert!(
        eventually(|| ctl(&["eval", "rabbit_alarm:get_alarms()."]).contains("memory")).await,
        "the memory alarm never fired"
    );

    // Blocked: the broker stops reading the connection, so a body larger than the socket
    // buffers never finishes writing. Bounded, not hung.
    let big = AmqpMessage::new(vec![7u8; 8 * 1024 * 1024]);
    let first = tokio::time::timeout(HANG, DeferSink::publish(&sink, &big, &republish()))
        .await
        .expect("the publish hung under a resource alarm");
    let err = first.unwrap_err();
    eprintln!("alarm: first publish: {err}");
    assert!(
        matches!(err, SinkError::NotConfirmed(_) | SinkError::Unavailable(_)),
        "{err:?}"
    );
    assert!(!sink.is_healthy());
    // Once the broker has said so, publishes fail at once instead of waiting out the bound.
    let second = tokio::time::timeout(HANG, DeferSink::publish(&sink, &msg, &republish()))
        .await
        .expect("the second publish hung");
    eprintln!(
        "alarm: second publish: {:?}",
        second.as_ref().map_err(ToString::to_string)
    );
    assert!(second.is_err());
    assert!(!sink.is_healthy());

    drop(guard);
    let mut recovered = false;
    for _ in 0..60 {
        if DeferSink::publish(&sink, &msg, &republish()).await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(recovered, "the sink publishes again once the alarm clears");
    assert!(sink.is_healthy());
    delete(&ch, &dq).await;
}
