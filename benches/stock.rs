//! The stock of ready sandboxes (`workers.ready_sandboxes`), A/B over MCP against the real server:
//! every call a fresh sandbox, at concurrency 1, in the patterns agents produce:
//! - `burst`: `STOCK_BURST` (default 6) calls back to back, then a pause of 1.5 s (the agent
//!   thinking), repeated `STOCK_ROUNDS` (default 4) times per server;
//! - `run`: `STOCK_RUN` (default 40) calls back to back without a pause, longer than any stock;
//! - `paced`: calls 150 ms apart;
//! - `lull` (with `STOCK_LULL=N`): N calls, each after `STOCK_LULL_MS` (default 5000) idle, the
//!   server's proportional set size read just before each.
//!
//! Set-ups (`STOCK_SETUPS`, comma-separated, default `before,default`): `before` (one prewarmed
//! worker with one ready sandbox: the pool before the stock), `default` (the shipped defaults),
//! `pPrR` (two workers, P prewarmed with R ready sandboxes each, e.g. `p2r8`; `p2r4q2`: 2 of them
//! when they are pre-imported ones); a name ending in
//! `+packages` (e.g. `default+packages`) gets the packages below without `STOCK_PREIMPORT`; `+map`
//! maps the pre-imported memory (`workers.map_snapshot_memory`), `+giveN` has an idle stock give
//! back memory after N s (`workers.idle_give_back_s`; `+give0`: never; the default 30 s is longer
//! than a lull), e.g. `default+map+give3`. Each is run `STOCK_REPEATS` (default 2) times,
//! alternating, so drift hits them alike. Workloads: `print(1)`, and with `STOCK_PREIMPORT=1` also numpy, pandas and a
//! matplotlib PNG with `preinstall_packages = ["pandas", "matplotlib"]` and
//! `preimport_modules = ["pandas", "matplotlib.pyplot"]` (the pool keeps pre-imported sandboxes).
//! Reports p50/p90 ms per pattern, the share of calls under 10 ms, the idle RSS of the server with
//! its stock full, and ratios against `before`.
//!
//! `cargo bench --bench stock`

use std::collections::BTreeMap;
use std::time::Duration;

#[path = "../tests/it/fixture.rs"]
mod fixture;

const PRINT: (&str, &str) = ("print(1)", "print(1)");
const DATA: [(&str, &str); 3] = [
    ("numpy", "import numpy as np\nnp.arange(3).sum()"),
    (
        "pandas",
        "import pandas as pd\npd.DataFrame({'a': [1, 2]}).a.sum()",
    ),
    (
        "matplotlib",
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3], [2, 3, 1])\nfig.savefig('plot.png')",
    ),
];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Pool settings of a set-up named `pPrR` (two workers, P prewarmed with R ready sandboxes each),
/// optionally `pPrRqQ` (Q of them when they are pre-imported ones, else the default);
/// `default`: the shipped defaults; `before`: `p1r1`, the pool before the stock.
fn pool_env(setup: &str) -> Vec<(&'static str, String)> {
    let mut parts = setup.split('+');
    let setup = parts.next().unwrap_or_default();
    let mut env = Vec::new();
    for option in parts {
        match option {
            "packages" => {}
            "map" => env.push((
                "CODE_INTERPRETER_MCP_WORKERS_MAP_SNAPSHOT_MEMORY",
                "true".into(),
            )),
            _ => {
                let seconds = option.strip_prefix("give").unwrap_or_else(|| {
                    panic!("set-up option +{option}: expected +packages, +map or +giveN")
                });
                env.push((
                    "CODE_INTERPRETER_MCP_WORKERS_IDLE_GIVE_BACK_S",
                    seconds.into(),
                ));
            }
        }
    }
    let spec = if setup == "before" { "p1r1" } else { setup };
    if spec == "default" {
        return env;
    }
    let (prewarmed, ready) = spec
        .strip_prefix('p')
        .and_then(|s| s.split_once('r'))
        .unwrap_or_else(|| panic!("set-up {setup}: expected before, default or pPrR (e.g. p2r4)"));
    let (ready, preimported) = ready.split_once('q').unwrap_or((ready, ""));
    env.extend([
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "2".into()),
        (
            "CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS",
            prewarmed.into(),
        ),
        ("CODE_INTERPRETER_MCP_WORKERS_READY_SANDBOXES", ready.into()),
    ]);
    if !preimported.is_empty() {
        env.push((
            "CODE_INTERPRETER_MCP_WORKERS_READY_PREIMPORTED_SANDBOXES",
            preimported.into(),
        ));
    }
    env
}

