//! Notebook-grade results over MCP against the real server: what a rich output costs a call.
//!
//! * `display(df)` of a 1,000-row DataFrame (HTML, Markdown table and text) in a session that has the
//!   DataFrame, against the same call printing `len(df)`;
//! * the same stateless, importing pandas and building the DataFrame each time;
//! * a plotly figure shown (`fig.show()`: its JSON displayed, figure-N.html written) in a session
//!   with plotly installed from the local wheel mirror (served as a loopback HTTPS index).
//!
//! Back to back, p50/p90. Run with `cargo bench --bench notebook`; `NOTEBOOK_CALLS` (default 20) sets
//! the calls per series.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../tests/it/fixture.rs"]
mod fixture;
#[path = "../tests/it/mirror_index.rs"]
mod mirror_index;
#[path = "../tests/it/tls.rs"]
mod tls;

const FRAME: &str = "import pandas as pd\ndf = pd.DataFrame({'n': range(1000), 'sq': [i * i for i in range(1000)], 'name': [f'row {i}' for i in range(1000)]})";

fn run(http: &reqwest::blocking::Client, url: &str, args: Value) -> (Value, Duration) {
    let started = Instant::now();
    let reply = fixture::call_tool_with(http, url, "run_python_code", args);
    let elapsed = started.elapsed();
    let result = reply["result"]["structuredContent"].clone();
    assert_eq!(result["success"], true, "{reply}");
    (reply, elapsed)
}

fn series(calls: usize, mut one: impl FnMut() -> Duration) -> Vec<Duration> {
    let mut samples: Vec<Duration> = (0..calls).map(|_| one()).collect();
    samples.sort();
    samples
}

fn pct(samples: &[Duration], q: f64) -> f64 {
    samples[((samples.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1000.0
}

fn show(label: &str, samples: &[Duration]) {
    println!(
        "{label:<52} p50 {:>7.1} ms  p90 {:>7.1} ms  ({} calls)",
        pct(samples, 0.5),
        pct(samples, 0.9),
        samples.len()
    );
}

fn main() {
    let calls: usize = std::env::var("NOTEBOOK_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let lock = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("node_modules/pyodide/pyodide-lock.json"),
    )
    .unwrap();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-notebook");
    std::fs::create_dir_all(&dir).unwrap();
    let index = mirror_index::MirrorIndex::start(&fixture::package_mirror(), &lock, &dir);
    let mut command = fixture::server_command();
    command.env("RUST_LOG", "warn");
    for (key, value) in index.envs() {
        command.env(key, value);
    }
    let server = fixture::Server::spawn(&mut command, false);
    server.wait_ready();
    let http = fixture::client();
    let url = server.url.clone();

    let (reply, _) = run(&http, &url, json!({"code": FRAME, "session_id": "new"}));
    let session = reply["result"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let plain = series(calls, || {
        run(
            &http,
            &url,
            json!({"code": "print(len(df))", "session_id": session}),
        )
        .1
    });
    let displayed = series(calls, || {
        run(
            &http,
            &url,
            json!({"code": "display(df)", "session_id": session}),
        )
        .1
    });
    show("session: print(len(df)) (1,000 rows)", &plain);
    show("session: display(df)", &displayed);
    println!(
        "  display(df) / print: {:.2}x (p50)",
        pct(&displayed, 0.5) / pct(&plain, 0.5)
    );
    let stateless = series(calls.min(10), || {
        run(
            &http,
            &url,
            json!({"code": format!("{FRAME}\ndisplay(df)")}),
        )
        .1
    });
    show("stateless: import pandas, build, display(df)", &stateless);

    let (_, installed) = run(
        &http,
        &url,
        json!({"code": "%pip install -q narwhals==2.29.0 plotly==7.1.0\nimport plotly.express as px", "session_id": session, "timeout_ms": 120000}),
    );
    println!(
        "  %pip install plotly in the session: {:.0} ms",
        installed.as_secs_f64() * 1000.0
    );
    let mut n = 0;
    let plotly = series(calls, || {
        n += 1;
        let code = format!(
            "fig = px.scatter(x=list(range({n} * 10)), y=list(range({n} * 10)))\nfig.show()"
        );
        run(&http, &url, json!({"code": code, "session_id": session})).1
    });
    show(
        "session: plotly fig.show() (JSON display + figure-N.html)",
        &plotly,
    );
}
