//! Files written for the layout before the expert group: every setting that moved is taken
//! from its old place and put at its new one before the file is read, so that such a file
//! loads to the same configuration; a setting that no longer exists is refused, naming what
//! replaced it.

use toml::{Table, Value};

use crate::ConfigError;

/// Where each setting of the layout before the expert group lives now, as dotted paths: old,
/// new. A table moves whole. A file naming a setting at its old place loads as if it named the
/// new one ([`RuntimeConfig::from_toml`](crate::runtime::RuntimeConfig::from_toml)).
pub const MOVED: &[(&str, &str)] = &[
    ("queue", "expert.queue"),
    ("admission", "expert.admission"),
    ("limit", "expert.limit"),
    ("shares", "expert.shares"),
    ("work_conserving", "expert.work_conserving"),
    ("share_reserve_ms", "expert.share_reserve_ms"),
    ("breaker", "expert.breaker"),
    ("max_deferring", "expert.max_deferring"),
    ("max_dead_lettering", "expert.max_dead_lettering"),
    ("defer_cooldown_ms", "expert.defer_cooldown_ms"),
    ("max_held", "expert.max_held"),
    ("max_parked", "expert.max_parked"),
    ("poll_interval_ms", "expert.poll_interval_ms"),
    ("patience_share", "expert.patience_share"),
    ("retry.base_backoff_ms", "expert.retry.base_backoff_ms"),
    ("retry.max_backoff_ms", "expert.retry.max_backoff_ms"),
    ("memory.thresholds", "expert.memory.thresholds"),
];

/// Settings that no longer exist, as dotted paths, with what replaced them. Empty while every
/// setting of an old layout has a new place ([`MOVED`]); a setting removed later goes here so
/// that a file still naming it is refused with the way forward, never read half.
pub(crate) const REMOVED: &[(&str, &str)] = &[];

/// A setting moved from its old place to its new one.
pub(crate) type Move = (&'static str, &'static str);

/// Moves every setting of [`MOVED`] found in `table` to its new place, in place.
///
/// # Errors
///
/// A [`ConfigError::replaced`] for a setting of [`REMOVED`], a [`ConfigError::given_twice`]
/// for one given at both its old and its new place.
pub(crate) fn migrate(table: &mut Table) -> Result<Vec<Move>, ConfigError> {
    migrate_with(table, MOVED, REMOVED)
}

/// [`migrate`] with the tables given, so that tests can name a removed setting.
pub(crate) fn migrate_with(
    table: &mut Table,
    moved: &[Move],
    removed: &[(&str, &str)],
) -> Result<Vec<Move>, ConfigError> {
    if let Some((old, replacement)) = removed.iter().find(|(old, _)| get(table, old).is_some()) {
        return Err(ConfigError::replaced(*old, *replacement));
    }
    let mut done = Vec::new();
    for &(old, new) in moved {
        if get(table, old).is_none() {
            continue;
        }
        if get(table, new).is_some() {
            return Err(ConfigError::given_twice(old, new));
        }
        let Some(value) = take(table, old) else {
            continue;
        };
        put(table, new, value)?;
        done.push((old, new));
    }
    Ok(done)
}

/// The value at a dotted `path`, if every table on the way is one.
fn get<'a>(table: &'a Table, path: &str) -> Option<&'a Value> {
    let (parents, key) = split(path);
    let mut t = table;
    for p in parents {
        t = t.get(p)?.as_table()?;
    }
    t.get(key)
}

fn take(table: &mut Table, path: &str) -> Option<Value> {
    let (parents, key) = split(path);
    let mut t = table;
    for p in parents {
        t = t.get_mut(p)?.as_table_mut()?;
    }
    t.remove(key)
}

/// Puts `value` at `path`, making the tables on the way.
fn put(table: &mut Table, path: &str, value: Value) -> Result<(), ConfigError> {
    let (parents, key) = split(path);
    let mut t = table;
    let mut at = String::new();
    for p in parents {
        at = if at.is_empty() {
            p.to_owned()
        } else {
            format!("{at}.{p}")
        };
        let next = t
            .entry(p.to_owned())
            .or_insert_with(|| Value::Table(Table::new()));
        t = match next {
            Value::Table(inner) => inner,
            other => return Err(ConfigError::new(at, other.type_str(), "a table")),
        };
    }
    t.insert(key.to_owned(), value);
    Ok(())
}

fn split(path: &str) -> (Vec<&str>, &str) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let key = parts.pop().unwrap_or_default();
    (parts, key)
}
