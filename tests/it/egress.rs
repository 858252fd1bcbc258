//! Credentialed HTTPS egress (issue 46, second part): `[[network.hosts]]` grants against a loopback
//! HTTPS server that records every request's headers. Python's usual clients reach a granted host
//! unchanged; the injected credential arrives there and nowhere else (not in the sandbox, not across
//! a redirect, not back through a reflecting response); methods, paths, redirects to ungranted or
//! metadata addresses, and names that resolve to private addresses are refused in Rust.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use code_interpreter_mcp::config::HostGrant;
use code_interpreter_mcp::sandbox::{Engine, EngineSettings, ExecRequest, ExecResult};
use serde_json::{Value, json};

use crate::common::engine_settings;
use crate::tls::TlsServer;

/// The credential the grant injects (read from a file, as operators pass secrets).
const SECRET: &str = "sk-egress-marker-5d1e";

/// Every request the server received: (path, headers).
type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

struct Fixture {
    engine: Engine,
    server: TlsServer,
    seen: Seen,
}

fn grant(host: &str, methods: &[&str], paths: &[&str], private: bool) -> HostGrant {
    HostGrant {
        host: host.into(),
        methods: methods.iter().map(|m| m.to_string()).collect(),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        inject_headers: Default::default(),
        max_response_bytes: 1 << 20,
        allow_private_addresses: private,
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = crate::common::temp_dir("egress");
        let seen: Seen = Arc::default();
        let recorded = seen.clone();
        let server = TlsServer::start(&dir, move |port| {
            let record = move |path: &'static str| {
                let recorded = recorded.clone();
                move |headers: HeaderMap| {
                    recorded.lock().unwrap().push((path.to_string(), headers));
                    async {}
                }
            };
            let to = move |target: String| {
                move || {
                    let target = target.clone();
                    async move { (StatusCode::FOUND, [(header::LOCATION, target)]).into_response() }
                }
            };
            let r = record.clone();
            let r2 = record.clone();
            let r3 = record.clone();
            axum::Router::new()
                .route(
                    "/api/headers",
                    axum::routing::get(move |h: HeaderMap| {
                        let done = r("/api/headers")(h.clone());
                        async move {
                            done.await;
                            let names: Vec<String> =
                                h.keys().map(|k| k.as_str().to_string()).collect();
                            axum::Json(json!({ "names": names }))
                        }
                    }),
                )
                .route(
                    "/api/echo-key",
                    axum::routing::get(move |h: HeaderMap| {
                        let done = r2("/api/echo-key")(h.clone());
                        async move {
                            done.await;
                            let key = h
                                .get("x-api-key")
                                .map(|v| v.to_str().unwrap_or("").to_string())
                                .unwrap_or_default();
                            format!("you sent {key}")
                        }
                    }),
                )
                .route(
                    "/api/data.csv",
                    axum::routing::get(move |h: HeaderMap| {
                        let done = r3("/api/data.csv")(h);
                        async move {
                            done.await;
                            "city,sales\nOslo,3\nOslo,4\nLima,10\n"
                        }
                    }),
                )
                .route(
                    "/api/post",
                    axum::routing::post(|body: axum::body::Bytes| async move {
                        format!("got {} bytes", body.len())
                    }),
                )
                .route(
                    "/api/redirect-ip",
                    axum::routing::get(to(format!("https://127.0.0.1:{port}/api/headers"))),
                )
                .route(
                    "/api/redirect-metadata",
                    axum::routing::get(to("https://169.254.169.254/latest/meta-data/".into())),
                )
                .route(
                    "/api/redirect-mapped",
                    axum::routing::get(to("https://[::ffff:169.254.169.254]/latest/".into())),
                )
                .route(
                    "/api/redirect-vm",
                    axum::routing::get(to(format!("https://vm:{port}/api/headers"))),
                )
                .route(
                    "/api/bytes/{n}",
                    axum::routing::get(
                        |axum::extract::Path(n): axum::extract::Path<usize>| async move {
                            (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>()
                        },
                    ),
                )
                .route("/private", axum::routing::get(|| async { "private" }))
        });
        let secret_file = dir.join("api-key");
        std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
        let mut localhost = grant("localhost", &["GET", "POST"], &["/api/"], true);
        localhost
            .inject_headers
            .insert("X-Api-Key".into(), format!("@{}", secret_file.display()));
        let engine = Engine::new(EngineSettings {
            extra_ca_certs: vec![server.ca_pem_path.clone()],
            host_grants: vec![
                localhost,
                grant("127.0.0.1", &["GET"], &["/api/headers"], true),
                // (vm is 127.0.0.1 in this machine's /etc/hosts: refused after resolution.)
                grant("vm", &["GET"], &["/"], false),
                grant("169.254.169.254", &["GET"], &["/"], false),
            ],
            ..engine_settings()
        })
        .expect("engine");
        Fixture {
            engine,
            server,
            seen,
        }
    })
}

