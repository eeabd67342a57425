//! Tests of loading a configuration: the old layout moved into the new one, and errors naming
//! the dotted field.

use toml::{Table, Value};

use super::migrate::{migrate, migrate_with};
use super::MOVED;
use super::{ExpertConfig, LoadConfigError, RuntimeConfig};

/// A file in the new layout in which every setting that moved differs from its default.
const EVERY_MOVED_SETTING: &str = r#"
workers = 4
[retry]
max_retries = 5
[memory]
budget_bytes = 1000000
[expert]
work_conserving = false
share_reserve_ms = 250
max_deferring = 512
max_dead_lettering = 32
defer_cooldown_ms = 2000
max_held = 1000
max_parked = 500
poll_interval_ms = 10
patience_share = 0.5
[expert.queue]
capacity = 64
max_bytes = 100000
[expert.queue.weights]
critical = 9
high = 5
medium = 3
sheddable = 1
[expert.queue.admission]
exit_ratio = 0.25
[expert.admission]
tick_ms = 50
prefetch_per_slot = 4
[expert.limit]
kind = "aimd"
initial = 4
max = 8
[expert.shares]
critical = 1.0
high = 0.8
medium = 0.6
sheddable = 0.4
[expert.breaker]
min_calls = 10
[expert.retry]
base_backoff_ms = 50
max_backoff_ms = 5000
[expert.memory.thresholds]
critical = 1.0
high = 0.9
medium = 0.8
sheddable = 0.6
"#;

/// Moves the settings at the new places of [`MOVED`] back to their old places, as a file
/// written before the expert group held them; asserts each was there to move.
fn to_old_layout(mut table: Table) -> Table {
    for &(old, new) in MOVED {
        let value = take(&mut table, new).unwrap_or_else(|| panic!("`{new}` is not in the file"));
        let (parents, key) = old
            .rsplit_once('.')
            .map_or((None, old), |(p, k)| (Some(p), k));
        let parent = match parents {
            None => &mut table,
            Some(p) => table
                .entry(p)
                .or_insert_with(|| Value::Table(Table::new()))
                .as_table_mut()
                .unwrap(),
        };
        parent.insert(key.to_owned(), value);
    }
    // What is left of `[expert]` is empty tables only.
    let expert = table.remove("expert").unwrap();
    assert!(
        expert
            .as_table()
            .unwrap()
            .values()
            .all(|v| v.as_table().is_some_and(|t| t
                .values()
                .all(|v| v.as_table().is_some_and(Table::is_empty)))),
        "a setting of [expert] that MOVED does not list: {expert}"
    );
    table
}

fn take(table: &mut Table, path: &str) -> Option<Value> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let key = parts.pop()?;
    let mut t = table;
    for p in parts {
        t = t.get_mut(p)?.as_table_mut()?;
    }
    t.remove(key)
}

#[test]
fn every_old_top_level_key_loads_to_the_same_configuration() {
    let new = RuntimeConfig::from_toml(EVERY_MOVED_SETTING).unwrap();
    // Every setting of the expert group differs from its default, so a setting the old
    // layout lost would show.
    let d = ExpertConfig::default();
    let e = &new.expert;
    assert!(e.queue.capacity != d.queue.capacity && e.queue.max_bytes != d.queue.max_bytes);
    assert!(e.queue.weights != d.queue.weights && e.queue.admission != d.queue.admission);
    assert!(e.admission != d.admission && e.limit != d.limit && e.shares != d.shares);
    assert!(e.work_conserving != d.work_conserving && e.share_reserve_ms != d.share_reserve_ms);
    assert!(e.breaker != d.breaker && e.max_deferring != d.max_deferring);
    assert!(e.max_dead_lettering != d.max_dead_lettering);
    assert!(e.defer_cooldown_ms != d.defer_cooldown_ms && e.max_held != d.max_held);
    assert!(e.max_parked != d.max_parked && e.poll_interval_ms != d.poll_interval_ms);
    assert!(e.patience_share != d.patience_share && e.retry != d.retry && e.memory != d.memory);

    // Written out in the new layout, moved back to the old one, read again: the same.
    let table = Table::try_from(&new).unwrap();
    let old_text = toml::to_string(&to_old_layout(table)).unwrap();
    for (old, _) in MOVED {
        let top = old.split('.').next().unwrap();
        assert!(old_text.contains(top), "{old} missing from\n{old_text}");
    }
    assert_eq!(
        RuntimeConfig::from_toml(&old_text).unwrap(),
        new,
        "{old_text}"
    );
    // Through serde too (a RuntimeConfig inside an application's own configuration).
    let through_serde: RuntimeConfig = toml::from_str(&old_text).unwrap();
    assert_eq!(through_serde, new);
}

