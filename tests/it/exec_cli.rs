//! The `exec` debugging subcommand runs a file through the same engine and prints JSON.

#[test]
fn exec_runs_a_script_with_files_and_prints_the_result_as_json() {
    let dir = std::env::temp_dir().join(format!("cim-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("script.py");
    std::fs::write(&script, "from pathlib import Path\nprint(Path('data/in.txt').read_text().upper())\nPath('out.txt').write_text('done')\n1 + 2\n").unwrap();
    let input = dir.join("in.txt");
    std::fs::write(&input, "hello").unwrap();

    let out = crate::common::server_command()
        .arg("exec")
        .arg(&script)
        .arg("--file")
        .arg(format!("{}=data/in.txt", input.display()))
        .arg("--timeout-ms")
        .arg("20000")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(json["success"], true);
    assert_eq!(json["stdout"], "HELLO\n");
    assert_eq!(json["result"], "3");
    assert_eq!(json["files"][0]["path"], "out.txt");
    assert_eq!(json["files"][0]["mime_type"], "text/plain");
}

#[test]
fn exec_reports_python_errors_with_a_failing_status() {
    let dir = std::env::temp_dir().join(format!("cim-exec-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("bad.py");
    std::fs::write(&script, "raise KeyError('k')\n").unwrap();
    let out = crate::common::server_command()
        .arg("exec")
        .arg(&script)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["error"]["kind"], "python");
    assert_eq!(json["error"]["type"], "KeyError");
}

#[test]
fn missing_assets_are_a_clear_startup_error() {
    let dir = std::env::temp_dir().join(format!("cim-no-assets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("s.py");
    std::fs::write(&script, "1").unwrap();
    let out = crate::common::server_command()
        .arg("exec")
        .arg(&script)
        .env("CODE_INTERPRETER_MCP_ASSET_DIR", &dir)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&dir.display().to_string()), "{err}");
    assert!(err.contains("is missing package.json"), "{err}");
}

#[test]
fn assets_of_another_pyodide_version_are_refused() {
    let real = code_interpreter_mcp::assets::Assets::default_dir();
    let dir = std::env::temp_dir().join(format!("cim-wrong-assets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in code_interpreter_mcp::assets::REQUIRED_FILES {
        std::fs::copy(real.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("package.json"),
        r#"{"name": "pyodide", "version": "0.27.0"}"#,
    )
    .unwrap();
    let err = code_interpreter_mcp::assets::Assets::load(&dir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds pyodide 0.27.0"), "{err}");
    assert!(err.contains("314.0.3"), "{err}");

    std::fs::remove_file(dir.join("python_stdlib.zip")).unwrap();
    let err = code_interpreter_mcp::assets::Assets::load(&dir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is missing python_stdlib.zip"), "{err}");
}
