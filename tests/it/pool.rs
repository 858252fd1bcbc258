//! The worker pool through the real server: overload, FIFO queue with progress, queue wait not charged
//! to timeout_ms, cancellation while queued, probes through start-up, drain and worker loss,
//! SIGTERM with running and queued calls, and bearer tokens served in turn.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fixture::{Server, call_stateless, client, post_legacy, send_stateless, tool_call_body};

fn spawn_call(server: &Server, arguments: Value) -> thread::JoinHandle<Value> {
    let url = server.url.clone();
    thread::spawn(move || call_stateless(&url, arguments))
}

fn structured(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

fn get(url: &str) -> Result<(u16, String), reqwest::Error> {
    let r = client().get(url).send()?;
    Ok((r.status().as_u16(), r.text()?))
}

pub(crate) fn sigterm(server: &Server) {
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_full_queue_answers_overload_at_once() {
    let server = Server::start(&[
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_QUEUE_CAPACITY", "1"),
    ]);
    let running = spawn_call(&server, json!({"code": "import time\ntime.sleep(3)\n'a'"}));
    thread::sleep(Duration::from_millis(500));
    let queued = spawn_call(&server, json!({"code": "'b'"}));
    thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let overloaded = call_stateless(&server, json!({"code": "'c'"}));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "overload is immediate"
    );
    assert_eq!(overloaded["result"]["isError"], true);
    assert_eq!(structured(&overloaded)["error"]["kind"], "overload");
    assert!(
        structured(&overloaded)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue is full")
    );
    assert_eq!(structured(&running.join().unwrap())["result"], "a");
    assert_eq!(structured(&queued.join().unwrap())["result"], "b");
}

#[test]
fn queue_wait_is_not_charged_to_timeout_ms() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1")]);
    let running = spawn_call(&server, json!({"code": "import time\ntime.sleep(3)"}));
    thread::sleep(Duration::from_millis(300));
    let queued = call_stateless(&server, json!({"code": "1 + 1", "timeout_ms": 1500}));
    assert_eq!(structured(&queued)["success"], true, "{queued}");
    assert_eq!(structured(&queued)["result"], "2");
    assert_eq!(structured(&running.join().unwrap())["success"], true);
}

/// All JSON-RPC messages of an SSE response, in order.
fn stream_messages(response: reqwest::blocking::Response) -> Vec<Value> {
    let body = response.text().unwrap();
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str(d.trim()).ok())
        .collect()
}

fn call_with_token(url: &str, token: &str, code: &str) -> Vec<Value> {
    let body = tool_call_body("run_python_code", json!({"code": code}), Some(token));
    stream_messages(
        send_stateless(&client(), url, "tools/call", Some("run_python_code"), &body).unwrap(),
    )
}

