//! Per-principal quotas (`[quotas]`) through the real server, with two bearer tokens as two
//! principals: each quota refuses one principal's call with `QuotaExceeded` naming the quota and
//! when to retry, leaves the other principal alone, and lets the first through again once the cause
//! has passed (a call ended, the bucket refilled, a task expired).

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::containment::structured;
use crate::fixture::{Server, call_as, message};

fn server_with_tokens(extra: &[(&str, &str)]) -> Server {
    let dir = crate::common::temp_dir("quota-tokens");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "alice-token\nbob-token\n").unwrap();
    let tokens = tokens.to_str().unwrap().to_string();
    let mut envs = vec![
        (
            "CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE",
            tokens.as_str(),
        ),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "2"),
    ];
    envs.extend_from_slice(extra);
    Server::start(&envs)
}

/// run_python_code as `token`; the structured result.
fn run(server: &Server, token: &str, code: &str) -> Value {
    structured(&message(call_as(
        server,
        Some(token),
        json!({"code": code}),
    )))
    .clone()
}

/// The error of a call a quota refused.
fn quota_error(result: &Value, quota: &str) -> u64 {
    let error = &result["error"];
    assert_eq!(error["type"], "QuotaExceeded", "{result}");
    assert_eq!(error["kind"], "overload", "{result}");
    assert_eq!(error["quota"], quota, "{result}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains(&format!("quotas.{quota}")),
        "{result}"
    );
    error["retry_after_ms"].as_u64().unwrap_or(0)
}

#[test]
fn a_principal_over_its_call_quota_is_refused_and_another_is_not() {
    let server = server_with_tokens(&[("CODE_INTERPRETER_MCP_QUOTAS_MAX_CONCURRENT_CALLS", "1")]);
    assert_eq!(run(&server, "alice-token", "1")["result"], "1");
    let long = thread::scope(|scope| {
        let long = scope.spawn(|| {
            run(
                &server,
                "alice-token",
                "import time; time.sleep(2); 'slept'",
            )
        });
        thread::sleep(Duration::from_millis(700));
        let refused = run(&server, "alice-token", "2");
        let retry = quota_error(&refused, "max_concurrent_calls");
        assert!((100..=60_000).contains(&retry), "{refused}");
        assert_eq!(
            run(&server, "bob-token", "3")["result"],
            "3",
            "another principal is not held by Alice's quota"
        );
        long.join().unwrap()
    });
    assert_eq!(long["result"], "slept");
    assert_eq!(
        run(&server, "alice-token", "4")["result"],
        "4",
        "the call ended"
    );
}

#[test]
fn the_sandbox_seconds_bucket_refuses_until_it_refills() {
    let server = server_with_tokens(&[("CODE_INTERPRETER_MCP_QUOTAS_CPU_SECONDS_PER_MINUTE", "1")]);
    assert_eq!(
        run(
            &server,
            "alice-token",
            "import time; time.sleep(1.1); 'done'"
        )["result"],
        "done"
    );
    let refused = run(&server, "alice-token", "1");
    let retry = quota_error(&refused, "cpu_seconds_per_minute");
    // 1 s a minute: the deficit of at least 0.1 s takes at least 6 s to refill.
    assert!((5_000..=30_000).contains(&retry), "{refused}");
    assert_eq!(run(&server, "bob-token", "2")["result"], "2");
    let waited = Instant::now();
    thread::sleep(Duration::from_millis(retry + 300));
    assert_eq!(
        run(&server, "alice-token", "3")["result"],
        "3",
        "refilled after {:?}",
        waited.elapsed()
    );
}

#[test]
fn a_principal_holding_its_tasks_gets_no_more_until_one_expires() {
    let server = server_with_tokens(&[
        ("CODE_INTERPRETER_MCP_QUOTAS_MAX_TASKS", "1"),
        ("CODE_INTERPRETER_MCP_TASKS_TTL_S", "2"),
    ]);
    let start = |token: &str| {
        crate::tasks::request(
            &server,
            "tools/call",
            json!({"name": "run_python_code", "arguments": {"code": "import time; time.sleep(1); 1"}}),
            Some(token),
        )
    };
    let first = start("alice-token");
    assert_eq!(first["result"]["resultType"], "task", "{first}");
    let refused = start("alice-token");
    let result = &refused["result"];
    assert_eq!(result["isError"], true, "{refused}");
    let retry = quota_error(&result["structuredContent"], "max_tasks");
    assert_eq!(retry, 0, "only an expiry cures it: no retry time");
    let bob = start("bob-token");
    assert_eq!(bob["result"]["resultType"], "task", "{bob}");
    // The task's TTL (2 s) passes: it is forgotten and Alice may start another.
    thread::sleep(Duration::from_millis(2600));
    let again = start("alice-token");
    assert_eq!(again["result"]["resultType"], "task", "{again}");
}

