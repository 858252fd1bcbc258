//! Durable-session benchmark over MCP against the real server (release build): what saving a
//! session to the store and resuming it costs, back to back.
//!
//! * `x = 1`: two sessions and `sessions.max_resident = 1`, called in turn, so every call spills the
//!   other session and resumes its own: the server's save and resume times (from its log), the
//!   calls' round trips, and the stored image size;
//! * pandas (preinstalled) with a 1,000,000-row DataFrame, the same way;
//! * scale: `DURABLE_SESSIONS` (default 1000) sessions each keeping a 1 MB bytes object, with
//!   `max_resident = 8`: every one answers its own value afterwards, and the server's RSS (peak
//!   and after) is printed.
//!
//! Run with `cargo bench --bench durable`; `DURABLE_CALLS` (default 20) sets the calls per series.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../tests/it/fixture.rs"]
mod fixture;

const PANDAS_SETUP: &str = "import pandas as pd\nimport numpy as np\ndf = pd.DataFrame({'a': np.arange(1_000_000), 'b': np.arange(1_000_000) * 0.5})";

fn start(store: &std::path::Path, max_resident: &str, preinstall: &str) -> fixture::Server {
    let mut command = fixture::server_command();
    command
        .env("CODE_INTERPRETER_MCP_SESSIONS_MAX_SESSIONS", "2000")
        .env("CODE_INTERPRETER_MCP_SESSIONS_MAX_RESIDENT", max_resident)
        .env("CODE_INTERPRETER_MCP_SESSIONS_SPILL_AFTER_S", "0")
        .env("CODE_INTERPRETER_MCP_SESSIONS_STORE_URL", store)
        .env("CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES", preinstall)
        .env("CODE_INTERPRETER_MCP_LOG_FORMAT", "json")
        .env(
            "RUST_LOG",
            std::env::var("DURABLE_LOG")
                .unwrap_or_else(|_| "warn,code_interpreter_mcp::sessions=info".into()),
        );
    let server = fixture::Server::spawn(&mut command, true);
    server.wait_ready();
    server
}

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
    assert_eq!(result["session"]["durable"], true, "{result}");
    result["session_id"].as_str().unwrap().to_string()
}

/// The values of `field` in the server's log lines saying `message`, from line `from` on.
fn logged(server: &fixture::Server, from: usize, message: &str, field: &str) -> Vec<f64> {
    server.log.lock().unwrap()[from..]
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["fields"]["message"] == message)
        .filter_map(|event| event["fields"][field].as_f64())
        .collect()
}

fn log_len(server: &fixture::Server) -> usize {
    server.log.lock().unwrap().len()
}

fn pct(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    if samples.is_empty() {
        return f64::NAN;
    }
    samples[((samples.len() as f64 - 1.0) * q).round() as usize]
}

fn show(label: &str, samples: &mut [f64], unit: &str) {
    println!(
        "{label:<40} p50 {:>9.1} {unit}  p90 {:>9.1} {unit}  ({} samples)",
        pct(samples, 0.5),
        pct(samples, 0.9),
        samples.len()
    );
}

/// Two sessions set up by `setup`, called in turn with `call` (each call spills the other and
/// resumes its own); prints the save, resume and round-trip distributions and the image size.
fn alternate(
    http: &reqwest::blocking::Client,
    server: &fixture::Server,
    label: &str,
    setup: &str,
    call: &str,
    calls: usize,
) {
    let ids = [
        new_session(http, server, setup),
        new_session(http, server, setup),
    ];
    let from = log_len(server);
    let mut round_trips = Vec::new();
    for n in 0..calls {
        let id = &ids[n % 2];
        let (_, took) = run(http, server, json!({"code": call, "session_id": id}));
        round_trips.push(took.as_secs_f64() * 1000.0);
    }
    // (The server logs after it answers.)
    std::thread::sleep(Duration::from_millis(300));
    let mut saves = logged(server, from, "session saved and spilled", "ms");
    let mut resumes = logged(server, from, "session resumed", "ms");
    let mut bytes: Vec<f64> = logged(server, from, "session saved and spilled", "bytes")
        .into_iter()
        .map(|b| b / 1e6)
        .collect();
    println!("{label}:");
    show("  save (image made, sealed, stored)", &mut saves, "ms");
    show("  resume (lease, load, open, restore)", &mut resumes, "ms");
    show(
        "  call round trip (a save + a resume + run)",
        &mut round_trips,
        "ms",
    );
    show("  stored image (sealed)", &mut bytes, "MB");
    for id in &ids {
        fixture::call_tool_with(
            http,
            &server.url,
            "clear_session",
            json!({"session_id": id}),
        );
    }
}

/// Resident and peak resident set size of `pid`, MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn main() {
    let calls: usize = std::env::var("DURABLE_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let sessions: usize = std::env::var("DURABLE_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let store = std::env::temp_dir().join(format!("durable-bench-{}", std::process::id()));
    println!(
        "durable-session benchmark: back-to-back calls, release build, store a local directory ({})",
        store.display()
    );

    let server = start(&store, "1", "pandas");
    if let Ok(path) = std::env::var("DURABLE_LOG_FILE") {
        let log = server.log.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let _ = std::fs::write(&path, log.lock().unwrap().join("\n"));
            }
        });
    }
    alternate(&http, &server, "session holding x = 1", "x = 1", "x", calls);
    alternate(
        &http,
        &server,
        "session holding pandas, a 1,000,000-row DataFrame",
        PANDAS_SETUP,
        "int(df['a'].sum())",
        calls,
    );
    drop(server);
    if sessions == 0 {
        let _ = std::fs::remove_dir_all(&store);
        return;
    }

    let server = start(&store, "8", "");
    let started = Instant::now();
    let ids: Vec<String> = (0..sessions)
        .map(|n| {
            new_session(
                &http,
                &server,
                &format!("n = {n}\nblob = bytes(range(256)) * 4096"),
            )
        })
        .collect();
    let created = started.elapsed();
    let (rss_created, _) = rss_mib(server.child.id());
    let started = Instant::now();
    for (n, id) in ids.iter().enumerate() {
        let (result, _) = run(
            &http,
            &server,
            json!({"code": "(n, len(blob))", "session_id": id}),
        );
        assert_eq!(result["result"], format!("({n}, 1048576)"), "{result}");
    }
    let checked = started.elapsed();
    let (rss, peak) = rss_mib(server.child.id());
    println!(
        "{sessions} sessions of 1 MB each, max_resident 8: created in {:.1} s, every one answered its own value (resumed) in {:.1} s; server RSS {:.0} MiB after creating, {:.0} MiB after, peak {:.0} MiB",
        created.as_secs_f64(),
        checked.as_secs_f64(),
        rss_created,
        rss,
        peak
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&store);
}
