//! Long-running work over real HTTP: run_python_code as an MCP task (SEP-2663) in both protocol
//! eras — created at once for a client that declares the extension, polled with tasks/get (status
//! message with the newest output), past the synchronous cap while synchronous calls are served (long_task.rs),
//! cancelled within a second (a session's code interrupted, the session kept), expired after its
//! TTL, invisible to other bearer tokens, queued behind `tasks.max_running` with their position in
//! the status — and output streamed as progress notifications while a
//! synchronous call runs.

use std::io::{BufRead, BufReader};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fixture::{Server, call_stateless, client, message, stateless_meta};
use crate::metrics::{free_port, scrape, value};

const TASKS: &str = "io.modelcontextprotocol/tasks";

/// The `_meta` of a 2026-07-28 request from a client that declares the tasks extension.
fn task_meta() -> Value {
    let mut meta = stateless_meta();
    meta["io.modelcontextprotocol/clientCapabilities"] = json!({"extensions": {TASKS: {}}});
    meta
}

/// A 2026-07-28 request of a tasks-declaring client (with `token` as its bearer token, if any).
pub(crate) fn request(server: &Server, method: &str, params: Value, token: Option<&str>) -> Value {
    let mut params = params;
    params["_meta"] = task_meta();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut http = client()
        .post(&server.url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method);
    if let Some(task) = params["taskId"].as_str() {
        http = http.header("Mcp-Name", task);
    }
    if method == "tools/call" {
        http = http.header("Mcp-Name", "run_python_code");
        if let Some(session) = params["arguments"]["session_id"].as_str() {
            http = http.header("Mcp-Param-Session-Id", session);
        }
    }
    if let Some(token) = token {
        http = http.header("Authorization", format!("Bearer {token}"));
    }
    message(http.body(body.to_string()).send().unwrap())
}

/// Starts `arguments` as a task; its id.
pub(crate) fn start(server: &Server, arguments: Value) -> String {
    let reply = request(
        server,
        "tools/call",
        json!({"name": "run_python_code", "arguments": arguments}),
        None,
    );
    let result = &reply["result"];
    assert_eq!(result["resultType"], "task", "{reply}");
    assert_eq!(result["status"], "working", "{reply}");
    assert!(
        result.get("task").is_none(),
        "a flat CreateTaskResult: {reply}"
    );
    result["taskId"].as_str().unwrap().to_string()
}

pub(crate) fn get(server: &Server, task: &str) -> Value {
    request(server, "tasks/get", json!({"taskId": task}), None)["result"].clone()
}

