//! Data-science calls in fresh sandboxes, over MCP against the real server (default pool: 2
//! workers, both prewarmed with 4 ready sandboxes each), every call a new sandbox, back to back at concurrency 1 (no pause between
//! calls, so a caller meets the pool as it is right after the previous call), in three set-ups:
//! - `empty`: the package layer holds micropip only (packages load from their imports);
//! - `preinstall`: `preinstall_packages = ["pandas", "matplotlib"]`;
//! - `preimport`: the same plus `preimport_modules = ["pandas", "matplotlib.pyplot"]`.
//!
//! For each: p50/p90 of `print(1)`, `import numpy`, a pandas sum, a matplotlib PNG; `print(1)` and
//! the pandas sum at concurrency 8 (calls/s); sandbox creation inside the server (ms, from its debug
//! log) and the server's CPU time per `print(1)` call at concurrency 8 (creation dominates it).
//! Ratios against the `preinstall` set-up (the baseline) close the report.
//!
//! With `PACKAGES_NATIVE` set to a CPython interpreter that has pandas, numpy and matplotlib (a
//! virtualenv's `bin/python`), a `native` row runs the same workloads the same way, each call a
//! fresh native process (`python -c CODE`, no sandbox, no MCP), and the report closes with each
//! set-up against it: the fresh-native-process column, measured side by side.
//!
//! The server's RSS is read when it is idle (2 s after ready) and, with `PACKAGES_MIXED=N`, after N
//! more calls back to back cycling through the four workloads (then 2 s idle).
//!
//! `cargo bench --bench packages`; `PACKAGES_CALLS` (default 12) calls per cell, `PACKAGES_SETUPS`
//! (comma-separated names) to run only some set-ups.

use std::time::{Duration, Instant};

#[path = "../tests/it/fixture.rs"]
mod fixture;

const WORKLOADS: [(&str, &str); 4] = [
    ("print(1)", "print(1)"),
    ("numpy", "import numpy as np\nnp.arange(3).sum()"),
    (
        "pandas",
        "import pandas as pd\npd.DataFrame({'a': [1, 2]}).a.sum()",
    ),
    (
        "matplotlib",
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3], [2, 3, 1])\nax.set_title('line')\nfig.savefig('plot.png')",
    ),
];

