//! Sandbox cost, measured against the real engine in both boot modes: time to create one ready
//! sandbox (new isolate + Pyodide, from a memory snapshot or from scratch) and time to execute
//! `print(1)` in it. Run with `cargo bench --bench sandbox`; set `BENCH_ITERATIONS` (default 20),
//! `BENCH_MODES=snapshot` to skip the full-boot mode, `BENCH_IDLE_MS` to let each sandbox wait that
//! long between boot and execution, as a prewarmed one does, `BENCH_PREINSTALL=pandas` to measure with
//! packages in the package layer, `BENCH_PREIMPORT=pandas,matplotlib.pyplot` to restore sandboxes
//! from the snapshot with those modules imported, `BENCH_CODE` to execute other code than `print(1)`,
//! `BENCH_SPARE_MEMORY=1` to restore each sandbox into the pages of the one before, as pool workers do,
//! `BENCH_MAP_MEMORY=1` to map the pre-imported snapshot's memory copy-on-write
//! (`workers.map_snapshot_memory`), `BENCH_HOLD=N` to also measure N ready sandboxes held at once,
//! `BENCH_TRIM=1` to have each ready sandbox give back the pages it holds unchanged before it is
//! held or runs (as an idle pool's stock does after `workers.idle_give_back_s`), `BENCH_FILE=0` to
//! copy the pre-imported memory from an anonymous store instead of the sealed file that a copied
//! memory gives back to (`workers.idle_give_back_s = 0`).

use std::time::{Duration, Instant};

use code_interpreter_mcp::config::Settings;
use code_interpreter_mcp::sandbox::{BootMode, Engine, EngineSettings, ExecRequest, Flavor};

