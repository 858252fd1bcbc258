//! A task that runs past the synchronous cap (120 s) while synchronous calls are served. A module
//! of its own so that it starts mid-suite (libtest starts tests in name order): it sleeps for over
//! two minutes, and as the last test to start it held the whole run up by as long.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::fixture::{Server, call_stateless};
use crate::tasks::{get, settle, start};

#[test]
fn a_task_runs_past_the_synchronous_cap_while_synchronous_calls_are_served() {
    // Past the synchronous cap (120 s); CIM_LONG_TASK_SECONDS sets it (300 before CI had to be
    // brought back under 25 minutes).
    let seconds: u64 = std::env::var("CIM_LONG_TASK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(135);
    let server = Server::start(&[]);
    // Synchronous calls keep the 120 s cap and are told to use a task.
    let refused = call_stateless(&server, json!({"code": "1", "timeout_ms": 200_000}));
    let error = &refused["result"]["structuredContent"]["error"];
    assert_eq!(error["kind"], "validation", "{refused}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("run it as a task"),
        "{refused}"
    );

    let code = format!(
        "import time\nfor i in range({seconds}):\n    print(f'tick {{i}}', flush=True)\n    time.sleep(1)\n'done'"
    );
    let task = start(
        &server,
        json!({"code": code, "timeout_ms": (seconds + 60) * 1000}),
    );
    thread::sleep(Duration::from_millis(2500));
    let state = get(&server, &task);
    assert_eq!(state["status"], "working", "{state}");
    let status = state["statusMessage"].as_str().unwrap();
    assert!(status.starts_with("running for"), "{status}");
    assert!(
        status.contains("tick 0\ntick 1"),
        "the newest output: {status}"
    );
    assert!(state["pollIntervalMs"].as_u64().is_some(), "{state}");

    // A hundred synchronous calls meanwhile, on the worker the task leaves free.
    let served = Instant::now();
    for n in 0..100 {
        let reply = call_stateless(&server, json!({"code": format!("{n} * 2")}));
        assert_eq!(
            reply["result"]["structuredContent"]["result"],
            (n * 2).to_string(),
            "{reply}"
        );
    }
    assert_eq!(
        get(&server, &task)["status"],
        "working",
        "the calls were served while it ran"
    );
    let (state, _) = settle(&server, &task, Duration::from_secs(seconds + 120));
    assert_eq!(state["status"], "completed", "{state}");
    let status = state["statusMessage"].as_str().unwrap();
    assert!(status.starts_with("ran for "), "{status}");
    assert!(
        status.contains(&format!("tick {}", seconds - 1)),
        "{status}"
    );
    let result = &state["result"];
    assert_eq!(result["structuredContent"]["result"], "done", "{state}");
    assert!(result["content"].as_array().is_some_and(|c| !c.is_empty()));
    println!(
        "a {seconds} s task completed; 100 synchronous calls took {:?} meanwhile",
        served.elapsed()
    );
}
