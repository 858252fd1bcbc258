//! Prometheus metrics through the real server: exact counter increments and label sets after a
//! scripted mix of calls, gauges while calls are queued and running, histogram buckets, the listener's
//! start before Python initialisation, bind failures, and nothing opened when disabled.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::fixture::{Server, call_stateless, client, send_stateless, tool_call_body};

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Samples of a scrape: "name{labels}" -> value.
pub(crate) fn scrape(port: u16) -> (String, BTreeMap<String, f64>) {
    let text = client()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let samples = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((normalize(name), value.parse().ok()?))
        })
        .collect();
    (text, samples)
}

/// Sorts the labels of `name{a="1",b="2"}` so lookups do not depend on the exporter's order.
fn normalize(series: &str) -> String {
    match series.split_once('{') {
        None => series.to_string(),
        Some((name, rest)) => {
            let mut labels: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
            labels.sort();
            format!("{name}{{{}}}", labels.join(","))
        }
    }
}

pub(crate) fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    *samples
        .get(&normalize(series))
        .unwrap_or_else(|| panic!("no series {series}"))
}

fn tool_calls(samples: &BTreeMap<String, f64>, outcome: &str) -> f64 {
    value(
        samples,
        &format!(
            "code_interpreter_mcp_tool_calls_total{{tool=\"run_python_code\",outcome=\"{outcome}\"}}"
        ),
    )
}

