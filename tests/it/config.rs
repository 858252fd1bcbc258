//! The server binary and its configuration: an invalid configuration stops start-up with status 2
//! before anything binds, and --print-config shows every value with its source. (Loading, merging and
//! validation themselves are tested in the configuration crate, crates/config/tests.)

use std::path::{Path, PathBuf};
use std::process::Command;

use code_interpreter_mcp::config::AppConfig;

/// A fresh temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cim-config-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn bin() -> Command {
    crate::common::server_command()
}

#[test]
fn invalid_configuration_exits_with_status_2_before_binding() {
    let dir = temp_dir("exit");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        "[workers]\nmax_workers = 0\n",
    );
    let out = bin().current_dir(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("workers.max_workers") && err.contains("code-interpreter-mcp.toml"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing was announced");
}

#[test]
fn print_config_shows_values_and_their_sources() {
    let dir = temp_dir("print");
    write(
        &dir,
        "code-interpreter-mcp.toml",
        "[workers]\nqueue_capacity = 4\n",
    );
    let out = bin()
        .current_dir(&dir)
        .arg("--print-config")
        .env("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "3")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let file = dir.join("code-interpreter-mcp.toml");
    assert!(
        text.contains(&format!("queue_capacity = 4  # file {}", file.display())),
        "{text}"
    );
    assert!(
        text.contains(
            "max_workers = 3  # environment variable CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS"
        ),
        "{text}"
    );
    assert!(text.contains("memory_limit_mb = 512  # default"), "{text}");
    assert!(text.contains("[integrations.prometheus]"), "{text}");
    // The printed configuration is itself a valid configuration file with the same values.
    let reparsed: AppConfig = toml::from_str(&text).unwrap();
    assert_eq!(reparsed.workers.max_workers, 3);
}
