//! The command line: with no subcommand the MCP server runs; `code-interpreter-mcp exec script.py` runs
//! one file through the engine and prints the result as JSON, for humans debugging the sandbox;
//! `code-interpreter-mcp prepare` builds the package layer and memory snapshot and exits (image builds).
//! `--config FILE` (repeatable) replaces configuration discovery; `--print-config` shows the effective
//! configuration and where each value came from.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::config::{ConfigError, EngineSettings};
use crate::protocol::limits::{DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS};
use crate::sandbox::SnapshotOrigin;
use crate::sandbox::{ExecRequest, InputFile};

#[derive(Debug, Parser)]
#[command(name = "code-interpreter-mcp", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Configuration file to load instead of discovering code-interpreter-mcp.toml and
    /// *.auto.code-interpreter-mcp.toml in the working directory (repeatable; later files win).
    #[arg(long = "config", value_name = "FILE", global = true)]
    pub config: Vec<PathBuf>,
    /// Print the effective configuration with the source of every value, then exit.
    #[arg(long)]
    pub print_config: bool,
    /// Serve MCP over standard input and output instead of HTTP (for clients that launch the server
    /// as a child process).
    #[arg(long)]
    pub stdio: bool,
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
        #[arg(long, default_value_t = DEFAULT_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_MS))]
        timeout_ms: u64,
    },
    /// Build the package layer (micropip and preinstall_packages) and the memory snapshot under
    /// package_cache_dir, check that a sandbox starts from them, and exit: for container image builds,
    /// so that the server starts without network and without writing.
    Prepare,
}

/// Runs the command line; returns the process exit status (2 for configuration and start-up errors).
pub fn main() -> i32 {
    let cli = Cli::parse();
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let loaded = match crate::config::load(&cli.config, &cwd, &|k| std::env::var(k).ok()) {
        Ok(l) => l,
        Err(ConfigError(message)) => {
            eprintln!("code-interpreter-mcp: invalid configuration: {message}");
            return 2;
        }
    };
    if cli.print_config {
        print!("{}", crate::config::print_config(&loaded));
        return 0;
    }
    let settings = &loaded.settings;
    if cli.command.is_some() {
        // The one-shot commands log only what went wrong (stdout is theirs), unless RUST_LOG says.
        crate::app::init_logging(settings.log_format, "warn");
        for warning in &loaded.warnings {
            tracing::warn!("{warning}");
        }
    }
    let outcome = match cli.command {
        Some(Command::Exec {
            script,
            files,
            timeout_ms,
        }) => exec(script, files, timeout_ms, &settings.engine),
        Some(Command::Prepare) => prepare(&settings.engine),
        None => crate::app::serve(settings, cli.stdio, &loaded.warnings),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("code-interpreter-mcp: {e:#}");
            2
        }
    }
}

/// Runs `exec`; returns the process exit status.
pub fn exec(
    script: PathBuf,
    files: Vec<String>,
    timeout_ms: u64,
    config: &EngineSettings,
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
    let engine = crate::app::engine(config)?;
    let result = engine.execute(ExecRequest {
        code,
        files: inputs,
        timeout: Duration::from_millis(timeout_ms),
        ..Default::default()
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(if result.success { 0 } else { 1 })
}

/// Runs `prepare`; returns the process exit status.
pub fn prepare(config: &EngineSettings) -> anyhow::Result<i32> {
    let started = std::time::Instant::now();
    let engine = crate::app::engine(config)?;
    let layer = engine.layer_origin();
    anyhow::ensure!(
        matches!(
            layer,
            Some(
                crate::sandbox::layer::LayerOrigin::Built
                    | crate::sandbox::layer::LayerOrigin::Reused
            )
        ),
        "the package layer is not on disk ({layer:?}): package_cache_dir must be writable and a package source reachable"
    );
    let result = engine.execute(ExecRequest {
        code: "import micropip\nmicropip.__name__".into(),
        files: Vec::new(),
        timeout: Duration::from_secs(60),
        ..Default::default()
    });
    anyhow::ensure!(
        result.success && result.result.as_deref() == Some("micropip"),
        "a sandbox from the prepared layer failed: {}",
        serde_json::to_string(&result)?
    );
    let dir = &config.package_cache_dir;
    let origin = engine.snapshot_origin();
    anyhow::ensure!(
        matches!(
            origin,
            None | Some(SnapshotOrigin::ReadBack | SnapshotOrigin::Taken { on_disk: true })
        ),
        "no memory snapshot was written to {} ({origin:?})",
        dir.display()
    );
    anyhow::ensure!(
        config.preimport_modules.is_empty() || engine.preimported(),
        "the snapshot with preimport_modules {:?} could not be made or does not work (see the warning above)",
        config.preimport_modules
    );
    println!(
        "prepared {} in {:.1} s: package layer {layer:?} ({} preinstalled), memory snapshot on disk{}",
        dir.display(),
        started.elapsed().as_secs_f64(),
        config.preinstall_packages.len(),
        if engine.preimported() {
            ", with pre-imported modules"
        } else {
            ""
        }
    );
    Ok(0)
}
