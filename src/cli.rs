//! The command line: `code-interpreter-mcp exec script.py` runs one file through the engine and prints
//! the result as JSON, for humans debugging the sandbox.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::sandbox::{Engine, EngineConfig, ExecRequest, InputFile};

#[derive(Debug, Parser)]
#[command(name = "code-interpreter-mcp", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one Python file in a fresh sandbox and print the result as JSON.
    Exec {
        /// The Python script to run.
        script: PathBuf,
        /// Copy a local file into the sandbox: LOCAL=WORKSPACE_PATH (repeatable).
        #[arg(long = "file", value_name = "LOCAL=WORKSPACE_PATH")]
        files: Vec<String>,
        /// Timeout for the code, in milliseconds.
        #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=120_000))]
        timeout_ms: u64,
        /// Directory with the Pyodide runtime files (default: node_modules/pyodide).
        #[arg(long, env = "CODE_INTERPRETER_MCP_ASSET_DIR")]
        asset_dir: Option<PathBuf>,
        /// Package wheel source: a directory, file:// URL or https:// base URL.
        #[arg(long, env = "CODE_INTERPRETER_MCP_PACKAGE_BASE_URL")]
        package_base_url: Option<String>,
    },
}

/// Runs `exec`; returns the process exit status.
pub fn exec(
    script: PathBuf,
    files: Vec<String>,
    timeout_ms: u64,
    asset_dir: Option<PathBuf>,
    package_base_url: Option<String>,
) -> anyhow::Result<i32> {
    let code = std::fs::read_to_string(&script)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", script.display()))?;
    let mut inputs = Vec::new();
    for spec in files {
        let (local, target) = spec
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--file expects LOCAL=WORKSPACE_PATH, got {spec:?}"))?;
        let content =
            std::fs::read(local).map_err(|e| anyhow::anyhow!("cannot read {local}: {e}"))?;
        inputs.push(InputFile {
            path: target.trim_start_matches("/workspace/").to_string(),
            content,
        });
    }
    let mut config = EngineConfig::default();
    if let Some(dir) = asset_dir {
        config.asset_dir = dir;
    }
    if let Some(source) = package_base_url {
        config.package_source = crate::packages::PackageSource::parse(&source);
    }
    let engine = Engine::new(config)?;
    let result = engine.execute(ExecRequest {
        code,
        files: inputs,
        timeout: Duration::from_millis(timeout_ms),
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(if result.success { 0 } else { 1 })
}