/// Scrapes until `series` has `expected` (at most 20 s); the last scrape.
fn wait_for(port: u16, series: &str, expected: f64) -> BTreeMap<String, f64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, samples) = scrape(port);
        if samples.get(&normalize(series)) == Some(&expected) {
            return samples;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never reached {expected}: {samples:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn scripted_calls_move_exactly_the_expected_series() {
    let port = free_port();
    let port_s = port.to_string();
    let server = Server::start(&[
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        ),
        ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port_s),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_QUEUE_CAPACITY", "1"),
    ]);
    let (text, before) = scrape(port);
    // Every family is present from the start; counters at zero, capacity at its setting.
    for family in [
        "tool_calls_total",
        "tool_call_duration_seconds",
        "execution_queue_depth",
        "execution_queue_capacity",
        "execution_queue_wait_seconds",
        "workers",
        "python_execution_duration_seconds",
        "isolate_initialization_duration_seconds",
        "execution_rejections_total",
        "worker_unexpected_exits_total",
        "tasks",
        "tasks_ended_total",
        "task_duration_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE code_interpreter_mcp_{family} ")),
            "family {family} missing:\n{text}"
        );
    }
    assert_eq!(
        value(&before, "code_interpreter_mcp_execution_queue_capacity"),
        1.0
    );
    assert_eq!(
        value(&before, "code_interpreter_mcp_execution_queue_depth"),
        0.0
    );
    assert_eq!(tool_calls(&before, "success"), 0.0);
    assert_eq!(
        value(
            &before,
            "code_interpreter_mcp_worker_unexpected_exits_total"
        ),
        0.0
    );

    // success, python error, timeout, validation
    call_stateless(&server, json!({"code": "1"}));
    call_stateless(&server, json!({"code": "raise ValueError()"}));
    call_stateless(
        &server,
        json!({"code": "while True: pass", "timeout_ms": 300}),
    );
    call_stateless(
        &server,
        json!({"code": "1", "files": [{"path": "/abs", "content_base64": ""}]}),
    );

    // one running, one queued (gauges), one overloaded; first let the worker finish discarding the
    // previous sandbox
    wait_for(port, "code_interpreter_mcp_workers{state=\"idle\"}", 1.0);
    let url = server.url.clone();
    let running =
        thread::spawn(move || call_stateless(&url, json!({"code": "import time\ntime.sleep(4)"})));
    wait_for(
        port,
        "code_interpreter_mcp_workers{state=\"executing\"}",
        1.0,
    );
    let url = server.url.clone();
    let queued = thread::spawn(move || call_stateless(&url, json!({"code": "2"})));
    let during = wait_for(port, "code_interpreter_mcp_execution_queue_depth", 1.0);
    assert_eq!(
        value(&during, "code_interpreter_mcp_workers{state=\"executing\"}"),
        1.0
    );
    assert_eq!(
        value(&during, "code_interpreter_mcp_workers{state=\"idle\"}"),
        0.0
    );
    assert_eq!(
        value(
            &during,
            "code_interpreter_mcp_workers{state=\"initializing\"}"
        ),
        0.0
    );
    let overloaded = call_stateless(&server, json!({"code": "3"}));
    assert_eq!(
        overloaded["result"]["structuredContent"]["error"]["kind"],
        "overload"
    );
    running.join().unwrap();
    queued.join().unwrap();

    let (text, after) = scrape(port);
    assert_eq!(
        tool_calls(&after, "success"),
        3.0,
        "1, the sleep and the queued call"
    );
    assert_eq!(tool_calls(&after, "python_error"), 1.0);
    assert_eq!(tool_calls(&after, "timeout"), 1.0);
    assert_eq!(tool_calls(&after, "validation_error"), 1.0);
    assert_eq!(tool_calls(&after, "overload"), 1.0);
    assert_eq!(tool_calls(&after, "runtime_failure"), 0.0);
    assert_eq!(
        value(
            &after,
            "code_interpreter_mcp_execution_rejections_total{reason=\"validation\"}"
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "code_interpreter_mcp_execution_rejections_total{reason=\"queue_full\"}"
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "code_interpreter_mcp_execution_rejections_total{reason=\"shutdown\"}"
        ),
        0.0
    );
    let exec_count = |outcome: &str| {
        value(
            &after,
            &format!(
                "code_interpreter_mcp_python_execution_duration_seconds_count{{outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(exec_count("success"), 3.0);
    assert_eq!(exec_count("python_error"), 1.0);
    assert_eq!(exec_count("timeout"), 1.0);
    assert_eq!(
        value(
            &after,
            "code_interpreter_mcp_execution_queue_wait_seconds_count{outcome=\"dispatched\"}"
        ),
        5.0
    );
    assert_eq!(
        value(
            &after,
            "code_interpreter_mcp_isolate_initialization_duration_seconds_count{phase=\"on_demand\",outcome=\"success\"}"
        ),
        5.0,
        "no prewarmed worker: every call booted on demand"
    );
    assert_eq!(
        value(&after, "code_interpreter_mcp_execution_queue_depth"),
        0.0
    );
    // Once the last used sandbox is discarded, the worker is idle again.
    wait_for(port, "code_interpreter_mcp_workers{state=\"idle\"}", 1.0);

    // Bucket boundaries.
    for le in [
        "0.001", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10",
        "30", "60", "120", "+Inf",
    ] {
        assert!(
            text.contains(&format!("code_interpreter_mcp_python_execution_duration_seconds_bucket{{outcome=\"success\",le=\"{le}\"}}")),
            "python bucket {le}"
        );
    }
    assert!(
        !text.contains("python_execution_duration_seconds_bucket{outcome=\"success\",le=\"300\"}")
    );
    for le in ["120", "300", "600", "+Inf"] {
        assert!(
            text.contains(&format!("code_interpreter_mcp_execution_queue_wait_seconds_bucket{{outcome=\"dispatched\",le=\"{le}\"}}")),
            "queue wait bucket {le}"
        );
    }
    // The five-second tokio reporter runs on the main runtime.
    for gauge in [
        "tokio_workers_count",
        "tokio_live_tasks_count",
        "tokio_global_queue_depth",
        "tokio_total_park_count",
        "tokio_min_park_count",
        "tokio_max_park_count",
        "tokio_total_busy_duration_seconds",
        "tokio_min_busy_duration_seconds",
        "tokio_max_busy_duration_seconds",
        "tokio_busy_ratio",
    ] {
        assert!(after.contains_key(gauge), "{gauge} missing");
    }
    assert!(
        value(&after, "tokio_workers_count") >= 4.0,
        "at least four runtime threads by default"
    );
    // Labels carry no code, messages or paths.
    assert!(!text.contains("ValueError") && !text.contains("time.sleep") && !text.contains("/abs"));

    // For promtool in CI.
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/metrics-scrape.txt");
    std::fs::write(out, &text).unwrap();
}

#[test]
fn cancelled_calls_are_counted() {
    let port = free_port();
    let port_s = port.to_string();
    let server = Server::start(&[
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        ),
        ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port_s),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
    ]);
    let url = server.url.clone();
    let running =
        thread::spawn(move || call_stateless(&url, json!({"code": "import time\ntime.sleep(3)"})));
    thread::sleep(Duration::from_millis(800));
    // A 2026-07-28 call whose client gives up: closing the response stream cancels it.
    let impatient = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    let body = tool_call_body("run_python_code", json!({"code": "'never'"}), None);
    let gave_up = send_stateless(
        &impatient,
        &server.url,
        "tools/call",
        Some("run_python_code"),
        &body,
    )
    .and_then(|r| r.text());
    assert!(
        gave_up.is_err(),
        "the call was still queued when the client left"
    );
    running.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, samples) = scrape(port);
        let cancelled = tool_calls(&samples, "cancelled");
        let wait = value(
            &samples,
            "code_interpreter_mcp_execution_queue_wait_seconds_count{outcome=\"cancelled\"}",
        );
        if cancelled == 1.0 && wait == 1.0 {
            assert_eq!(
                tool_calls(&samples, "success"),
                1.0,
                "the cancelled job never ran"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cancelled={cancelled} wait={wait}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// The server, on any port, with its metrics listener on `port`.
fn with_metrics_on(port: u16) -> std::process::Command {
    let mut command = crate::common::server_command();
    command
        .env("CODE_INTERPRETER_MCP_BIND_ADDR", "127.0.0.1:0")
        .env(
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        )
        .env(
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT",
            port.to_string(),
        );
    command
}

#[test]
fn the_listener_starts_before_python_and_fails_startup_when_it_cannot_bind() {
    let port = free_port();
    let mut child = with_metrics_on(port)
        .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "1")
        .env(
            "CODE_INTERPRETER_MCP_PACKAGE_BASE_URL",
            crate::common::package_mirror(),
        )
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout_pipe = child.stdout.take().unwrap();
    let first = Server::adopt(child, String::new()); // killed on drop, even if a check fails
    // Metrics answer while the prewarmed worker is still initialising, before anything else listens.
    let started = Instant::now();
    while client()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .is_err()
    {
        assert!(started.elapsed() < Duration::from_secs(20));
        thread::sleep(Duration::from_millis(20));
    }
    wait_for(
        port,
        "code_interpreter_mcp_workers{state=\"initializing\"}",
        1.0,
    );
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(stdout_pipe);
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert!(
        line.starts_with("code-interpreter-mcp listening"),
        "announced only after initialisation"
    );
    // The prewarmed worker and the on-demand one, both idle once the prewarmed worker has filled
    // its stock of ready sandboxes (it boots them one after another after the announcement).
    let deadline = Instant::now() + Duration::from_secs(20);
    let ready = loop {
        let (_, samples) = scrape(port);
        let idle = value(&samples, "code_interpreter_mcp_workers{state=\"idle\"}");
        let initializing = value(
            &samples,
            "code_interpreter_mcp_workers{state=\"initializing\"}",
        );
        if idle == 2.0 && initializing == 0.0 {
            break samples;
        }
        assert!(
            Instant::now() < deadline,
            "idle {idle}, initializing {initializing}"
        );
        thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        value(
            &ready,
            "code_interpreter_mcp_isolate_initialization_duration_seconds_count{phase=\"startup\",outcome=\"success\"}"
        ),
        1.0
    );

    // A second server on the same metrics port cannot start.
    let out = with_metrics_on(port).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot bind the Prometheus listener"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(first);

    // Invalid settings stop start-up (validation is covered key by key in the config tests).
    let out = crate::common::server_command()
        .env(
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        )
        .env(
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_HOST",
            "localhost",
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn disabled_metrics_open_no_port() {
    let port = free_port();
    let port_s = port.to_string();
    let server = Server::start(&[("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port_s)]);
    call_stateless(&server, json!({"code": "1"}));
    assert!(
        client()
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .is_err()
    );
}

#[test]
fn the_dashboard_and_alerts_use_only_exported_series() {
    let families = [
        "tool_calls_total",
        "tool_call_duration_seconds_bucket",
        "execution_queue_depth",
        "execution_queue_capacity",
        "execution_queue_wait_seconds_bucket",
        "workers",
        "python_execution_duration_seconds_bucket",
        "isolate_initialization_duration_seconds_bucket",
        "execution_rejections_total",
        "worker_unexpected_exits_total",
        "sessions",
        "sessions_created_total",
        "sessions_ended_total",
        "ready_sandboxes",
        "tasks",
        "tasks_ended_total",
        "task_duration_seconds_bucket",
        "sessions_resident",
        "sessions_saved",
        "session_saves_total",
        "session_resumes_total",
        "session_save_duration_seconds_bucket",
        "session_resume_duration_seconds_bucket",
        "auth_refusals_total",
        "authorization_keys_fetches_total",
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard =
        std::fs::read_to_string(root.join("deploy/grafana/code-interpreter-mcp.json")).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("valid dashboard JSON");
    assert!(parsed["panels"].as_array().unwrap().len() >= 8);
    let alerts = std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).unwrap();
    for text in [&dashboard, &alerts] {
        for (i, _) in text.match_indices("code_interpreter_mcp_") {
            let name: String = text[i + "code_interpreter_mcp_".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                families.contains(&name.as_str()),
                "unknown series code_interpreter_mcp_{name}"
            );
        }
    }
    for alert in [
        "QueueSaturated",
        "WorkerLost",
        "SlowCalls",
        "SessionsNearLimit",
        "SessionSavesFailing",
    ] {
        assert!(alerts.contains(alert), "{alert}");
    }
}

#[test]
fn calls_go_to_the_prewarmed_sandbox_while_one_is_ready() {
    let port = free_port();
    let port_s = port.to_string();
    let server = Server::start(&[
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        ),
        ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port_s),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "2"),
        ("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_READY_SANDBOXES", "1"),
    ]);
    let replenished = "code_interpreter_mcp_isolate_initialization_duration_seconds_count{phase=\"replenishment\",outcome=\"success\"}";
    for n in 1..=3 {
        let reply = call_stateless(&server, json!({"code": "1"}));
        assert_eq!(reply["result"]["structuredContent"]["success"], true);
        // The prewarmed worker prepares a replacement right away; wait until it is ready again.
        wait_for(port, replenished, f64::from(n));
        wait_for(port, "code_interpreter_mcp_workers{state=\"idle\"}", 2.0);
    }
    let (_, samples) = scrape(port);
    assert_eq!(
        value(
            &samples,
            "code_interpreter_mcp_isolate_initialization_duration_seconds_count{phase=\"on_demand\",outcome=\"success\"}"
        ),
        0.0,
        "the worker without a sandbox never had to boot one"
    );
}

#[test]
fn queued_calls_are_served_from_the_stock_of_ready_sandboxes_which_refills_after_them() {
    let port = free_port();
    let port_s = port.to_string();
    let server = Server::start(&[
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        ),
        ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port_s),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_READY_SANDBOXES", "3"),
    ]);
    let stock = "code_interpreter_mcp_ready_sandboxes";
    let series = |phase: &str| {
        format!(
            "code_interpreter_mcp_isolate_initialization_duration_seconds_count{{phase=\"{phase}\",outcome=\"success\"}}"
        )
    };
    // Ready is announced after the first sandbox; the worker boots the other two after it.
    wait_for(port, stock, 3.0);
    wait_for(port, &series("replenishment"), 2.0);
    // Two calls queued behind a running one: all three start from the stock, none boots.
    let url = server.url.clone();
    let running =
        thread::spawn(move || call_stateless(&url, json!({"code": "import time\ntime.sleep(2)"})));
    wait_for(
        port,
        "code_interpreter_mcp_workers{state=\"executing\"}",
        1.0,
    );
    let queued: Vec<_> = (0..2)
        .map(|i| {
            let url = server.url.clone();
            thread::spawn(move || call_stateless(&url, json!({"code": format!("{i} + 40")})))
        })
        .collect();
    wait_for(port, "code_interpreter_mcp_execution_queue_depth", 2.0);
    assert_eq!(
        running.join().unwrap()["result"]["structuredContent"]["success"],
        true
    );
    for (i, call) in queued.into_iter().enumerate() {
        let reply = call.join().unwrap();
        assert_eq!(
            reply["result"]["structuredContent"]["result"],
            json!((i + 40).to_string()),
            "{reply}"
        );
    }
    // Then the stock fills up again.
    let after = wait_for(port, stock, 3.0);
    assert_eq!(
        value(&after, &series("on_demand")),
        0.0,
        "no call waited for a boot"
    );
    assert_eq!(value(&after, &series("replenishment")), 5.0);
}
