//! What running several replicas needs, over real HTTP: bearer tokens on /mcp (401 challenges,
//! reload on change and on SIGHUP, probes open, tokens never logged), session ids that name their
//! replica (tool sessions and legacy-era MCP sessions) with the structured error on the wrong
//! replica, the session id mirrored in the Mcp-Param-Session-Id header and checked against the body,
//! and an offline start without preinstalled packages.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fixture::{
    LegacyClient, Server, call_stateless, client, list_tools_stateless, message, server_command,
    stateless_meta,
};

fn structured(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

fn signal(server: &Server, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// POSTs a 2026-07-28 run_python_code call with `arguments` and the era's standard headers plus
/// `extra` (and nothing else: no Mcp-Param-* header unless given).
fn post_call(
    server: &Server,
    arguments: Value,
    extra: &[(&str, &str)],
) -> reqwest::blocking::Response {
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "run_python_code", "arguments": arguments, "_meta": stateless_meta()}});
    let mut request = client()
        .post(&server.url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "run_python_code");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    request.body(body.to_string()).send().unwrap()
}

/// A stateless call with `authorization` (or none): its HTTP status, WWW-Authenticate and body.
fn call_with_token(server: &Server, token: Option<&str>) -> (u16, String, String) {
    let extra: Vec<(&str, &str)> = token.map(|t| ("Authorization", t)).into_iter().collect();
    let response = post_call(server, json!({"code": "6 * 7"}), &extra);
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, challenge, response.text().unwrap())
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !ok() {
        assert!(
            started.elapsed() < timeout,
            "{what}: not within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

#[test]
fn bearer_tokens_guard_mcp_reload_and_leave_probes_open() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "# operators\nfirst-secret-token\n\nsecond-secret-token\n",
    )
    .unwrap();
    let mut command = server_command();
    command
        .env("RUST_LOG", "info")
        .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "0")
        .env("CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE", &tokens);
    let server = Server::spawn(&mut command, true);

    let (status, challenge, _) = call_with_token(&server, None);
    assert_eq!(status, 401);
    assert_eq!(challenge, r#"Bearer realm="code-interpreter-mcp""#);
    let (status, challenge, _) = call_with_token(&server, Some("Bearer wrong-token"));
    assert_eq!(status, 401);
    assert!(
        challenge.starts_with(r#"Bearer realm="code-interpreter-mcp", error="invalid_token""#),
        "{challenge}"
    );
    let (status, _, _) = call_with_token(&server, Some("Basic Zmlyc3Qtc2VjcmV0LXRva2Vu"));
    assert_eq!(status, 401, "only the Bearer scheme");
    for token in ["Bearer first-secret-token", "bearer second-secret-token"] {
        let (status, _, body) = call_with_token(&server, Some(token));
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(r#""result":"42""#), "{body}");
    }
    // Probes are outside authentication.
    for probe in ["livez", "readyz"] {
        let response = client()
            .get(format!("{}/{probe}", server.base()))
            .send()
            .unwrap();
        assert_eq!(response.status(), 200, "{probe}");
    }

    // A changed file is picked up by the poll.
    std::fs::write(&tokens, "rotated-token\n").unwrap();
    wait_until("the rotated token", Duration::from_secs(5), || {
        call_with_token(&server, Some("Bearer rotated-token")).0 == 200
    });
    assert_eq!(
        call_with_token(&server, Some("Bearer first-secret-token")).0,
        401
    );
    // SIGHUP reloads at once.
    std::fs::write(&tokens, "after-hangup-token\n").unwrap();
    signal(&server, "HUP");
    let took = wait_until("the token after SIGHUP", Duration::from_secs(5), || {
        call_with_token(&server, Some("Bearer after-hangup-token")).0 == 200
    });
    assert!(took < Duration::from_secs(2), "SIGHUP took {took:?}");
    assert!(server.child.id() > 0);

    let log = server.log.lock().unwrap().join("\n");
    assert!(
        log.contains("refused an unauthenticated /mcp request"),
        "{log}"
    );
    assert!(log.contains("bearer tokens reloaded"), "{log}");
    for secret in [
        "first-secret-token",
        "second-secret-token",
        "wrong-token",
        "rotated-token",
        "after-hangup-token",
    ] {
        assert!(!log.contains(secret), "a token reached the log: {secret}");
    }
}

#[test]
fn a_missing_or_empty_token_file_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "# no tokens yet\n").unwrap();
    for (file, expected) in [
        (dir.path().join("absent"), "cannot read it"),
        (empty, "holds no token"),
    ] {
        let output = server_command()
            .env("CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE", &file)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("auth.bearer_tokens_file") && stderr.contains(expected),
            "{stderr}"
        );
    }
}

