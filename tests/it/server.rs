//! The MCP server as a real process over real HTTP: the announcement, the 2026-07-28 stateless era and
//! the legacy session lifecycle, `run_python_code` results and validation errors.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::{Value, json};

use crate::fixture::{Server, call_stateless, client, message, post_legacy};

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
    for version in ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"] {
        legacy_session(&server, version);
    }
}

fn legacy_session(server: &Server, version: &str) {
    let http = client();
    let post = |session: Option<&str>, body: Value| {
        post_legacy(&http, &server.url, session, version, body)
    };
    let init = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {},
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
    assert_eq!(init["result"]["protocolVersion"], version);
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
    // Structured output came with 2025-06-18 (tests/it/eras.rs has the rest).
    let structured = version >= "2025-06-18";
    assert_eq!(
        tool["outputSchema"]["properties"]["stdout"].is_object(),
        structured,
        "{version}"
    );

    let call = message(post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "run_python_code", "arguments": {"code": "raise ValueError('bad')"}}}),
    ));
    assert_eq!(call["result"]["isError"], true);
    let result = if structured {
        call["result"]["structuredContent"].clone()
    } else {
        assert!(call["result"].get("structuredContent").is_none(), "{call}");
        serde_json::from_str(call["result"]["content"][0]["text"].as_str().unwrap()).unwrap()
    };
    assert_eq!(result["error"]["kind"], "python");
    assert_eq!(result["error"]["type"], "ValueError");

    let closed = http
        .delete(&server.url)
        .header("Mcp-Session-Id", &session)
        .header("MCP-Protocol-Version", version)
        .send()
        .unwrap();
    assert_eq!(closed.status(), 204, "session closed");
    let after = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}),
    );
    assert_eq!(after.status(), 404, "a closed session is gone");
}

fn post_raw(url: &str, headers: &[(&str, &str)], body: String) -> reqwest::blocking::Response {
    let mut req = client()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(body).send().unwrap()
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"it","version":"1"}}}"#;

#[test]
fn host_header_verification_defaults_to_loopback_names() {
    let server = Server::start(&[]);
    let port = server
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches("/mcp")
        .to_string();
    for host in ["localhost", "127.0.0.1"] {
        let r = post_raw(
            &server.url,
            &[("Host", &format!("{host}:{port}"))],
            INIT.into(),
        );
        assert_eq!(r.status(), 200, "{host}");
    }
    let r = post_raw(&server.url, &[("Host", "[::1]:1234")], INIT.into());
    assert_eq!(r.status(), 200, "any port on a loopback name");
    let r = post_raw(&server.url, &[("Host", "evil.example")], INIT.into());
    assert_eq!(r.status(), 403);
}

#[test]
fn configured_hosts_replace_the_default_and_pin_ports() {
    let server = Server::start(&[(
        "CODE_INTERPRETER_MCP_HTTP_ALLOWED_HOSTS",
        "mcp.example.com, proxy.example.com:8443",
    )]);
    let status = |host: &str| {
        post_raw(&server.url, &[("Host", host)], INIT.into())
            .status()
            .as_u16()
    };
    assert_eq!(status("mcp.example.com"), 200);
    assert_eq!(
        status("mcp.example.com:1234"),
        200,
        "a bare name permits any port"
    );
    assert_eq!(status("proxy.example.com:8443"), 200);
    assert_eq!(
        status("proxy.example.com:9000"),
        403,
        "host:port pins the port"
    );
    assert_eq!(
        status("localhost"),
        403,
        "the list replaces the loopback default"
    );

    let open = Server::start(&[
        ("CODE_INTERPRETER_MCP_HTTP_ALLOWED_HOSTS", "mcp.example.com"),
        ("CODE_INTERPRETER_MCP_SKIP_HOST_HEADER_VERIFICATION", "true"),
    ]);
    let r = post_raw(&open.url, &[("Host", "anything.example")], INIT.into());
    assert_eq!(
        r.status(),
        200,
        "skip_host_header_verification allows any Host"
    );
}

