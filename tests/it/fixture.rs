//! The server as a real process and MCP over real HTTP: starting the binary and reading its
//! announcement, the local package mirror, and JSON-RPC requests of both protocol eras. Shared by the
//! integration tests (tests/it) and the load benchmark (benches/load.rs includes this file).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// Where the local Pyodide package mirror should be: `CODE_INTERPRETER_MCP_TEST_PACKAGES`, else
/// `../shared/pyodide-packages`.
fn mirror_dir() -> PathBuf {
    std::env::var_os("CODE_INTERPRETER_MCP_TEST_PACKAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/pyodide-packages")
        })
}

/// The local Pyodide package mirror (asserted to be there).
pub fn package_mirror() -> PathBuf {
    let dir = mirror_dir();
    assert!(
        dir.join("numpy-2.4.3-cp314-cp314-pyemscripten_2026_0_wasm32.whl")
            .is_file(),
        "the Pyodide package mirror is missing at {} (set CODE_INTERPRETER_MCP_TEST_PACKAGES)",
        dir.display()
    );
    dir
}

/// The package layer directory shared by the tests (and benchmarks) that keep the default package
/// configuration.
pub fn package_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("package-cache")
}

/// The server binary with the package mirror and package layer directory set, on a free port.
pub fn server_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_code-interpreter-mcp"));
    command
        .env("CODE_INTERPRETER_MCP_BIND_ADDR", "127.0.0.1:0")
        .env("CODE_INTERPRETER_MCP_PACKAGE_BASE_URL", mirror_dir())
        .env("CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR", package_cache());
    command
}

/// Where MCP requests go: a server, or the URL of one.
pub trait Endpoint {
    fn url(&self) -> &str;
}

impl Endpoint for str {
    fn url(&self) -> &str {
        self
    }
}

impl Endpoint for String {
    fn url(&self) -> &str {
        self
    }
}

/// A running server process, killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
    /// Its stderr lines, when started with `spawn(.., true)`.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Endpoint for Server {
    fn url(&self) -> &str {
        &self.url
    }
}