#[test]
fn session_ids_name_their_replica_and_other_replicas_ids_get_the_session_error() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_REPLICA_ID", "r7")]);
    let created = call_stateless(&server, json!({"code": "x = 5", "session_id": "new"}));
    let id = structured(&created)["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let random = id.strip_prefix("r7.").expect("the replica prefix");
    assert!(random.len() >= 32, "{id}");
    let again = call_stateless(&server, json!({"code": "x", "session_id": id}));
    assert_eq!(structured(&again)["result"], "5", "{again}");

    let foreign = format!("r2.{random}");
    let reply = call_stateless(&server, json!({"code": "x", "session_id": foreign}));
    let error = &structured(&reply)["error"];
    assert_eq!(error["kind"], "session", "{reply}");
    assert_eq!(error["type"], "SessionNotFound");
    let text = error["message"].as_str().unwrap();
    assert!(
        text.contains("created by replica \"r2\"") && text.contains("this is replica r7"),
        "{text}"
    );
    assert!(
        !text.contains(random),
        "the message shows a short id only: {text}"
    );

    // Legacy-era MCP sessions carry the prefix too.
    let legacy = LegacyClient::connect(&server);
    let listed = legacy.request("tools/list", json!({}));
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    let legacy_id = client()
        .post(&server.url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": LegacyClient::VERSION, "capabilities": {},
                "clientInfo": {"name": "it", "version": "1"}}})
            .to_string(),
        )
        .send()
        .unwrap()
        .headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(legacy_id.starts_with("r7."), "{legacy_id}");
}

#[test]
fn a_replica_id_that_cannot_prefix_an_id_stops_start_up() {
    let output = server_command()
        .env("CODE_INTERPRETER_MCP_REPLICA_ID", "Replica.1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("replica_id"), "{stderr}");
}

/// A stateless call with exactly the given Mcp-Param-Session-Id header (or none): status and reply.
fn call_with_param_header(server: &Server, arguments: Value, header: Option<&str>) -> (u16, Value) {
    let extra: Vec<(&str, &str)> = header
        .map(|h| ("Mcp-Param-Session-Id", h))
        .into_iter()
        .collect();
    let response = post_call(server, arguments, &extra);
    (response.status().as_u16(), message(response))
}

#[test]
fn the_session_id_is_mirrored_in_a_header_that_must_match_the_body() {
    let server = Server::start(&[]);
    let tools = list_tools_stateless(&server);
    for tool in ["run_python_code", "list_session_files", "clear_session"] {
        let schema = &tools.iter().find(|t| t["name"] == tool).unwrap()["inputSchema"];
        let property = &schema["properties"]["session_id"];
        assert_eq!(property["x-mcp-header"], "Session-Id", "{tool}: {property}");
        assert_eq!(property["type"], "string", "{tool}: {property}");
    }

    // Matching header: served (base64 form too).
    let (status, reply) = call_with_param_header(
        &server,
        json!({"code": "y = 1", "session_id": "new"}),
        Some("new"),
    );
    assert_eq!(status, 200, "{reply}");
    let id = structured(&reply)["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let encoded = crate::fixture::header_value(&format!("{id} "));
    assert!(encoded.starts_with("=?base64?"));
    let (status, reply) = call_with_param_header(
        &server,
        json!({"code": "y", "session_id": id}),
        Some(&format!(
            "=?base64?{}?=",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &id)
        )),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(structured(&reply)["result"], "1");

    // Missing or different header: 400 with HeaderMismatch (-32020), and the code does not run.
    for header in [None, Some("another-session")] {
        let (status, reply) =
            call_with_param_header(&server, json!({"code": "y = 2", "session_id": id}), header);
        assert_eq!(status, 400, "{header:?}: {reply}");
        assert_eq!(reply["error"]["code"], -32020, "{reply}");
    }
    let (_, reply) =
        call_with_param_header(&server, json!({"code": "y", "session_id": id}), Some(&id));
    assert_eq!(
        structured(&reply)["result"],
        "1",
        "refused calls did not run"
    );
    // No session_id, no header: a stateless call as ever.
    let (status, reply) = call_with_param_header(&server, json!({"code": "'plain'"}), None);
    assert_eq!(status, 200);
    assert_eq!(structured(&reply)["result"], "plain");
}

#[test]
fn without_a_package_source_and_preinstalls_the_server_starts_without_micropip() {
    let cache = tempfile::tempdir().unwrap();
    // Nothing listens on port 9: every download fails at once.
    let unreachable = "https://127.0.0.1:9/pyodide/";
    let mut command = server_command();
    command
        .env("RUST_LOG", "warn")
        .env("CODE_INTERPRETER_MCP_PACKAGE_BASE_URL", unreachable)
        .env("CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR", cache.path());
    let server = Server::spawn(&mut command, true);
    let log = server.log.lock().unwrap().join("\n");
    assert!(
        log.contains("no package source reachable: starting without micropip"),
        "{log}"
    );
    let reply = call_stateless(&server, json!({"code": "import json\njson.dumps([1])"}));
    assert_eq!(structured(&reply)["result"], "[1]", "{reply}");
    let reply = call_stateless(&server, json!({"code": "import micropip"}));
    let error = &structured(&reply)["error"];
    assert_eq!(error["type"], "ModuleNotFoundError", "{reply}");
    assert!(
        error["message"].as_str().unwrap().contains(
            "micropip is unavailable: the server started without a reachable package source"
        ),
        "{reply}"
    );
    // JavaScript cannot fetch micropip's wheel behind the runner's back either.
    let reply = call_stateless(
        &server,
        json!({"code": "import pyodide_js\nawait pyodide_js.loadPackage('micropip')\nimport micropip"}),
    );
    assert_eq!(structured(&reply)["success"], false, "{reply}");
    drop(server);

    // A package the operator asked for that cannot be prepared still stops start-up.
    let output = server_command()
        .env("CODE_INTERPRETER_MCP_PACKAGE_BASE_URL", unreachable)
        .env("CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR", cache.path())
        .env(
            "CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES",
            "snowballstemmer",
        )
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}
