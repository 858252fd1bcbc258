use clap::Parser;

use code_interpreter_mcp::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let status = match cli.command {
        Some(Command::Exec {
            script,
            files,
            timeout_ms,
            asset_dir,
            package_base_url,
        }) => {
            code_interpreter_mcp::cli::exec(script, files, timeout_ms, asset_dir, package_base_url)
        }
        None => Err(anyhow::anyhow!(
            "the MCP server is not built yet; use `code-interpreter-mcp exec script.py`"
        )),
    };
    match status {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("code-interpreter-mcp: {e:#}");
            std::process::exit(2);
        }
    }
}
