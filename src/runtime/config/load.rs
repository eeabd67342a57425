//! Loading a configuration from TOML (or any self-describing serde format): the old layout is
//! moved into the new one ([`super::migrate`]), and every error names the dotted field.

use serde::de::{Deserialize, Deserializer, Error as _};
use serde::{Serialize, Serializer};
use toml::{Table, Value};

use super::migrate::{self, Move};
use super::RuntimeConfig;
use crate::ConfigError;

/// A configuration that could not be loaded: bad TOML, or a value out of range.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadConfigError {
    /// The text is not valid TOML for this structure (the message names the key by its dotted
    /// path).
    Parse(toml::de::Error),
    /// A value is outside its allowed range, or a field no longer exists: the error names it
    /// and its allowed range, or what replaced it.
    Invalid(ConfigError),
}

impl std::fmt::Display for LoadConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // toml's own message ends in blank lines, meant for a terminal.
            LoadConfigError::Parse(e) => write!(f, "invalid config: {}", e.to_string().trim_end()),
            LoadConfigError::Invalid(e) => write!(f, "invalid config: {e}"),
        }
    }
}

impl std::error::Error for LoadConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadConfigError::Parse(e) => Some(e),
            LoadConfigError::Invalid(e) => Some(e),
        }
    }
}

impl RuntimeConfig {
    /// Parses and validates a TOML document.
    ///
    /// A document in the layout before the expert group (`[queue]`, `[admission]`,
    /// `[breaker]`, `[limit]`, `[shares]`, `max_held`, `retry.base_backoff_ms`, ... at the top
    /// level) loads to the same configuration: each such setting is moved under `expert`, and
    /// one warning (`tracing`) names every one moved with its new path. An error in such a
    /// setting names it as the file wrote it, and where it lives now
    /// ([`ConfigError::moved_to`]).
    ///
    /// # Errors
    ///
    /// [`LoadConfigError::Parse`] for text that is not this structure (unknown keys included),
    /// [`LoadConfigError::Invalid`] for a value out of range, a setting that no longer exists
    /// or one given at both its old and its new place; each names the field by its dotted
    /// path, and a value out of range its allowed range.
    ///
    /// # Examples
    ///
    /// ```
    /// use triage::runtime::RuntimeConfig;
    ///
    /// let old = RuntimeConfig::from_toml("max_held = 100\n[queue]\ncapacity = 64")?;
    /// let new = RuntimeConfig::from_toml("[expert]\nmax_held = 100\n[expert.queue]\ncapacity = 64")?;
    /// assert_eq!(old, new);
    ///
    /// let err = RuntimeConfig::from_toml("[expert.queue]\ncapacity = 0").unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid config: expert.queue.capacity = 0 is out of range: allowed 1..=4294967296"
    /// );
    /// let err = RuntimeConfig::from_toml("[queue]\ncapacity = 0").unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid config: queue.capacity = 0 is out of range: allowed 1..=4294967296 \
    ///      (the setting is now `expert.queue.capacity`: write it there)"
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, LoadConfigError> {
        let (config, moved) = parse(text)?;
        config
            .validate()
            .map_err(|e| LoadConfigError::Invalid(as_written(e, &moved)))?;
        Ok(config)
    }

    /// [`from_toml`](Self::from_toml) without [`validate`](Self::validate): for a reload,
    /// which validates as it applies.
    pub(crate) fn parse_toml(text: &str) -> Result<Self, LoadConfigError> {
        parse(text).map(|(config, _)| config)
    }
}

/// The text read as a [`RuntimeConfig`], not validated, with the settings moved from the old
/// layout.
fn parse(text: &str) -> Result<(RuntimeConfig, Vec<Move>), LoadConfigError> {
    let table: Table = match toml::from_str(text) {
        Ok(table) => table,
        Err(e) => return Err(too_large(text, &e).unwrap_or(LoadConfigError::Parse(e))),
    };
    read_moved(table)
}

/// `e` naming its field as the file wrote it ([`written`]).
fn as_written(e: ConfigError, moved: &[Move]) -> ConfigError {
    match written(e.field(), moved) {
        Some((old, now)) => e.written_at(old, now),
        None => e,
    }
}

/// For a `path` under a setting moved from the old layout, the path as the file wrote it and
/// the path now: errors name the first (the user looks for what they wrote) and tell the
/// second.
fn written(path: &str, moved: &[Move]) -> Option<(String, String)> {
    moved.iter().find_map(|(old, new)| {
        let rest = path.strip_prefix(new)?;
        (rest.is_empty() || rest.starts_with('.'))
            .then(|| (format!("{old}{rest}"), path.to_owned()))
    })
}

/// An integer past what TOML holds (a signed 64-bit number) is refused by the parser before
/// any field is read, so its message names no key and no range. The key is found by reading
/// the text again with a string in the number's place (every numeric field refuses it, at its
/// dotted path), and the range by reading it with the largest integer TOML holds (refused by
/// the field's own range check); `None` when the error is another one.
fn too_large(text: &str, e: &toml::de::Error) -> Option<LoadConfigError> {
    if !e.message().contains("too large") {
        return None;
    }
    let start = e.span()?.start;
    let len = text
        .get(start..)?
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '_' | '+' | '-')))
        .unwrap_or(text.len() - start);
    let literal = text.get(start..start + len)?;
    let with = |value: &str| format!("{}{value}{}", &text[..start], &text[start + len..]);
    let (path, now) = match toml::from_str::<Table>(&with("\"\"")).map(from_table) {
        Ok(Err(LoadConfigError::Parse(e))) => {
            let message = e.message();
            let now = message
                .split_once("(the setting is now `")
                .and_then(|(_, rest)| rest.split_once('`'))
                .map(|(now, _)| now.to_owned());
            (message.split(": ").next()?.to_owned(), now)
        }
        Ok(Err(LoadConfigError::Invalid(e))) => {
            (e.field().to_owned(), e.moved_to().map(str::to_owned))
        }
        _ => return None,
    };
    let extreme = if literal.starts_with('-') {
        i64::MIN.to_string()
    } else {
        i64::MAX.to_string()
    };
    let allowed = match RuntimeConfig::from_toml(&with(&extreme)) {
        Err(LoadConfigError::Invalid(e)) if e.field() == path => e.allowed().to_owned(),
        _ => format!("{}..={} (a TOML integer is 64-bit)", i64::MIN, i64::MAX),
    };
    let e = ConfigError::new(path.clone(), literal, allowed);
    Some(LoadConfigError::Invalid(match now {
        Some(now) => e.written_at(path, now),
        None => e,
    }))
}

