//! The command line: with no subcommand the MCP server runs; `code-interpreter-mcp exec script.py` runs
//! one file through the engine and prints the result as JSON, for humans debugging the sandbox.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::sandbox::{Engine, EngineConfig, ExecRequest, InputFile};

#[derive(Debug, Parser)]
#[command(name = "code-interpreter-mcp", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Server settings taken from the environment until the configuration file support lands.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// HTTP socket address; port 0 picks a free port.
    #[arg(
        long,
        env = "CODE_INTERPRETER_MCP_BIND_ADDR",
        default_value = "127.0.0.1:8000"
    )]
    pub bind_addr: std::net::SocketAddr,
    /// Directory with the Pyodide runtime files (default: node_modules/pyodide).
    #[arg(
        long = "asset-dir",
        env = "CODE_INTERPRETER_MCP_ASSET_DIR",
        global = true
    )]
    pub asset_dir: Option<PathBuf>,
    /// Package wheel source: a directory, file:// URL or https:// base URL.
    #[arg(
        long = "package-base-url",
        env = "CODE_INTERPRETER_MCP_PACKAGE_BASE_URL",
        global = true
    )]
    pub package_base_url: Option<String>,
    /// Maximum simultaneous executions.
    #[arg(long, env = "CODE_INTERPRETER_MCP_MAX_WORKERS", default_value_t = 2)]
    pub max_workers: usize,
    /// Maximum number of waiting requests.
    #[arg(long, env = "CODE_INTERPRETER_MCP_QUEUE_CAPACITY", default_value_t = 8)]
    pub queue_capacity: usize,
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
    },
}

/// Runs `exec`; returns the process exit status.
pub fn exec(
    script: PathBuf,
    files: Vec<String>,
    timeout_ms: u64,
    args: &ServeArgs,
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
    let engine = Engine::new(engine_config(args))?;
    let result = engine.execute(ExecRequest {
        code,
        files: inputs,
        timeout: Duration::from_millis(timeout_ms),
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(if result.success { 0 } else { 1 })
}

fn engine_config(args: &ServeArgs) -> EngineConfig {
    let mut config = EngineConfig::default();
    if let Some(dir) = &args.asset_dir {
        config.asset_dir = dir.clone();
    }
    if let Some(source) = &args.package_base_url {
        config.package_source = crate::packages::PackageSource::parse(source);
    }
    config
}

/// Runs the MCP server until Ctrl-C or SIGTERM; returns the process exit status.
pub fn serve(args: ServeArgs) -> anyhow::Result<i32> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn")),
        )
        .init();
    let threads = tokio_worker_threads()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    runtime.block_on(crate::server::serve(crate::server::ServerConfig {
        bind_addr: args.bind_addr,
        engine: engine_config(&args),
        max_workers: args.max_workers,
        queue_capacity: args.queue_capacity,
        ..Default::default()
    }))?;
    Ok(0)
}

/// TOKIO_WORKER_THREADS, or the available parallelism with a minimum of four.
fn tokio_worker_threads() -> anyhow::Result<usize> {
    match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(value) => {
            let n: usize = value
                .trim()
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "TOKIO_WORKER_THREADS must be a positive integer, got {value:?}"
                    )
                })?;
            if n < 4 {
                tracing::warn!(threads = n, "TOKIO_WORKER_THREADS is below 4");
            }
            Ok(n)
        }
        Err(_) => Ok(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .max(4)),
    }
}
