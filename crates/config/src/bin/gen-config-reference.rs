//! Writes the configuration key reference (docs/config-reference.json) generated from `AppConfig`.
//! `--check` fails when the committed file is stale; `--path FILE` names another file.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut check = false;
    // crates/config -> the repository root.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/config is two levels below the root");
    let mut path = root.join("docs/config-reference.json");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--check" => check = true,
            "--path" => match args.next() {
                Some(p) => path = PathBuf::from(p),
                None => {
                    eprintln!("--path needs a file");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprintln!(
                    "unknown argument {other}; usage: gen-config-reference [--check] [--path FILE]"
                );
                return ExitCode::from(2);
            }
        }
    }
    let expected = code_interpreter_mcp_config::reference_json();
    if check {
        match std::fs::read_to_string(&path) {
            Ok(current) if current == expected => {
                println!("{} is up to date", path.display());
                ExitCode::SUCCESS
            }
            _ => {
                eprintln!(
                    "{} is stale: run `cargo run --bin gen-config-reference` and commit the result",
                    path.display()
                );
                ExitCode::FAILURE
            }
        }
    } else if let Err(e) = std::fs::write(&path, expected) {
        eprintln!("cannot write {}: {e}", path.display());
        ExitCode::FAILURE
    } else {
        println!("wrote {}", path.display());
        ExitCode::SUCCESS
    }
}
