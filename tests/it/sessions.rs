//! Stateful sessions through the real server and real MCP requests in both eras: state persisting
//! within a session and never across sessions or into stateless calls, timeouts that interrupt and
//! keep the state, hard stops that end a session, expiry, the cap, clear, ordering, session files as
//! tools and resources, images and resource links in results, plot capture, and tool metadata.

use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fixture::{
    LegacyClient, Server, call_stateless, call_tool_stateless, list_tools_stateless,
    request_stateless,
};

fn structured(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

/// Runs `code` in `session` (an id, or "new"); the structured result.
fn in_session(server: &Server, session: &str, code: &str) -> Value {
    in_session_with(server, session, code, 30_000)
}

fn in_session_with(server: &Server, session: &str, code: &str, timeout_ms: u64) -> Value {
    let reply = call_stateless(
        server,
        json!({"code": code, "session_id": session, "timeout_ms": timeout_ms}),
    );
    structured(&reply).clone()
}

/// A new session's id, after running `code` in it.
fn new_session(server: &Server, code: &str) -> String {
    let r = in_session(server, "new", code);
    assert_eq!(r["success"], true, "{r}");
    let id = r["session_id"].as_str().expect("a session id").to_string();
    assert!(id.len() >= 22, "at least 128 bits: {id}");
    assert!(
        id.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "URL-safe: {id}"
    );
    id
}

#[test]
fn state_persists_within_a_session_and_nowhere_else() {
    let server = Server::start(&[]);
    let a = new_session(
        &server,
        "x = 41\nimport json\nopen('kept.txt', 'w').write('kept')",
    );
    let r = in_session(
        &server,
        &a,
        "x += 1\n(x, json.dumps([1]), open('kept.txt').read())",
    );
    assert_eq!(r["result"], "(42, '[1]', 'kept')", "{r}");
    assert_eq!(r["session_id"], a.as_str());
    // Another session and a stateless call see nothing of it.
    let b = new_session(&server, "y = 1");
    assert_ne!(a, b);
    let r = in_session(
        &server,
        &b,
        "('x' in dir(), __import__('os').path.exists('kept.txt'))",
    );
    assert_eq!(r["result"], "(False, False)", "{r}");
    let r = structured(&call_stateless(&server, json!({"code": "'x' in dir()"}))).clone();
    assert_eq!(r["result"], "False");
    assert!(
        r.get("session_id").is_none(),
        "stateless results carry no session id: {r}"
    );
    // The empty string starts a session too, as the stateful spec's clients send it.
    let r = in_session(&server, "", "1");
    assert!(r["session_id"].is_string(), "{r}");
}

#[test]
fn unknown_ids_get_the_session_error_after_validation() {
    let server = Server::start(&[]);
    let r = in_session(&server, "no-such-session", "1");
    assert_eq!(r["success"], false);
    assert_eq!(r["error"]["kind"], "session", "{r}");
    assert_eq!(r["error"]["type"], "SessionNotFound");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("does not exist or has expired") && message.contains("\"new\""),
        "{message}"
    );
    // Validation comes first.
    let reply = call_stateless(
        &server,
        json!({"code": "1", "session_id": "no-such-session", "timeout_ms": 0}),
    );
    assert_eq!(structured(&reply)["error"]["kind"], "validation");
}

#[test]
fn a_timeout_interrupts_python_and_keeps_the_session() {
    let server = Server::start(&[]);
    let id = new_session(&server, "state = 'kept'");
    // A regular expression that backtracks catastrophically is interrupted too: CPython's regex
    // engine checks for signals while it runs.
    for code in [
        "while True:\n    pass",
        "import time\ntime.sleep(100)",
        "import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')",
    ] {
        let started = Instant::now();
        let r = in_session_with(&server, &id, code, 1000);
        assert_eq!(r["timed_out"], true, "{code}: {r}");
        assert_eq!(r["error"]["kind"], "timeout");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("interrupted"),
            "{r}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let r = in_session(&server, &id, "state");
        assert_eq!(r["result"], "kept", "{code}: the state survives: {r}");
    }
}

#[test]
fn a_call_that_ignores_the_interrupt_ends_the_session_clearly() {
    let server = Server::start(&[]);
    let id = new_session(&server, "state = 1");
    // sum() over a range runs in C and never checks for signals: the interrupt goes unseen.
    let r = in_session_with(&server, &id, "sum(range(10 ** 15))", 1000);
    assert_eq!(r["error"]["kind"], "timeout", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("session has ended"), "{message}");
    let r = in_session(&server, &id, "state");
    assert_eq!(r["error"]["type"], "SessionNotFound", "{r}");
}

