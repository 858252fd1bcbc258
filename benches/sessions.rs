//! Session benchmark over MCP against the real server: what a stateful session costs and saves.
//!
//! * back-to-back calls (no pause): a stateless `x = 1` (fresh sandbox each time) against `x += 1` in
//!   one live session, p50/p90/p99 and the ratio of medians;
//! * a data-science workload: `import pandas` + a `describe()` stateless every time, against the same
//!   `describe()` in a session that imported pandas once;
//! * memory: the proportional set size a live session adds, idle (after `x = 1`) and after
//!   `import pandas`, measured over four sessions.
//!
//! Run with `cargo bench --bench sessions`; `SESSION_CALLS` (default 30) sets the calls per series.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../tests/it/fixture.rs"]
mod fixture;

const PANDAS_SETUP: &str = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000), 'b': [i * 0.5 for i in range(1000)]})";
const PANDAS_CALL: &str = "df.describe().loc['mean', 'b']";

fn start() -> fixture::Server {
    let mut command = fixture::server_command();
    command
        .env("CODE_INTERPRETER_MCP_SESSIONS_MAX_SESSIONS", "8")
        .env("RUST_LOG", "warn");
    let server = fixture::Server::spawn(&mut command, false);
    server.wait_ready();
    server
}

/// One `run_python_code` call: its structured result and round-trip time.
fn run(
    http: &reqwest::blocking::Client,
    server: &fixture::Server,
    args: Value,
) -> (Value, Duration) {
    let started = Instant::now();
    let reply = fixture::call_tool_with(http, &server.url, "run_python_code", args);
    let elapsed = started.elapsed();
    let result = reply["result"]["structuredContent"].clone();
    assert_eq!(result["success"], true, "{reply}");
    (result, elapsed)
}

fn new_session(http: &reqwest::blocking::Client, server: &fixture::Server, code: &str) -> String {
    let (result, _) = run(http, server, json!({"code": code, "session_id": "new"}));
    result["session_id"].as_str().unwrap().to_string()
}

fn series(
    http: &reqwest::blocking::Client,
    server: &fixture::Server,
    calls: usize,
    args: impl Fn(usize) -> Value,
) -> Vec<Duration> {
    let mut samples: Vec<Duration> = (0..calls).map(|i| run(http, server, args(i)).1).collect();
    samples.sort();
    samples
}

fn pct(samples: &[Duration], q: f64) -> f64 {
    samples[((samples.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1000.0
}

fn show(label: &str, samples: &[Duration]) {
    println!(
        "{label:<44} p50 {:>7.1} ms  p90 {:>7.1} ms  p99 {:>7.1} ms  ({} calls)",
        pct(samples, 0.5),
        pct(samples, 0.9),
        pct(samples, 0.99),
        samples.len()
    );
}

/// The server's PSS after a pause that lets garbage collection settle.
fn settled_pss(server: &fixture::Server) -> f64 {
    std::thread::sleep(Duration::from_millis(1500));
    fixture::pss_mib(server.child.id())
}

fn main() {
    let calls: usize = std::env::var("SESSION_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let server = start();
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();

    // Back-to-back small calls.
    let stateless = series(&http, &server, calls, |_| json!({"code": "x = 1\nx"}));
    let id = new_session(&http, &server, "x = 0");
    let in_session = series(
        &http,
        &server,
        calls,
        |_| json!({"code": "x += 1\nx", "session_id": id}),
    );
    let (last, _) = run(&http, &server, json!({"code": "x", "session_id": id}));
    assert_eq!(last["result"], calls.to_string(), "{last}");

    // pandas: stateless pays the import every call; the session paid it once.
    let stateless_pandas = series(
        &http,
        &server,
        calls.min(10),
        |_| json!({"code": format!("{PANDAS_SETUP}\n{PANDAS_CALL}")}),
    );
    let started = Instant::now();
    let pandas_id = new_session(&http, &server, PANDAS_SETUP);
    let session_first = started.elapsed();
    let session_pandas = series(
        &http,
        &server,
        calls,
        |_| json!({"code": PANDAS_CALL, "session_id": pandas_id}),
    );

    // Memory: four more sessions, idle, then with pandas imported.
    for session in [&id, &pandas_id] {
        fixture::call_tool_with(
            &http,
            &server.url,
            "clear_session",
            json!({"session_id": session}),
        );
    }
    let base = settled_pss(&server);
    let ids: Vec<String> = (0..4)
        .map(|_| new_session(&http, &server, "x = 1"))
        .collect();
    let idle = settled_pss(&server);
    for id in &ids {
        run(
            &http,
            &server,
            json!({"code": PANDAS_SETUP, "session_id": id}),
        );
    }
    let with_pandas = settled_pss(&server);

    println!(
        "session benchmark: back-to-back calls, default pool (2 workers, both prewarmed, 4 ready sandboxes each) unless CODE_INTERPRETER_MCP_* says otherwise"
    );
    show("stateless `x = 1` (fresh sandbox each)", &stateless);
    show("session `x += 1`", &in_session);
    println!(
        "  session vs stateless: p50 {:.1}x faster",
        pct(&stateless, 0.5) / pct(&in_session, 0.5)
    );
    show("stateless pandas import + describe()", &stateless_pandas);
    println!(
        "{:<44} {:>7.1} ms",
        "session: first call (import pandas)",
        session_first.as_secs_f64() * 1000.0
    );
    show(
        "session describe() (pandas already loaded)",
        &session_pandas,
    );
    println!(
        "  session vs stateless: p50 {:.1}x faster",
        pct(&stateless_pandas, 0.5) / pct(&session_pandas, 0.5)
    );
    println!(
        "memory (PSS) per live session: idle {:.0} MiB, with pandas imported {:.0} MiB (process {:.0} → {:.0} → {:.0} MiB)",
        (idle - base) / 4.0,
        (with_pandas - base) / 4.0,
        base,
        idle,
        with_pandas
    );
}