fn progress_messages(messages: &[Value], token: &str) -> Vec<String> {
    messages
        .iter()
        .filter(|m| {
            m["method"] == "notifications/progress" && m["params"]["progressToken"] == token
        })
        .map(|m| m["params"]["message"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn queued_calls_get_their_position_and_running_calls_a_heartbeat() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1")]);
    let url = server.url.clone();
    let running =
        thread::spawn(move || call_with_token(&url, "run", "import time\ntime.sleep(8)\n'done'"));
    thread::sleep(Duration::from_millis(500));
    let queued = call_with_token(&server.url, "wait", "'second'");
    let notices = progress_messages(&queued, "wait");
    assert!(
        notices.len() >= 2,
        "a notice after 1 s and another 5 s later while queued: {notices:?}"
    );
    assert!(
        notices.iter().all(|n| n.contains("queued: position 1")),
        "{notices:?}"
    );
    let result = queued.iter().find(|m| m["id"] == 7).expect("the result");
    assert_eq!(result["result"]["structuredContent"]["result"], "second");

    let first = running.join().unwrap();
    let heartbeats = progress_messages(&first, "run");
    assert!(
        heartbeats.iter().any(|n| n.starts_with("running for")),
        "{heartbeats:?}"
    );
    // Progress values only increase.
    let values: Vec<f64> = first
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| m["params"]["progress"].as_f64().unwrap())
        .collect();
    assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
}

#[test]
fn cancelling_a_queued_call_removes_it_from_the_queue() {
    let server = Server::start(&[
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_QUEUE_CAPACITY", "1"),
    ]);
    let http = client();
    let post = |session: Option<&str>, body: Value| {
        post_legacy(&http, &server.url, session, "2025-06-18", body)
    };
    let init = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "it", "version": "1"}}}),
    );
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );

    let call = |id: u64, code: &str| {
        let url = server.url.clone();
        let session = session.clone();
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "run_python_code", "arguments": {"code": code}}});
        thread::spawn(move || {
            client()
                .post(&url)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("Mcp-Session-Id", &session)
                .header("MCP-Protocol-Version", "2025-06-18")
                .body(body.to_string())
                .send()
                .ok()
                .and_then(|r| r.text().ok())
        })
    };
    let running = call(2, "import time\ntime.sleep(4)\n'a'");
    thread::sleep(Duration::from_millis(500));
    let _cancelled = call(3, "'b'");
    thread::sleep(Duration::from_millis(500));
    let ack = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3, "reason": "test"}}),
    );
    assert!(ack.status().is_success());
    thread::sleep(Duration::from_millis(300));
    // With the cancelled call gone, the single queue slot is free again.
    let after = call(4, "'c'").join().unwrap().expect("a response");
    let reply: Value = after
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == 4)
        .unwrap_or_else(|| panic!("{after}"));
    assert_eq!(
        reply["result"]["structuredContent"]["result"], "c",
        "{reply}"
    );
    assert!(running.join().unwrap().unwrap().contains("\\\"a\\\""));
}

#[test]
fn probes_refuse_then_pass_through_start_up_and_accept_any_host() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base = format!("http://127.0.0.1:{port}");
    let mut child = crate::common::server_command()
        .env(
            "CODE_INTERPRETER_MCP_BIND_ADDR",
            format!("127.0.0.1:{port}"),
        )
        .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "1")
        .env(
            "CODE_INTERPRETER_MCP_PACKAGE_BASE_URL",
            crate::common::package_mirror(),
        )
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server::adopt(child_take(&mut child), format!("{base}/mcp"));
    let started = Instant::now();
    let first = get(&format!("{base}/readyz"));
    assert!(
        first.is_err(),
        "nothing listens while Pyodide initialises: {first:?}"
    );
    let mut refused = 1;
    loop {
        match get(&format!("{base}/readyz")) {
            Ok((200, body)) => {
                assert_eq!(body, "ok");
                break;
            }
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => refused += 1,
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never became ready"
        );
        thread::sleep(Duration::from_millis(50));
    }
    assert!(refused > 1);
    assert_eq!(get(&format!("{base}/livez")).unwrap(), (200, "ok".into()));
    // Pod-IP Host headers work on probes, while /mcp keeps verifying Host.
    let r = client()
        .get(format!("{base}/readyz"))
        .header("Host", "10.1.2.3:8000")
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client()
        .post(format!("{base}/mcp"))
        .header("Host", "10.1.2.3:8000")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body("{}")
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);
    drop(server);
}

fn child_take(child: &mut std::process::Child) -> std::process::Child {
    std::mem::replace(child, Command::new("true").spawn().unwrap())
}