#[test]
fn idle_sessions_expire_and_the_cap_holds() {
    let server = Server::start(&[
        ("CODE_INTERPRETER_MCP_SESSIONS_IDLE_TIMEOUT_S", "2"),
        ("CODE_INTERPRETER_MCP_SESSIONS_MAX_SESSIONS", "2"),
    ]);
    let a = new_session(&server, "1");
    let _b = new_session(&server, "1");
    let r = in_session(&server, "new", "1");
    assert_eq!(r["error"]["type"], "TooManySessions", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sessions.max_sessions"),
        "{r}"
    );
    thread::sleep(Duration::from_secs(4));
    let r = in_session(&server, &a, "1");
    assert_eq!(r["error"]["type"], "SessionNotFound", "expired: {r}");
    // The reaper freed the slots.
    new_session(&server, "1");
}

#[test]
fn clear_session_discards_it_and_stops_a_running_call() {
    let server = Server::start(&[]);
    let id = new_session(&server, "x = 1");
    let url = server.url.clone();
    let running_id = id.clone();
    let running = thread::spawn(move || {
        call_stateless(
            &url,
            json!({"code": "while True:\n    pass", "session_id": running_id, "timeout_ms": 60000}),
        )
    });
    thread::sleep(Duration::from_millis(800));
    let started = Instant::now();
    let cleared = call_tool_stateless(&server, "clear_session", json!({"session_id": id}));
    assert_eq!(structured(&cleared)["success"], true, "{cleared}");
    let reply = running.join().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the running call was stopped: {reply}"
    );
    assert_eq!(structured(&reply)["success"], false);
    let r = in_session(&server, &id, "x");
    assert_eq!(r["error"]["type"], "SessionNotFound");
    let again = call_tool_stateless(&server, "clear_session", json!({"session_id": id}));
    assert_eq!(
        structured(&again)["error"]["type"],
        "SessionNotFound",
        "{again}"
    );
    assert_eq!(again["result"]["isError"], true);
}