fn run(code: &str) -> ExecResult {
    fixture().engine.execute(ExecRequest {
        code: code.into(),
        timeout: Duration::from_secs(120),
        ..Default::default()
    })
}

/// The final expression of `code`, asserted to succeed, as JSON.
fn run_json(code: &str) -> Value {
    let r = run(code);
    assert!(r.error.is_none(), "{code}\n{:?}\n{}", r.error, r.stderr);
    serde_json::from_str(r.result.as_deref().unwrap_or("null"))
        .unwrap_or_else(|e| panic!("{e}: {:?}", r.result))
}

/// The headers the server saw on its last request to `path`.
fn last_seen(path: &str) -> HeaderMap {
    fixture()
        .seen
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(p, _)| p == path)
        .map(|(_, h)| h.clone())
        .unwrap_or_else(|| panic!("no request to {path}"))
}

#[test]
fn pythons_usual_clients_reach_a_granted_host_and_the_credential_arrives_only_there() {
    let base = fixture().server.base();
    let out = run_json(&format!(
        r#"
import json, urllib.request
import pandas as pd
import requests
from pyodide.http import pyfetch
out = {{}}
out["urllib"] = json.loads(urllib.request.urlopen("{base}/api/headers").read())["names"]
out["requests"] = requests.get("{base}/api/headers").json()["names"]
out["pyfetch"] = (await (await pyfetch("{base}/api/headers")).json())["names"]
df = pd.read_csv("{base}/api/data.csv")
out["pandas"] = df.groupby("city")["sales"].sum().to_dict()
out["post"] = requests.post("{base}/api/post", data=b"x" * 1000).text
json.dumps(out)
"#
    ));
    for client in ["urllib", "requests", "pyfetch"] {
        let names = out[client].as_array().unwrap();
        assert!(names.iter().any(|n| n == "x-api-key"), "{client}: {out}");
    }
    assert_eq!(out["pandas"], json!({"Lima": 10, "Oslo": 7}), "{out}");
    assert_eq!(out["post"], "got 1000 bytes", "{out}");
    assert_eq!(last_seen("/api/data.csv")["x-api-key"], SECRET);
    // The sandbox never holds the value: not in what it received, not in its environment.
    let r = run(&format!(
        "import os, requests\nr = requests.get('{base}/api/headers')\nprint(dict(r.headers), r.text, dict(os.environ), r.request.headers)"
    ));
    assert!(r.error.is_none(), "{r:?}");
    assert!(
        !r.stdout.contains(SECRET) && !r.stderr.contains(SECRET),
        "{r:?}"
    );
}