#[test]
fn each_old_key_alone_moves_to_its_new_place() {
    let new = RuntimeConfig::from_toml(EVERY_MOVED_SETTING).unwrap();
    let full = Table::try_from(&new).unwrap();
    for &(old, new_path) in MOVED {
        // The one setting at its old place, everything else at the defaults.
        let mut only = Table::new();
        let value = take(&mut full.clone(), new_path).unwrap();
        let (parent, key) = old
            .rsplit_once('.')
            .map_or((None, old), |(p, k)| (Some(p), k));
        match parent {
            None => {
                only.insert(key.to_owned(), value.clone());
            }
            Some(p) => {
                only.insert(
                    p.to_owned(),
                    Value::Table(Table::from_iter([(key.to_owned(), value.clone())])),
                );
            }
        }
        let mut moved = only.clone();
        let done = migrate(&mut moved).unwrap();
        assert_eq!(done, vec![(old, new_path)]);
        let from_old = RuntimeConfig::from_toml(&toml::to_string(&only).unwrap()).unwrap();
        let at_new = toml::to_string(&moved).unwrap();
        assert_eq!(
            from_old,
            RuntimeConfig::from_toml(&at_new).unwrap(),
            "{old}"
        );
        assert_ne!(from_old, RuntimeConfig::default(), "{old} was not read");
    }
}

#[test]
fn a_setting_at_both_places_is_refused_naming_the_new_one() {
    let err = RuntimeConfig::from_toml("max_held = 10\n[expert]\nmax_held = 20").unwrap_err();
    let LoadConfigError::Invalid(e) = &err else {
        panic!("{err}")
    };
    assert_eq!(e.field(), "max_held");
    assert_eq!(
        err.to_string(),
        "invalid config: max_held is given at its old place and at its new one, \
         `expert.max_held`: write it there only"
    );
}

#[test]
fn a_removed_setting_is_refused_naming_its_replacement() {
    let mut table: Table = toml::from_str("[queue.admission]\nexit_ratio = 0.3").unwrap();
    let removed = [(
        "queue.admission.exit_ratio",
        "the controller derives it; remove the line",
    )];
    let err = migrate_with(&mut table, MOVED, &removed).unwrap_err();
    assert_eq!(err.field(), "queue.admission.exit_ratio");
    assert_eq!(
        err.to_string(),
        "queue.admission.exit_ratio no longer exists: the controller derives it; remove the line"
    );
}

#[test]
fn an_unknown_key_is_named_by_its_dotted_path() {
    let err = RuntimeConfig::from_toml("[expert.queue]\ncapacty = 5").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid config: expert.queue.capacty: unknown field `capacty`"),
        "{err}"
    );
}

/// Errors serde raises while reading (before `validate`) name the dotted key and the range
/// too: counts, weights, levels, integers past what TOML holds.
#[test]
fn serde_level_errors_name_the_dotted_key_and_the_range() {
    let cases = [
        (
            "workers = 0",
            "workers = 0 is out of range: allowed 1..=100000",
        ),
        (
            "[expert.queue]\ncapacity = -1",
            "expert.queue.capacity = -1 is out of range: allowed 1..=4294967296",
        ),
        (
            "max_held = 0",
            "max_held = 0 is out of range: allowed 1..=100000 (the setting is now \
             `expert.max_held`: write it there)",
        ),
        (
            "[expert.queue.weights]\ncritical = 8\nhigh = 4\nmedium = 2\nsheddable = 1001",
            "expert.queue.weights.sheddable = 1001 is out of range: allowed 1..=1000",
        ),
        (
            "[expert.queue]\nmax_bytes = 0",
            "expert.queue.max_bytes = 0 is out of range: allowed 1..=9223372036854775807 (bytes; \
             leave the key out for no byte budget)",
        ),
        (
            "brownout_level = 256",
            "brownout_level = 256 is out of range: allowed 0..=255",
        ),
        (
            "forced_shed_level = -1",
            "forced_shed_level = -1 is out of range: allowed 0..=3",
        ),
        (
            "max_deferrals = 4294967296",
            "max_deferrals = 4294967296 is out of range: allowed 1..=1000",
        ),
        (
            "[retry]\nmax_retries = 4294967297",
            "retry.max_retries = 4294967297 is out of range: allowed 0..=100",
        ),
        (
            "[expert.breaker]\nhalf_open_probes = 0",
            "expert.breaker.half_open_probes = 0 is out of range: allowed 1..=10000",
        ),
        // A negative value for an unsigned field, with the range validate states.
        (
            "[expert]\ndefer_cooldown_ms = -1",
            "expert.defer_cooldown_ms = -1 is out of range: allowed 1..=3600000",
        ),
        (
            "[expert.admission]\nprefetch_per_slot = -2",
            "expert.admission.prefetch_per_slot = -2 is out of range: allowed 1..=1000",
        ),
        // Past u64 (and i64): the parser refuses the number before any field is read.
        (
            "workers = 99999999999999999999",
            "workers = 99999999999999999999 is out of range: allowed 1..=100000",
        ),
        (
            "[expert]\ndefer_cooldown_ms = 18446744073709551616",
            "expert.defer_cooldown_ms = 18446744073709551616 is out of range: allowed \
             1..=3600000",
        ),
        (
            "[queue]\ncapacity = 99999999999999999999",
            "queue.capacity = 99999999999999999999 is out of range: allowed 1..=4294967296 (the \
             setting is now `expert.queue.capacity`: write it there)",
        ),
    ];
    for (text, expected) in cases {
        let err = RuntimeConfig::from_toml(text).unwrap_err();
        assert!(
            matches!(err, LoadConfigError::Invalid(_)),
            "{text:?}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("invalid config: {expected}"),
            "{text:?}"
        );
    }
}