struct Setup {
    name: &'static str,
    env: Vec<(&'static str, String)>,
}

fn setups() -> Vec<Setup> {
    let cache = |name: &str| {
        format!(
            "{}/bench-packages-{name}",
            env!("CARGO_TARGET_TMPDIR").trim_end_matches('/')
        )
    };
    let preinstall = (
        "CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES",
        "pandas matplotlib".to_string(),
    );
    let all = vec![
        Setup {
            name: "empty",
            env: vec![("CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR", cache("empty"))],
        },
        Setup {
            name: "preinstall",
            env: vec![
                (
                    "CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR",
                    cache("preinstall"),
                ),
                preinstall.clone(),
                // The baseline: preinstalled, not pre-imported.
                (
                    "CODE_INTERPRETER_MCP_PREIMPORT_PREINSTALLED",
                    "false".to_string(),
                ),
            ],
        },
        Setup {
            name: "preimport",
            env: vec![
                ("CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR", cache("preimport")),
                preinstall,
                (
                    "CODE_INTERPRETER_MCP_PREIMPORT_MODULES",
                    "pandas,matplotlib.pyplot".to_string(),
                ),
            ],
        },
    ];
    match std::env::var("PACKAGES_SETUPS") {
        Ok(chosen) => all
            .into_iter()
            .filter(|s| chosen.split(',').any(|c| c.trim() == s.name))
            .collect(),
        Err(_) => all,
    }
}

fn start(setup: &Setup) -> (fixture::Server, Duration) {
    let started = Instant::now();
    let mut command = fixture::server_command();
    command
        .env("CODE_INTERPRETER_MCP_LOG_FORMAT", "json")
        .env("RUST_LOG", "warn,code_interpreter_mcp::pool=debug")
        .envs(setup.env.iter().map(|(k, v)| (*k, v.as_str())));
    let server = fixture::Server::spawn(&mut command, true);
    server.wait_ready();
    (server, started.elapsed())
}

/// The process's user + system CPU time.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) : utime is the 14th field overall.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn pct(samples: &[Duration], q: f64) -> f64 {
    samples[((samples.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1000.0
}

struct Row {
    name: &'static str,
    start_to_ready: Duration,
    c1: Vec<Vec<Duration>>,
    c8_rate: f64,
    /// The pandas sum at concurrency 8, calls/s.
    c8_pandas_rate: f64,
    cpu_per_call_ms: f64,
    boots: Vec<f64>,
    /// The server's RSS idle after start, and after the mixed calls (MiB; NaN: not measured).
    rss_idle: f64,
    rss_after_mixed: f64,
}

/// `calls` runs of `call` spread over 8 threads (each with its HTTP client): calls per second.
fn rate_at_8(
    calls: usize,
    call: impl Fn(&reqwest::blocking::Client) + Send + Sync + 'static,
) -> f64 {
    let call = std::sync::Arc::new(call);
    let started = Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let call = call.clone();
            std::thread::spawn(move || {
                let http = reqwest::blocking::Client::new();
                for _ in 0..calls / 8 {
                    call(&http);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    (calls / 8 * 8) as f64 / started.elapsed().as_secs_f64()
}

/// One call as a fresh native process: `python -c code` in a scratch directory, matplotlib
/// drawing off-screen; its wall time.
fn native_run(python: &str, dir: &std::path::Path, code: &str) -> Duration {
    let started = Instant::now();
    let status = std::process::Command::new(python)
        .args(["-c", code])
        .current_dir(dir)
        .env("MPLBACKEND", "Agg")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("PACKAGES_NATIVE runs");
    assert!(status.success(), "{python} -c {code:?}: {status}");
    started.elapsed()
}

/// The `native` row (see the module doc), or `None` without `PACKAGES_NATIVE`.
fn native_row(calls: usize) -> Option<Row> {
    let python = std::env::var("PACKAGES_NATIVE").ok()?;
    let dir = std::env::temp_dir().join(format!("bench-native-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c1 = Vec::new();
    for (_, code) in WORKLOADS {
        // One call first, not counted (the page cache warm, as the server's is).
        native_run(&python, &dir, code);
        let mut samples: Vec<Duration> = (0..calls)
            .map(|_| native_run(&python, &dir, code))
            .collect();
        samples.sort();
        c1.push(samples);
    }
    let rate = |code: &'static str| {
        let (python, dir) = (python.clone(), dir.clone());
        rate_at_8(calls * 4, move |_| {
            native_run(&python, &dir, code);
        })
    };
    let row = Row {
        name: "native",
        start_to_ready: Duration::ZERO,
        c1,
        c8_rate: rate(WORKLOADS[0].1),
        c8_pandas_rate: rate(WORKLOADS[2].1),
        cpu_per_call_ms: f64::NAN,
        boots: Vec::new(),
        rss_idle: f64::NAN,
        rss_after_mixed: f64::NAN,
    };
    let _ = std::fs::remove_dir_all(&dir);
    Some(row)
}

fn main() {
    let calls: usize = std::env::var("PACKAGES_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let mut rows = Vec::new();
    for setup in setups() {
        // The first start builds the layer and the snapshots; start-to-ready is measured warm.
        drop(start(&setup));
        let (server, start_to_ready) = start(&setup);
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let rss_idle = fixture::rss_mib(server.child.id());
        let mut c1 = Vec::new();
        for (_, code) in WORKLOADS {
            // One call first, not counted: the pool settles into its back-to-back state.
            fixture::timed_run(&http, &server.url, code);
            let mut samples: Vec<Duration> = (0..calls)
                .map(|_| fixture::timed_run(&http, &server.url, code))
                .collect();
            samples.sort();
            c1.push(samples);
        }
        let cpu_before = cpu(server.child.id());
        let url = server.url.clone();
        let c8_rate = rate_at_8(calls * 4, move |http| {
            fixture::timed_run(http, &url, "print(1)");
        });
        let cpu_used = cpu(server.child.id()).saturating_sub(cpu_before);
        let cpu_per_call_ms = cpu_used.as_secs_f64() * 1000.0 / (calls * 4 / 8 * 8) as f64;
        let url = server.url.clone();
        let c8_pandas_rate = rate_at_8(calls * 4, move |http| {
            fixture::timed_run(http, &url, WORKLOADS[2].1);
        });
        let mixed: usize = std::env::var("PACKAGES_MIXED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let rss_after_mixed = if mixed > 0 {
            for n in 0..mixed {
                fixture::timed_run(&http, &server.url, WORKLOADS[n % WORKLOADS.len()].1);
            }
            std::thread::sleep(Duration::from_secs(2));
            fixture::rss_mib(server.child.id())
        } else {
            f64::NAN
        };
        rows.push(Row {
            name: setup.name,
            start_to_ready,
            c1,
            c8_rate,
            c8_pandas_rate,
            cpu_per_call_ms,
            rss_idle,
            rss_after_mixed,
            boots: server.logged_boot_ms(),
        });
    }
    rows.extend(native_row(calls));
    println!(
        "packages benchmark: {calls} back-to-back calls per cell at concurrency 1, fresh sandbox (or process) each; p50/p90 ms"
    );
    print!("{:<11} {:>9}", "set-up", "ready ms");
    for (name, _) in WORKLOADS {
        print!(" {name:>16}");
    }
    println!(
        " {:>10} {:>14} {:>12} {:>22} {:>14}",
        "c=8 call/s", "c=8 pandas/s", "CPU/call ms", "creation p50/p90 ms", "RSS idle/mixed"
    );
    for r in &rows {
        print!(
            "{:<11} {:>9.0}",
            r.name,
            r.start_to_ready.as_secs_f64() * 1000.0
        );
        for samples in &r.c1 {
            print!(
                " {:>16}",
                format!("{:.0}/{:.0}", pct(samples, 0.5), pct(samples, 0.9))
            );
        }
        let q = |p: f64| {
            r.boots
                .get(((r.boots.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        println!(
            " {:>10.1} {:>14.1} {:>12.1} {:>22} {:>14}",
            r.c8_rate,
            r.c8_pandas_rate,
            r.cpu_per_call_ms,
            format!("{:.0}/{:.0}", q(0.5), q(0.9)),
            format!("{:.0}/{:.0}", r.rss_idle, r.rss_after_mixed)
        );
    }
    for base_name in ["preinstall", "native"] {
        let Some(base) = rows.iter().find(|r| r.name == base_name) else {
            continue;
        };
        for r in rows
            .iter()
            .filter(|r| r.name != base_name && r.name != "native")
        {
            print!("{} vs {base_name} (p50, >1 is faster):", r.name);
            for (i, (name, _)) in WORKLOADS.iter().enumerate() {
                print!(" {name} {:.2}x", pct(&base.c1[i], 0.5) / pct(&r.c1[i], 0.5));
            }
            println!(
                " c=8 print(1) {:.2}x, pandas {:.2}x",
                r.c8_rate / base.c8_rate,
                r.c8_pandas_rate / base.c8_pandas_rate
            );
        }
    }
}
