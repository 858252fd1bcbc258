//! Sandbox cost, measured against the real engine: time to create one ready sandbox (isolate + Pyodide
//! boot) and time to execute `print(1)` in it. Run with `cargo bench --bench sandbox`; set
//! `BENCH_ITERATIONS` (default 20) for more samples.

use std::time::{Duration, Instant};

use code_interpreter_mcp::sandbox::{Engine, EngineConfig, ExecRequest};

fn main() {
    let iterations: usize = std::env::var("BENCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let engine = Engine::new(EngineConfig::default()).expect("engine");

    // One warm-up call, not counted.
    let _ = engine.execute(request());

    let mut boots = Vec::with_capacity(iterations);
    let mut runs = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let sandbox = engine.boot().expect("boot");
        boots.push(started.elapsed());
        let started = Instant::now();
        let result = sandbox.execute(request());
        runs.push(started.elapsed());
        assert!(result.success && result.stdout == "1\n", "{result:?}");
    }
    println!("sandbox benchmark, {iterations} fresh sandboxes (full boot)");
    report("create ready sandbox", &mut boots);
    report("execute print(1)", &mut runs);
}

fn request() -> ExecRequest {
    ExecRequest {
        code: "print(1)".into(),
        files: Vec::new(),
        timeout: Duration::from_secs(30),
    }
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
