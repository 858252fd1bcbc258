//! The mix of calls that must leave nothing behind (issue 44, point 4): plain ones, timeouts (a
//! Python loop, `time.sleep`, a C-level loop, a JavaScript loop), calls the client abandons,
//! sessions created, used and cleared, and tasks; and what a server holds before and after it —
//! file descriptors, threads, memory, store files, live tasks. Shared by the test
//! (`tests/it/no_growth.rs`) and the soak benchmark (`benches/soak.rs`, which includes this file
//! beside `fixture.rs`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fixture::{
    Server, call_stateless, call_tool_stateless, client, rss_mib, send_stateless, tool_call_body,
};

/// What a server holds at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    pub fds: usize,
    pub threads: usize,
    pub rss_mib: f64,
    pub store_files: usize,
    /// Tasks waiting or working, by the metrics.
    pub live_tasks: f64,
}

/// A server taken through the mix: what it held before (after a warm-up round) and after.
pub struct Report {
    pub calls: usize,
    pub tasks: usize,
    pub elapsed: Duration,
    pub before: Held,
    pub after: Held,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (b, a) = (&self.before, &self.after);
        write!(
            f,
            "{} calls in {:.1?} (c=4, {} tasks): fds {} -> {}, threads {} -> {}, RSS {:.0} -> \
             {:.0} MiB, store files {} -> {}, live tasks {} -> {}",
            self.calls,
            self.elapsed,
            self.tasks,
            b.fds,
            a.fds,
            b.threads,
            a.threads,
            b.rss_mib,
            a.rss_mib,
            b.store_files,
            a.store_files,
            b.live_tasks,
            a.live_tasks
        )
    }
}

/// Starts a server for the mix (its store in `store`, tasks expiring after 2 s, metrics on
/// `metrics_port`) with `extra` settings.
pub fn start(store: &Path, metrics_port: u16, extra: &[(&str, &str)]) -> Server {
    let port = metrics_port.to_string();
    let mut env = vec![
        (
            "CODE_INTERPRETER_MCP_SESSIONS_STORE_URL",
            store.to_str().unwrap(),
        ),
        ("CODE_INTERPRETER_MCP_TASKS_TTL_S", "2"),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        ),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT",
            port.as_str(),
        ),
        ("CODE_INTERPRETER_MCP_WORKERS_QUEUE_CAPACITY", "64"),
        // (The mix's tasks are tasks from the start, short as they are.)
        ("CODE_INTERPRETER_MCP_TASKS_IMMEDIATE_RESULT_MS", "0"),
    ];
    env.extend_from_slice(extra);
    Server::start(&env)
}

/// Runs a warm-up round, then `calls` calls of the mix from 4 clients at once.
pub fn run(server: &Server, store: &Path, metrics_port: u16, calls: usize) -> Report {
    let pid = server.child.id();
    let tasks = AtomicUsize::new(0);
    for i in 0..100 {
        one(server, i, &tasks);
    }
    let settle = || {
        thread::sleep(Duration::from_millis(2500));
        held(pid, store, metrics_port)
    };
    let before = settle();
    let started = Instant::now();
    let next = AtomicUsize::new(100);
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= 100 + calls {
                        break;
                    }
                    one(server, i, &tasks);
                }
            });
        }
    });
    let elapsed = started.elapsed();
    Report {
        calls,
        tasks: tasks.load(Ordering::Relaxed),
        elapsed,
        before,
        after: settle(),
    }
}

/// What the server of `pid` holds now.
fn held(pid: u32, store: &Path, metrics_port: u16) -> Held {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(Iterator::count)
        .unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    Held {
        fds,
        threads,
        rss_mib: rss_mib(pid),
        store_files: walk(store).len(),
        live_tasks: live_tasks(metrics_port),
    }
}

/// The files under `dir`.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The timeouts of the mix, each ended by the watchdog.
const TIMEOUTS: [&str; 4] = [
    "while True:\n    pass",
    "import time\ntime.sleep(60)",
    "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')",
    "from pyodide.code import run_js\nrun_js('while (true) {}')",
];

/// One call of the mix, chosen by `i`: every 10th a timeout, every 20th (offset) abandoned by its
/// client, every 20th (offset) a session created, used and cleared, every 50th a task; the rest
/// plain calls (some with a file, some failing).
fn one(server: &Server, i: usize, tasks: &AtomicUsize) {
    match i % 100 {
        n if n % 10 == 0 => {
            let reply = call_stateless(
                server,
                json!({"code": TIMEOUTS[(i / 10) % TIMEOUTS.len()], "timeout_ms": 300}),
            );
            assert_eq!(
                reply["result"]["structuredContent"]["error"]["type"], "TimeoutError",
                "{reply}"
            );
        }
        n if n % 20 == 5 => {
            // Abandoned: the client goes away while the code runs.
            let body = tool_call_body(
                "run_python_code",
                json!({"code": "while True:\n    pass", "timeout_ms": 20000}),
                None,
            );
            let impatient = reqwest::blocking::Client::builder()
                .timeout(Duration::from_millis(300))
                .build()
                .unwrap();
            let sent = send_stateless(
                &impatient,
                &server.url,
                "tools/call",
                Some("run_python_code"),
                &body,
            );
            assert!(sent.is_err(), "the call ran past the client's patience");
        }
        n if n % 20 == 15 => {
            let reply = call_stateless(server, json!({"code": "x = 41", "session_id": "new"}));
            let id = reply["result"]["structuredContent"]["session_id"]
                .as_str()
                .unwrap_or_else(|| panic!("{reply}"))
                .to_string();
            let reply = call_stateless(
                server,
                json!({"code": "open('f.txt', 'w').write('x')\nx + 1", "session_id": id}),
            );
            assert_eq!(
                reply["result"]["structuredContent"]["result"], "42",
                "{reply}"
            );
            let cleared = call_tool_stateless(server, "clear_session", json!({"session_id": id}));
            assert_eq!(
                cleared["result"]["structuredContent"]["success"], true,
                "{cleared}"
            );
        }
        n if n % 50 == 1 => {
            tasks.fetch_add(1, Ordering::Relaxed);
            let reply = task(server, json!({"code": "sum(range(1000))"}));
            assert!(reply.get("result").is_some(), "{reply}");
        }
        n if n % 7 == 3 => {
            let reply = call_stateless(server, json!({"code": "1 / 0"}));
            assert_eq!(
                reply["result"]["structuredContent"]["error"]["type"],
                "ZeroDivisionError"
            );
        }
        _ => {
            let reply = call_stateless(
                server,
                json!({"code": "open('out.txt', 'w').write('y' * 100)\nprint(1)\n6 * 7"}),
            );
            assert_eq!(
                reply["result"]["structuredContent"]["result"], "42",
                "{reply}"
            );
        }
    }
}

/// A call from a client that declares the tasks extension (it becomes a task); the reply.
fn task(server: &Server, arguments: Value) -> Value {
    let mut body = tool_call_body("run_python_code", arguments, None);
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let sent = send_stateless(
        &client(),
        &server.url,
        "tools/call",
        Some("run_python_code"),
        &body,
    );
    crate::fixture::message(sent.unwrap())
}

/// Live tasks by the metrics (waiting and working).
fn live_tasks(port: u16) -> f64 {
    let text = client()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("code_interpreter_mcp_tasks{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}
