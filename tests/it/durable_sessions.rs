//! Durable sessions through the real server: a session spilled to the store when idle and resumed
//! by its next call, forked, kept through a restart (SIGTERM saves it), resumed by another replica
//! sharing an S3-compatible store (moto) and handed back on demand, refused with the reason when it holds a JavaScript object,
//! and kept in memory when the store's disk is full.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::temp_dir;
use crate::fixture::{Server, call_stateless, call_tool_stateless};

fn in_session(server: &Server, session: &str, code: &str) -> Value {
    let reply = call_stateless(server, json!({"code": code, "session_id": session}));
    reply["result"]["structuredContent"].clone()
}

fn images(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".img"))
            .count()
    })
}

/// Waits until `dir` holds `n` images.
fn wait_for_images(dir: &Path, n: usize) {
    let started = Instant::now();
    while images(dir) != n {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} images, expected {n}",
            images(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(server: Server) {
    crate::pool::sigterm(&server);
    let mut server = server;
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_session_is_spilled_resumed_forked_and_kept_through_a_restart() {
    let store = temp_dir("durable-store");
    let store_url = store.display().to_string();
    let envs = [
        (
            "CODE_INTERPRETER_MCP_SESSIONS_STORE_URL",
            store_url.as_str(),
        ),
        ("CODE_INTERPRETER_MCP_SESSIONS_SPILL_AFTER_S", "1"),
    ];
    let server = Server::start(&envs);
    let r = in_session(
        &server,
        "new",
        "x = 41\ndef f(n): return n + x\nopen('kept.txt', 'w').write('kept')",
    );
    assert_eq!(r["success"], true, "{r}");
    let id = r["session_id"].as_str().unwrap().to_string();
    assert_eq!(r["session"]["id"], id.as_str());
    assert_eq!(r["session"]["durable"], true, "{r}");
    // Idle past spill_after_s: saved to the store, out of memory.
    wait_for_images(&store, 1);
    let r = in_session(&server, &id, "(f(1), open('kept.txt').read())");
    assert_eq!(r["result"], "(42, 'kept')", "resumed: {r}");

    // A fork is a copy that goes its own way.
    let fork = call_tool_stateless(&server, "fork_session", json!({"session_id": id}));
    let fork = &fork["result"]["structuredContent"];
    assert_eq!(fork["success"], true, "{fork}");
    let copy = fork["session_id"].as_str().unwrap().to_string();
    assert_ne!(copy, id);
    let r = in_session(
        &server,
        &copy,
        "x = 0\nopen('kept.txt', 'w').write('copy')\nf(1)",
    );
    assert_eq!(r["result"], "1", "{r}");
    let r = in_session(&server, &id, "(f(1), open('kept.txt').read())");
    assert_eq!(
        r["result"], "(42, 'kept')",
        "the original is untouched: {r}"
    );

    // A session holding a JavaScript object says so, and why.
    let r = in_session(&server, "new", "import js\no = js.Object.new()\no.a = 1");
    assert_eq!(r["session"]["durable"], false, "{r}");
    let reason = r["session"]["reason"].as_str().unwrap();
    assert!(reason.contains("JavaScript object"), "{reason}");
    let pinned = r["session_id"].as_str().unwrap().to_string();
    // So does one with an asyncio task still pending (its timer is JavaScript's), until it is done.
    let r = in_session(
        &server,
        "new",
        "import asyncio\ntask = asyncio.ensure_future(asyncio.sleep(3600))",
    );
    assert_eq!(r["session"]["durable"], false, "{r}");
    let reason = r["session"]["reason"].as_str().unwrap();
    assert!(reason.contains("asyncio"), "{reason}");
    let waiting = r["session_id"].as_str().unwrap().to_string();
    let r = in_session(
        &server,
        &waiting,
        "task.cancel()\nawait asyncio.sleep(0)\ntask.cancelled()",
    );
    assert_eq!(r["result"], "True", "{r}");
    assert_eq!(r["session"]["durable"], true, "{r}");
    let refused = call_tool_stateless(&server, "fork_session", json!({"session_id": pinned}));
    let refused = &refused["result"]["structuredContent"];
    assert_eq!(refused["error"]["type"], "SessionNotDurable", "{refused}");

    // SIGTERM saves what it can; a new process on the same store resumes it.
    in_session(&server, &id, "x = 100");
    stop(server);
    let server = Server::start(&envs);
    let r = in_session(&server, &id, "(f(1), open('kept.txt').read())");
    assert_eq!(r["result"], "(101, 'kept')", "after the restart: {r}");
    let r = in_session(&server, &copy, "open('kept.txt').read()");
    assert_eq!(r["result"], "copy", "{r}");
    // The pinned session ended with the process, and its next call hears why.
    let r = in_session(&server, &pinned, "o");
    assert_eq!(r["error"]["type"], "SessionNotFound", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("JavaScript object"), "{message}");
    // Clearing deletes the image.
    let before = images(&store);
    let cleared = call_tool_stateless(&server, "clear_session", json!({"session_id": id}));
    assert_eq!(cleared["result"]["structuredContent"]["success"], true);
    wait_for_images(&store, before - 1);
}

/// The one image in `dir`.
fn the_image(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "img"))
        .expect("an image")
}

/// Waits until the image at `path` is no longer `old` (the session was saved again).
fn wait_for_change(path: &Path, old: &[u8]) {
    let started = Instant::now();
    while std::fs::read(path).is_ok_and(|now| now == old) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not saved again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_image_put_back_or_replaced_by_a_fifo_is_refused_at_once() {
    let store = temp_dir("durable-replay");
    let store_url = store.display().to_string();
    let envs = [
        (
            "CODE_INTERPRETER_MCP_SESSIONS_STORE_URL",
            store_url.as_str(),
        ),
        ("CODE_INTERPRETER_MCP_SESSIONS_SPILL_AFTER_S", "1"),
    ];
    let server = Server::start(&envs);
    let id = in_session(&server, "new", "x = 1")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for_images(&store, 1);
    let path = the_image(&store);
    let first = std::fs::read(&path).unwrap();
    assert_eq!(in_session(&server, &id, "x = 2\nx")["result"], "2");
    wait_for_change(&path, &first);
    let second = std::fs::read(&path).unwrap();
    // x = 1 saved, then x = 2 saved, then the first file put back: refused, not rolled back.
    std::fs::write(&path, &first).unwrap();
    let r = in_session(&server, &id, "x");
    assert_eq!(r["error"]["type"], "SessionUnrestorable", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("older one"), "{message}");

    // Another process, the newer image back and the older one put back again: refused too (the
    // generation is recorded beside the image).
    stop(server);
    let server = Server::start(&envs);
    std::fs::write(&path, &second).unwrap();
    std::fs::write(&path, &first).unwrap();
    let r = in_session(&server, &id, "x");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("older one"), "{r}");

    // A FIFO in place of an image: an error at once, and the shutdown is not held.
    let other = in_session(&server, "new", "y = 1")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let started = Instant::now();
    while images(&store) < 2 {
        assert!(started.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(50));
    }
    let fifo = std::fs::read_dir(&store)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "img") && *p != path)
        .unwrap();
    std::fs::remove_file(&fifo).unwrap();
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let asked = Instant::now();
    let r = in_session(&server, &other, "y");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("not a regular file"), "{r}");
    let stopping = Instant::now();
    stop(server);
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopping.elapsed()
    );
}

