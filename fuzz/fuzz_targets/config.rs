//! Configuration loading on arbitrary TOML text and environment values: it never panics, and a
//! configuration it accepts is valid and prints as a configuration that loads to the same values.
//!
//! The input is split on the first NUL byte: TOML text, then `KEY=VALUE` lines for the environment.

#![no_main]

use std::collections::HashMap;

use code_interpreter_mcp_config::validate::validate;
use code_interpreter_mcp_config::{parse, print_config};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (toml, env) = text.split_once('\0').unwrap_or((&text, ""));
    let env: HashMap<String, String> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("CODE_INTERPRETER_MCP_{k}"), v.to_string()))
        .collect();
    let lookup = |k: &str| env.get(k).cloned();
    if let Ok(loaded) = parse(&[("fuzz.toml".into(), toml.to_string())], &lookup) {
        let settings = validate(&loaded.config, &loaded.sources, loaded.settings.tokio_worker_threads)
            .expect("an accepted configuration is valid");
        assert_eq!(settings, loaded.settings, "validation is a function of the configuration");
        let printed = print_config(&loaded);
        let again = parse(&[("printed.toml".into(), printed.clone())], &|_| None)
            .unwrap_or_else(|e| panic!("the printed configuration loads: {e}\n{printed}"));
        assert_eq!(again.config, loaded.config, "{printed}");
        assert_eq!(again.settings.engine, loaded.settings.engine, "{printed}");
    }
});
