//! The configuration files the examples ship load, and say what their comments say.

use triage::runtime::RuntimeConfig;

/// `examples/overload/triage.toml` is valid, and as it ships it is the configuration the
/// overload example runs without `--config` (the defaults, 8 workers, a queue of 256, a 1 ms
/// poll), so that `--config examples/overload/triage.toml` reproduces the first command.
#[test]
fn the_overload_examples_file_loads_and_is_its_default_run() {
    let text = include_str!("../../examples/overload/triage.toml");
    let config = RuntimeConfig::from_toml(text).expect("examples/overload/triage.toml loads");
    let mut expected = RuntimeConfig {
        workers: 8.try_into().unwrap(),
        poll_interval_ms: 1,
        ..RuntimeConfig::default()
    };
    expected.queue.capacity = 256.try_into().unwrap();
    assert_eq!(config, expected);
}

/// Every commented-out line of the file is valid too once uncommented (section by section),
/// so the examples in its comments cannot rot.
#[test]
fn the_overload_examples_commented_lines_load_when_uncommented() {
    let text = include_str!("../../examples/overload/triage.toml");
    let uncommented: String = text
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            // A commented key or table, not prose.
            Some(rest) if rest.starts_with('[') || rest.split_whitespace().nth(1) == Some("=") => {
                rest.to_owned()
            }
            _ => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    RuntimeConfig::from_toml(&uncommented).unwrap_or_else(|e| {
        panic!("examples/overload/triage.toml, uncommented, does not load: {e}\n{uncommented}")
    });
}
