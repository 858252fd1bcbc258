//! What live output costs: a call printing 100,000 lines with `flush=True`, over MCP against the real
//! server, with a progress token (its output streamed as `notifications/progress`, coalesced every
//! 250 ms) and without one (nothing streamed), in interleaved pairs so that the machine's drift
//! falls on both sides alike. Prints both distributions (p50/p90) and the per-pair ratio's median.
//!
//! Run with `cargo bench --bench streaming`; `STREAMING_PAIRS` (default 10) sets the pairs,
//! `STREAMING_LINES` (default 100000) the lines per call.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../tests/it/fixture.rs"]
mod fixture;

/// One call; its wall time and the progress notices it streamed.
fn call(
    http: &reqwest::blocking::Client,
    url: &str,
    code: &str,
    token: Option<&str>,
) -> (Duration, usize) {
    let body = fixture::tool_call_body(
        "run_python_code",
        json!({"code": code, "timeout_ms": 120_000}),
        token,
    );
    let started = Instant::now();
    let response =
        fixture::send_stateless(http, url, "tools/call", Some("run_python_code"), &body).unwrap();
    let mut notices = 0;
    let mut result = None;
    for line in BufReader::new(response).lines() {
        let line = line.unwrap();
        let data = line.strip_prefix("data:").unwrap_or(&line);
        let Ok(message) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        if message["method"] == "notifications/progress" {
            notices += 1;
        } else if message.get("id").is_some() {
            result = Some(message);
            break;
        }
    }
    let elapsed = started.elapsed();
    let result = result.expect("a result");
    assert_eq!(
        result["result"]["structuredContent"]["success"], true,
        "{result}"
    );
    (elapsed, notices)
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    let pairs: usize = std::env::var("STREAMING_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let lines: usize = std::env::var("STREAMING_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let mut command = fixture::server_command();
    command.env("RUST_LOG", "warn");
    let server = fixture::Server::spawn(&mut command, false);
    server.wait_ready();
    let http = fixture::client();
    let url = server.url.clone();
    let code = format!("for i in range({lines}):\n    print(f'line {{i}}', flush=True)");
    // Warm both paths once.
    call(&http, &url, &code, None);
    call(&http, &url, &code, Some("warm"));

    let (mut plain, mut streamed, mut ratios, mut notices) = (vec![], vec![], vec![], vec![]);
    for n in 0..pairs {
        // Alternate which side goes first.
        let token = format!("p{n}");
        let (a, b) = if n % 2 == 0 {
            let a = call(&http, &url, &code, None);
            (a, call(&http, &url, &code, Some(&token)))
        } else {
            let b = call(&http, &url, &code, Some(&token));
            (call(&http, &url, &code, None), b)
        };
        plain.push(a.0.as_secs_f64() * 1000.0);
        streamed.push(b.0.as_secs_f64() * 1000.0);
        ratios.push(b.0.as_secs_f64() / a.0.as_secs_f64());
        notices.push(b.1 as f64);
    }
    for v in [&mut plain, &mut streamed, &mut ratios, &mut notices] {
        v.sort_by(f64::total_cmp);
    }
    println!("{lines} lines printed with flush=True, {pairs} interleaved pairs:");
    println!(
        "  without a progress token   p50 {:>8.1} ms  p90 {:>8.1} ms",
        pct(&plain, 0.5),
        pct(&plain, 0.9)
    );
    println!(
        "  with a progress token      p50 {:>8.1} ms  p90 {:>8.1} ms  ({} notices per call, median)",
        pct(&streamed, 0.5),
        pct(&streamed, 0.9),
        pct(&notices, 0.5)
    );
    println!(
        "  streamed / not, per pair   median {:.3}  (min {:.3}, max {:.3})",
        pct(&ratios, 0.5),
        ratios[0],
        ratios[ratios.len() - 1]
    );
}
