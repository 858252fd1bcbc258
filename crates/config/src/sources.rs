//! Where each value came from (a default, a file, an environment variable), and the error that
//! names a key with its source.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    Env(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(v) => write!(f, "environment variable {v}"),
        }
    }
}

/// A configuration that cannot be used; the message names the key, where it came from and what is
/// allowed. The process exits with status 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

/// The source of `path`: its own, else that of a key below it (for a table), else that of the nearest
/// key above it; a key no file or variable set is a default.
pub fn source_of(sources: &BTreeMap<String, Source>, path: &str) -> Source {
    if let Some(s) = sources.get(path) {
        return s.clone();
    }
    let below = format!("{path}.");
    if let Some((_, s)) = sources.iter().find(|(k, _)| k.starts_with(&below)) {
        return s.clone();
    }
    let mut p = path;
    while let Some(i) = p.rfind('.') {
        p = &p[..i];
        if let Some(s) = sources.get(p) {
            return s.clone();
        }
    }
    Source::Default
}
