//! Secrets stay out (issue 46, third part): three marker credentials are planted where operators
//! put them (a stdio upstream's environment, a Streamable HTTP upstream's header, a granted host's
//! injected header), hostile code tries every path it has to them, and then the sandbox's memory
//! (its whole WebAssembly memory, scanned from inside without the code knowing the markers; its V8
//! heap, through a heap snapshot), its session image, its files, its environment, every result,
//! the server's log at debug level and its metrics are searched for them. Each marker is shown to
//! have reached its destination, so the search is not vacuous; a control value the code does make
//! is found by the same searches, so the searches work.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use code_interpreter_mcp::config::{HostGrant, UpstreamTransport};
use code_interpreter_mcp::sandbox::{Engine, EngineSettings, ExecRequest, Flavor};
use code_interpreter_mcp::upstream::Upstreams;
use serde_json::{Value, json};

use crate::common::{engine_settings, temp_dir};
use crate::tls::TlsServer;
use crate::upstream::{
    everything, everything_over_http, free_port, node, processes_with, settings,
};

/// The three markers (20 bytes each, new for every test process) and the files holding them.
struct Markers {
    env: String,
    header: String,
    inject: String,
    dir: std::path::PathBuf,
}

impl Markers {
    fn new(name: &str) -> Self {
        use std::hash::{BuildHasher, RandomState};
        let random = |kind: &str| {
            let n = RandomState::new().hash_one((kind, std::process::id()));
            format!("{kind}-{n:016x}")
        };
        let dir = temp_dir(name);
        let markers = Self {
            env: random("env"),
            header: random("hdr"),
            inject: random("inj"),
            dir,
        };
        for (file, value) in markers.all() {
            std::fs::write(markers.dir.join(file), format!("{value}\n")).unwrap();
        }
        markers
    }

    fn all(&self) -> [(&'static str, &str); 3] {
        [
            ("env", &self.env),
            ("header", &self.header),
            ("inject", &self.inject),
        ]
    }

    /// `@FILE` for the marker of `kind`.
    fn template(&self, kind: &str) -> String {
        format!("@{}", self.dir.join(kind).display())
    }

    /// The markers `haystack` holds (by kind).
    fn found_in(&self, haystack: &[u8]) -> Vec<&'static str> {
        self.all()
            .into_iter()
            .filter(|(_, m)| memchr::memmem::find(haystack, m.as_bytes()).is_some())
            .map(|(kind, _)| kind)
            .collect()
    }
}

/// The value the hostile code computes (never written in it), the searches' positive control.
fn control() -> String {
    format!("ctl-{:016x}", 0x1F2E_3D4Cu64 * 0x5A6B_7C8Du64)
}

/// The rolling hash the code scans its memory with (tests/it/secrets.rs's SCAN, in JavaScript):
/// two polynomial hashes of a 20-byte window, so that the code holds only numbers.
fn hashes(value: &str) -> (u64, u64) {
    const P1: u64 = 2_147_483_647;
    const P2: u64 = 2_147_483_629;
    let (mut h1, mut h2) = (0u64, 0u64);
    for b in value.bytes() {
        h1 = (h1 * 257 + u64::from(b)) % P1;
        h2 = (h2 * 263 + u64::from(b)) % P2;
    }
    (h1, h2)
}

/// JavaScript: where in `mem` (a Uint8Array) a 20-byte window has one of `targets`' hashes.
const SCAN: &str = r#"(mem, targets) => {
  const n = 20, P1 = 2147483647, P2 = 2147483629, B1 = 257, B2 = 263;
  let p1 = 1, p2 = 1;
  for (let i = 0; i < n - 1; i++) { p1 = (p1 * B1) % P1; p2 = (p2 * B2) % P2; }
  const t = Array.from(targets, (x) => [x[0], x[1]]);
  const hits = t.map(() => 0);
  let h1 = 0, h2 = 0;
  for (let i = 0, len = mem.length; i < len; i++) {
    if (i >= n) {
      h1 = (h1 - ((mem[i - n] * p1) % P1) + P1) % P1;
      h2 = (h2 - ((mem[i - n] * p2) % P2) + P2) % P2;
    }
    h1 = (h1 * B1 + mem[i]) % P1;
    h2 = (h2 * B2 + mem[i]) % P2;
    for (let k = 0; k < t.length; k++) {
      if (h1 === t[k][0] && h2 === t[k][1]) hits[k]++;
    }
  }
  return hits;
}"#;