impl Server {
    /// The sandbox creation times (ms) a server started with a JSON log and the pool at debug level
    /// has logged so far, sorted.
    pub fn logged_boot_ms(&self) -> Vec<f64> {
        let mut ms: Vec<f64> = self
            .log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["fields"]["message"] == "sandbox boot")
            .filter_map(|event| event["fields"]["ms"].as_f64())
            .collect();
        ms.sort_by(f64::total_cmp);
        ms
    }

    /// The server with the tests' defaults (warnings only, no sandbox booted before the first call;
    /// tests of prewarming set it) and `envs` on top.
    pub fn start(envs: &[(&str, &str)]) -> Self {
        Self::start_with_args(&[], envs)
    }

    pub fn start_with_args(args: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut command = server_command();
        command
            .args(args)
            .env("RUST_LOG", "warn")
            .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "0")
            .envs(envs.iter().copied());
        Self::spawn(&mut command, false)
    }

    /// Starts `command` and waits for its announcement; with `capture`, its stderr lines are kept
    /// in `log` (else stderr is inherited).
    pub fn spawn(command: &mut Command, capture: bool) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(if capture {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .expect("server starts");
        let log = Arc::new(Mutex::new(Vec::new()));
        if let Some(stderr) = child.stderr.take() {
            let sink = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    sink.lock().unwrap().push(line);
                }
            });
        }
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
            log,
        }
    }

    /// A server process started elsewhere, killed when this is dropped.
    pub fn adopt(child: Child, url: String) -> Self {
        Self {
            child,
            url,
            log: Arc::default(),
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn base(&self) -> String {
        self.url.trim_end_matches("/mcp").to_string()
    }

    /// Waits until `/readyz` answers 200.
    pub fn wait_ready(&self) {
        let ready = format!("{}/readyz", self.base());
        let http = reqwest::blocking::Client::new();
        while http
            .get(&ready)
            .send()
            .map(|r| r.status() != 200)
            .unwrap_or(true)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .unwrap()
}

/// An HTTP client that sends `Authorization: Bearer <token>` with every request.
pub fn client_with_token(token: &str) -> reqwest::blocking::Client {
    let headers = [(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    )]
    .into_iter()
    .collect();
    reqwest::blocking::Client::builder()
        .default_headers(headers)
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .unwrap()
}

/// A 2026-07-28 tools/call of run_python_code with `arguments`, sent with `Authorization: Bearer
/// <token>` when a token is given; the raw response.
pub fn call_as(
    server: &(impl Endpoint + ?Sized),
    token: Option<&str>,
    arguments: Value,
) -> reqwest::blocking::Response {
    let body = tool_call_body("run_python_code", arguments, None);
    let http = token.map_or_else(client, client_with_token);
    send_stateless(
        &http,
        server.url(),
        "tools/call",
        Some("run_python_code"),
        &body,
    )
    .unwrap()
}

/// The JSON-RPC message in a response that is either JSON or an SSE stream.
pub fn message(response: reqwest::blocking::Response) -> Value {
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

pub fn call_stateless(server: &(impl Endpoint + ?Sized), arguments: Value) -> Value {
    call_tool_stateless(server, "run_python_code", arguments)
}

/// tools/list in the 2026-07-28 era; the tools sorted by name.
pub fn list_tools_stateless(server: &(impl Endpoint + ?Sized)) -> Vec<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {"_meta": stateless_meta()}});
    let reply =
        message(send_stateless(&client(), server.url(), "tools/list", None, &body).unwrap());
    let mut tools = reply["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .clone();
    tools.sort_by_key(|t| t["name"].as_str().unwrap_or("").to_string());
    tools
}

pub fn call_tool_stateless(
    server: &(impl Endpoint + ?Sized),
    tool: &str,
    arguments: Value,
) -> Value {
    call_tool_with(&client(), server, tool, arguments)
}

/// A 2026-07-28 tools/call with `http`; the reply (asserted to be HTTP 200).
pub fn call_tool_with(
    http: &reqwest::blocking::Client,
    server: &(impl Endpoint + ?Sized),
    tool: &str,
    arguments: Value,
) -> Value {
    let body = tool_call_body(tool, arguments, None);
    let response = send_stateless(http, server.url(), "tools/call", Some(tool), &body).unwrap();
    assert_eq!(response.status(), 200);
    message(response)
}

/// A process's resident set size (VmRSS), MiB (NaN if it cannot be read).
pub fn rss_mib(pid: u32) -> f64 {
    proc_mib(pid, "status", "VmRSS:")
}

/// A process's proportional set size (`Pss` of its `smaps_rollup`), MiB (NaN if it cannot be read).
pub fn pss_mib(pid: u32) -> f64 {
    proc_mib(pid, "smaps_rollup", "Pss:")
}

/// A "`key` N kB" line of `/proc/<pid>/<file>`, in MiB (NaN if absent).
fn proc_mib(pid: u32, file: &str, key: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Runs `code` with `run_python_code` over `http` and returns the round trip, asserting success.
pub fn timed_run(http: &reqwest::blocking::Client, url: &str, code: &str) -> std::time::Duration {
    let started = std::time::Instant::now();
    let reply = call_tool_with(http, url, "run_python_code", json!({"code": code}));
    let elapsed = started.elapsed();
    assert_eq!(
        reply["result"]["structuredContent"]["success"], true,
        "{reply}"
    );
    elapsed
}

/// The `_meta` a 2026-07-28 request carries instead of an initialize handshake.
pub fn stateless_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "it", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// A 2026-07-28 tools/call request, with a progress token when given.
pub fn tool_call_body(tool: &str, arguments: Value, progress_token: Option<&str>) -> Value {
    let mut meta = stateless_meta();
    if let Some(token) = progress_token {
        meta["progressToken"] = json!(token);
    }
    json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta}
    })
}

/// POSTs a request of the session era; with a session id, the session header too, and the version
/// header from 2025-06-18 on (older clients send none).
pub fn post_legacy(
    http: &reqwest::blocking::Client,
    url: &str,
    session: Option<&str>,
    version: &str,
    body: Value,
) -> reqwest::blocking::Response {
    let mut req = http
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream");
    if let Some(id) = session {
        req = req.header("Mcp-Session-Id", id);
        if version >= "2025-06-18" {
            req = req.header("MCP-Protocol-Version", version);
        }
    }
    req.body(body.to_string()).send().unwrap()
}

