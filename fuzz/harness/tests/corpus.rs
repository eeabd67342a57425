//! The fuzz targets' smoke run on stable: every committed corpus input and crash reproducer
//! (`fuzz/corpus/<target>/`, `fuzz/regressions/<target>/`) through its target's body, so a
//! change that breaks an invariant an input once exercised fails the test suite, without
//! libFuzzer or nightly.
//!
//! `fuzz/open/<target>/` holds reproducers of defects found but not yet fixed (in code another
//! change owns): each must still fail, so that the fix that makes it pass also moves it to
//! `fuzz/regressions/`, where it guards the fix from then on.

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let corpus = inputs(&root.join("corpus").join(target));
    assert!(!corpus.is_empty(), "no committed corpus for {target}");
    for path in corpus
        .iter()
        .chain(&inputs(&root.join("regressions").join(target)))
    {
        let data = std::fs::read(path).expect("readable input");
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(outcome.is_ok(), "{target}: {} fails", path.display());
    }
    for path in inputs(&root.join("open").join(target)) {
        let data = std::fs::read(path.as_path()).expect("readable input");
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(
            outcome.is_err(),
            "{target}: {} passes now: move it to fuzz/regressions/{target}/",
            path.display()
        );
    }
}

#[test]
fn wire() {
    replay("wire", triage_fuzz::wire::run);
}

#[test]
fn http_entry() {
    replay("http_entry", triage_fuzz::http_entry::run);
}

#[test]
fn kafka_classify() {
    replay("kafka_classify", triage_fuzz::kafka::run);
}

#[test]
fn amqp_classify() {
    replay("amqp_classify", triage_fuzz::amqp::run);
}

#[test]
fn config() {
    replay("config", triage_fuzz::config::run);
}

#[test]
fn every_target_is_replayed() {
    let names: Vec<&str> = triage_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "wire",
            "http_entry",
            "kafka_classify",
            "amqp_classify",
            "config"
        ]
    );
}