fn start(setup: &str, preimport: bool) -> fixture::Server {
    let preimport = preimport || setup.contains("+packages");
    let mut command = fixture::server_command();
    command
        .env("CODE_INTERPRETER_MCP_LOG_FORMAT", "json")
        .env("RUST_LOG", "warn,code_interpreter_mcp::pool=debug");
    command.envs(pool_env(setup));
    if preimport {
        command
            .env(
                "CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR",
                format!(
                    "{}/bench-stock-preimport",
                    env!("CARGO_TARGET_TMPDIR").trim_end_matches('/')
                ),
            )
            .env(
                "CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES",
                "pandas matplotlib",
            )
            .env(
                "CODE_INTERPRETER_MCP_PREIMPORT_MODULES",
                "pandas,matplotlib.pyplot",
            );
    }
    let server = fixture::Server::spawn(&mut command, true);
    server.wait_ready();
    server
}

/// Waits until the server's workers have filled their stocks: no sandbox boot logged for 1 s.
fn settle(server: &fixture::Server) {
    let mut seen = server.logged_boot_ms().len();
    loop {
        std::thread::sleep(Duration::from_millis(1000));
        let now = server.logged_boot_ms().len();
        if now == seen {
            return;
        }
        seen = now;
    }
}

fn pct(samples: &mut [Duration], q: f64) -> f64 {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1000.0
}

#[derive(Default)]
struct Cell {
    samples: Vec<Duration>,
}