#[test]
fn foreign_origins_are_rejected() {
    let server = Server::start(&[]);
    let r = post_raw(
        &server.url,
        &[("Origin", "https://evil.example")],
        INIT.into(),
    );
    assert_eq!(r.status(), 403);
    let r = post_raw(
        &server.url,
        &[("Origin", "http://localhost:6274")],
        INIT.into(),
    );
    assert_eq!(
        r.status(),
        200,
        "a page on loopback may call a loopback server"
    );

    let server = Server::start(&[(
        "CODE_INTERPRETER_MCP_HTTP_ALLOWED_ORIGINS",
        "https://app.example.com",
    )]);
    let r = post_raw(
        &server.url,
        &[("Origin", "https://app.example.com")],
        INIT.into(),
    );
    assert_eq!(r.status(), 200);
    let r = post_raw(
        &server.url,
        &[("Origin", "http://localhost:6274")],
        INIT.into(),
    );
    assert_eq!(
        r.status(),
        403,
        "the configured list replaces the loopback default"
    );
}

#[test]
fn http_body_ceiling_is_derived_from_the_aggregate_limit() {
    // max_total_file_kb = 1024: ceiling = 4 * ceil(1048576 / 3) + 4 * 63 + 8388608 = 9,786,964 bytes.
    let ceiling: usize = 9_786_964;
    let server = Server::start(&[
        ("CODE_INTERPRETER_MCP_INPUT_LIMITS_MAX_FILE_KB", "1024"),
        (
            "CODE_INTERPRETER_MCP_INPUT_LIMITS_MAX_TOTAL_FILE_KB",
            "1024",
        ),
    ]);
    let headers = [
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "run_python_code"),
    ];
    // A valid call with a 1 MiB file, padded with JSON whitespace to exactly the ceiling.
    use base64::Engine as _;
    let content = base64::engine::general_purpose::STANDARD.encode(vec![b'a'; 1024 * 1024]);
    let call = json!({
        "jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {
            "name": "run_python_code",
            "arguments": {"code": "import os\nos.path.getsize('big.bin')", "files": [{"path": "big.bin", "content_base64": content}]},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "it", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    })
    .to_string();
    let padded = |len: usize| format!("{call}{}", " ".repeat(len - call.len()));

    let r = post_raw(&server.url, &headers, padded(ceiling));
    assert_eq!(r.status(), 200);
    let reply = message(r);
    assert_eq!(
        reply["result"]["structuredContent"]["result"], "1048576",
        "{reply}"
    );

    let r = post_raw(&server.url, &headers, padded(ceiling + 1));
    assert_eq!(r.status(), 413);
    let text = r.text().unwrap();
    assert!(text.contains("9786964 bytes"), "{text}");
    assert!(
        text.contains("input_limits.max_total_file_kb = 1024"),
        "{text}"
    );
}

#[test]
fn stdio_round_trip() {
    use std::io::Write;
    let mut child = crate::common::server_command()
        .arg("--stdio")
        .env(
            "CODE_INTERPRETER_MCP_PACKAGE_BASE_URL",
            crate::common::package_mirror(),
        )
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut send = |v: Value| writeln!(stdin, "{v}").unwrap();
    let mut recv = || {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "it", "version": "1"}}}),
    );
    let init = recv();
    assert_eq!(init["result"]["serverInfo"]["name"], "code-interpreter-mcp");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_python_code", "arguments": {"code": "import js\njs.console.log('js')\nprint('py')\n1 + 1"}}}),
    );
    let call = recv();
    let structured = &call["result"]["structuredContent"];
    assert_eq!(structured["stdout"], "py\n", "{call}");
    assert_eq!(
        structured["stderr"], "js\n",
        "JavaScript console output stays in the result"
    );
    assert_eq!(structured["result"], "2");
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the server exits when stdin closes: {status}"
    );
}