#[test]
fn a_failed_initialisation_never_binds() {
    let dir = std::env::temp_dir().join(format!("cim-bad-assets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = crate::common::server_command()
        .env("CODE_INTERPRETER_MCP_BIND_ADDR", "127.0.0.1:0")
        .env("CODE_INTERPRETER_MCP_ASSET_DIR", &dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "no announcement");
    // Assets that pass the start-up checks but cannot boot Python: the prewarmed worker's failure stops
    // start-up before anything listens.
    let real = code_interpreter_mcp::assets::Assets::default_dir();
    for f in code_interpreter_mcp::assets::REQUIRED_FILES {
        std::fs::copy(real.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("python_stdlib.zip"), b"not a zip archive").unwrap();
    for (boot, expected) in [
        ("snapshot", "taking the Pyodide memory snapshot failed"),
        ("full", "prewarmed worker 0 failed to initialise Pyodide"),
    ] {
        let out = crate::common::server_command()
            .env("CODE_INTERPRETER_MCP_BIND_ADDR", "127.0.0.1:0")
            .env("CODE_INTERPRETER_MCP_ASSET_DIR", &dir)
            .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "1")
            .env("CODE_INTERPRETER_MCP_WORKERS_BOOT", boot)
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0));
        assert!(out.stdout.is_empty(), "no announcement");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{err}");
        assert!(err.contains("Fatal Python error"), "{err}");
    }
}

#[test]
fn worker_panics_are_counted_and_the_rest_keep_serving() {
    let server = Server::start(&[
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "2"),
        ("CODE_INTERPRETER_MCP_TEST_PANIC_MARKER", "__cim_panic__"),
    ]);
    let base = server.base();
    let lost = call_stateless(&server, json!({"code": "'__cim_panic__'"}));
    assert_eq!(structured(&lost)["error"]["kind"], "runtime");
    assert_eq!(structured(&lost)["error"]["type"], "WorkerLost");
    assert_eq!(get(&format!("{base}/livez")).unwrap().0, 200);
    assert_eq!(
        get(&format!("{base}/readyz")).unwrap().0,
        200,
        "one worker left"
    );
    assert_eq!(
        structured(&call_stateless(&server, json!({"code": "7"})))["result"],
        "7"
    );

    call_stateless(&server, json!({"code": "'__cim_panic__'"}));
    assert_eq!(
        get(&format!("{base}/livez")).unwrap(),
        (503, "unavailable".into())
    );
    assert_eq!(
        get(&format!("{base}/readyz")).unwrap(),
        (503, "unavailable".into())
    );
}

#[test]
fn sigterm_drains_running_calls_cancels_queued_ones_and_exits() {
    let mut server = Server::start(&[
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_QUEUE_CAPACITY", "2"),
    ]);
    let base = server.base();
    let running = spawn_call(
        &server,
        json!({"code": "import time\ntime.sleep(4)\n'finished'"}),
    );
    thread::sleep(Duration::from_millis(500));
    let queued_a = spawn_call(&server, json!({"code": "'a'"}));
    let queued_b = spawn_call(&server, json!({"code": "'b'"}));
    thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    sigterm(&server);
    thread::sleep(Duration::from_millis(200));

    assert_eq!(
        get(&format!("{base}/readyz")).unwrap(),
        (503, "unavailable".into())
    );
    assert_eq!(get(&format!("{base}/livez")).unwrap(), (200, "ok".into()));
    let rejected = call_stateless(&server, json!({"code": "'late'"}));
    assert_eq!(structured(&rejected)["error"]["kind"], "runtime");
    assert!(
        structured(&rejected)["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down")
    );

    for queued in [queued_a, queued_b] {
        let reply = queued.join().unwrap();
        assert_eq!(structured(&reply)["error"]["kind"], "runtime", "{reply}");
        assert_eq!(structured(&reply)["error"]["type"], "ServerShuttingDown");
    }
    let finished = running.join().unwrap();
    assert_eq!(structured(&finished)["result"], "finished", "{finished}");

    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(31),
            "exit within the deadline"
        );
        thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

