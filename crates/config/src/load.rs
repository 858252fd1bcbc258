//! Loading: the TOML files (discovered in the working directory, or named with `--config`) merged in
//! order (tables by key, arrays replaced whole), environment variables applied last, deserialised
//! into [`AppConfig`], validated into [`Settings`], with the source of every value remembered.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::model::{AUTO_SUFFIX, AppConfig, CONFIG_FILE};
use crate::reference::{KeyInfo, keys};
use crate::settings::Settings;
use crate::sources::{ConfigError, Source, source_of};
use crate::validate::validate;

/// The loaded configuration: as written (for `--print-config`), as validated and parsed (what the
/// application uses), and the source of every value.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: AppConfig,
    pub settings: Settings,
    pub sources: BTreeMap<String, Source>,
    pub files: Vec<PathBuf>,
    /// What the operator should change, though it loaded (deprecated environment variables).
    pub warnings: Vec<String>,
}

/// Loads the configuration: `explicit` files (each must exist) or discovery in `dir`, then `env`.
pub fn load(
    explicit: &[PathBuf],
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    let files = if explicit.is_empty() {
        discover(dir)?
    } else {
        for f in explicit {
            if !f.is_file() {
                return Err(ConfigError(format!(
                    "configuration file {} given with --config does not exist",
                    f.display()
                )));
            }
        }
        explicit.to_vec()
    };
    let mut texts = Vec::with_capacity(files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            ConfigError(format!(
                "cannot read configuration file {}: {e}",
                file.display()
            ))
        })?;
        texts.push((file, text));
    }
    parse(&texts, env)
}

/// The configuration of these files' texts (in order, later ones winning) and `env`: merged,
/// overridden, deserialised and validated as [`load`] does.
pub fn parse(
    files: &[(PathBuf, String)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    let mut merged = toml::Table::new();
    let mut sources = BTreeMap::new();
    for (file, text) in files {
        let table: toml::Table = text.parse().map_err(|e| {
            ConfigError(format!(
                "configuration file {} is not valid TOML: {e}",
                file.display()
            ))
        })?;
        merge(
            &mut merged,
            table,
            "",
            &Source::File(file.clone()),
            &mut sources,
        );
    }

    let mut warnings = Vec::new();
    for info in keys() {
        let Some(var) = &info.env else { continue };
        // The key's variable, else the first of its earlier names that is set (deprecated).
        let set = env(var).map(|raw| (var.clone(), raw));
        let mut earlier = info
            .env_deprecated
            .iter()
            .filter_map(|old| env(old).map(|raw| (old.clone(), raw)));
        let (var, raw) = match (set, earlier.next()) {
            (Some(set), Some((old, _))) => {
                warnings.push(format!(
                    "environment variable {old} is deprecated and ignored: {var} is set (for key {})",
                    info.key
                ));
                set
            }
            (Some(set), None) => set,
            (None, Some((old, raw))) => {
                warnings.push(format!(
                    "environment variable {old} is deprecated: name it {var} (for key {})",
                    info.key
                ));
                (old, raw)
            }
            (None, None) => continue,
        };
        let value = env_value(&info, &var, &raw)?;
        set_path(&mut merged, &info.key, value);
        sources.insert(info.key.clone(), Source::Env(var));
    }

    let config: AppConfig =
        serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
            let path = e.path().to_string();
            let source = source_of(&sources, &path);
            ConfigError(format!("key {path} ({source}): {}", e.inner()))
        })?;

    let tokio_worker_threads = match env("TOKIO_WORKER_THREADS") {
        None => None,
        Some(raw) => Some(
            raw.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    ConfigError(format!(
                        "environment variable TOKIO_WORKER_THREADS = {raw:?}: must be a positive integer"
                    ))
                })?,
        ),
    };

    let settings = validate(&config, &sources, tokio_worker_threads)?;
    Ok(Loaded {
        config,
        settings,
        sources,
        files: files.iter().map(|(file, _)| file.clone()).collect(),
        warnings,
    })
}

/// `code-interpreter-mcp.toml` and `*.auto.code-interpreter-mcp.toml` in `dir`, in file-name order.
pub fn discover(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        ConfigError(format!(
            "cannot list the working directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| !t.is_dir()).unwrap_or(false))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n == CONFIG_FILE || (n.ends_with(AUTO_SUFFIX) && n.len() > AUTO_SUFFIX.len()))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// Merges `from` into `into`: tables by key, everything else (arrays included) replaced whole.
fn merge(
    into: &mut toml::Table,
    from: toml::Table,
    prefix: &str,
    source: &Source,
    sources: &mut BTreeMap<String, Source>,
) {
    for (key, value) in from {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(incoming)) => {
                merge(existing, incoming, &path, source, sources);
            }
            (_, toml::Value::Table(incoming)) => {
                let mut fresh = toml::Table::new();
                merge(&mut fresh, incoming, &path, source, sources);
                into.insert(key, toml::Value::Table(fresh));
            }
            (_, value) => {
                sources.retain(|k, _| !(k == &path || k.starts_with(&format!("{path}."))));
                sources.insert(path, source.clone());
                into.insert(key, value);
            }
        }
    }
}

fn set_path(table: &mut toml::Table, path: &str, value: toml::Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().expect("non-empty path");
    let mut cur = table;
    for part in parts {
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        cur = entry.as_table_mut().expect("just made a table");
    }
    cur.insert(last.to_string(), value);
}

fn env_value(info: &KeyInfo, var: &str, raw: &str) -> Result<toml::Value, ConfigError> {
    let bad = |allowed: &str| {
        ConfigError(format!(
            "environment variable {var} = {raw:?} (for key {}): {allowed}",
            info.key
        ))
    };
    Ok(match info.kind {
        "boolean" => match raw.trim() {
            "true" => toml::Value::Boolean(true),
            "false" => toml::Value::Boolean(false),
            _ => return Err(bad("must be true or false")),
        },
        "integer" => {
            toml::Value::Integer(raw.trim().parse().map_err(|_| bad("must be an integer"))?)
        }
        "array of strings" if info.env_whitespace => toml::Value::Array(
            raw.split_whitespace()
                .map(|s| toml::Value::String(s.to_string()))
                .collect(),
        ),
        "array of strings" => toml::Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_string()))
                .collect(),
        ),
        _ => toml::Value::String(raw.to_string()),
    })
}