/// A file in the old layout is told about the setting it wrote, at the path it wrote it, and
/// where that setting lives now: whether serde, `validate` or the parser refuses the value.
#[test]
fn errors_in_an_old_layout_file_name_the_path_as_written_and_the_new_one() {
    let cases = [
        // Refused by serde's range check, under a moved table.
        (
            "[queue]\ncapacity = 0",
            "queue.capacity",
            "expert.queue.capacity",
        ),
        // Refused by `validate`, under a moved table.
        (
            "[admission]\nrecover_ms = 600001",
            "admission.recover_ms",
            "expert.admission.recover_ms",
        ),
        // A moved key inside a table that stays.
        (
            "[retry]\nbase_backoff_ms = 0",
            "retry.base_backoff_ms",
            "expert.retry.base_backoff_ms",
        ),
    ];
    for (text, written, now) in cases {
        let Err(LoadConfigError::Invalid(e)) = RuntimeConfig::from_toml(text) else {
            panic!("{text:?} loaded or failed to parse");
        };
        assert_eq!((e.field(), e.moved_to()), (written, Some(now)), "{text:?}");
        let message = e.to_string();
        assert!(
            message.starts_with(&format!("{written} = ")) && message.contains(&format!("`{now}`")),
            "{text:?}: {message}"
        );
    }
    // Not a value out of range but the wrong type: the parser's message, at the path written.
    let err = RuntimeConfig::from_toml("max_held = \"many\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("invalid config: max_held: invalid type")
            && err.contains("`expert.max_held`"),
        "{err}"
    );
    // The type refused names the integers the field takes, not the parser's type.
    let err = RuntimeConfig::from_toml("workers = 4.5")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "invalid config: workers: invalid type: floating point `4.5`, expected an integer in \
         1..=100000"
    );
    // The same settings in the new layout: no mention of a move.
    let Err(LoadConfigError::Invalid(e)) = RuntimeConfig::from_toml("[expert.queue]\ncapacity = 0")
    else {
        panic!("loaded");
    };
    assert_eq!((e.field(), e.moved_to()), ("expert.queue.capacity", None));
}

/// The limit moves below `workers`: an adaptive limit's defaults (initial 20, max 200) and a
/// fixed limit above `workers` are capped at it, so the tier shares, fractions of the limit,
/// hold (a fresh-user trial: with `kind = "aimd"` and 8 workers the limit read 20 and 8
/// Sheddable handlers ran at once, against 4 with the fixed default).
#[test]
fn a_limit_above_workers_is_capped_at_workers() {
    use crate::limit::{AimdConfig, Gradient2Config, LimitConfig};
    let with = |workers: usize, limit: LimitConfig| RuntimeConfig {
        workers: workers.try_into().unwrap(),
        expert: ExpertConfig {
            limit: Some(limit),
            ..ExpertConfig::default()
        },
        ..RuntimeConfig::default()
    };
    let aimd = with(8, LimitConfig::Aimd(AimdConfig::default()));
    assert_eq!(aimd.limiter().unwrap().limit(), 8);
    let gradient = with(8, LimitConfig::Gradient2(Gradient2Config::default()));
    assert_eq!(gradient.limiter().unwrap().limit(), 8);
    let fixed = with(4, LimitConfig::Fixed { limit: 50 });
    assert_eq!(fixed.limiter().unwrap().limit(), 4);
    // Below `workers`, the configured values stand.
    let small = with(64, LimitConfig::Aimd(AimdConfig::default()));
    assert_eq!(small.limiter().unwrap().limit(), 20);
    // A value out of its own range is still refused, naming it.
    let bad = with(8, LimitConfig::Fixed { limit: 0 });
    let err = bad.limiter().unwrap_err().to_string();
    assert!(err.contains("expert.limit"), "{err}");
}