/// POSTs a 2026-07-28 request with the headers that era requires.
pub fn send_stateless(
    http: &reqwest::blocking::Client,
    url: &str,
    method: &str,
    name: Option<&str>,
    body: &Value,
) -> reqwest::Result<reqwest::blocking::Response> {
    let mut request = http
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method);
    if let Some(name) = name {
        request = request.header("Mcp-Name", name);
    }
    // What a 2026-07-28 client does for an argument declared with x-mcp-header (every session_id).
    if let Some(session) = body["params"]["arguments"]["session_id"].as_str() {
        request = request.header("Mcp-Param-Session-Id", header_value(session));
    }
    request.body(body.to_string()).send()
}

/// A value as a 2026-07-28 client sends it in an `Mcp-Param-*` header: as is when it is plain
/// visible ASCII, else `=?base64?…?=`.
pub fn header_value(value: &str) -> String {
    use base64::Engine as _;
    let plain = !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        && value.trim() == value
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    if plain {
        value.to_string()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    }
}

/// A client of the session era (2025-11-25 unless told): initialized, with its Mcp-Session-Id.
pub struct LegacyClient {
    http: reqwest::blocking::Client,
    url: String,
    session: String,
    version: &'static str,
    next_id: std::cell::Cell<u64>,
    /// The body of the `initialize` response as it came (JSON or an SSE stream).
    pub initialize_body: String,
}

impl LegacyClient {
    pub const VERSION: &'static str = "2025-11-25";

    pub fn connect(server: &(impl Endpoint + ?Sized)) -> Self {
        Self::connect_at(server, Self::VERSION)
    }

    /// A client that negotiates `version`.
    pub fn connect_at(server: &(impl Endpoint + ?Sized), version: &'static str) -> Self {
        Self::connect_with(server, version, json!({}))
    }

    /// A client that negotiates `version` and declares `capabilities`.
    pub fn connect_with(
        server: &(impl Endpoint + ?Sized),
        version: &'static str,
        capabilities: Value,
    ) -> Self {
        let http = client();
        let init = post_legacy(
            &http,
            server.url(),
            None,
            version,
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": capabilities,
                "clientInfo": {"name": "it", "version": "1"}}}),
        );
        assert_eq!(init.status(), 200);
        let session = init.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        let initialize_body = init.text().unwrap();
        let ack = post_legacy(
            &http,
            server.url(),
            Some(&session),
            version,
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        assert!(ack.status().is_success());
        Self {
            http,
            url: server.url().to_string(),
            session,
            version,
            next_id: std::cell::Cell::new(2),
            initialize_body,
        }
    }

    /// The client's `Mcp-Session-Id`.
    pub fn session_id(&self) -> &str {
        &self.session
    }

    /// One request; its JSON-RPC reply.
    pub fn request(&self, method: &str, params: Value) -> Value {
        message(self.send(method, params))
    }

    /// One request; the HTTP response as it came.
    pub fn send(&self, method: &str, params: Value) -> reqwest::blocking::Response {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        post_legacy(
            &self.http,
            &self.url,
            Some(&self.session),
            self.version,
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
    }

    pub fn call(&self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }
}

/// A 2026-07-28 request of any method; its reply.
pub fn request_stateless(server: &(impl Endpoint + ?Sized), method: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = stateless_meta();
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params});
    let name = params
        .get("uri")
        .and_then(Value::as_str)
        .map(str::to_string);
    message(send_stateless(&client(), server.url(), method, name.as_deref(), &body).unwrap())
}

/// A server of the test's own (a stand-in collector, issuer, proxy or host) on a loopback port,
/// served by a runtime of its own for as long as this lives.
pub struct Background {
    pub port: u16,
    runtime: tokio::runtime::Runtime,
    listener: Option<std::net::TcpListener>,
}

impl Background {
    /// A loopback port, bound, and the one-thread runtime that will serve it.
    pub fn bind() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Self {
            port: listener.local_addr().unwrap().port(),
            runtime,
            listener: Some(listener),
        }
    }

    /// Serves `app` over plain HTTP on the port.
    pub fn serve(mut self, app: axum::Router) -> Self {
        let listener = self.listener.take().expect("served once");
        self.runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
        self
    }
}
