//! Containment, second round: sessions, session resources and the transport cannot be used to pin,
//! brick, exhaust or leak the server. Real engine, real server, real HTTP: cancelled calls leave no
//! zombie, queues and listings are bounded, compiled modules do not accumulate, crashes the code
//! causes are the code's and end only its session, and no whole session id reaches a log line or
//! error data (links, headers, bodies and tokens: containment_transport.rs).

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fixture::{LegacyClient, Server, call_stateless, server_command};

pub(crate) fn structured(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

pub(crate) fn in_session(server: &Server, session: &str, code: &str, timeout_ms: u64) -> Value {
    structured(&call_stateless(
        server,
        json!({"code": code, "session_id": session, "timeout_ms": timeout_ms}),
    ))
    .clone()
}

pub(crate) fn new_session(server: &Server, code: &str) -> String {
    let r = in_session(server, "new", code, 30_000);
    assert_eq!(r["success"], true, "{r}");
    r["session_id"].as_str().unwrap().to_string()
}

/// A server whose stderr is kept (the crate's own lines at debug, as an operator debugging would
/// see them, rmcp's at the default), with `envs`.
fn logged_server(envs: &[(&str, &str)]) -> Server {
    let mut command = server_command();
    command
        .env("RUST_LOG", "info,code_interpreter_mcp=debug,rmcp=warn")
        .env("CODE_INTERPRETER_MCP_LOG_FORMAT", "json")
        .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "0")
        .envs(envs.iter().copied());
    Server::spawn(&mut command, true)
}

/// POSTs a legacy-era request with the client's MCP session and `extra` headers.
pub(crate) fn legacy_post(
    legacy: &LegacyClient,
    url: &str,
    body: Value,
    extra: &[(&str, &str)],
    timeout: Duration,
) -> reqwest::Result<reqwest::blocking::Response> {
    let mut request = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .build()
        .unwrap()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Session-Id", legacy.session_id())
        .header("MCP-Protocol-Version", LegacyClient::VERSION);
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    request.body(body.to_string()).send()
}

/// Starts a legacy-era tools/call with id `id` in the background, then cancels it once it has run
/// for `after`; the cancelled request's reply (if any).
fn cancel_after(
    server: &Server,
    legacy: &LegacyClient,
    id: u64,
    arguments: Value,
    after: Duration,
) -> Option<Value> {
    let call = {
        let url = server.url.clone();
        let session = legacy.session_id().to_string();
        thread::spawn(move || {
            let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "run_python_code", "arguments": arguments}});
            reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap()
                .post(&url)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("Mcp-Session-Id", session)
                .header("MCP-Protocol-Version", LegacyClient::VERSION)
                .body(body.to_string())
                .send()
                .and_then(|r| r.text())
                .ok()
                .and_then(|text| {
                    text.lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .chain(std::iter::once(text.as_str()))
                        .find_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                })
        })
    };
    thread::sleep(after);
    let cancelled = legacy_post(
        legacy,
        &server.url,
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the user gave up"}}),
        &[],
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(cancelled.status().is_success(), "{}", cancelled.status());
    call.join().unwrap()
}

fn log_of(server: &Server) -> String {
    server.log.lock().unwrap().join("\n")
}

// --- 1. Cancelled calls leave no zombie ------------------------------------------------------------

#[test]
fn a_cancelled_session_call_is_interrupted_the_session_lives_and_shutdown_is_prompt() {
    let mut server = logged_server(&[]);
    let legacy = LegacyClient::connect(&server);
    let created = legacy.call(
        "run_python_code",
        json!({"code": "state = 'kept'", "session_id": "new"}),
    );
    let id = structured(&created)["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let started = Instant::now();
    cancel_after(
        &server,
        &legacy,
        100,
        json!({"code": "while True:\n    pass", "session_id": id, "timeout_ms": 120_000}),
        Duration::from_millis(1500),
    );
    // The code was interrupted (not terminated): the state is there, the next call runs now.
    let r = legacy.call(
        "run_python_code",
        json!({"code": "state", "session_id": id}),
    );
    assert_eq!(structured(&r)["result"], "kept", "{r}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Recorded as cancelled, never as a timeout.
    let log = log_of(&server);
    assert!(log.contains("\"outcome\":\"cancelled\""), "{log}");
    assert!(!log.contains("\"outcome\":\"timeout\""), "{log}");
    // Nothing holds the session busy: SIGTERM is answered at once, and the exit is clean.
    let signalled = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(signalled.elapsed() < Duration::from_secs(31));
        thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "no zombie call to wait for: {:?}",
        signalled.elapsed()
    );
}

#[test]
fn a_cancelled_new_session_call_gives_its_slot_back() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_SESSIONS_MAX_SESSIONS", "1")]);
    let legacy = LegacyClient::connect(&server);
    for n in 0..3 {
        cancel_after(
            &server,
            &legacy,
            200 + n,
            json!({"code": "while True:\n    pass", "session_id": "new", "timeout_ms": 120_000}),
            Duration::from_millis(1500),
        );
    }
    // Nobody learnt those sessions' ids: they ended, and the one slot is free.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = in_session(&server, "new", "'mine'", 30_000);
        if r["success"] == true {
            assert_eq!(r["result"], "mine");
            break;
        }
        assert_eq!(r["error"]["type"], "TooManySessions", "{r}");
        assert!(Instant::now() < deadline, "the slot never came back: {r}");
        thread::sleep(Duration::from_millis(100));
    }
}