#[test]
fn calls_to_one_session_run_in_order_while_a_stateless_call_completes() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1")]);
    let id = new_session(&server, "log = []");
    let mut handles = Vec::new();
    for i in 0..3 {
        let url = server.url.clone();
        let id = id.clone();
        handles.push(thread::spawn(move || {
            call_stateless(
                &url,
                json!({"code": format!("import time\ntime.sleep(0.6)\nlog.append({i})\nlist(log)"), "session_id": id}),
            )
        }));
        thread::sleep(Duration::from_millis(100));
    }
    // Meanwhile, a stateless call is served at once.
    let started = Instant::now();
    let r = structured(&call_stateless(&server, json!({"code": "6 * 7"}))).clone();
    assert_eq!(r["result"], "42");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let results: Vec<String> = handles
        .into_iter()
        .map(|h| {
            structured(&h.join().unwrap())["result"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(results, ["[0]", "[0, 1]", "[0, 1, 2]"]);
}

/// A 2×1 PNG written with zlib and struct only.
const PNG_CODE: &str = r#"
import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff)
raw = b'\x00\xff\x00\x00\x00\x00\xff'
png = b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 2, 1, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')
open('dot.png', 'wb').write(png)
open('notes.txt', 'w').write('hello')
"#;

#[test]
fn images_come_back_as_image_content_and_session_files_as_links() {
    let server = Server::start(&[]);
    // A stateless call: the PNG as image content, after the JSON text block.
    let reply = call_stateless(&server, json!({"code": PNG_CODE}));
    let content = reply["result"]["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "text");
    let _: Value = serde_json::from_str(content[0]["text"].as_str().unwrap()).expect("JSON text");
    let images: Vec<&Value> = content.iter().filter(|c| c["type"] == "image").collect();
    assert_eq!(images.len(), 1, "{reply}");
    assert_eq!(images[0]["mimeType"], "image/png");
    assert!(
        content.iter().all(|c| c["type"] != "resource_link"),
        "no links outside a session"
    );
    // In a session, every returned file is linked too; new or changed files only.
    let r = call_stateless(&server, json!({"code": PNG_CODE, "session_id": "new"}));
    let id = structured(&r)["session_id"].as_str().unwrap().to_string();
    let links: Vec<&Value> = r["result"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "resource_link")
        .collect();
    let mut uris: Vec<&str> = links.iter().map(|l| l["uri"].as_str().unwrap()).collect();
    uris.sort();
    assert_eq!(
        uris,
        [
            format!("session://{id}/dot.png").as_str(),
            format!("session://{id}/notes.txt").as_str()
        ]
    );
    assert!(links.iter().all(|l| l["size"].as_u64().unwrap() > 0));
    let r = call_stateless(
        &server,
        json!({"code": "open('notes.txt', 'a').write('!')", "session_id": id}),
    );
    let files: Vec<&str> = structured(&r)["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["notes.txt"], "only the changed file returns");
}

#[test]
fn client_uris_reach_the_log_only_in_short_form() {
    let server = Server::spawn(&mut crate::fixture::server_command(), true);
    let a = new_session(&server, "open('f', 'w').write('a')");
    let b = new_session(&server, "open('f', 'w').write('b')");
    let random = b.rsplit('.').next().unwrap().to_string();
    for uri in [
        format!("session://{a}/../{b}/f"),
        format!("session://{a}/{b}/f"),
        format!("session://{random}.x/f"),
        format!("file:///{b}/f"),
    ] {
        let reply = request_stateless(&server, "resources/read", json!({"uri": uri}));
        assert!(reply.get("error").is_some(), "{uri}: {reply}");
        assert!(!reply.to_string().contains(&random), "{uri}: {reply}");
    }
    thread::sleep(Duration::from_millis(300));
    let log = server.log.lock().unwrap().join("\n");
    assert!(
        log.contains("response error"),
        "rmcp logged the errors: {log}"
    );
    assert!(!log.contains(&random), "{log}");
}

#[test]
fn session_files_are_listed_and_readable_as_resources_in_both_eras() {
    let server = Server::start(&[]);
    let id = new_session(&server, PNG_CODE);
    let listed = call_tool_stateless(&server, "list_session_files", json!({"session_id": id}));
    let listed = structured(&listed);
    assert_eq!(listed["session_id"], id.as_str());
    let files = listed["files"].as_array().unwrap();
    let png = files
        .iter()
        .find(|f| f["path"] == "dot.png")
        .expect("dot.png");
    assert_eq!(png["mime_type"], "image/png");
    assert_eq!(png["uri"], format!("session://{id}/dot.png"));
    let unknown = call_tool_stateless(&server, "list_session_files", json!({"session_id": "nope"}));
    assert_eq!(structured(&unknown)["error"]["type"], "SessionNotFound");

    // 2026-07-28: read a text and a binary file; unknown ones are invalid params (-32602).
    let text = request_stateless(
        &server,
        "resources/read",
        json!({"uri": format!("session://{id}/notes.txt")}),
    );
    let contents = &text["result"]["contents"][0];
    assert_eq!(contents["text"], "hello", "{text}");
    assert_eq!(contents["mimeType"], "text/plain");
    let blob = request_stateless(&server, "resources/read", json!({"uri": png["uri"]}));
    assert!(blob["result"]["contents"][0]["blob"].is_string(), "{blob}");
    for uri in [
        format!("session://{id}/missing.txt"),
        "session://nope/x".into(),
    ] {
        let missing = request_stateless(&server, "resources/read", json!({"uri": uri}));
        assert_eq!(missing["error"]["code"], -32602, "{missing}");
        // The error names the resource with the session id shortened, as logs do (rmcp logs
        // error data; the id is the session's credential).
        let shown = missing["error"]["data"]["uri"].as_str().unwrap();
        assert!(shown.starts_with("session://"), "{missing}");
        assert!(!missing.to_string().contains(&id), "{missing}");
    }
    let templates = request_stateless(&server, "resources/templates/list", json!({}));
    assert_eq!(
        templates["result"]["resourceTemplates"][0]["uriTemplate"],
        "session://{session_id}/{path}"
    );
    // Stateless clients have no identity: nothing is listed.
    let listed = request_stateless(&server, "resources/list", json!({}));
    assert_eq!(listed["result"]["resources"], json!([]), "{listed}");

    // The session era: a client lists the files of the sessions it created, and only those.
    let client = LegacyClient::connect(&server);
    let r = client.call(
        "run_python_code",
        json!({"code": "open('mine.txt', 'w').write('m')", "session_id": "new"}),
    );
    let mine = structured(&r)["session_id"].as_str().unwrap().to_string();
    let listed = client.request("resources/list", json!({}));
    let uris: Vec<&str> = listed["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        uris,
        [format!("session://{mine}/mine.txt").as_str()],
        "{listed}"
    );
    let other = LegacyClient::connect(&server);
    assert_eq!(
        other.request("resources/list", json!({}))["result"]["resources"],
        json!([])
    );
    let read = client.request("resources/read", json!({"uri": uris[0]}));
    assert_eq!(read["result"]["contents"][0]["text"], "m", "{read}");
    let missing = client.request(
        "resources/read",
        json!({"uri": format!("session://{mine}/nope")}),
    );
    assert_eq!(
        missing["error"]["code"], -32002,
        "the session era's not-found code: {missing}"
    );
}

#[test]
fn matplotlib_figures_are_captured_in_both_modes() {
    let server = Server::start(&[]);
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nplt.figure()\nplt.plot([3, 2, 1])\n'drawn'";
    for session in [None, Some("new")] {
        let mut arguments = json!({"code": code, "timeout_ms": 120000});
        if let Some(s) = session {
            arguments["session_id"] = json!(s);
        }
        let reply = call_stateless(&server, arguments);
        let r = structured(&reply);
        assert_eq!(r["result"], "drawn", "{r}");
        let mut paths: Vec<&str> = r["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        paths.sort();
        assert_eq!(
            paths,
            ["figure-1.png", "figure-2.png"],
            "shown and left open"
        );
        let images = reply["result"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["type"] == "image")
            .count();
        assert_eq!(images, 2);
    }
    // A user's own figure-1.png is not overwritten.
    let reply = call_stateless(
        &server,
        json!({"code": "open('figure-1.png', 'w').write('mine')\nimport matplotlib.pyplot as plt\nplt.plot([1])\nopen('figure-1.png').read()", "timeout_ms": 120000}),
    );
    let r = structured(&reply);
    assert_eq!(r["result"], "mine");
    assert!(
        r["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "figure-2.png")
    );
}

#[test]
fn tools_carry_titles_annotations_and_session_schemas() {
    let server = Server::start(&[]);
    let tools = list_tools_stateless(&server);
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "clear_session",
            "fork_session",
            "get_code_snippet",
            "list_code_snippets",
            "list_session_files",
            "run_python_code"
        ]
    );
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap();
    let run = tool("run_python_code");
    assert_eq!(run["title"], "Run Python code");
    assert_eq!(run["annotations"]["readOnlyHint"], false);
    assert_eq!(run["annotations"]["idempotentHint"], false);
    assert_eq!(
        run["annotations"]["openWorldHint"], true,
        "default hosts and installs"
    );
    assert!(run["inputSchema"]["properties"]["session_id"].is_object());
    for name in [
        "list_code_snippets",
        "get_code_snippet",
        "list_session_files",
    ] {
        assert_eq!(tool(name)["annotations"]["readOnlyHint"], true, "{name}");
        assert_eq!(tool(name)["annotations"]["idempotentHint"], true, "{name}");
    }
    assert_eq!(
        tool("clear_session")["annotations"]["destructiveHint"],
        true
    );
    let fork = tool("fork_session");
    assert_eq!(fork["annotations"]["destructiveHint"], false);
    assert_eq!(fork["annotations"]["readOnlyHint"], false);
    assert!(fork["outputSchema"]["properties"]["session_id"].is_object());
    assert!(run["outputSchema"]["properties"]["session"].is_object());
    assert!(tool("list_session_files")["outputSchema"]["properties"]["files"].is_object());

    // Disabled: no session tools, no session_id; no network: not open-world.
    let server = Server::start(&[
        ("CODE_INTERPRETER_MCP_SESSIONS_ENABLED", "false"),
        ("CODE_INTERPRETER_MCP_ALLOWED_HOSTS", ""),
    ]);
    let tools = list_tools_stateless(&server);
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["get_code_snippet", "list_code_snippets", "run_python_code"]
    );
    let run = tools
        .iter()
        .find(|t| t["name"] == "run_python_code")
        .unwrap();
    assert!(
        run["inputSchema"]["properties"].get("session_id").is_none(),
        "{run}"
    );
    assert_eq!(run["annotations"]["openWorldHint"], false);
}

#[test]
fn sigterm_lets_a_running_session_call_finish_then_ends_the_sessions_and_exits() {
    let mut server = Server::start(&[]);
    let id = new_session(&server, "state = 'kept'");
    let idle = new_session(&server, "other = 1");
    let running = {
        let url = server.url.clone();
        let id = id.clone();
        thread::spawn(move || {
            structured(&call_stateless(
                &url,
                json!({"code": "import time\ntime.sleep(2)\nstate", "session_id": id}),
            ))
            .clone()
        })
    };
    thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    thread::sleep(Duration::from_millis(200));
    // While draining: a call to a session waits until the session is saved to the store, then gets
    // 503 with Retry-After (a proxy sends it to another replica, which resumes the session).
    let body = crate::fixture::tool_call_body(
        "run_python_code",
        json!({"code": "other", "session_id": idle}),
        None,
    );
    let response = crate::fixture::send_stateless(
        &crate::fixture::client(),
        &server.url,
        "tools/call",
        Some("run_python_code"),
        &body,
    )
    .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let finished = running.join().unwrap();
    assert_eq!(
        finished["result"], "kept",
        "the running call finished: {finished}"
    );
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
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "sessions do not hold the exit back: {:?}",
        signalled.elapsed()
    );
    // Both sessions were saved: a new process on the same store resumes them.
    let server = Server::start(&[]);
    assert_eq!(in_session(&server, &id, "state")["result"], "kept");
    assert_eq!(in_session(&server, &idle, "other")["result"], "1");
}