/// The queue serves principals in turn (the measurement): while Alice keeps 50 calls
/// queued on the only worker, Bob's calls wait for the running call at most: the p50 and p90 of
/// his call times grow by no more than about one of her calls (in a first-come queue he would
/// wait for all fifty, 5 s of sleeping alone).
#[test]
fn one_principals_fifty_queued_calls_cost_another_at_most_one_call() {
    let dir = crate::common::temp_dir("fair-tokens");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "alice-token\nbob-token\n").unwrap();
    let server = Server::start(&[
        (
            "CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE",
            tokens.to_str().unwrap(),
        ),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_WORKERS_QUEUE_CAPACITY", "64"),
    ]);
    let call = |url: String, token: &'static str, code: &'static str| {
        move || {
            let body = tool_call_body("run_python_code", json!({"code": code}), None);
            let started = Instant::now();
            let reply = client()
                .post(&url)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("MCP-Protocol-Version", "2026-07-28")
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", "run_python_code")
                .header("Authorization", format!("Bearer {token}"))
                .body(body.to_string())
                .send()
                .unwrap();
            (
                structured(&crate::fixture::message(reply)).clone(),
                started.elapsed(),
            )
        }
    };
    let percentiles = |mut times: Vec<Duration>| {
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        (at(0.5), at(0.9))
    };
    let bob = |n: usize| -> Vec<Duration> {
        (0..n)
            .map(|_| {
                let (r, took) = call(server.url.clone(), "bob-token", "1 + 1")();
                assert_eq!(r["result"], "2", "{r}");
                took
            })
            .collect()
    };
    // Bob alone (his first call pays nothing extra: the worker is prewarmed).
    bob(2);
    let (alone_50, alone_90) = percentiles(bob(10));
    // Alice's 50 calls of 0.1 s, all queued behind one another.
    let started = Instant::now();
    let alice: Vec<_> = (0..50)
        .map(|_| {
            thread::spawn(call(
                server.url.clone(),
                "alice-token",
                "import time\ntime.sleep(0.1)\n'alice'",
            ))
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    let burst = Instant::now();
    let (loaded_50, loaded_90) = percentiles(bob(10));
    let burst = (burst, Instant::now());
    let mut alice_times = Vec::new();
    let mut alice_during = 0;
    for handle in alice {
        let (r, took) = handle.join().unwrap();
        assert_eq!(r["result"], "alice", "{r}");
        // (Every call of hers was sent at `started`, about `took` before it ended.)
        let ended = started + took;
        alice_during += usize::from(burst.0 < ended && ended <= burst.1);
        alice_times.push(took);
    }
    // Bob's calls come back to back, each sent when the last returns: they alternate with Alice's
    // rather than going first every time (he is not owed the turns he did not take).
    assert!(
        alice_during >= 5,
        "only {alice_during} of alice's calls ended during bob's 10: bob went first every time"
    );
    let (_, alice_90) = percentiles(alice_times.clone());
    let alice_last = alice_times.iter().max().copied().unwrap();
    println!(
        "bob alone p50 {alone_50:?} p90 {alone_90:?}; with alice's 50 queued p50 {loaded_50:?} \
p90 {loaded_90:?}; alice's last call ended after {alice_last:?}"
    );
    assert!(
        alice_last > Duration::from_millis(5000),
        "alice's calls ran one at a time behind each other: {alice_times:?} (p90 {alice_90:?})"
    );
    // One of Alice's calls on the worker (her sleep, a sandbox's start, her result), measured: the
    // worker ran her 50 (and Bob's 10) back to back.
    let one_call = alice_last / 50;
    let (extra_50, extra_90) = (
        loaded_50.saturating_sub(alone_50),
        loaded_90.saturating_sub(alone_90),
    );
    println!("one of alice's calls: {one_call:?}; bob's extra p50 {extra_50:?}, p90 {extra_90:?}");
    // p50: at most the rest of the call running when he comes (1.1 x and 50 ms of slack); p90 may
    // also pay a sandbox start of his own (the ready stock is spent under load): two calls' time.
    assert!(
        extra_50 <= one_call.mul_f64(1.1) + Duration::from_millis(50)
            && extra_90 <= one_call * 2 + Duration::from_millis(50),
        "bob waited more than one of alice's calls: alone {alone_50:?}/{alone_90:?}, loaded \
{loaded_50:?}/{loaded_90:?}, one call {one_call:?}"
    );
}