// --- 2. Bounded queues, listings and caches -------------------------------------------------------

#[test]
fn a_busy_session_queues_at_most_its_capacity_and_refuses_the_rest_as_overload() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_SESSIONS_QUEUE_CAPACITY", "1")]);
    let id = new_session(&server, "import time");
    let calls: Vec<_> = (0..2)
        .map(|n| {
            let url = server.url.clone();
            let id = id.clone();
            thread::spawn(move || {
                structured(&call_stateless(
                    &url,
                    json!({"code": format!("time.sleep(2)\n{n}"), "session_id": id}),
                ))
                .clone()
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(700));
    let started = Instant::now();
    let refused = in_session(&server, &id, "'one too many'", 30_000);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    assert_eq!(refused["error"]["kind"], "overload", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sessions.queue_capacity = 1"),
        "{refused}"
    );
    for call in calls {
        let r = call.join().unwrap();
        assert_eq!(r["success"], true, "{r}");
    }
}

#[test]
fn session_listings_are_capped_and_say_so_and_resources_page() {
    let server = Server::start(&[]);
    let legacy = LegacyClient::connect(&server);
    let create = "import os\nfor n in range(1200):\n    open(f'f{n:04}.txt', 'w').close()\n\
long = '/'.join(['d' * 250] * 20)\nos.makedirs(long)\nopen(long + '/deep.txt', 'w').close()\n";
    let big = legacy.call(
        "run_python_code",
        json!({"code": create, "session_id": "new"}),
    );
    let big_id = structured(&big)["session_id"].as_str().unwrap().to_string();
    let small = legacy.call(
        "run_python_code",
        json!({"code": "for n in range(5):\n    open(f'g{n}.txt', 'w').close()", "session_id": "new"}),
    );
    let small_id = structured(&small)["session_id"]
        .as_str()
        .unwrap()
        .to_string();

    let listed = legacy.call("list_session_files", json!({"session_id": big_id}));
    let listed = structured(&listed);
    assert_eq!(listed["files"].as_array().unwrap().len(), 1000, "capped");
    assert_eq!(listed["truncated"], true);
    assert!(listed["files_left_out"].as_u64().unwrap() >= 1);
    assert!(
        listed["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["path"].as_str().unwrap().len() <= 4096)
    );
    let serialized = listed.to_string().len();
    assert!(serialized < 400_000, "a bounded answer: {serialized} bytes");

    // resources/list pages through the client's sessions, 1000 resources a page.
    let first = legacy.request("resources/list", json!({}));
    let resources = first["result"]["resources"].as_array().unwrap();
    assert_eq!(resources.len(), 1000, "{}", first["result"]["nextCursor"]);
    let cursor = first["result"]["nextCursor"].as_str().expect("a next page");
    let second = legacy.request("resources/list", json!({"cursor": cursor}));
    let rest = second["result"]["resources"].as_array().unwrap();
    let want = if big_id < small_id { 5 } else { 1000 };
    assert!(rest.len() <= want, "{}", rest.len());
    assert!(
        second["result"]
            .get("nextCursor")
            .is_none_or(Value::is_null)
            || rest.len() == 1000
    );
    let bad = legacy.request("resources/list", json!({"cursor": "999999999:0"}));
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

#[test]
fn webassembly_modules_the_code_compiles_do_not_outlive_their_sandbox() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1")]);
    // A valid module whose custom section holds 48 MiB, distinct for each `n`.
    let compile = |n: usize| {
        format!(
            r#"
import js
from pyodide.ffi import to_js
def leb(v):
    out = bytearray()
    while True:
        b = v & 0x7f
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)
body = bytearray(b"\x04blob") + bytearray(48 * 1024 * 1024)
body[5:13] = ({n}).to_bytes(8, "little")
wasm = b"\x00asm\x01\x00\x00\x00" + b"\x00" + leb(len(body)) + bytes(body)
del body
module = js.WebAssembly.Module.new(to_js(wasm))
len(wasm)
"#
        )
    };
    // (The first calls settle the process: the engine's own caches fill.)
    for _ in 0..2 {
        let r = structured(&call_stateless(&server, json!({"code": "print(1)"}))).clone();
        assert_eq!(r["success"], true, "{r}");
    }
    let before = rss_mib(server.child.id());
    for n in 0..5 {
        let r = structured(&call_stateless(
            &server,
            json!({"code": compile(n), "timeout_ms": 60_000}),
        ))
        .clone();
        assert_eq!(r["success"], true, "{r}");
    }
    let r = structured(&call_stateless(&server, json!({"code": "print(1)"}))).clone();
    assert_eq!(r["success"], true, "{r}");
    thread::sleep(Duration::from_millis(500));
    let after = rss_mib(server.child.id());
    assert!(
        after - before < 150.0,
        "five 48 MiB modules compiled by calls stayed in the process: {before:.0} -> {after:.0} MiB"
    );
}

// --- 3. Crashes the code causes are the code's, and end only its session ------------------------

#[test]
fn code_nested_too_deeply_is_a_python_error_before_and_after_the_clock() {
    let server = Server::start(&[]);
    let deep = format!("x = 1\n{}", "x".to_string() + &"+1".repeat(30_000));
    let r = structured(&call_stateless(&server, json!({"code": deep}))).clone();
    assert_eq!(r["success"], false);
    assert_eq!(r["error"]["kind"], "python", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nested too deeply")
            || r["error"]["type"] == "RecursionError",
        "{r}"
    );
    for deep in [
        format!("-{}", "-".repeat(50_000) + "1"),
        format!("x{}", ".real".repeat(40_000)),
    ] {
        let r = structured(&call_stateless(&server, json!({"code": deep}))).clone();
        assert_eq!(r["error"]["kind"], "python", "{r}");
    }
    // In a session: the code's crash ends its session with the structured session error, which
    // says why; other sessions and stateless calls are untouched.
    let other = new_session(&server, "kept = 1");
    let id = new_session(&server, "state = 1");
    let r = in_session(
        &server,
        &id,
        "import sys\nsys.setrecursionlimit(10 ** 7)\ndef f(n):\n    return f(n + 1) + 1\nf(0)",
        30_000,
    );
    assert_eq!(r["error"]["kind"], "python", "{r}");
    if r["error"]["type"] == "InterpreterCrashed" {
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .ends_with("the session has ended")
        );
        let next = in_session(&server, &id, "state", 30_000);
        assert_eq!(next["error"]["kind"], "session", "{next}");
        assert!(
            next["error"]["message"]
                .as_str()
                .unwrap()
                .contains("its Python interpreter failed fatally"),
            "{next}"
        );
    } else {
        let next = in_session(&server, &id, "state", 30_000);
        assert_eq!(next["result"], "1", "{next}");
    }
    let r = in_session(&server, &other, "kept", 30_000);
    assert_eq!(r["result"], "1", "{r}");
}

#[test]
fn odd_file_system_entries_and_raised_texts_do_not_brick_a_session() {
    let server = Server::start(&[]);
    let id = new_session(&server, "state = 1");
    // A MEMFS entry whose name holds a slash: no path reaches it.
    let r = in_session(
        &server,
        &id,
        "import pyodide_js\nFS = pyodide_js.FS\nparent = FS.lookupPath('/workspace').node\nFS.filesystems.MEMFS.createNode(parent, 'a/b', 33188, 0)\nopen('plain.txt', 'w').write('x')\n'made'",
        30_000,
    );
    assert_eq!(r["result"], "made", "{r}");
    let r = in_session(&server, &id, "state", 30_000);
    assert_eq!(r["result"], "1", "{r}");
    let listed = structured(&call_stateless(
        &server,
        json!({"code": "1", "session_id": id}),
    ))
    .clone();
    assert_eq!(listed["success"], true, "{listed}");
    // A message is only a message: it never ends the session.
    let r = in_session(
        &server,
        &id,
        "raise Exception('the session has ended')",
        30_000,
    );
    assert_eq!(r["error"]["kind"], "python");
    let r = in_session(&server, &id, "state", 30_000);
    assert_eq!(r["result"], "1", "{r}");
}

#[test]
fn a_replaced_runner_cannot_stretch_the_set_up_past_timeout_ms() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_WORKERS_SETUP_TIMEOUT_S", "60")]);
    let id = new_session(&server, "state = 1");
    // The runner reads `linecache.cache` before the user's clock starts: make that loop forever.
    let r = in_session(
        &server,
        &id,
        "import _sandbox_runner\nclass Evil:\n    @property\n    def cache(self):\n        while True:\n            pass\n_sandbox_runner.linecache = Evil()\n'armed'",
        30_000,
    );
    assert_eq!(r["result"], "armed", "{r}");
    let started = Instant::now();
    let r = in_session(&server, &id, "state", 2000);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by timeout_ms, not setup_timeout_s: {:?}",
        started.elapsed()
    );
    assert_eq!(r["error"]["kind"], "timeout", "{r}");
    assert_eq!(r["error"]["type"], "SetupTimeout", "{r}");
    let next = in_session(&server, &id, "state", 2000);
    assert_eq!(next["error"]["kind"], "session", "{next}");
}

