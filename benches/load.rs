//! Load benchmark over MCP against the real server, in both boot modes: start-to-ready time, resident memory (of the process, and the
//! proportional set size per idle prewarmed worker), `print(1)` round trips at concurrency 1
//! and 8 (p50/p90/p99), sustained calls per second, every call in a fresh sandbox, and the
//! distribution of sandbox creation times inside the server during the run (from its debug log).
//! Run with `cargo bench --bench load`; `LOAD_CALLS` (default 24) sets the number of calls per
//! concurrency level.

use std::time::{Duration, Instant};

use serde_json::json;

#[path = "../tests/it/fixture.rs"]
mod fixture;

/// A ready server, how long it took from start to ready, and its log.
struct Started {
    server: fixture::Server,
    start_to_ready: Duration,
}

fn start(mode: &str) -> Started {
    start_with(mode, &[])
}

/// Starts the server with `env` on top of the benchmark's settings and waits until it is ready.
fn start_with(boot: &str, env: &[(&str, &str)]) -> Started {
    let started = Instant::now();
    let mut command = fixture::server_command();
    command
        .env("CODE_INTERPRETER_MCP_WORKERS_BOOT", boot)
        .env("CODE_INTERPRETER_MCP_PACKAGE_BASE_URL", package_base_url())
        .env("CODE_INTERPRETER_MCP_LOG_FORMAT", "json")
        // The pool logs every sandbox creation at debug level.
        .env("RUST_LOG", "warn,code_interpreter_mcp::pool=debug")
        .envs(env.iter().copied());
    let server = fixture::Server::spawn(&mut command, true);
    server.wait_ready();
    Started {
        server,
        start_to_ready: started.elapsed(),
    }
}

/// Memory per idle prewarmed worker: the proportional set size (shared pages split between their
/// users) of a ready server with four prewarmed workers minus that of one with a single worker,
/// divided by three.
fn pss_per_worker(mode: &str) -> f64 {
    let pss_with = |workers: &str| {
        let server = start_with(
            mode,
            &[
                ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", workers),
                ("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", workers),
            ],
        );
        // Let the prewarmed workers' post-boot garbage collection finish.
        std::thread::sleep(Duration::from_millis(500));
        fixture::pss_mib(server.server.child.id())
    };
    let one = pss_with("1");
    let four = pss_with("4");
    (four - one) / 3.0
}

/// `CODE_INTERPRETER_MCP_PACKAGE_BASE_URL` if set, else the team's local mirror next to the checkout
/// (micropip comes from there when the package layer is first built).
fn package_base_url() -> String {
    std::env::var("CODE_INTERPRETER_MCP_PACKAGE_BASE_URL").unwrap_or_else(|_| {
        let mirror = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/pyodide-packages");
        if std::path::Path::new(mirror).is_dir() {
            mirror.to_string()
        } else {
            String::new()
        }
    })
}

fn call(http: &reqwest::blocking::Client, url: &str) -> Duration {
    let started = Instant::now();
    let reply = fixture::call_tool_with(http, url, "run_python_code", json!({"code": "print(1)"}));
    let elapsed = started.elapsed();
    assert_eq!(
        reply["result"]["structuredContent"]["stdout"], "1\n",
        "{reply}"
    );
    elapsed
}