/// Every string of a V8 heap snapshot, whole: each flat string node's text, and each concatenated
/// string (V8's rope, which a string built piece by piece is) joined from its pieces, the ropes
/// that are a piece of a larger one left to it. (A sliced string is part of its parent, which is
/// searched whole.)
fn heap_strings(snapshot: &[u8]) -> Vec<String> {
    let v: Value = serde_json::from_slice(snapshot).expect("a heap snapshot is JSON");
    let meta = &v["snapshot"]["meta"];
    let position = |fields: &Value, name: &str| {
        fields
            .as_array()
            .unwrap()
            .iter()
            .position(|f| f == name)
            .unwrap()
    };
    let (node_fields, edge_fields) = (&meta["node_fields"], &meta["edge_fields"]);
    let (nf, ef) = (
        node_fields.as_array().unwrap().len(),
        edge_fields.as_array().unwrap().len(),
    );
    let (n_type, n_name, n_edges) = (
        position(node_fields, "type"),
        position(node_fields, "name"),
        position(node_fields, "edge_count"),
    );
    let (e_name, e_to) = (
        position(edge_fields, "name_or_index"),
        position(edge_fields, "to_node"),
    );
    let node_types = meta["node_types"][0].as_array().unwrap();
    let kind = |name: &str| node_types.iter().position(|t| t == name).unwrap() as u64;
    let (flat, rope) = (kind("string"), kind("concatenated string"));
    let numbers = |key: &str| -> Vec<u64> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect()
    };
    let (nodes, edges) = (numbers("nodes"), numbers("edges"));
    let strings: Vec<&str> = v["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let count = nodes.len() / nf;
    let mut first_edge = Vec::with_capacity(count);
    let mut at = 0;
    for i in 0..count {
        first_edge.push(at);
        at += nodes[i * nf + n_edges] as usize * ef;
    }
    // A rope's pieces: its edges named "first" and "second".
    let pieces = |i: usize| -> [Option<usize>; 2] {
        let mut out = [None, None];
        for k in 0..nodes[i * nf + n_edges] as usize {
            let edge = first_edge[i] + k * ef;
            let to = edges[edge + e_to] as usize / nf;
            match strings.get(edges[edge + e_name] as usize) {
                Some(&"first") => out[0] = Some(to),
                Some(&"second") => out[1] = Some(to),
                _ => {}
            }
        }
        out
    };
    let is_rope = |i: usize| nodes[i * nf + n_type] == rope;
    let mut inner = vec![false; count];
    for i in (0..count).filter(|&i| is_rope(i)) {
        for piece in pieces(i).into_iter().flatten() {
            inner[piece] = true;
        }
    }
    let mut out = Vec::new();
    for i in 0..count {
        let kind = nodes[i * nf + n_type];
        if kind == flat {
            out.push(strings[nodes[i * nf + n_name] as usize].to_string());
        } else if kind == rope && !inner[i] {
            // Joined depth first, left to right, without recursion (ropes can be deep).
            let mut text = String::new();
            let mut stack = vec![i];
            while let Some(node) = stack.pop() {
                if is_rope(node) {
                    let [first, second] = pieces(node);
                    stack.extend(second);
                    stack.extend(first);
                } else if nodes[node * nf + n_type] == flat {
                    text.push_str(strings[nodes[node * nf + n_name] as usize]);
                }
            }
            out.push(text);
        }
    }
    out
}

/// server-everything over HTTP behind a reverse proxy that records the headers of every request
/// it forwards (to show the upstream's credential arrives there).
struct Proxy {
    url: String,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    _server: crate::fixture::Background,
}