/// Reads `table` as a [`RuntimeConfig`], moving the old layout into the new first; not
/// validated.
pub(crate) fn from_table(table: Table) -> Result<RuntimeConfig, LoadConfigError> {
    read_moved(table).map(|(config, _)| config)
}

/// [`from_table`], with the settings moved from the old layout; an error names a moved field
/// as the file wrote it ([`as_written`]).
fn read_moved(mut table: Table) -> Result<(RuntimeConfig, Vec<Move>), LoadConfigError> {
    let moved = migrate::migrate(&mut table).map_err(LoadConfigError::Invalid)?;
    warn_moved(&moved);
    match read(table.clone()) {
        Ok(config) => Ok((config, moved)),
        Err((path, e)) => Err(
            match negative(&table, &path, e.message()).unwrap_or_else(|| from_serde(&path, &e)) {
                LoadConfigError::Invalid(e) => LoadConfigError::Invalid(as_written(e, &moved)),
                LoadConfigError::Parse(e) => LoadConfigError::Parse(match written(&path, &moved) {
                    Some((old, now)) => toml::de::Error::custom(format!(
                        "{old}{} (the setting is now `{now}`: write it there)",
                        e.message()
                            .strip_prefix(path.as_str())
                            .unwrap_or(e.message())
                    )),
                    None => e,
                }),
            },
        ),
    }
}

/// The migrated `table` read, or the dotted path of the error and the error.
fn read(table: Table) -> Result<RuntimeConfig, (String, toml::de::Error)> {
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(Value::Table(table), &mut track);
    RuntimeConfig::deserialize(de).map_err(|e| (track.path().to_string(), e))
}

/// An integer out of its type's range (serde's `invalid value: integer `-1`, expected u64`)
/// as a range error naming the field and its allowed range: the range `validate` states when
/// the largest integer is put in its place, else the type's.
fn negative(table: &Table, path: &str, message: &str) -> Option<LoadConfigError> {
    let rest = message.strip_prefix("invalid value: integer `")?;
    let (value, ty) = rest.split_once("`, expected ")?;
    let type_range = match ty {
        "u8" => format!("0..={}", u8::MAX),
        "u16" => format!("0..={}", u16::MAX),
        "u32" => format!("0..={}", u32::MAX),
        "u64" | "usize" => format!("0..={}", u64::MAX),
        _ => return None,
    };
    let mut probe = table.clone();
    let mut at = &mut probe;
    let mut parts: Vec<&str> = path.split('.').collect();
    let key = parts.pop()?;
    for p in parts {
        at = at.get_mut(p)?.as_table_mut()?;
    }
    at.insert(key.to_owned(), Value::Integer(i64::MAX));
    let allowed = match read(probe).map(|c| c.validate()) {
        Ok(Err(e)) if e.field() == path => e.allowed().to_owned(),
        _ => type_range,
    };
    Some(LoadConfigError::Invalid(ConfigError::new(
        path, value, allowed,
    )))
}

/// One warning per configuration read, naming every setting found at its old place.
fn warn_moved(moved: &[Move]) {
    if moved.is_empty() {
        return;
    }
    let list: Vec<String> = moved
        .iter()
        .map(|(old, new)| format!("{old} -> {new}"))
        .collect();
    tracing::warn!(
        moved = moved.len(),
        "configuration in the layout before the expert group: {} setting(s) read at their new \
         place ({}); write them there (docs/configuration.md)",
        moved.len(),
        list.join(", ")
    );
}

/// A serde error at `path` as a load error: a value out of range (the messages of
/// [`crate::config_de`] and the types' own range checks) as [`ConfigError`], naming the dotted
/// field; anything else as a parse error prefixed with the path.
fn from_serde(path: &str, e: &toml::de::Error) -> LoadConfigError {
    let message = e.message();
    if let Some((field, value, allowed)) = crate::config_de::out_of_range(path, message) {
        return LoadConfigError::Invalid(ConfigError::new(field, value, allowed));
    }
    let message = if path.is_empty() || path == "." {
        message.to_owned()
    } else {
        format!("{path}: {message}")
    };
    LoadConfigError::Parse(toml::de::Error::custom(message))
}

impl<'de> Deserialize<'de> for RuntimeConfig {
    /// Reads any self-describing format (TOML, JSON, ...) as [`RuntimeConfig::from_toml`]
    /// does, the old layout included, without the range checks of
    /// [`validate`](RuntimeConfig::validate) that serde's own types do not make.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let table = Table::deserialize(d)?;
        from_table(table).map_err(|e| match e {
            LoadConfigError::Parse(e) => D::Error::custom(e.message()),
            LoadConfigError::Invalid(e) => D::Error::custom(e),
        })
    }
}

impl Serialize for RuntimeConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RuntimeConfig::serialize(self, s)
    }
}