/// A server process over stdio, initialized (protocol 2025-03-26, as many stdio hosts speak).
struct StdioServer {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl StdioServer {
    fn start(store: &std::path::Path) -> Self {
        let mut child = crate::common::server_command()
            .arg("--stdio")
            .env("CODE_INTERPRETER_MCP_SESSIONS_STORE_URL", store)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut server = Self {
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            next: 1,
        };
        let init = server.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25",
            "capabilities": {}, "clientInfo": {"name": "it", "version": "1"}}),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        server.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server
    }

    fn send(&mut self, message: Value) {
        use std::io::Write;
        writeln!(self.stdin.as_mut().unwrap(), "{message}").unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            self.stdout.read_line(&mut line).unwrap();
            let message: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
            if message["id"] == id {
                return message;
            }
        }
    }

    /// Runs `code` in `session`; the structured result.
    fn run(&mut self, session: &str, code: &str) -> Value {
        let reply = self.request(
            "tools/call",
            json!({"name": "run_python_code", "arguments": {"code": code, "session_id": session}}),
        );
        reply["result"]["structuredContent"].clone()
    }

    /// Waits for the process to end (within 30 s); whether it ended well, and how long it took.
    fn wait(mut self) -> (bool, std::time::Duration) {
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), started.elapsed());
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "still running"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn stdio_sessions_survive_their_process_at_eof_and_sigterm() {
    let store = crate::common::temp_dir("stdio-store");
    let mut first = StdioServer::start(&store);
    let r = first.run("new", "x = 41");
    assert_eq!(r["session"]["durable"], true, "{r}");
    let id = r["session_id"].as_str().unwrap().to_string();
    // The host closes standard input (a process per call or per conversation): saved, then gone.
    first.stdin = None;
    let (ok, took) = first.wait();
    assert!(ok, "exited well");
    println!("saved and exited {took:?} after EOF");

    let mut second = StdioServer::start(&store);
    let r = second.run(&id, "x += 1\nx");
    assert_eq!(r["result"], "42", "{r}");
    // SIGTERM (a desktop app restarting its servers): saved as well.
    let status = std::process::Command::new("kill")
        .args(["-TERM", &second.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (ok, _) = second.wait();
    assert!(ok, "exited well after SIGTERM");

    let mut third = StdioServer::start(&store);
    assert_eq!(third.run(&id, "x")["result"], "42");
    // One that cannot be saved says why when its id comes back.
    let r = third.run("new", "import js\nheld = js.Object.new()");
    assert_eq!(r["session"]["durable"], false, "{r}");
    let pinned = r["session_id"].as_str().unwrap().to_string();
    third.stdin = None;
    assert!(third.wait().0);
    let mut fourth = StdioServer::start(&store);
    let r = fourth.run(&pinned, "held");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("JavaScript object"), "{r}");
}

#[test]
fn json_logs_have_one_line_per_call_without_code_or_paths() {
    let mut child = crate::common::server_command()
        .env("CODE_INTERPRETER_MCP_BIND_ADDR", "127.0.0.1:0")
        .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "0")
        .env("CODE_INTERPRETER_MCP_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_string();
    let stderr = child.stderr.take().unwrap();
    let server = Server::adopt(child, url);
    call_stateless(
        &server,
        json!({"code": "print('SECRET_CODE_MARKER')", "files": [{"path": "secret_dir/data.txt", "content_base64": "U0VDUkVU"}]}),
    );
    drop(server); // ends the process, closing stderr
    let logs: Vec<Value> = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    let calls: Vec<&Value> = logs
        .iter()
        .filter(|l| l["fields"]["message"] == "tool call")
        .collect();
    assert_eq!(calls.len(), 1, "{logs:?}");
    let fields = &calls[0]["fields"];
    assert_eq!(fields["tool"], "run_python_code");
    assert_eq!(fields["outcome"], "success");
    assert!(fields["queue_wait_ms"].is_u64() && fields["execution_ms"].is_u64());
    let all = serde_json::to_string(&logs).unwrap();
    for secret in ["SECRET_CODE_MARKER", "secret_dir", "U0VDUkVU"] {
        assert!(!all.contains(secret), "{secret} leaked into the logs");
    }
    assert!(
        logs.iter()
            .any(|l| l["fields"]["http_body_limit"] == 78_293_928),
        "effective limits are logged"
    );
}