fn recording_proxy(target: String) -> Proxy {
    let server = crate::fixture::Background::bind();
    let port = server.port;
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let recorded = seen.clone();
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (client, target, recorded) = (client.clone(), target.clone(), recorded.clone());
        async move {
            let (parts, body) = request.into_parts();
            recorded.lock().unwrap().push(parts.headers.clone());
            let body = axum::body::to_bytes(body, 16 << 20)
                .await
                .unwrap_or_default();
            let mut headers = parts.headers.clone();
            headers.remove(header::HOST);
            headers.remove(header::CONTENT_LENGTH);
            match client
                .request(parts.method, &target)
                .headers(headers)
                .body(body)
                .send()
                .await
            {
                Ok(reply) => {
                    let mut response = axum::http::Response::builder().status(reply.status());
                    for (name, value) in reply.headers() {
                        if name != header::TRANSFER_ENCODING && name != header::CONTENT_LENGTH {
                            response = response.header(name, value);
                        }
                    }
                    response
                        .body(axum::body::Body::from_stream(reply.bytes_stream()))
                        .unwrap()
                }
                Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
            }
        }
    });
    Proxy {
        url: format!("http://127.0.0.1:{port}/mcp"),
        seen,
        _server: server.serve(app),
    }
}

/// A granted HTTPS host: `/api/headers` answers the names of the headers it got (and records the
/// values), `/api/echo-key` answers the injected key back.
fn granted_host(dir: &std::path::Path) -> (TlsServer, Arc<Mutex<Vec<HeaderMap>>>) {
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let recorded = seen.clone();
    let server = TlsServer::start(dir, move |_port| {
        let r = recorded.clone();
        axum::Router::new()
            .route(
                "/api/headers",
                axum::routing::get(move |h: HeaderMap| {
                    r.lock().unwrap().push(h.clone());
                    let names: Vec<String> = h.keys().map(|k| k.as_str().to_string()).collect();
                    async move { axum::Json(json!({ "names": names })) }
                }),
            )
            .route(
                "/api/echo-key",
                axum::routing::get(|h: HeaderMap| async move {
                    let key = h
                        .get("x-api-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    format!("you sent {key}")
                }),
            )
    });
    (server, seen)
}

/// What hostile code does with every path it has to the credentials: the environment, every file,
/// every string reachable from JavaScript's globals, the upstreams (a tool that answers its
/// environment, the catalog, errors), the granted host (an echo of the key, the request's own
/// headers), and last a scan of its whole WebAssembly memory for the markers' hashes. Ends with a
/// JSON object of what it saw.
fn hostile_code(base: &str, targets: &[(u64, u64)]) -> String {
    let targets = serde_json::to_string(
        &targets
            .iter()
            .map(|(a, b)| vec![*a, *b])
            .collect::<Vec<_>>(),
    )
    .unwrap();
    format!(
        r#"
import json, os, sys
import js
import upstream
import _sandbox_upstream
from upstream import local, web
from pyodide.ffi import to_js

texts = []
def keep(label, value):
    texts.append(f"{{label}}: {{value}}")

keep("environ", dict(os.environ))
# Every file outside the standard library (which comes from the snapshot).
files = []
for root, dirs, names in os.walk("/"):
    if root in ("/proc", "/dev", "/sys") or root.startswith("/lib/python3"):
        dirs[:] = []
        continue
    for name in names:
        try:
            with open(os.path.join(root, name), "rb") as f:
                files.append(f.read(1 << 20))
        except Exception as e:
            keep("unreadable " + name, e)
# Every string reachable from globalThis (own keys, values, to depth 8).
walk = js.eval('''(() => {{
  const seen = new Set(); const out = []; const stack = [[globalThis, 0]];
  while (stack.length && seen.size < 200000) {{
    const [o, d] = stack.pop();
    if (o === null || (typeof o !== "object" && typeof o !== "function") || seen.has(o)) continue;
    if (ArrayBuffer.isView(o) || o instanceof ArrayBuffer) continue;
    seen.add(o);
    let keys; try {{ keys = Reflect.ownKeys(o); }} catch (e) {{ continue; }}
    for (const k of keys) {{
      out.push(String(k));
      let v; try {{ v = o[k]; }} catch (e) {{ continue; }}
      if (typeof v === "string") out.push(v.slice(0, 100000));
      else if (d < 8) stack.push([v, d + 1]);
    }}
  }}
  return out.join("\\n");
}})''')()
js_strings = str(walk)
# The upstreams: a tool that answers its own environment, the catalog, an error, a plain call.
for label, attempt in [
    ("get-env", lambda: local["get-env"]()),
    ("echo", lambda: web.echo(message="hello")),
    ("bad args", lambda: web.echo(message=7)),
]:
    try:
        keep(label, await attempt())
    except Exception as e:
        keep(label, f"{{type(e).__name__}}: {{e}}")
keep("catalog", str(_sandbox_upstream._js("catalog")))
keep("help", local.echo.__doc__)
#SAVE
# The granted host: the key echoed back, the request's own headers, a header of our own.
async def attempt(url, **options):
    try:
        opts = to_js(options, dict_converter=js.Object.fromEntries)
        r = await js.fetch(url, opts)
        headers = js.JSON.stringify(getattr(js.Array, "from")(r.headers.entries()))
        return f"{{r.status}} {{headers}} {{await r.text()}}"
    except Exception as e:
        return "refused: " + str(e)
keep("echo-key", await attempt("{base}/api/echo-key"))
keep("headers", await attempt("{base}/api/headers"))
keep("own header", await attempt("{base}/api/headers", headers={{"X-Api-Key": "mine"}}))
import urllib.request
try:
    keep("urllib", urllib.request.urlopen("{base}/api/echo-key").read())
except Exception as e:
    keep("urllib", e)
# The control: a value the code makes (and hands to JavaScript) without writing it down.
control = "ctl-" + format(0x1F2E3D4C * 0x5A6B7C8D, "016x")
js.globalThis.secretsTestControl = control
# Last, the whole WebAssembly memory, with everything above still alive in it.
import pyodide_js
scan = js.eval('''{SCAN}''')
hits = scan(pyodide_js._module.HEAPU8, to_js({targets})).to_py()
json.dumps({{"texts": texts, "hits": hits, "files": len(files), "js_strings": len(js_strings),
            "memory": pyodide_js._module.HEAPU8.length}})
"#
    )
}

/// The engine side: the sandbox's memory, heap, files, environment, image and results.
#[test]
fn no_credential_reaches_the_sandbox_its_memory_its_image_or_its_results() {
    let markers = Markers::new("secrets-engine");
    let (host, host_seen) = granted_host(&markers.dir);
    let proxy = recording_proxy(everything_over_http());
    let mut servers = BTreeMap::new();
    servers.insert(
        "local".to_string(),
        settings(UpstreamTransport::Stdio {
            command: node(),
            args: vec![everything(), "stdio".into()],
            env: BTreeMap::from([("UPSTREAM_MARKER".to_string(), markers.template("env"))]),
        }),
    );
    servers.insert(
        "web".to_string(),
        settings(UpstreamTransport::Http {
            url: proxy.url.clone(),
            headers: BTreeMap::from([("X-Upstream-Key".to_string(), markers.template("header"))]),
        }),
    );
    let upstreams = Upstreams::start(&servers, &[]).expect("upstreams start");
    let engine = Engine::with_upstreams(
        EngineSettings {
            extra_ca_certs: vec![host.ca_pem_path.clone()],
            host_grants: vec![HostGrant {
                host: "localhost".into(),
                methods: vec!["GET".into()],
                paths: vec!["/api/".into()],
                inject_headers: BTreeMap::from([(
                    "X-Api-Key".to_string(),
                    markers.template("inject"),
                )]),
                max_response_bytes: 1 << 20,
                allow_private_addresses: true,
            }],
            ..engine_settings()
        },
        upstreams,
    )
    .expect("engine starts");
    let mut targets: Vec<(u64, u64)> = markers.all().iter().map(|(_, m)| hashes(m)).collect();
    targets.push(hashes(&control()));

    // The paths that read and call come first, and the session is saved (the image holds what they
    // read); then the granted host's attempts (a Response they leave reachable keeps the session
    // from being saved: to be found), the control, and the memory scan last.
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    let code = hostile_code(&host.base(), &targets);
    let (before, after) = code.split_once("#SAVE\n").unwrap();
    crate::common::run_in(&mut session, before);
    let image = session.save_image().expect("the session saves");
    let result = session.run(
        ExecRequest {
            code: after.to_string(),
            timeout: Duration::from_secs(120),
            ..Default::default()
        },
        None,
    );
    assert!(
        result.error.is_none(),
        "{:?}\n{}",
        result.error,
        result.stderr
    );
    let whole = serde_json::to_string(&result).unwrap();
    assert_eq!(markers.found_in(whole.as_bytes()), [""; 0], "in the result");
    let out: Value = serde_json::from_str(result.result.as_deref().unwrap()).unwrap();
    let texts = out["texts"].to_string();
    // Each path was tried and answered.
    for expected in [
        "get-env: UpstreamError",
        "withheld",
        "echo: Echo: hello",
        "bad args: TypeError",
        "echo-key: refused",
        "x-api-key",
        "available",
    ] {
        assert!(texts.contains(expected), "{expected}: {texts}");
    }
    assert!(out["files"].as_u64().unwrap() > 0, "{out}");
    assert!(out["js_strings"].as_u64().unwrap() > 10_000, "{out}");
    // The memory scan: no marker, and the control found (the scan works).
    assert_eq!(out["hits"], json!([0, 0, 0, out["hits"][3]]), "{out}");
    assert!(out["hits"][3].as_u64().unwrap() >= 1, "{out}");

    // The V8 heap: every string in it, ropes joined.
    let heap = session.heap_snapshot();
    assert!(heap.len() > 1 << 20, "{} bytes", heap.len());
    assert_eq!(markers.found_in(&heap), [""; 0], "in the V8 heap snapshot");
    let strings = heap_strings(&heap);
    assert!(strings.len() > 10_000, "{} strings", strings.len());
    for text in &strings {
        assert_eq!(markers.found_in(text.as_bytes()), [""; 0], "in the V8 heap");
    }
    assert!(
        strings.iter().any(|t| t.contains(&control())),
        "the heap holds the control (a rope, as Pyodide builds it)"
    );
    // The session image (saved half way): every page of memory the session changed, and its files.
    assert_eq!(markers.found_in(&image.memory), [""; 0], "in the image");
    assert!(
        memchr::memmem::find(&image.memory, b"environ: {'USER'").is_some(),
        "the image holds what the code read"
    );
    for (path, data) in &image.files {
        assert_eq!(markers.found_in(data), [""; 0], "in {path}");
    }

    // Each credential did reach its destination.
    let sent = |seen: &Arc<Mutex<Vec<HeaderMap>>>, name: &str| -> Vec<String> {
        seen.lock()
            .unwrap()
            .iter()
            .filter_map(|h| h.get(name).and_then(|v| v.to_str().ok()).map(String::from))
            .collect()
    };
    assert!(
        sent(&host_seen, "x-api-key").contains(&markers.inject),
        "the granted host got its key"
    );
    assert!(
        !sent(&host_seen, "x-api-key").contains(&"mine".to_string()),
        "the sandbox's own X-Api-Key was refused"
    );
    assert!(
        sent(&proxy.seen, "x-upstream-key")
            .iter()
            .all(|v| v == &markers.header)
            && !sent(&proxy.seen, "x-upstream-key").is_empty(),
        "the HTTP upstream got its header on every request"
    );
    assert!(
        !processes_with(&format!("UPSTREAM_MARKER={}", markers.env)).is_empty(),
        "the stdio upstream has its variable"
    );
}

/// The server side, as operators run it: credentials from environment variables and files, the
/// log at debug level, the metrics, every MCP reply.
#[test]
fn no_credential_reaches_the_log_the_metrics_or_an_mcp_reply() {
    use crate::fixture::{Server, call_stateless, call_tool_stateless, server_command};
    let markers = Markers::new("secrets-server");
    let (host, host_seen) = granted_host(&markers.dir);
    let proxy = recording_proxy(everything_over_http());
    let config = markers.dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"extra_ca_certs = [{ca:?}]

[upstream.local]
command = {node:?}
args = [{everything:?}, "stdio"]
env = {{ UPSTREAM_MARKER = "${{CIM_TEST_ENV_MARKER}}" }}

[upstream.web]
url = {url:?}
headers = {{ X-Upstream-Key = "Key ${{CIM_TEST_HEADER_MARKER}}" }}

[[network.hosts]]
host = "localhost"
paths = ["/api/"]
inject_headers = {{ X-Api-Key = {inject:?} }}
allow_private_addresses = true
"#,
            ca = host.ca_pem_path,
            node = node(),
            everything = everything(),
            url = proxy.url,
            inject = markers.template("inject"),
        ),
    )
    .unwrap();
    let port = free_port().to_string();
    let mut command = server_command();
    command
        .args(["--config", config.to_str().unwrap()])
        .env("RUST_LOG", "debug")
        .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "0")
        .env(
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        )
        .env("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port)
        .env("CIM_TEST_ENV_MARKER", &markers.env)
        .env("CIM_TEST_HEADER_MARKER", &markers.header);
    let server = Server::spawn(&mut command, true);
    let base = host.base();
    let mut replies = Vec::new();
    for code in [
        "from upstream import local\nawait local['get-env']()".to_string(),
        "from upstream import web\nawait web['get-env']()".to_string(),
        "from upstream import web\nawait web.echo(message='over mcp')".to_string(),
        "import os\ndict(os.environ)".to_string(),
        format!("import js\nr = await js.fetch('{base}/api/echo-key')\nawait r.text()"),
        format!("import js\nr = await js.fetch('{base}/api/headers')\nawait r.text()"),
        "import _sandbox_upstream as g\nawait g._js('call', 'web', 'nope', '{}', 1)".to_string(),
    ] {
        replies.push(call_stateless(&server, json!({ "code": code })));
    }
    replies.push(call_tool_stateless(
        &server,
        "list_upstream_tools",
        json!({}),
    ));
    let replies = serde_json::to_string(&replies).unwrap();
    assert!(replies.contains("Echo: over mcp"), "{replies}");
    assert!(replies.contains("withheld"), "{replies}");
    assert_eq!(markers.found_in(replies.as_bytes()), [""; 0], "in a reply");
    let (metrics, _) = crate::metrics::scrape(port.parse().unwrap());
    assert!(metrics.contains("code_interpreter_mcp_upstream_calls_total"));
    assert_eq!(
        markers.found_in(metrics.as_bytes()),
        [""; 0],
        "in the metrics"
    );
    crate::pool::sigterm(&server);
    let mut server = server;
    let _ = server.child.wait();
    let log = server.log.lock().unwrap().join("\n");
    assert!(log.contains("DEBUG"), "the log is at debug level");
    assert!(log.contains("upstream call"), "{log}");
    assert_eq!(markers.found_in(log.as_bytes()), [""; 0], "in the log");
    // Each credential did reach its destination.
    assert!(host_seen.lock().unwrap().iter().any(|h| {
        h.get("x-api-key")
            .is_some_and(|v| v.as_bytes() == markers.inject.as_bytes())
    }));
    let header = format!("Key {}", markers.header);
    assert!(proxy.seen.lock().unwrap().iter().any(|h| {
        h.get("x-upstream-key")
            .is_some_and(|v| v.as_bytes() == header.as_bytes())
    }));
}