/// Round trips of `calls` calls spread over `concurrency` clients, and the wall time for all.
fn drive(url: &str, calls: usize, concurrency: usize) -> (Vec<Duration>, Duration) {
    let started = Instant::now();
    let per_client = calls.div_ceil(concurrency);
    let handles: Vec<_> = (0..concurrency)
        .map(|_| {
            let url = url.to_string();
            std::thread::spawn(move || {
                let http = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(300))
                    .build()
                    .unwrap();
                (0..per_client)
                    .map(|_| call(&http, &url))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut samples: Vec<Duration> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    samples.sort();
    (samples, started.elapsed())
}

fn pct(samples: &[Duration], q: f64) -> f64 {
    samples[((samples.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1000.0
}

struct Row {
    mode: &'static str,
    start_to_ready: Duration,
    rss_ready: f64,
    rss_loaded: f64,
    pss_per_worker: f64,
    boots: Vec<f64>,
    c1: Vec<Duration>,
    c8: Vec<Duration>,
    c8_rate: f64,
}

fn main() {
    let calls: usize = std::env::var("LOAD_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    // The first start of a checkout builds the package layer; start-to-ready is measured warm.
    drop(start("snapshot"));
    let mut rows = Vec::new();
    // LOAD_MODES=snapshot skips the (slow) full-boot mode; LOAD_PAUSE_MS sets the pause between
    // sequential calls in snapshot mode (default 400 ms: time for the worker to prepare the next
    // sandbox).
    let chosen = std::env::var("LOAD_MODES").unwrap_or_else(|_| "full,snapshot".into());
    let modes: Vec<&'static str> = ["full", "snapshot"]
        .into_iter()
        .filter(|m| chosen.split(',').any(|c| c.trim() == *m))
        .collect();
    let pause: u64 = std::env::var("LOAD_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    for mode in modes {
        let started = start(mode);
        let server = &started.server;
        let server_start_to_ready = started.start_to_ready;
        let rss_ready = fixture::rss_mib(server.child.id());
        // Sequential calls, with a pause so a prewarmed worker can prepare the next sandbox.
        let mut c1 = Vec::new();
        let http = reqwest::blocking::Client::new();
        for _ in 0..calls {
            c1.push(call(&http, &server.url));
            std::thread::sleep(Duration::from_millis(if mode == "full" {
                3000
            } else {
                pause
            }));
        }
        c1.sort();
        let (c8, wall) = drive(&server.url, calls, 8);
        let rss_loaded = fixture::rss_mib(server.child.id());
        let boots = started.server.logged_boot_ms();
        drop(started);
        rows.push(Row {
            mode,
            start_to_ready: server_start_to_ready,
            rss_ready,
            rss_loaded,
            pss_per_worker: pss_per_worker(mode),
            boots,
            c8_rate: c8.len() as f64 / wall.as_secs_f64(),
            c1,
            c8,
        });
    }
    println!(
        "load benchmark: {calls} print(1) calls per level, default pool (2 workers, both prewarmed, 4 ready sandboxes each) unless CODE_INTERPRETER_MCP_* says otherwise"
    );
    println!(
        "{:<9} {:>14} {:>11} {:>12} {:>12} {:>24} {:>24} {:>10}",
        "boot",
        "start→ready ms",
        "RSS idle",
        "RSS loaded",
        "PSS/worker",
        "c=1 p50/p90/p99 ms",
        "c=8 p50/p90/p99 ms",
        "c=8 call/s"
    );
    for r in &rows {
        println!(
            "{:<9} {:>14.0} {:>8.0} MiB {:>8.0} MiB {:>8.0} MiB {:>24} {:>24} {:>10.2}",
            r.mode,
            r.start_to_ready.as_secs_f64() * 1000.0,
            r.rss_ready,
            r.rss_loaded,
            r.pss_per_worker,
            format!(
                "{:.0}/{:.0}/{:.0}",
                pct(&r.c1, 0.5),
                pct(&r.c1, 0.9),
                pct(&r.c1, 0.99)
            ),
            format!(
                "{:.0}/{:.0}/{:.0}",
                pct(&r.c8, 0.5),
                pct(&r.c8, 0.9),
                pct(&r.c8, 0.99)
            ),
            r.c8_rate,
        );
    }
    println!("sandbox creation inside the server during the run (all phases):");
    for r in &rows {
        let q = |p: f64| r.boots[((r.boots.len() as f64 - 1.0) * p).round() as usize];
        if r.boots.is_empty() {
            println!("{:<9} no creation logged", r.mode);
        } else {
            println!(
                "{:<9} {} sandboxes: min {:.0} ms, p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                r.mode,
                r.boots.len(),
                r.boots[0],
                q(0.5),
                q(0.9),
                q(0.99),
                r.boots[r.boots.len() - 1]
            );
        }
    }
    let (Some(full), Some(snap)) = (
        rows.iter().find(|r| r.mode == "full"),
        rows.iter().find(|r| r.mode == "snapshot"),
    ) else {
        return;
    };
    let median = |v: &[f64]| v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "snapshot vs full: creation p50 {:.1}x faster, c=1 p50 {:.1}x faster, c=8 throughput {:.1}x higher, {:.1}x less memory per worker",
        median(&full.boots) / median(&snap.boots),
        pct(&full.c1, 0.5) / pct(&snap.c1, 0.5),
        snap.c8_rate / full.c8_rate,
        full.pss_per_worker / snap.pss_per_worker
    );
}
