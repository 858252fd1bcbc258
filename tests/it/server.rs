//! The MCP server as a real process over real HTTP: the announcement, the 2026-07-28 stateless era and
//! the legacy session lifecycle, `run_python_code` results and validation errors.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

/// A running server process, killed on drop.
pub struct Server {
    child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    pub fn start(envs: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_code-interpreter-mcp"))
            .env("CODE_INTERPRETER_MCP_BIND_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .env(
                "CODE_INTERPRETER_MCP_PACKAGE_BASE_URL",
                crate::common::package_mirror(),
            )
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("server starts");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("announcement");
        // code-interpreter-mcp listening on port PORT at http://ADDR:PORT/mcp
        let prefix = "code-interpreter-mcp listening on port ";
        assert!(line.starts_with(prefix), "unexpected announcement {line:?}");
        let rest = line[prefix.len()..].trim();
        let (port, url) = rest.split_once(" at ").expect("port and URL");
        let port: u16 = port.parse().expect("numeric port");
        assert_ne!(port, 0);
        assert_eq!(url, format!("http://127.0.0.1:{port}/mcp"));
        Self {
            child,
            url: url.to_string(),
        }
    }
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .unwrap()
}

/// The JSON-RPC message in a response that is either JSON or an SSE stream.
fn message(response: reqwest::blocking::Response) -> Value {
    let is_sse = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body = response.text().unwrap();
    if !is_sse {
        return serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|m| m.get("id").is_some())
        .unwrap_or_else(|| panic!("no response in stream: {body}"))
}

fn call_stateless(server: &Server, arguments: Value) -> Value {
    let body = json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {
            "name": "run_python_code",
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "it", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    });
    let response = client()
        .post(&server.url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "run_python_code")
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(response.status(), 200);
    message(response)
}

#[test]
fn stateless_2026_07_28_call_runs_python_and_returns_structured_content() {
    let server = Server::start(&[]);
    let reply = call_stateless(&server, json!({"code": "print('hi')\n6 * 7"}));
    let result = &reply["result"];
    assert_eq!(result["isError"], false, "{reply}");
    let structured = &result["structuredContent"];
    assert_eq!(structured["success"], true);
    assert_eq!(structured["stdout"], "hi\n");
    assert_eq!(structured["result"], "42");
    // The same result as a JSON text block for clients that ignore structured content.
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_eq!(&serde_json::from_str::<Value>(text).unwrap(), structured);
}

#[test]
fn validation_errors_come_back_before_execution() {
    let server = Server::start(&[]);
    let reply = call_stateless(
        &server,
        json!({"code": "1", "files": [{"path": "../escape.txt", "content_base64": "aGk="}]}),
    );
    let result = &reply["result"];
    assert_eq!(result["isError"], true, "{reply}");
    assert_eq!(result["structuredContent"]["error"]["kind"], "validation");
    assert!(
        result["structuredContent"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'..'")
    );
    let reply = call_stateless(&server, json!({"code": "1", "timeout_ms": 120001}));
    assert_eq!(
        reply["result"]["structuredContent"]["error"]["kind"],
        "validation"
    );
}

#[test]
fn legacy_session_lifecycle_lists_and_calls_the_tool() {
    let server = Server::start(&[]);
    let http = client();
    let post = |session: Option<&str>, body: Value| {
        let mut req = http
            .post(&server.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream");
        if let Some(id) = session {
            req = req
                .header("Mcp-Session-Id", id)
                .header("MCP-Protocol-Version", "2025-06-18");
        }
        req.body(body.to_string()).send().unwrap()
    };
    let init = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "it", "version": "1"}}}),
    );
    assert_eq!(init.status(), 200);
    let session = init
        .headers()
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_string();
    let init = message(init);
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    let ack = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert!(ack.status().is_success());

    let list = message(post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    ));
    let tools = list["result"]["tools"].as_array().unwrap();
    let tool = tools
        .iter()
        .find(|t| t["name"] == "run_python_code")
        .expect("the tool");
    assert_eq!(tool["inputSchema"]["required"], json!(["code"]));
    assert!(tool["outputSchema"]["properties"]["stdout"].is_object());

    let call = message(post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "run_python_code", "arguments": {"code": "raise ValueError('bad')"}}}),
    ));
    assert_eq!(call["result"]["isError"], true);
    assert_eq!(
        call["result"]["structuredContent"]["error"]["kind"],
        "python"
    );
    assert_eq!(
        call["result"]["structuredContent"]["error"]["type"],
        "ValueError"
    );

    let closed = http
        .delete(&server.url)
        .header("Mcp-Session-Id", &session)
        .header("MCP-Protocol-Version", "2025-06-18")
        .send()
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
}