fn main() {
    let burst = env_usize("STOCK_BURST", 6);
    let rounds = env_usize("STOCK_ROUNDS", 4);
    let run = env_usize("STOCK_RUN", 40);
    let repeats = env_usize("STOCK_REPEATS", 2);
    let lull = env_usize("STOCK_LULL", 0);
    let lull_pause = Duration::from_millis(env_usize("STOCK_LULL_MS", 5000) as u64);
    let patterns: &[&str] = if lull > 0 {
        &["burst", "run", "paced", "lull"]
    } else {
        &["burst", "run", "paced"]
    };
    let preimport = std::env::var("STOCK_PREIMPORT").as_deref() == Ok("1");
    let setups: Vec<String> = std::env::var("STOCK_SETUPS")
        .unwrap_or_else(|_| "before,default".into())
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let mut workloads = vec![PRINT];
    if preimport {
        workloads.extend(DATA);
        // The first start builds the layer and both snapshots.
        drop(start(&setups[0], true));
    }
    // (set-up, workload, pattern) -> samples; set-up -> idle RSS and creation times.
    let mut cells: BTreeMap<(String, &str, &str), Cell> = BTreeMap::new();
    let mut rss: BTreeMap<(String, &str), Vec<f64>> = BTreeMap::new();
    let mut lull_pss: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut boots: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    for _ in 0..repeats {
        for setup in &setups {
            let server = start(setup, preimport);
            for (name, code) in &workloads {
                let mut record = |pattern: &'static str, sample: Duration| {
                    cells
                        .entry((setup.clone(), *name, pattern))
                        .or_default()
                        .samples
                        .push(sample)
                };
                // The pool's stock follows the flavor of the calls: one call first, not counted.
                fixture::timed_run(&http, &server.url, code);
                settle(&server);
                rss.entry((setup.clone(), *name))
                    .or_default()
                    .push(fixture::rss_mib(server.child.id()));
                for _ in 0..rounds {
                    for _ in 0..burst {
                        record("burst", fixture::timed_run(&http, &server.url, code));
                    }
                    settle(&server);
                }
                for _ in 0..run {
                    record("run", fixture::timed_run(&http, &server.url, code));
                }
                settle(&server);
                for _ in 0..burst * 2 {
                    record("paced", fixture::timed_run(&http, &server.url, code));
                    std::thread::sleep(Duration::from_millis(150));
                }
                for _ in 0..lull {
                    std::thread::sleep(lull_pause);
                    lull_pss
                        .entry(setup.clone())
                        .or_default()
                        .push(fixture::pss_mib(server.child.id()));
                    record("lull", fixture::timed_run(&http, &server.url, code));
                }
            }
            boots
                .entry(setup.clone())
                .or_default()
                .extend(server.logged_boot_ms());
        }
    }
    println!(
        "stock benchmark: concurrency 1, fresh sandbox per call; burst = {burst} back to back then 1.5 s+ pause (x{rounds}), run = {run} back to back, paced = 150 ms apart; {repeats} alternating repeats; p50/p90 ms, share under 10 ms"
    );
    print!("{:<9} {:<11}", "set-up", "workload");
    for pattern in patterns {
        print!(" {pattern:>22}");
    }
    println!();
    let mut p50s: BTreeMap<(String, &str, &str), f64> = BTreeMap::new();
    for setup in &setups {
        for (name, _) in &workloads {
            print!("{setup:<9} {name:<11}");
            for pattern in patterns {
                let cell = cells.get_mut(&(setup.clone(), *name, pattern)).unwrap();
                let fast = cell
                    .samples
                    .iter()
                    .filter(|d| **d < Duration::from_millis(10))
                    .count() as f64
                    / cell.samples.len() as f64;
                let (p50, p90) = (pct(&mut cell.samples, 0.5), pct(&mut cell.samples, 0.9));
                p50s.insert((setup.clone(), *name, pattern), p50);
                print!(" {:>22}", format!("{p50:.1}/{p90:.1} {:.0}%", fast * 100.0));
            }
            println!();
        }
    }
    println!(
        "idle RSS with full stocks after each workload's first call (MiB), sandbox creation in the server (p50 ms):"
    );
    for setup in &setups {
        let mean = |r: &Vec<f64>| r.iter().sum::<f64>() / r.len() as f64;
        let per_workload: Vec<String> = workloads
            .iter()
            .map(|(name, _)| format!("{name} {:.0}", mean(&rss[&(setup.clone(), *name)])))
            .collect();
        let mut b = boots[setup].clone();
        b.sort_by(f64::total_cmp);
        println!(
            "  {setup:<9} RSS {}; creation p50 {:.1} ms over {} sandboxes",
            per_workload.join(", "),
            b.get(b.len() / 2).copied().unwrap_or(f64::NAN),
            b.len()
        );
        if let Some(pss) = lull_pss.get_mut(setup) {
            pss.sort_by(f64::total_cmp);
            println!(
                "  {setup:<9} proportional set size after {} ms idle: p50 {:.0} MiB (min {:.0}, max {:.0})",
                lull_pause.as_millis(),
                pss[pss.len() / 2],
                pss[0],
                pss[pss.len() - 1]
            );
        }
    }
    if setups.iter().any(|s| s == "before") {
        println!("p50 ratios against `before` (lower is faster):");
        for setup in setups.iter().filter(|s| *s != "before") {
            for (name, _) in &workloads {
                let ratios: Vec<String> = patterns
                    .iter()
                    .map(|p| {
                        let a = p50s[&(setup.clone(), *name, *p)];
                        let b = p50s[&("before".to_string(), *name, *p)];
                        format!("{p} {:.2}x", a / b)
                    })
                    .collect();
                println!("  {setup:<9} {name:<11} {}", ratios.join(", "));
            }
        }
    }
}