/// Polls `task` until its status is no longer `working`; the final state and how long it took.
pub(crate) fn settle(server: &Server, task: &str, within: Duration) -> (Value, Duration) {
    let started = Instant::now();
    loop {
        let state = get(server, task);
        if state["status"] != "working" {
            return (state, started.elapsed());
        }
        assert!(started.elapsed() < within, "still working: {state}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_cancelled_task_ends_within_a_second_and_a_session_survives() {
    // Two workers: one task runs at a time, the next waits in the tasks' queue.
    let server = Server::start(&[("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "2")]);
    let task = start(
        &server,
        json!({"code": "while True:\n    pass", "timeout_ms": 600_000}),
    );
    thread::sleep(Duration::from_millis(1500));
    let queued = start(&server, json!({"code": "'second'"}));
    thread::sleep(Duration::from_millis(700));
    let state = get(&server, &queued);
    assert_eq!(state["status"], "working", "{state}");
    assert_eq!(
        state["statusMessage"], "queued: position 1 of 1 waiting for a running slot",
        "{state}"
    );
    let ack = request(&server, "tasks/cancel", json!({"taskId": task}), None);
    assert!(ack.get("error").is_none(), "{ack}");
    let (state, took) = settle(&server, &task, Duration::from_secs(5));
    assert_eq!(state["status"], "cancelled", "{state}");
    assert!(took <= Duration::from_secs(1), "{took:?}");
    let status = state["statusMessage"].as_str().unwrap();
    assert!(status.starts_with("cancelled after "), "{status}");
    // The queued task then runs.
    let (state, _) = settle(&server, &queued, Duration::from_secs(30));
    assert_eq!(
        state["result"]["structuredContent"]["result"], "second",
        "{state}"
    );
    // Cancelling again is acknowledged the same way.
    let again = request(&server, "tasks/cancel", json!({"taskId": task}), None);
    assert!(again.get("error").is_none(), "{again}");

    // In a session: the code is interrupted and the session keeps its state.
    let created = call_stateless(&server, json!({"code": "kept = 41", "session_id": "new"}));
    let id = created["result"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let task = start(
        &server,
        json!({"code": "import time\nwhile True:\n    time.sleep(0.1)", "session_id": id, "timeout_ms": 600_000}),
    );
    thread::sleep(Duration::from_millis(1500));
    request(&server, "tasks/cancel", json!({"taskId": task}), None);
    let (state, took) = settle(&server, &task, Duration::from_secs(5));
    assert_eq!(state["status"], "cancelled", "{state}");
    assert!(took <= Duration::from_secs(1), "{took:?}");
    let after = call_stateless(&server, json!({"code": "kept + 1", "session_id": id}));
    assert_eq!(
        after["result"]["structuredContent"]["result"], "42",
        "{after}"
    );
}

#[test]
fn tasks_expire_are_bounded_and_visible_only_to_their_token() {
    let dir = crate::common::temp_dir("task-tokens");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "alice\nbob\n").unwrap();
    let port = free_port().to_string();
    let server = Server::start(&[
        (
            "CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE",
            tokens.to_str().unwrap(),
        ),
        ("CODE_INTERPRETER_MCP_TASKS_TTL_S", "2"),
        ("CODE_INTERPRETER_MCP_TASKS_QUEUE_CAPACITY", "0"),
        // (Every call a task at once, however short.)
        ("CODE_INTERPRETER_MCP_TASKS_IMMEDIATE_RESULT_MS", "0"),
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "2"),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        ),
        ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port),
    ]);
    let metric = |series: &str| value(&scrape(port.parse().unwrap()).1, series);
    let call = |code: &str, token: &str| {
        request(
            &server,
            "tools/call",
            json!({"name": "run_python_code", "arguments": {"code": code, "timeout_ms": 60000}}),
            Some(token),
        )
    };
    let created = call("import time\ntime.sleep(1)\n6 * 7", "alice");
    let task = created["result"]["taskId"].as_str().unwrap().to_string();
    // The one running slot is taken and no task may wait: the next is the overload error, at once.
    let refused = call("1", "alice");
    assert_eq!(
        refused["result"]["structuredContent"]["error"]["kind"], "overload",
        "{refused}"
    );
    for (token, id) in [("bob", task.as_str()), ("alice", "no-such-task")] {
        for method in ["tasks/get", "tasks/cancel"] {
            let reply = request(&server, method, json!({"taskId": id}), Some(token));
            assert_eq!(reply["error"]["code"], -32602, "{method} {token}: {reply}");
            // The same answer as for an unknown id, which the error (logged by rmcp) shortens.
            assert!(!reply.to_string().contains(id), "{reply}");
            assert!(
                reply["error"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("unknown task: \"")
            );
        }
    }
    let started = Instant::now();
    let state = loop {
        let state =
            request(&server, "tasks/get", json!({"taskId": task}), Some("alice"))["result"].clone();
        if state["status"] != "working" {
            break state;
        }
        thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["result"]["structuredContent"]["result"], "42");
    assert_eq!(state["ttlMs"], 2000);
    assert_eq!(
        metric(r#"code_interpreter_mcp_tasks_ended_total{status="completed"}"#),
        1.0
    );
    assert_eq!(
        metric(r#"code_interpreter_mcp_tasks{state="working"}"#),
        0.0
    );
    // Kept for a TTL after it ended, then gone.
    while started.elapsed() < Duration::from_secs(6) {
        thread::sleep(Duration::from_millis(200));
    }
    let gone = request(&server, "tasks/get", json!({"taskId": task}), Some("alice"));
    assert_eq!(gone["error"]["code"], -32602, "{gone}");
    // A task still running at its TTL fails.
    let long = call("import time\ntime.sleep(30)", "alice");
    let long = long["result"]["taskId"].as_str().unwrap().to_string();
    thread::sleep(Duration::from_millis(2500));
    let state =
        request(&server, "tasks/get", json!({"taskId": long}), Some("alice"))["result"].clone();
    assert_eq!(state["status"], "failed", "{state}");
    // (The expired task's future is dropped just after the poll that found it expired.)
    let failed = r#"code_interpreter_mcp_tasks_ended_total{status="failed"}"#;
    let polled = Instant::now();
    while metric(failed) < 1.0 && polled.elapsed() < Duration::from_secs(3) {
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(metric(failed), 1.0);
    assert_eq!(
        metric(r#"code_interpreter_mcp_tasks{state="working"}"#),
        0.0
    );
    assert_eq!(
        metric(r#"code_interpreter_mcp_task_duration_seconds_count{status="completed"}"#),
        1.0
    );
}

#[test]
fn a_short_call_of_a_tasks_client_is_answered_inline_and_a_long_one_becomes_a_task() {
    let server = Server::start(&[]);
    let tools_call = |arguments: Value| {
        request(
            &server,
            "tools/call",
            json!({"name": "run_python_code", "arguments": arguments}),
            None,
        )
    };
    // print(1), back to back, from a client that declared tasks and from one that did not.
    let mut with_tasks = Vec::new();
    let mut without = Vec::new();
    for _ in 0..20 {
        let began = Instant::now();
        let reply = tools_call(json!({"code": "print(1)"}));
        with_tasks.push(began.elapsed());
        assert_eq!(
            reply["result"]["structuredContent"]["stdout"], "1\n",
            "{reply}"
        );
        assert!(
            reply["result"]
                .get("resultType")
                .is_none_or(|t| t != "task"),
            "{reply}"
        );
        let began = Instant::now();
        let reply = call_stateless(&server, json!({"code": "print(1)"}));
        without.push(began.elapsed());
        assert_eq!(
            reply["result"]["structuredContent"]["stdout"], "1\n",
            "{reply}"
        );
    }
    with_tasks.sort();
    without.sort();
    println!(
        "print(1) p50 (debug build): declared tasks {:?}, did not {:?}",
        with_tasks[10], without[10]
    );
    assert!(
        with_tasks[10] < without[10] * 3 + Duration::from_millis(50),
        "no poll interval for a short call: {:?} vs {:?}",
        with_tasks[10],
        without[10]
    );
    // Past the window (1 s): a task, carrying on with the same running call.
    let began = Instant::now();
    let task = start(
        &server,
        json!({"code": "import time\nprint('before', flush=True)\ntime.sleep(2)\n'done'"}),
    );
    let waited = began.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(1900),
        "{waited:?}"
    );
    let (state, _) = settle(&server, &task, Duration::from_secs(20));
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["result"]["structuredContent"]["result"], "done");
    assert_eq!(state["result"]["structuredContent"]["stdout"], "before\n");
    // A call allowed more than the synchronous cap is a task at once.
    let began = Instant::now();
    let task = start(&server, json!({"code": "1", "timeout_ms": 200_000}));
    assert!(
        began.elapsed() < Duration::from_millis(800),
        "{:?}",
        began.elapsed()
    );
    let (state, _) = settle(&server, &task, Duration::from_secs(20));
    assert_eq!(state["status"], "completed", "{state}");
}

#[test]
fn an_expired_task_stops_its_code_and_frees_its_worker_unpolled() {
    let port = free_port().to_string();
    let server = Server::start(&[
        ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1"),
        ("CODE_INTERPRETER_MCP_TASKS_TTL_S", "2"),
        (
            "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
            "true",
        ),
        ("CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT", &port),
    ]);
    let metric = |series: &str| value(&scrape(port.parse().unwrap()).1, series);
    let task = start(
        &server,
        json!({"code": "while True:\n    pass", "timeout_ms": 600_000}),
    );
    // Past its TTL, never polled: it has failed on its own and the one worker is free.
    thread::sleep(Duration::from_millis(2600));
    assert_eq!(
        metric(r#"code_interpreter_mcp_tasks_ended_total{status="failed"}"#),
        1.0
    );
    let began = Instant::now();
    let reply = call_stateless(&server, json!({"code": "6 * 7"}));
    assert_eq!(
        reply["result"]["structuredContent"]["result"], "42",
        "{reply}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "the worker was held: {:?}",
        began.elapsed()
    );
    // (rmcp keeps the expired entry until asked: then it answers failed, or forgets it.)
    let reply = request(&server, "tasks/get", json!({"taskId": task}), None);
    if let Some(state) = reply.get("result") {
        assert_eq!(state["status"], "failed", "{reply}");
    } else {
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
    }
}

#[test]
fn legacy_clients_that_declare_the_extension_get_synchronous_calls() {
    let server = Server::start(&[]);
    let http = client();
    let init = http
        .post(&server.url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {"extensions": {TASKS: {}}},
                "clientInfo": {"name": "it", "version": "1"}}})
            .to_string(),
        )
        .send()
        .unwrap();
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let init = message(init);
    assert!(
        init["result"]["capabilities"]["extensions"][TASKS].is_object(),
        "the server declares the extension: {init}"
    );
    let post = |id: u64, method: &str, params: Value| {
        message(
            http.post(&server.url)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("Mcp-Session-Id", &session)
                .header("MCP-Protocol-Version", "2025-11-25")
                .body(
                    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                        .to_string(),
                )
                .send()
                .unwrap(),
        )
    };
    http.post(&server.url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Session-Id", &session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .body(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string())
        .send()
        .unwrap();
    // Calls are answered inline however long they take: no client of this era tried handles a
    // task it did not ask for (the Inspector CLI 2.12.0 declares the extension and fails on one).
    let inline = post(
        5,
        "tools/call",
        json!({"name": "run_python_code", "arguments": {"code": "6 * 7"}}),
    );
    assert_eq!(
        inline["result"]["structuredContent"]["result"], "42",
        "{inline}"
    );
    let long = post(
        2,
        "tools/call",
        json!({"name": "run_python_code", "arguments": {"code": "import time\ntime.sleep(1.5)\nprint('hello')\n7"}}),
    );
    assert!(long["result"].get("taskId").is_none(), "{long}");
    assert_eq!(long["result"]["structuredContent"]["result"], "7", "{long}");
    assert_eq!(
        long["result"]["structuredContent"]["stdout"], "hello\n",
        "{long}"
    );
}

#[test]
fn output_streams_as_progress_before_the_call_ends() {
    let server = Server::start(&[]);
    let code = "import time\nfor i in range(6):\n    print(f'line {i}', flush=True)\n    time.sleep(0.5)\n'end'";
    let body =
        crate::fixture::tool_call_body("run_python_code", json!({"code": code}), Some("out"));
    let started = Instant::now();
    let response = crate::fixture::send_stateless(
        &client(),
        &server.url,
        "tools/call",
        Some("run_python_code"),
        &body,
    )
    .unwrap();
    // (time of arrival, message) of every event, read as the stream arrives.
    let mut events = Vec::new();
    for line in BufReader::new(response).lines() {
        let line = line.unwrap();
        if let Some(data) = line.strip_prefix("data:")
            && let Ok(message) = serde_json::from_str::<Value>(data.trim())
        {
            let done = message.get("id").is_some();
            events.push((started.elapsed(), message));
            if done {
                break;
            }
        }
    }
    let (ended_at, last) = events.last().unwrap();
    assert_eq!(
        last["result"]["structuredContent"]["result"], "end",
        "{last}"
    );
    assert_eq!(
        last["result"]["structuredContent"]["stdout"],
        "line 0\nline 1\nline 2\nline 3\nline 4\nline 5\n",
        "the result is unchanged"
    );
    let streamed: Vec<(Duration, String)> = events
        .iter()
        .filter(|(_, m)| m["method"] == "notifications/progress")
        .map(|(at, m)| {
            (
                *at,
                m["params"]["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let first = streamed
        .iter()
        .find(|(_, text)| text.contains("line 0"))
        .unwrap_or_else(|| panic!("no streamed output: {events:?}"));
    assert!(
        first.0 + Duration::from_millis(1500) < *ended_at,
        "line 0 came at {:?}, the result at {ended_at:?}",
        first.0
    );
    let all: String = streamed.iter().map(|(_, text)| text.as_str()).collect();
    for n in 0..6 {
        assert!(all.contains(&format!("line {n}\n")), "{all}");
    }
    // Coalesced: at most one notice per 250 ms of the call (plus the last flush).
    let most = usize::try_from(ended_at.as_millis() / 250).unwrap() + 2;
    assert!(
        streamed.len() <= most,
        "{} notices in {ended_at:?}",
        streamed.len()
    );
}

#[test]
fn at_shutdown_a_task_that_cannot_finish_fails_and_pollers_read_why() {
    let server = Server::start(&[]);
    let task = start(
        &server,
        json!({"code": "import time\ntime.sleep(300)", "timeout_ms": 600_000}),
    );
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(get(&server, &task)["status"], "working");
    crate::pool::sigterm(&server);
    // The server drains: the task may still finish until shortly before the 30 s deadline, then it
    // is stopped and fails with the shutdown error, which tasks/get returns before HTTP closes.
    let started = Instant::now();
    let mut last = Value::Null;
    while started.elapsed() < Duration::from_secs(40) {
        let reply = client()
            .post(&server.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tasks/get")
            .header("Mcp-Name", &task)
            .body(
                json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                    "params": {"taskId": task, "_meta": task_meta()}})
                .to_string(),
            )
            .send();
        let Ok(reply) = reply else { break };
        let state = message(reply)["result"].clone();
        if state["status"] == "failed" {
            last = state;
            break;
        }
        assert_eq!(state["status"], "working", "{state}");
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        last["status"], "failed",
        "the failure was readable before exit"
    );
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("shutting down"), "{last}");
    assert!(
        last["statusMessage"]
            .as_str()
            .is_some_and(|m| m.starts_with("stopped by the shutdown after")),
        "{last}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(29),
        "stopped before the deadline: {:?}",
        started.elapsed()
    );
}

/// Tasks waiting for a running slot are served in turn between bearer tokens: while one token has
/// five tasks queued behind the only slot, another token's task runs after the running one (in
/// arrival order it would wait for all five, 3 s of sleeping).
#[test]
fn a_tokens_queued_tasks_do_not_hold_up_another_tokens_task() {
    let dir = crate::common::temp_dir("task-fair-tokens");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "alice\nbob\n").unwrap();
    let server = Server::start(&[
        (
            "CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE",
            tokens.to_str().unwrap(),
        ),
        ("CODE_INTERPRETER_MCP_TASKS_IMMEDIATE_RESULT_MS", "0"),
        ("CODE_INTERPRETER_MCP_TASKS_MAX_RUNNING", "1"),
    ]);
    let start_as = |token: &str, code: &str| {
        let reply = request(
            &server,
            "tools/call",
            json!({"name": "run_python_code", "arguments": {"code": code, "timeout_ms": 60000}}),
            Some(token),
        );
        reply["result"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("{reply}"))
            .to_string()
    };
    let settle_as = |token: &str, task: &str| loop {
        let state =
            request(&server, "tasks/get", json!({"taskId": task}), Some(token))["result"].clone();
        if state["status"] != "working" {
            return (state, Instant::now());
        }
        thread::sleep(Duration::from_millis(20));
    };
    let alice: Vec<String> = (0..5)
        .map(|_| start_as("alice", "import time\ntime.sleep(0.6)\n'alice'"))
        .collect();
    thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    let bob = start_as("bob", "6 * 7");
    let (state, bob_done) = settle_as("bob", &bob);
    assert_eq!(state["status"], "completed", "{state}");
    let waited = bob_done - asked;
    let (state, alice_done) = settle_as("alice", &alice[4]);
    assert_eq!(state["status"], "completed", "{state}");
    println!(
        "bob's task took {waited:?}; alice's last ended {:?} after bob asked",
        alice_done - asked
    );
    assert!(
        waited < Duration::from_millis(2000),
        "bob's task waited behind alice's: {waited:?}"
    );
    assert!(alice_done > bob_done, "alice's last task ran after bob's");
}
