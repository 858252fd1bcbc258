use clap::Parser;

use code_interpreter_mcp::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let status = match cli.command {
        Some(Command::Exec {
            script,
            files,
            timeout_ms,
        }) => code_interpreter_mcp::cli::exec(script, files, timeout_ms, &cli.serve),
        None => code_interpreter_mcp::cli::serve(cli.serve),
    };
    match status {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("code-interpreter-mcp: {e:#}");
            std::process::exit(2);
        }
    }
}
