//! The configuration of code-interpreter-mcp, in a crate of its own so that reading it (and generating
//! its reference) needs no V8.
//!
//! - [`model`]: the one configuration type, [`AppConfig`], as files and environment variables spell
//!   it: every key with its default, documentation and environment override;
//! - [`reference`]: the keys as the type describes them, and the generated reference;
//! - [`load`]: discovery, merging, environment variables, deserialisation; [`sources`]: where each
//!   value came from, and the error naming a key with its source;
//! - [`validate`]: every rule (numeric ranges in one table), yielding [`Settings`] ([`settings`]):
//!   the configuration parsed once, which the application maps into its running parts;
//! - [`print`]: what `--print-config` shows;
//! - [`secret`]: credentials written as templates (`${VAR}`, `@file`), resolved at start-up into
//!   values whose Debug never shows them.
//!
//! The fixed per-request limits and the request checks are the tools' wire protocol, not
//! configuration: they live in the `code-interpreter-mcp-protocol` crate.

pub mod load;
pub mod model;
pub mod print;
pub mod reference;
pub mod secret;
pub mod settings;
pub mod sources;
pub mod validate;

pub use load::{Loaded, discover, load, parse};
pub use model::*;
pub use print::print_config;
pub use reference::{KeyInfo, keys, reference_json};
pub use secret::Secret;
pub use settings::{
    Applies, AppsSettings, EngineSettings, HostGrant, HttpSettings, IntrospectionSettings,
    OAuthScopes, OAuthSettings, QuotaOverride, QuotaPolicy, QuotaSettings, SessionSettings,
    Settings, SnippetSettings, TaskSettings, TraceSettings, UpstreamSettings, UpstreamTransport,
    WorkerSettings,
};
pub use sources::{ConfigError, Source};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_environment_variable_is_found() {
        let env: Vec<_> = keys()
            .into_iter()
            .filter_map(|k| k.env.map(|e| (k.key, e)))
            .collect();
        assert!(env.contains(&(
            "workers.max_workers".into(),
            "CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS".into()
        )));
        assert!(env.contains(&(
            "integrations.prometheus.port".into(),
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT".into()
        )));
        assert!(env.contains(&(
            "input_limits.max_file_kb".into(),
            "CODE_INTERPRETER_MCP_INPUT_LIMITS_MAX_FILE_KB".into()
        )));
    }

    #[test]
    fn defaults_are_valid() {
        validate::validate(
            &AppConfig::default(),
            &std::collections::BTreeMap::new(),
            None,
        )
        .unwrap();
    }
}