fn main() {
    // The engine's warnings (a snapshot it could not take, say), and more with RUST_LOG.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    // BENCH_MODES=snapshot measures only the snapshot mode (for profiling).
    if std::env::var("BENCH_MODES").as_deref() == Ok("snapshot") {
        measure(BootMode::Snapshot, iterations);
        return;
    }
    let full = measure(BootMode::Full, iterations);
    let snapshot = measure(BootMode::Snapshot, iterations);
    println!(
        "median sandbox creation: full {:.1} ms, snapshot {:.1} ms ({:.1}x faster)",
        ms(full),
        ms(snapshot),
        full.as_secs_f64() / snapshot.as_secs_f64()
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Prints the distributions for one boot mode; returns the median creation time.
fn measure(boot: BootMode, iterations: usize) -> Duration {
    let started = Instant::now();
    let mut config = EngineSettings {
        boot,
        ..Settings::default().engine
    };
    // Wheels (micropip for the package layer) from CODE_INTERPRETER_MCP_PACKAGE_BASE_URL, else the
    // team's local mirror next to the checkout, else the Pyodide CDN.
    let mirror = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/pyodide-packages");
    if let Ok(url) = std::env::var("CODE_INTERPRETER_MCP_PACKAGE_BASE_URL") {
        config.package_base_url = Some(url);
    } else if std::path::Path::new(mirror).is_dir() {
        config.package_base_url = Some(mirror.to_string());
    }
    // BENCH_PREINSTALL=pandas,...: measure with these packages in the package layer.
    if let Ok(list) = std::env::var("BENCH_PREINSTALL") {
        config.preinstall_packages = list.split(',').map(String::from).collect();
        config.package_cache_dir =
            concat!(env!("CARGO_TARGET_TMPDIR"), "/bench-package-cache").into();
    }
    // BENCH_MAP_MEMORY=1: the pre-imported snapshot's memory is mapped copy-on-write.
    config.map_snapshot_memory = std::env::var("BENCH_MAP_MEMORY").as_deref() == Ok("1");
    // BENCH_FILE=0: a copied memory is copied from an anonymous store, not from the sealed file
    // an idle sandbox gives back to (`workers.idle_give_back_s = 0`).
    config.give_back_idle_memory = std::env::var("BENCH_FILE").as_deref() != Ok("0");
    // BENCH_PREIMPORT=pandas,...: sandboxes restore the snapshot with these modules imported.
    if let Ok(list) = std::env::var("BENCH_PREIMPORT") {
        config.preimport_modules = list.split(',').map(String::from).collect();
    }
    let engine = Engine::new(config).expect("engine");
    if !config_preimport_ok(&engine) {
        panic!("BENCH_PREIMPORT is set but the snapshot with pre-imported modules is not in use");
    }
    let engine_ready = started.elapsed();

    // BENCH_IDLE_MS: how long a booted sandbox waits before it runs (a prewarmed worker's case).
    let idle = std::env::var("BENCH_IDLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);

    // BENCH_PREIMPORT: every sandbox is restored from the snapshot with the pre-imported modules.
    let flavor = if engine.preimported() {
        Flavor::Preimported
    } else {
        Flavor::Plain
    };

    // BENCH_SPARE_MEMORY=1: each sandbox restores into the pages of the one dropped before it, as
    // on a pool worker (pages/spare.rs). Off by default: the memory rows below then show
    // what a sandbox takes from the system, not pages moved from its predecessor.
    if std::env::var("BENCH_SPARE_MEMORY").as_deref() == Ok("1") {
        engine.keep_spare_memory_on_this_thread();
    }

    // One warm-up call, not counted.
    let _ = engine.execute(request());

    // BENCH_TRIM=1: each ready sandbox gives back the mapped pages it holds unchanged.
    let trim = std::env::var("BENCH_TRIM").as_deref() == Ok("1");

    // BENCH_HOLD=N: N ready sandboxes held at once, each settled as a pool's stock holds them; what
    // each adds to the process (proportional set size, anonymous memory), averaged over the N. (One
    // sandbox at a time would undercount: it reuses what the one before it freed.)
    if let Some(n) = std::env::var("BENCH_HOLD")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let (pss, anon) = (rollup_kib("Pss:"), rollup_kib("Anonymous:"));
        let mut given = Vec::new();
        let mut held: Vec<_> = (0..n)
            .map(|_| {
                let mut sandbox = engine.boot_flavor(flavor).expect("boot");
                sandbox.collect_garbage();
                if trim {
                    given.push(
                        sandbox.give_back_unchanged_memory().expect("given back") as u64 / 1024,
                    );
                }
                sandbox
            })
            .collect();
        let per = |now: u64, before: u64| now.saturating_sub(before) as f64 / n as f64 / 1024.0;
        println!(
            "{n} ready sandboxes held: {:.1} MiB proportional set size, {:.1} MiB anonymous each",
            per(rollup_kib("Pss:"), pss),
            per(rollup_kib("Anonymous:"), anon),
        );
        if trim {
            report_kib("memory given back", &mut given);
        }
        // (The isolates of one thread go newest first.)
        while held.pop().is_some() {}
    }

    let mut boots = Vec::with_capacity(iterations);
    let mut runs = Vec::with_capacity(iterations);
    let mut teardowns = Vec::with_capacity(iterations);
    let mut private_ready = Vec::with_capacity(iterations);
    let mut private_used = Vec::with_capacity(iterations);
    let mut own_ready = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let before = private_kib();
        let own_before = rollup_kib("Anonymous:");
        let started = Instant::now();
        let sandbox = engine.boot_flavor(flavor).expect("boot");
        boots.push(started.elapsed());
        private_ready.push(private_kib().saturating_sub(before));
        own_ready.push(rollup_kib("Anonymous:").saturating_sub(own_before));
        let mut sandbox = sandbox;
        if let Some(idle) = idle {
            // As a prewarmed worker does with a sandbox it holds.
            sandbox.collect_garbage();
            std::thread::sleep(idle);
        }
        if trim {
            sandbox.give_back_unchanged_memory().expect("given back");
        }
        let started = Instant::now();
        let result = sandbox.run(request(), None);
        runs.push(started.elapsed());
        private_used.push(private_kib().saturating_sub(before));
        let started = Instant::now();
        drop(sandbox);
        teardowns.push(started.elapsed());
        let expected = std::env::var("BENCH_CODE").is_err().then_some("1\n");
        assert!(
            result.success && expected.is_none_or(|e| result.stdout == e),
            "{:?}",
            result.error
        );
    }
    println!(
        "{boot:?} boot: {iterations} fresh sandboxes; engine ready in {:.0} ms",
        ms(engine_ready)
    );
    report("create ready sandbox", &mut boots);
    report("execute print(1)", &mut runs);
    report("discard used sandbox", &mut teardowns);
    report_kib("dirty memory, ready", &mut private_ready);
    report_kib("dirty memory, after run", &mut private_used);
    report_kib("own memory, ready", &mut own_ready);
    boots[boots.len() / 2]
}

/// Whether the engine restores what BENCH_PREIMPORT asks for.
fn config_preimport_ok(engine: &Engine) -> bool {
    engine.settings().preimport_modules.is_empty() || engine.preimported()
}

fn request() -> ExecRequest {
    ExecRequest {
        // BENCH_CODE: measure executing this instead of print(1).
        code: std::env::var("BENCH_CODE").unwrap_or_else(|_| "print(1)".into()),
        files: Vec::new(),
        timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

/// The process's written private memory (Private_Dirty of /proc/self/smaps_rollup: pages copied or
/// written for it alone; a page mapped from a shared file and only read is not counted), KiB; 0
/// where the system cannot say.
fn private_kib() -> u64 {
    rollup_kib("Private_Dirty:")
}

/// One field of /proc/self/smaps_rollup, KiB; 0 where the system cannot say.
fn rollup_kib(field: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/smaps_rollup") else {
        return 0;
    };
    text.lines()
        .filter(|l| l.starts_with(field))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// A sandbox's private memory (what the process grew by while it lived), MiB.
fn report_kib(name: &str, samples: &mut [u64]) {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{name:<24} median {:>6.1} MiB  p90 {:>6.1} MiB",
        pick(0.5) as f64 / 1024.0,
        pick(0.9) as f64 / 1024.0,
    );
}

fn report(name: &str, samples: &mut [Duration]) {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<24} min {:>9.2} ms  median {:>9.2} ms  p90 {:>9.2} ms  max {:>9.2} ms",
        ms(samples[0]),
        ms(pick(0.5)),
        ms(pick(0.9)),
        ms(samples[samples.len() - 1]),
    );
}
