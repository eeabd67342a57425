//! The configuration files the examples ship load, and say what their comments say.

use triage::runtime::RuntimeConfig;

/// `examples/overload/triage.toml` is valid, and as it ships it is the configuration the
/// overload example runs without `--config` (the zero-configuration defaults with 8 workers),
/// so that `--config examples/overload/triage.toml` reproduces the first command.
#[test]
fn the_overload_examples_file_loads_and_is_its_default_run() {
    let text = include_str!("../../examples/overload/triage.toml");
    let config = RuntimeConfig::from_toml(text).expect("examples/overload/triage.toml loads");
    let expected = RuntimeConfig {
        workers: 8.try_into().unwrap(),
        ..RuntimeConfig::default()
    };
    assert_eq!(config, expected);
}

/// The same file in the layout before the expert group (`[queue]`, `[admission]`, `[shares]`,
/// `poll_interval_ms` at the top level), as users wrote it, loads to the same configuration.
#[test]
fn the_overload_examples_file_in_the_old_layout_loads_the_same() {
    let old = RuntimeConfig::from_toml(include_str!("old_layout.toml")).expect("old layout loads");
    let new =
        RuntimeConfig::from_toml(include_str!("../../examples/overload/triage.toml")).unwrap();
    assert_eq!(old, new);
    // Its commented lines too, uncommented: the whole old layout, limit and retry included.
    let uncommented = uncomment(include_str!("old_layout.toml"));
    let old = RuntimeConfig::from_toml(&uncommented).expect("old layout, uncommented, loads");
    let new = RuntimeConfig::from_toml(&uncomment(include_str!(
        "../../examples/overload/triage.toml"
    )))
    .unwrap();
    assert_eq!(old, new);
}

fn uncomment(text: &str) -> String {
    text.lines()
        .map(|l| match l.strip_prefix("# ") {
            // A commented key or table, not prose.
            Some(rest) if rest.starts_with('[') || rest.split_whitespace().nth(1) == Some("=") => {
                rest.to_owned()
            }
            _ => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every commented-out line of the file is valid too once uncommented (section by section),
/// so the examples in its comments cannot rot.
#[test]
fn the_overload_examples_commented_lines_load_when_uncommented() {
    let text = include_str!("../../examples/overload/triage.toml");
    let uncommented = uncomment(text);
    RuntimeConfig::from_toml(&uncommented).unwrap_or_else(|e| {
        panic!("examples/overload/triage.toml, uncommented, does not load: {e}\n{uncommented}")
    });
}