#[test]
fn a_full_disk_keeps_the_session_in_memory_and_working() {
    let store = temp_dir("durable-full");
    std::fs::create_dir_all(&store).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&store)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a 1 MiB tmpfs needs root");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&store);
    let store_url = store.display().to_string();
    let server = Server::start(&[
        (
            "CODE_INTERPRETER_MCP_SESSIONS_STORE_URL",
            store_url.as_str(),
        ),
        ("CODE_INTERPRETER_MCP_SESSIONS_SPILL_AFTER_S", "1"),
    ]);
    let r = in_session(
        &server,
        "new",
        "import os\nblob = os.urandom(4 << 20)\nlen(blob)",
    );
    let id = r["session_id"].as_str().unwrap().to_string();
    // Spills are tried (and fail: no space) for a few seconds.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(images(&store), 0);
    let r = in_session(&server, &id, "len(blob)");
    assert_eq!(r["result"], (4 << 20).to_string(), "still in memory: {r}");
}

#[test]
fn a_replica_sharing_an_s3_store_resumes_another_replicas_session() {
    let moto = crate::store::moto();
    let envs = |replica: &'static str| {
        vec![
            ("CODE_INTERPRETER_MCP_REPLICA_ID", replica.to_string()),
            (
                "CODE_INTERPRETER_MCP_SESSIONS_STORE_URL",
                "s3://sessions-bucket/durable".to_string(),
            ),
            (
                "CODE_INTERPRETER_MCP_SESSIONS_SPILL_AFTER_S",
                "1".to_string(),
            ),
            ("AWS_ENDPOINT_URL", moto.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ACCESS_KEY_ID", "test".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "test".to_string()),
        ]
    };
    let start = |replica: &'static str| {
        let owned = envs(replica);
        let borrowed: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Server::start(&borrowed)
    };
    let (r1, r2) = (start("r1"), start("r2"));
    let r = in_session(&r1, "new", "data = {'rows': list(range(5))}");
    let id = r["session_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("r1."), "{id}");
    // Once r1 has spilled it, r2 resumes it from the store.
    let started = Instant::now();
    let resumed = loop {
        let r = in_session(&r2, &id, "sum(data['rows'])");
        if r["success"] == true {
            break r;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{r}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(resumed["result"], "10", "{resumed}");
    // r2 holds the session now: a call on r1 asks r2 for it (a marker in the store), r2 saves it
    // once idle, and r1 resumes it; one place at a time, state carried each way.
    let r = in_session(&r1, &id, "data['rows'].append(5)\nlen(data['rows'])");
    assert_eq!(r["result"], "6", "{r}");
    let r = in_session(&r2, &id, "len(data['rows'])");
    assert_eq!(r["result"], "6", "{r}");
}
