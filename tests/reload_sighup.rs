//! Reloading the configuration file on SIGHUP (feature `reload`): write the file, send the
//! signal to this process, observe the new generation and behaviour; a bad file changes
//! nothing. A test binary of its own: the SIGHUP handler stays installed for the process.

#![cfg(all(unix, feature = "reload"))]

use std::path::Path;
use std::time::Duration;

use triage::runtime::{Ack, Envelope, HandlerError, Job, Runtime, RuntimeConfig, SubmitError};
use triage::Criticality;

const POLICY: &str = "[policy]\ncritical = \"backpressure\"\nhigh = \"backpressure\"\n\
                      medium = \"drop\"\nsheddable = \"backpressure\"\n";

fn hangup() {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// Sends SIGHUP until `done` holds: a signal sent before the handler's task first polled, or
/// two sent close together, may be delivered as one.
async fn hangup_until(done: impl Fn() -> bool) {
    for _ in 0..500 {
        hangup();
        for _ in 0..20 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    panic!("the reload never happened");
}

fn write(path: &Path, text: &str) {
    // Written beside and renamed into place, as editors and config managers do, so that a
    // reload never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_file_and_a_bad_file_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("triage-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("runtime.toml");
    write(&path, &format!("workers = 2\n{POLICY}"));
    let config = RuntimeConfig::from_toml(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let rt = Runtime::builder(config)
        .start(|_job: Job<u32>| async { Ok::<(), HandlerError>(()) })
        .unwrap();
    let handle = rt.config_handle();
    let task = handle.reload_on_sighup(&path).unwrap();
    let sheddable = |id| rt.try_submit(Envelope::new(id, Criticality::Sheddable, Ack::noop()));
    sheddable(0).unwrap();

    // The operator raises the forced shed level and sends SIGHUP.
    write(
        &path,
        &format!("workers = 2\nforced_shed_level = 1\n{POLICY}"),
    );
    hangup_until(|| rt.config_generation() == 2).await;
    assert_eq!(rt.config().forced_shed_level, 1);
    assert!(matches!(sheddable(1), Err(SubmitError::Overloaded(_))));

    // A bad file (out of range) is logged and changes nothing; the next good one applies.
    write(
        &path,
        &format!("workers = 2\nforced_shed_level = 7\n{POLICY}"),
    );
    assert_eq!(rt.config_refused(), 0);
    hangup_until(|| rt.config_refused() >= 1).await;
    assert_eq!(rt.config_generation(), 2);
    assert_eq!(rt.config().forced_shed_level, 1);
    write(
        &path,
        &format!("workers = 2\nforced_shed_level = 0\n{POLICY}"),
    );
    hangup_until(|| rt.config_generation() == 3).await;
    assert_eq!(rt.config().forced_shed_level, 0);
    sheddable(2).unwrap();

    // The task ends with the runtime.
    let _ = rt.shutdown(Duration::from_secs(1)).await;
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the reload task ends when the runtime stops")
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
