//! Shared fixtures: one engine per test process, and helpers to run code.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use code_interpreter_mcp::config::Settings;
use code_interpreter_mcp::sandbox::{
    BootMode, Engine, EngineSettings, ExecRequest, ExecResult, InputFile,
};

pub use crate::fixture::{package_cache, package_mirror, server_command};

/// A fresh, empty directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Engine settings for tests: wheels from the local mirror, the shared test package layer, and the
/// boot mode `CODE_INTERPRETER_MCP_TEST_BOOT` names (`full` re-runs the suites on the fallback path;
/// default: the snapshot mode).
pub fn engine_settings() -> EngineSettings {
    EngineSettings {
        package_base_url: Some(package_mirror().display().to_string()),
        package_cache_dir: package_cache(),
        boot: match std::env::var("CODE_INTERPRETER_MCP_TEST_BOOT").as_deref() {
            Ok("full") => BootMode::Full,
            _ => BootMode::Snapshot,
        },
        // Tests of pre-imported modules ask for them.
        preimport_preinstalled: false,
        ..Settings::default().engine
    }
}

pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::new(engine_settings()).expect("engine starts"))
}

pub fn request(code: &str) -> ExecRequest {
    ExecRequest {
        code: code.to_string(),
        files: Vec::new(),
        timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

pub fn run(code: &str) -> ExecResult {
    engine().execute(request(code))
}

pub fn run_with(code: &str, files: &[(&str, &[u8])], timeout: Duration) -> ExecResult {
    engine().execute(ExecRequest {
        code: code.to_string(),
        files: files
            .iter()
            .map(|(p, c)| InputFile {
                path: p.to_string(),
                content: c.to_vec(),
            })
            .collect(),
        timeout,
        ..Default::default()
    })
}

/// Asserts success and returns the result, printing everything on failure.
#[track_caller]
pub fn ok(result: &ExecResult) -> &ExecResult {
    assert!(result.success, "execution failed: {result:#?}");
    result
}

/// The decoded bytes of the returned file at `path`; panics when it was not returned.
#[track_caller]
pub fn returned_file(result: &ExecResult, path: &str) -> Vec<u8> {
    use base64::Engine as _;
    let file = result
        .files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} not returned: {result:#?}"));
    base64::engine::general_purpose::STANDARD
        .decode(&file.content_base64)
        .unwrap()
}

/// Runs `code` in `sandbox` (a session's, kept) within 120 s; its final expression, the run
/// asserted to have succeeded.
pub fn run_in(sandbox: &mut code_interpreter_mcp::sandbox::Sandbox, code: &str) -> Option<String> {
    let result = sandbox.run(
        ExecRequest {
            code: code.into(),
            timeout: Duration::from_secs(120),
            ..Default::default()
        },
        None,
    );
    assert!(result.error.is_none(), "{code}: {:?}", result.error);
    result.result
}