// --- 4. No whole session id in a log line or error data --------------------------------------------

#[test]
fn no_whole_session_id_reaches_the_log_or_error_data() {
    let server = logged_server(&[]);
    let legacy = LegacyClient::connect(&server);
    let mut ids = Vec::new();
    let mut texts = Vec::new();
    for code in ["open('a.txt', 'w').write('a')", "while True:\n    pass"] {
        let r = legacy.call(
            "run_python_code",
            json!({"code": code, "session_id": "new", "timeout_ms": 500}),
        );
        texts.push(r.to_string());
        ids.push(structured(&r)["session_id"].as_str().unwrap().to_string());
    }
    let id = &ids[0];
    for (method, params) in [
        (
            "resources/read",
            json!({"uri": format!("session://{id}/missing.txt")}),
        ),
        (
            "resources/read",
            json!({"uri": format!("session://{id}/a.txt")}),
        ),
        (
            "resources/read",
            json!({"uri": format!("session://{id}x/a.txt")}),
        ),
        (
            "resources/read",
            json!({"uri": format!("session://{id}/../../etc/passwd")}),
        ),
        ("resources/list", json!({})),
        (
            "tools/call",
            json!({"name": "list_session_files", "arguments": {"session_id": id}}),
        ),
        (
            "tools/call",
            json!({"name": "list_session_files", "arguments": {"session_id": format!("{id}x")}}),
        ),
        (
            "tools/call",
            json!({"name": "run_python_code", "arguments": {"code": "1", "session_id": format!("{id}x")}}),
        ),
        (
            "tools/call",
            json!({"name": "run_python_code", "arguments": {"code": "1", "session_id": 5}}),
        ),
        (
            "tools/call",
            json!({"name": "clear_session", "arguments": {"session_id": ids[1]}}),
        ),
        (
            "tools/call",
            json!({"name": "clear_session", "arguments": {"session_id": ids[1]}}),
        ),
    ] {
        let reply = legacy.request(method, params);
        if reply.get("error").is_some() || reply["result"]["isError"] == true {
            texts.push(reply.to_string());
        }
    }
    // A contradicting header, in the legacy era.
    let mismatch = legacy_post(
        &legacy,
        &server.url,
        json!({"jsonrpc": "2.0", "id": 50, "method": "tools/call",
            "params": {"name": "run_python_code", "arguments": {"code": "1", "session_id": id}}}),
        &[("Mcp-Param-Session-Id", &ids[1])],
        Duration::from_secs(30),
    )
    .unwrap();
    texts.push(mismatch.text().unwrap());
    thread::sleep(Duration::from_millis(300));
    let log = log_of(&server);
    assert!(
        log.contains("session created"),
        "the log was captured: {log}"
    );
    for id in &ids {
        let random = id.rsplit('.').next().unwrap();
        assert!(
            !log.contains(random),
            "a whole session id in the log:\n{log}"
        );
        for text in texts.iter().skip(2) {
            assert!(
                !text.contains(random),
                "a whole session id in error data: {text}"
            );
        }
    }
}
