//! The keys of [`AppConfig`] as its type describes them (through `facet` reflection): path, type,
//! default, documentation and environment variable; and the generated reference built from them.

use facet::Facet as _;
use serde::Serialize;

use crate::model::{AUTO_SUFFIX, AppConfig, CONFIG_FILE};

/// One configuration key as described by the type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyInfo {
    /// Dotted key path, e.g. `workers.max_workers`.
    pub key: String,
    /// Value type: `string`, `boolean`, `integer`, `array of strings`, `table`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The default, as JSON.
    pub default: serde_json::Value,
    /// What the key does.
    pub doc: String,
    /// Environment variable overriding the key, if any: always [`env_name`] of the key.
    pub env: Option<String>,
    /// Earlier names of that variable, still read (with a deprecation warning) when it is unset.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env_deprecated: Vec<String>,
    /// Whether a list in the environment variable is whitespace-separated (else comma-separated).
    #[serde(skip)]
    pub env_whitespace: bool,
}

/// The environment variable of a key, by the one rule: `CODE_INTERPRETER_MCP_` and the key's path
/// in capitals, with `_` for `.` (`workers.max_workers`: `CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS`).
pub fn env_name(key: &str) -> String {
    format!(
        "CODE_INTERPRETER_MCP_{}",
        key.to_ascii_uppercase().replace('.', "_")
    )
}

/// Every leaf key of [`AppConfig`] (tables of user-named entries, like snippets, are one key).
pub fn keys() -> Vec<KeyInfo> {
    let defaults = serde_json::to_value(AppConfig::default()).expect("defaults serialise");
    let mut out = Vec::new();
    collect_keys(AppConfig::SHAPE, "", &defaults, &mut out);
    out
}

fn collect_keys(
    shape: &'static facet::Shape,
    prefix: &str,
    defaults: &serde_json::Value,
    out: &mut Vec<KeyInfo>,
) {
    let facet::Type::User(facet::UserType::Struct(st)) = shape.ty else {
        return;
    };
    for field in st.fields {
        let key = if prefix.is_empty() {
            field.name.to_string()
        } else {
            format!("{prefix}.{}", field.name)
        };
        let field_shape = field.shape.get();
        let default = defaults
            .get(field.name)
            .cloned()
            .unwrap_or(serde_json::Value::Null);
        let is_section = matches!(
            field_shape.ty,
            facet::Type::User(facet::UserType::Struct(_))
        ) && !matches!(field_shape.def, facet::Def::Scalar);
        if is_section && default.is_object() {
            collect_keys(field_shape, &key, &default, out);
            continue;
        }
        // A table of named entries with defaults of their own (`[upstream.NAME]`), or an array of
        // tables (`[[network.hosts]]`): the key, then each entry's keys under `NAME` or `[]`.
        let entry = match field_shape.def {
            facet::Def::Map(map) => entry_defaults(&key).map(|d| (map.v(), d, ".NAME")),
            facet::Def::List(list) => entry_defaults(&key).map(|d| (list.t(), d, "[]")),
            _ => None,
        };
        let mut doc_lines = Vec::new();
        let mut env = None;
        let mut env_deprecated = Vec::new();
        let mut env_whitespace = false;
        for line in field.doc {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("Environment:") {
                env = rest.split_whitespace().next().map(String::from);
                env_whitespace = rest.contains("(whitespace-separated");
                env_deprecated = rest
                    .split("(deprecated alias: ")
                    .skip(1)
                    .filter_map(|alias| alias.split(')').next())
                    .map(String::from)
                    .collect();
            } else if !line.is_empty() {
                doc_lines.push(line);
            }
        }
        out.push(KeyInfo {
            kind: match entry {
                Some((_, _, "[]")) => "array of tables",
                _ => kind_of(&default),
            },
            key: key.clone(),
            default,
            doc: doc_lines.join(" "),
            env,
            env_deprecated,
            env_whitespace,
        });
        if let Some((value_shape, defaults, below)) = entry {
            collect_keys(value_shape, &format!("{key}{below}"), &defaults, out);
        }
    }
}

/// The defaults of one entry of a table of named entries, for those whose entries have defaults.
fn entry_defaults(key: &str) -> Option<serde_json::Value> {
    match key {
        "upstream" => serde_json::to_value(crate::model::UpstreamConfig::default()).ok(),
        "network.hosts" => serde_json::to_value(crate::model::HostGrantConfig::default()).ok(),
        "quotas.overrides" => {
            serde_json::to_value(crate::model::QuotaOverrideConfig::default()).ok()
        }
        _ => None,
    }
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "integer",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array of strings",
        serde_json::Value::Object(_) => "table",
        // Only optional keys default to nothing (an override's quotas).
        serde_json::Value::Null => "optional integer",
    }
}

/// The configuration key reference as pretty JSON (what `gen-config-reference` writes).
pub fn reference_json() -> String {
    let mut text = serde_json::to_string_pretty(&serde_json::json!({
        "generated_by": "cargo run --bin gen-config-reference",
        "files": format!("{CONFIG_FILE} and *{AUTO_SUFFIX} in the working directory, or --config FILE ..."),
        "keys": keys(),
        "fixed_limits": code_interpreter_mcp_protocol::limits::ALL,
    }))
    .expect("reference serialises");
    text.push('\n');
    text
}
