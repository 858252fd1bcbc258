//! `--print-config`: the effective configuration as TOML, each value annotated with its source.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::load::Loaded;
use crate::sources::{Source, source_of};

/// The effective configuration as TOML, each value annotated with where it came from.
pub fn print_config(loaded: &Loaded) -> String {
    let value = toml::Value::try_from(&loaded.config).expect("configuration serialises");
    let mut out = String::new();
    if loaded.files.is_empty() {
        out.push_str("# no configuration files\n");
    } else {
        for f in &loaded.files {
            let _ = writeln!(out, "# loaded {}", f.display());
        }
    }
    for warning in &loaded.warnings {
        let _ = writeln!(out, "# warning: {warning}");
    }
    if let toml::Value::Table(table) = value {
        write_table(&mut out, &table, "", &loaded.sources);
    }
    out
}

fn write_table(
    out: &mut String,
    table: &toml::Table,
    prefix: &str,
    sources: &BTreeMap<String, Source>,
) {
    for (key, value) in table {
        if value.is_table() {
            continue;
        }
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let rendered = toml::Value::to_string(value);
        let _ = writeln!(out, "{key} = {rendered}  # {}", source_of(sources, &path));
    }
    for (key, value) in table {
        if let toml::Value::Table(inner) = value {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            let _ = writeln!(out, "\n[{path}]");
            write_table(out, inner, &path, sources);
        }
    }
}