#[test]
fn a_principal_with_its_queued_calls_waiting_gets_no_more_in_the_queue() {
    let server = server_with_tokens(&[
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_QUOTAS_MAX_QUEUED_CALLS", "2"),
    ]);
    // Alice's first call runs (1.5 s), two more wait: her queue allowance.
    let server = &server;
    thread::scope(|scope| {
        let mut alice = Vec::new();
        alice.push(scope.spawn(|| run(server, "alice-token", "import time; time.sleep(1.5); 0")));
        thread::sleep(Duration::from_millis(400));
        for n in 1..=2 {
            let code = format!("{n}");
            alice.push(scope.spawn(move || run(server, "alice-token", &code)));
        }
        thread::sleep(Duration::from_millis(300));
        let refused = run(server, "alice-token", "3");
        let retry = quota_error(&refused, "max_queued_calls");
        assert!((100..=60_000).contains(&retry), "{refused}");
        // Bob's call still gets into the queue, and is served in turn.
        assert_eq!(run(server, "bob-token", "4")["result"], "4");
        for (n, call) in alice.into_iter().enumerate() {
            assert_eq!(call.join().unwrap()["result"], n.to_string());
        }
    });
    // Her queue has drained: she may queue again.
    assert_eq!(run(server, "alice-token", "5")["result"], "5");
}

#[test]
fn a_principal_holding_its_sessions_gets_no_more_until_it_clears_one() {
    let server = server_with_tokens(&[("CODE_INTERPRETER_MCP_QUOTAS_MAX_SESSIONS", "2")]);
    let create = |token: &str| {
        structured(&message(call_as(
            &server,
            Some(token),
            json!({"code": "x = 1", "session_id": "new"}),
        )))
        .clone()
    };
    let first = create("alice-token");
    let id = first["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"))
        .to_string();
    create("alice-token");
    let refused = create("alice-token");
    assert_eq!(
        quota_error(&refused, "max_sessions"),
        0,
        "only ending one cures it"
    );
    assert!(refused["session_id"].is_null(), "{refused}");
    assert!(
        create("bob-token")["session_id"].is_string(),
        "another principal's are its own"
    );
    let cleared = crate::fixture::call_tool_with(
        &crate::fixture::client_with_token("alice-token"),
        &server,
        "clear_session",
        json!({"session_id": id}),
    );
    assert_eq!(cleared["result"]["isError"], false, "{cleared}");
    let again = create("alice-token");
    assert!(again["session_id"].is_string(), "{again}");
}

/// `auth.named_tokens`: a token's name is its principal (its sessions survive a new token), its
/// log and metric label, and picks its `[[quotas.overrides]]` entry.
#[test]
fn a_named_token_keeps_its_sessions_under_a_new_token_and_gets_its_override() {
    let dir = crate::common::temp_dir("named-tokens");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "alice:alice-token-1\nbatch:batch-token\n").unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[[quotas.overrides]]\nname = \"batch\"\nmax_concurrent_calls = 0\n",
    )
    .unwrap();
    let port = crate::upstream::free_port().to_string();
    let server = Server::start_with_args(
        &["--config", config.to_str().unwrap()],
        &[
            (
                "CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE",
                tokens.to_str().unwrap(),
            ),
            ("CODE_INTERPRETER_MCP_AUTH_NAMED_TOKENS", "true"),
            ("CODE_INTERPRETER_MCP_QUOTAS_MAX_CONCURRENT_CALLS", "1"),
            ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "2"),
            (
                "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
                "true",
            ),
            ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port),
            (
                "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PRINCIPAL_LABEL",
                "true",
            ),
        ],
    );
    // batch's override lifts the concurrency quota; alice keeps the server's (1).
    for (token, second_runs) in [("batch-token", true), ("alice-token-1", false)] {
        thread::scope(|scope| {
            let long = scope.spawn(|| run(&server, token, "import time; time.sleep(1.5); 'slept'"));
            thread::sleep(Duration::from_millis(600));
            let second = run(&server, token, "2");
            if second_runs {
                assert_eq!(second["result"], "2", "{second}");
            } else {
                quota_error(&second, "max_concurrent_calls");
            }
            assert_eq!(long.join().unwrap()["result"], "slept");
        });
    }
    let created = structured(&message(call_as(
        &server,
        Some("alice-token-1"),
        json!({"code": "x = 41", "session_id": "new"}),
    )))
    .clone();
    let id = created["session_id"].as_str().unwrap().to_string();
    // Alice's token is replaced: the file is reloaded within 2 s, the old token refused, and
    // her session answers to the new one (same name, same principal).
    std::fs::write(&tokens, "alice:alice-token-2\nbatch:batch-token\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while call_as(&server, Some("alice-token-2"), json!({"code": "1"})).status() != 200 {
        assert!(
            Instant::now() < deadline,
            "the new token was never accepted"
        );
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        call_as(&server, Some("alice-token-1"), json!({"code": "1"})).status(),
        401
    );
    let resumed = structured(&message(call_as(
        &server,
        Some("alice-token-2"),
        json!({"code": "x + 1", "session_id": id}),
    )))
    .clone();
    assert_eq!(resumed["result"], "42", "{resumed}");
    // The metric label is the name; never a token.
    let (text, _) = crate::metrics::scrape(port.parse().unwrap());
    let calls = |name: &str| {
        text.lines().any(|l| {
            l.starts_with("code_interpreter_mcp_tool_calls_total{")
                && l.contains(&format!("principal=\"{name}\""))
        })
    };
    assert!(calls("alice") && calls("batch"), "{text}");
    assert!(!text.contains("-token"), "{text}");
}