#[test]
fn a_fetched_body_reaches_python_whole_once_and_counts_against_the_budget_while_held() {
    let base = fixture().server.base();
    // pyodide.http's bytes() copies the body straight from Rust (http.py); every other reader takes
    // it through JavaScript as before. Whatever the path, the bytes are the server's, read once.
    let out = run_json(&format!(
        r#"
import hashlib, json, js
from pyodide.http import pyfetch
expected = bytes(i % 251 for i in range(1_000_000))
out = {{}}
r = await pyfetch("{base}/api/bytes/1000000")
data = await r.bytes()
out["bytes"] = [type(data).__name__, len(data), data == expected, r.body_used]
try:
    await r.bytes()
    out["again"] = "read twice"
except Exception as e:
    out["again"] = str(e)
out["empty"] = await (await pyfetch("{base}/api/bytes/0")).bytes()
out["empty"] = [type(out["empty"]).__name__, len(out["empty"])]
out["one"] = list(await (await pyfetch("{base}/api/bytes/1")).bytes())
r = await pyfetch("{base}/api/bytes/300000")
twin = r.clone()
out["clone"] = [(await r.bytes()) == expected[:300000], (await twin.bytes()) == expected[:300000]]
out["memoryview"] = bytes(await (await pyfetch("{base}/api/bytes/5000")).memoryview()) == expected[:5000]
out["arrayBuffer"] = (await (await js.fetch("{base}/api/bytes/7000")).arrayBuffer()).to_bytes() == expected[:7000]
out["text"] = len(await (await pyfetch("{base}/api/bytes/100")).text())
json.dumps(out)
"#
    ));
    assert_eq!(
        out["bytes"],
        json!(["bytes", 1_000_000, true, true]),
        "{out}"
    );
    assert!(
        out["again"].as_str().unwrap().contains("already used"),
        "{out}"
    );
    assert_eq!(out["empty"], json!(["bytes", 0]), "{out}");
    assert_eq!(out["one"], json!([0]), "{out}");
    assert_eq!(out["clone"], json!([true, true]), "{out}");
    assert_eq!(out["memoryview"], json!(true), "{out}");
    assert_eq!(out["arrayBuffer"], json!(true), "{out}");
    assert_eq!(out["text"], json!(100), "{out}");

    // A body Rust holds for the sandbox is charged to its budget until read: responses fetched and
    // never read end the call at the budget, as the ArrayBuffers they were before did.
    let mut big = grant("localhost", &["GET"], &["/api/bytes/"], true);
    big.max_response_bytes = 64 << 20;
    let engine = Engine::new(EngineSettings {
        extra_ca_certs: vec![fixture().server.ca_pem_path.clone()],
        host_grants: vec![big],
        sandbox_memory_limit_mb: 256,
        ..engine_settings()
    })
    .expect("engine");
    let r = engine.execute(ExecRequest {
        code: format!(
            "import js
held = []
for i in range(8):
    held.append(await js.fetch('{base}/api/bytes/{}'))
    print(i, flush=True)",
            60 << 20
        ),
        timeout: Duration::from_secs(120),
        ..Default::default()
    });
    let e = r.error.as_ref().expect("past the budget");
    assert_eq!(e.error_type, "MemoryLimitExceeded", "{r:?}");
    assert!(!r.stdout.contains("7\n"), "{r:?}");
}

#[test]
fn what_the_grant_does_not_cover_is_refused_and_nothing_leaks() {
    let base = fixture().server.base();
    let port = fixture().server.addr.port();
    let out = run_json(&format!(
        r#"
import json
import js
from pyodide.ffi import to_js
async def attempt(url, **options):
    try:
        opts = to_js(options, dict_converter=js.Object.fromEntries)
        r = await js.fetch(url, opts)
        return f"{{r.status}} {{await r.text()}}"
    except Exception as e:
        return "refused: " + str(e).splitlines()[-1]
out = {{}}
out["path"] = await attempt("{base}/private")
out["traversal"] = await attempt("{base}/api/%2e%2e/private")
out["method"] = await attempt("{base}/api/headers", method="DELETE")
out["own_key"] = await attempt("{base}/api/headers", headers={{"X-Api-Key": "mine"}})
out["reflected"] = await attempt("{base}/api/echo-key")
out["metadata"] = await attempt("{base}/api/redirect-metadata")
out["mapped"] = await attempt("{base}/api/redirect-mapped")
out["literal"] = await attempt("https://169.254.169.254/latest/meta-data/")
out["rebinding_name"] = await attempt("https://vm:{port}/api/headers")
out["redirect_to_name"] = await attempt("{base}/api/redirect-vm")
out["cross_host"] = await attempt("{base}/api/redirect-ip")
json.dumps(out)
"#
    ));
    let refused = |key: &str, needle: &str| {
        let text = out[key].as_str().unwrap();
        assert!(
            text.starts_with("refused") && text.to_lowercase().contains(&needle.to_lowercase()),
            "{key}: {text}"
        );
        assert!(!text.contains(SECRET), "{key}: {text}");
    };
    refused("path", "not granted");
    refused("traversal", "not granted");
    refused("method", "not granted");
    refused("own_key", "x-api-key");
    refused("reflected", "contains a credential");
    // (169.254.169.254 is granted here, but not to private addresses.)
    refused("metadata", "not a public address");
    refused("mapped", "not on the allowlist");
    refused("literal", "not a public address");
    refused("rebinding_name", "not a public address");
    refused("redirect_to_name", "not a public address");
    // Followed to another granted host, without the first host's credential.
    let cross = out["cross_host"].as_str().unwrap();
    assert!(cross.starts_with("200"), "{cross}");
    assert!(!cross.contains("x-api-key"), "{cross}");
    assert!(last_seen("/api/headers").get("x-api-key").is_none());
    // The echoing server did receive the key; the sandbox did not get its answer.
    assert_eq!(last_seen("/api/echo-key")["x-api-key"], SECRET);
}
