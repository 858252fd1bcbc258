//! Containment, second round (continued from containment.rs): session files never lead out of
//! /workspace, a contradicting session header is refused in the legacy era, broken bodies are the
//! client's error, and with bearer tokens a session answers only to its creator.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

use crate::containment::{legacy_post, new_session, structured};
use crate::fixture::{LegacyClient, Server, call_stateless, message};

// --- 5. Smaller: links, headers, bodies, tokens -----------------------------------------------------

#[test]
fn session_resources_never_follow_a_link_out_of_the_workspace() {
    let server = Server::start(&[]);
    let id = new_session(
        &server,
        "import os\nos.symlink('/lib', 'lib')\nos.symlink('/lib/python3.14/os.py', 'os.py')\nos.makedirs('real')\nopen('real/ok.txt', 'w').write('ok')",
    );
    let legacy = LegacyClient::connect(&server);
    for path in ["lib/python3.14/os.py", "os.py", "lib"] {
        let reply = legacy.request(
            "resources/read",
            json!({"uri": format!("session://{id}/{path}")}),
        );
        // (Resource-not-found: -32002 in this era, -32602 in 2026-07-28's.)
        assert_eq!(reply["error"]["code"], -32002, "{path}: {reply}");
    }
    let reply = legacy.request(
        "resources/read",
        json!({"uri": format!("session://{id}/real/ok.txt")}),
    );
    assert_eq!(reply["result"]["contents"][0]["text"], "ok", "{reply}");
}

#[test]
fn a_legacy_request_whose_session_header_contradicts_its_body_is_refused() {
    let server = Server::start(&[]);
    let legacy = LegacyClient::connect(&server);
    let r = legacy.call(
        "run_python_code",
        json!({"code": "y = 1", "session_id": "new"}),
    );
    let id = structured(&r)["session_id"].as_str().unwrap().to_string();
    for header in ["another-session", "new"] {
        let response = legacy_post(
            &legacy,
            &server.url,
            json!({"jsonrpc": "2.0", "id": 60, "method": "tools/call",
                "params": {"name": "run_python_code", "arguments": {"code": "y = 2", "session_id": id}}}),
            &[("Mcp-Param-Session-Id", header)],
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(response.status(), 400, "{header}");
        let reply = message(response);
        assert_eq!(reply["error"]["code"], -32020, "{reply}");
    }
    // A matching header (or none, in this era) is served, and the refused calls did not run.
    let response = legacy_post(
        &legacy,
        &server.url,
        json!({"jsonrpc": "2.0", "id": 61, "method": "tools/call",
            "params": {"name": "run_python_code", "arguments": {"code": "y", "session_id": id}}}),
        &[("Mcp-Param-Session-Id", &id)],
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(structured(&message(response))["result"], "1");
}

/// Sends raw bytes to the server's HTTP port; the status line of the answer.
fn raw_http(server: &Server, request: &[u8], close_write: bool) -> String {
    let address = server.base().trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).unwrap();
    if close_write {
        stream.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_truncated_body_or_broken_chunking_is_a_client_error() {
    let server = Server::start(&[]);
    let head = |extra: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: run_python_code\r\n{extra}\r\n"
        )
    };
    let truncated = format!("{}{{\"jsonrpc\": \"2.0\"", head("Content-Length: 1000\r\n"));
    let status = raw_http(&server, truncated.as_bytes(), true);
    assert!(status.contains(" 400 "), "{status}");
    let chunked = format!(
        "{}zz\r\nnot a chunk\r\n",
        head("Transfer-Encoding: chunked\r\n")
    );
    let status = raw_http(&server, chunked.as_bytes(), true);
    assert!(status.contains(" 400 "), "{status}");
    // The server serves on.
    let r = structured(&call_stateless(&server, json!({"code": "6 * 7"}))).clone();
    assert_eq!(r["result"], "42");
}

#[test]
fn with_bearer_tokens_a_session_answers_only_to_the_token_that_created_it() {
    let dir = crate::common::temp_dir("session-tokens");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "alice-token\nbob-token\n").unwrap();
    let server = Server::start(&[(
        "CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE",
        tokens.to_str().unwrap(),
    )]);
    let call = |token: &str, arguments: Value| {
        structured(&message(crate::fixture::call_as(
            &server,
            Some(token),
            arguments,
        )))
        .clone()
    };
    let r = call(
        "alice-token",
        json!({"code": "secret = 42", "session_id": "new"}),
    );
    let id = r["session_id"].as_str().unwrap().to_string();
    let r = call("bob-token", json!({"code": "secret", "session_id": id}));
    assert_eq!(r["error"]["type"], "SessionNotFound", "{r}");
    let r = call("alice-token", json!({"code": "secret", "session_id": id}));
    assert_eq!(r["result"], "42", "{r}");
}
