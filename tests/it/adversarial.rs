//! Hostile code, with only the `code` and `files` arguments, against the real engine and server: each
//! case asserts the safe outcome inside its own call and that the next call is served. Grouped by
//! class: panics in V8 callbacks, boot-only capabilities, work before the clock, limits enforced in
//! Rust, memory outside the V8 heap, and outcome classification (outbound requests: adversarial_fetch.rs).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use code_interpreter_mcp::sandbox::{Engine, EngineSettings, ErrorKind, ExecRequest, ExecResult};
use serde_json::json;

use crate::common::{engine, engine_settings, ok, run, run_with};
use crate::fixture::{Server, call_stateless};

/// The engine still serves an ordinary call.
#[track_caller]
pub(crate) fn still_serves(engine: &Engine) {
    let r = engine.execute(crate::common::request("print('next')\n6 * 7"));
    assert_eq!(
        ok(&r).result.as_deref(),
        Some("42"),
        "the next call: {r:#?}"
    );
    assert_eq!(r.stdout, "next\n");
}

/// JavaScript evaluated through Python's `js` module, returning its value's str().
pub(crate) fn js(code: &str) -> String {
    format!(
        "import js\njs.eval({})",
        serde_json::to_string(code).unwrap()
    )
}

/// Awaited JavaScript (a promise), through Python.
pub(crate) fn js_await(code: &str) -> String {
    format!(
        "import js\nawait js.eval({})",
        serde_json::to_string(code).unwrap()
    )
}

#[track_caller]
pub(crate) fn error_of(r: &ExecResult) -> &code_interpreter_mcp::sandbox::ExecError {
    assert!(!r.success, "expected a failure: {r:#?}");
    r.error.as_ref().expect("an error")
}

/// A minimal module that defines a memory (WebAssembly section 5).
const MODULE_WITH_MEMORY: &str = "new Uint8Array([0,97,115,109,1,0,0,0,5,3,1,0,1])";
/// A minimal module without one.
const EMPTY_MODULE: &str = "new Uint8Array([0,97,115,109,1,0,0,0])";

// --- 1. No user action reaches a Rust panic in a V8 callback -----------------------------------

#[test]
fn streaming_webassembly_compilation_is_refused_not_fatal() {
    for call in ["compileStreaming", "instantiateStreaming"] {
        let r = run(&js_await(&format!(
            "WebAssembly.{call}(Promise.resolve({EMPTY_MODULE})).then(() => 'compiled', e => `refused: ${{e.name}}: ${{e.message}}`)"
        )));
        // V8 asks whether code generation is allowed before it asks for the bytes (and Rust says no
        // after boot); the streaming handler that refuses sits behind that.
        let out = ok(&r).result.clone().unwrap();
        assert!(
            out.contains("disallowed by embedder") || out.contains("not available"),
            "{call}: {out}"
        );
        still_serves(engine());
    }
}

#[test]
fn a_looping_then_getter_on_a_compiled_module_times_out_instead_of_aborting() {
    let code = js_await(&format!(
        "Object.defineProperty(WebAssembly.Module.prototype, 'then', {{ get() {{ for (;;) {{}} }} }}); WebAssembly.compile({EMPTY_MODULE})"
    ));
    let r = run_with(&code, &[], Duration::from_millis(500));
    assert_eq!(error_of(&r).kind, ErrorKind::Timeout, "{r:#?}");
    still_serves(engine());
}

#[test]
fn dynamic_import_with_a_hostile_promise_prototype_is_refused() {
    // deno_core's import error path unwrapped a message that a patched `then` can make a number.
    let code = js_await(
        "const then = Promise.prototype.then; \
         Promise.prototype.then = function (ok, fail) { if (fail) fail({ __proto__: Error.prototype, message: 42 }); return then.call(this, ok, fail); }; \
         Error.prepareStackTrace = (e) => { e.message = 0; }; \
         import('x').then(() => 'imported', () => 'refused')",
    );
    let r = run(&code);
    assert!(r.error.is_none_or(|e| e.kind != ErrorKind::Runtime));
    still_serves(engine());
    for specifier in ["ext:core/mod.js", "asset:///pyodide.mjs", "./x"] {
        let r = run(&js_await(&format!(
            "import('{specifier}').then(() => 'imported', e => `refused: ${{e.message}}`)"
        )));
        assert_eq!(
            ok(&r).result.as_deref(),
            Some("refused: import() is not available in the sandbox")
        );
    }
}

#[test]
fn index_accessors_on_the_shared_prototypes_cannot_be_defined() {
    // An index setter on Array.prototype that rejects a promise re-entered deno_core's rejection
    // tracking while it held a borrow: a panic.
    for target in ["Array.prototype", "Object.prototype"] {
        let r = run(&js(&format!(
            "try {{ Object.defineProperty({target}, 0, {{ set() {{ Promise.reject(1); }} }}); 'defined' }} catch (e) {{ e.name }}"
        )));
        assert_eq!(ok(&r).result.as_deref(), Some("TypeError"), "{target}");
        let r = run(&js(&format!(
            "try {{ Object.setPrototypeOf({target}, new Proxy({{}}, {{}})); 'changed' }} catch (e) {{ e.name }}"
        )));
        assert_eq!(ok(&r).result.as_deref(), Some("TypeError"), "{target}");
    }
    still_serves(engine());
}

#[test]
fn stack_traces_are_bounded_and_never_hand_out_call_sites() {
    // A patched call site and a 512 MiB message both aborted deno_core's stack formatter.
    let r = run(&js(
        "Error.prepareStackTrace = (e, sites) => { Object.defineProperty(Array.prototype, 9, { get() { throw 1; } }); return sites[0].getFileName() + sites[0].getFileName(); }; \
         typeof new Error('x').stack",
    ));
    assert_eq!(ok(&r).result.as_deref(), Some("string"));
    let r = run(&js("new Error('\\u00e9'.repeat(2 ** 27)).stack.length"));
    let len: usize = ok(&r).result.as_deref().unwrap().parse().unwrap();
    assert!(len < 20_000, "{len}");
    still_serves(engine());
}

#[test]
fn huge_values_in_op_error_messages_are_cut() {
    for expr in [
        "new URL('\\x80'.repeat(9e7))",
        "new TextDecoder('\\x80'.repeat(9e7))",
        "readbuffer('\\x80'.repeat(9e7))",
    ] {
        let r = run(&js(&format!(
            "try {{ {expr}; 'no error' }} catch (e) {{ String(e.message.length) }}"
        )));
        let len: usize = ok(&r).result.as_deref().unwrap().parse().unwrap();
        // 200 characters of the value, each at most a 6-character escape.
        assert!(len < 1500, "{expr}: a message of {len} characters");
    }
    still_serves(engine());
}

#[test]
fn an_error_getter_that_loops_cannot_outlive_the_timeout() {
    // deno_core turns a termination into an error and reads its `name`: a getter that loops forever
    // there would pin the worker, unless the watchdog keeps terminating.
    let code = format!(
        "{}\nwhile True:\n    pass",
        js(
            "Object.defineProperty(Error.prototype, 'name', { get() { for (;;) {} } }); Error.prepareStackTrace = () => { for (;;) {} }; 1"
        )
    );
    let started = Instant::now();
    let r = run_with(&code, &[], Duration::from_millis(500));
    assert_eq!(error_of(&r).kind, ErrorKind::Timeout, "{r:#?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    still_serves(engine());
}

#[test]
fn the_server_process_survives_every_attack_of_this_class() {
    let server = Server::start(&[("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1")]);
    for code in [
        js_await(&format!(
            "WebAssembly.compileStreaming(Promise.resolve({EMPTY_MODULE})).catch(e => e.name)"
        )),
        js_await(&format!(
            "WebAssembly.instantiateStreaming(Promise.resolve({EMPTY_MODULE})).catch(e => e.name)"
        )),
        js("new Error('\\u00e9'.repeat(2 ** 27)).stack.length"),
    ] {
        let reply = call_stateless(&server, json!({"code": code, "timeout_ms": 5000}));
        assert!(
            reply["result"]["structuredContent"]["error"]["kind"] != "runtime",
            "{reply}"
        );
    }
    let reply = call_stateless(&server, json!({"code": "6 * 7"}));
    assert_eq!(
        reply["result"]["structuredContent"]["result"], "42",
        "{reply}"
    );
}

// --- 2. Boot-time capabilities die with boot -----------------------------------------------------

#[test]
fn boot_closures_are_unreachable_after_boot() {
    let r = run(
        "import pyodide_js\nm = pyodide_js._module\n[hasattr(pyodide_js._api.config, n) for n in ('createPyodideModule', '_loadSnapshot')] + [hasattr(m, n) for n in ('sandboxWrapperModule', 'sandboxRestoreMemory', 'sandboxRestored')]",
    );
    assert_eq!(
        ok(&r).result.as_deref(),
        Some("[False, False, False, False, False]")
    );
    still_serves(engine());
}

// --- 3. One deadline covers everything a call does ----------------------------------------------

#[test]
fn package_loading_is_bounded_by_the_setup_budget() {
    let engine = Engine::new(EngineSettings {
        setup_timeout: Duration::from_millis(300),
        ..engine_settings()
    })
    .expect("engine");
    let started = Instant::now();
    let r = engine.execute(crate::common::request("import pandas\n1"));
    let e = error_of(&r);
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert_eq!(e.error_type, "SetupTimeout");
    assert!(
        e.message.contains("workers.setup_timeout_s"),
        "{}",
        e.message
    );
    assert!(r.timed_out);
    assert!(started.elapsed() < Duration::from_secs(30));
    still_serves(&engine);
}

#[test]
fn a_cancelled_call_is_stopped_at_once() {
    let mut sandbox = engine().boot().expect("boot");
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        flag.store(true, Ordering::SeqCst);
    });
    let started = Instant::now();
    let r = sandbox.run(
        ExecRequest {
            code: "while True:\n    pass".into(),
            files: Vec::new(),
            timeout: Duration::from_secs(120),
            ..Default::default()
        },
        Some(cancel),
    );
    canceller.join().unwrap();
    assert_eq!(error_of(&r).error_type, "Cancelled");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    still_serves(engine());
}

#[test]
fn deep_long_and_conflicting_input_paths_are_rejected_before_queueing() {
    let server = Server::start(&[]);
    let deep = vec!["d"; 1500].join("/");
    let long_component = "x".repeat(300);
    for (path, other, needle) in [
        (deep.as_str(), None, "at most 32 are allowed"),
        (long_component.as_str(), None, "longer than 255 bytes"),
        ("a", Some("a/b"), "is also a directory of"),
        ("bad\nname", None, "control character"),
    ] {
        let mut files = vec![json!({"path": path, "content_base64": ""})];
        if let Some(other) = other {
            files.push(json!({"path": other, "content_base64": ""}));
        }
        let started = Instant::now();
        let reply = call_stateless(
            &server,
            json!({"code": "1", "files": files, "timeout_ms": 1000}),
        );
        let error = &reply["result"]["structuredContent"]["error"];
        assert_eq!(error["kind"], "validation", "{reply}");
        assert!(
            error["message"].as_str().unwrap().contains(needle),
            "{reply}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    let reply = call_stateless(&server, json!({"code": "6 * 7"}));
    assert_eq!(reply["result"]["structuredContent"]["result"], "42");
}

// --- 4. Limits enforced where user code cannot reach --------------------------------------------

#[test]
fn a_file_system_that_lies_about_sizes_returns_nothing_past_the_cap() {
    // MEMFS reports every file as 1 byte: the sandbox offers a 32 MiB file as small, and Rust, which
    // counts the bytes it is handed, refuses it.
    let code = r#"
import js, pyodide_js
with open("big.bin", "wb") as f:
    f.write(b"x" * (32 * 1024 * 1024))
patch = js.eval("""(memfs) => {
  for (const ops of [memfs.node_ops, memfs.ops_table.file.node]) {
    const getattr = ops.getattr;
    ops.getattr = function (node) { const a = getattr.call(this, node); a.size = 1; return a; };
  }
}""")
patch(pyodide_js.FS.filesystems.MEMFS)
import os
os.stat("big.bin").st_size
"#;
    let r = run(code);
    let r = ok(&r);
    assert_eq!(r.result.as_deref(), Some("1"), "the lie is in place");
    // The sandbox's captured functions read what the lie says (1 byte); nothing past the cap comes
    // back either way (Rust counts the bytes it is handed: see output.rs's tests).
    for file in &r.files {
        assert!(
            file.content_base64.len() <= 4 * (10 << 20) / 3 + 4,
            "{}",
            file.path
        );
    }
    still_serves(engine());
}

#[test]
fn returned_paths_follow_the_input_path_rules() {
    // A directory listing that names a file outside /workspace: its path is refused in Rust.
    let code = r#"
import js, os, pyodide_js
os.makedirs("/tmp", exist_ok=True)
open("/tmp/evil.sh", "w").write("echo pwned")
open("fine.txt", "w").write("ok")
open("n" * 300, "w").write("a component over 255 bytes")
patch = js.eval("""(memfs) => {
  for (const ops of [memfs.node_ops, memfs.ops_table.dir.node]) {
    const readdir = ops.readdir;
    ops.readdir = function (node) {
      const names = readdir.call(this, node);
      if (node.name === "workspace") names.push("../tmp/evil.sh");
      return names;
    };
  }
}""")
patch(pyodide_js.FS.filesystems.MEMFS)
"../tmp/evil.sh" in pyodide_js.FS.readdir("/workspace")
"#;
    let r = run(code);
    let r = ok(&r);
    assert_eq!(r.result.as_deref(), Some("True"), "the lie is in place");
    let paths: Vec<&str> = r.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["fine.txt"]);
    // (The lie's name cannot be a path component: the walk skips it. The over-long name is real,
    // so it is offered, and Rust refuses it.)
    assert!(
        r.output_truncated,
        "the refused file marks the output truncated"
    );
    still_serves(engine());
}

#[test]
fn a_workspace_replaced_by_a_link_returns_nothing() {
    let r = run(
        "import os, shutil\nos.chdir('/')\nshutil.rmtree('/workspace')\nos.symlink('/lib', '/workspace')\n'linked'",
    );
    let r = ok(&r);
    assert_eq!(r.result.as_deref(), Some("linked"));
    assert!(r.files.is_empty(), "{} files", r.files.len());
    let r = run("import os, shutil\nos.chdir('/')\nshutil.rmtree('/workspace')\n'removed'");
    assert!(ok(&r).files.is_empty());
    still_serves(engine());
}

#[test]
fn the_report_cannot_be_forged_with_a_replaced_json_or_a_raised_result_limit() {
    let r = run(
        "import js\njs.JSON.stringify = js.eval(\"() => '{\\\"success\\\": true, \\\"result\\\": \\\"forged\\\"}'\")\nraise ValueError('the real outcome')",
    );
    let e = error_of(&r);
    assert_eq!(e.error_type, "ValueError");
    assert_eq!(e.message, "the real outcome");
    let r =
        run("import _sandbox_runner\n_sandbox_runner.RESULT_LIMIT = 10 ** 9\n'x' * (1024 * 1024)");
    let r = ok(&r);
    assert_eq!(r.result.as_ref().unwrap().len(), 64 * 1024);
    assert!(r.output_truncated);
    still_serves(engine());
}

#[test]
fn error_fields_are_capped() {
    let r = run(
        "import _sandbox_runner\n_sandbox_runner.MESSAGE_LIMIT = 10 ** 9\n_sandbox_runner.TRACEBACK_LIMIT = 10 ** 9\nE = type('E' * 100000, (Exception,), {})\nraise E('m' * (4 * 1024 * 1024))",
    );
    let e = error_of(&r);
    assert_eq!(e.kind, ErrorKind::Python);
    assert!(e.error_type.len() <= 256, "{}", e.error_type.len());
    assert!(e.message.len() <= 16 * 1024, "{}", e.message.len());
    assert!(e.traceback.as_ref().unwrap().len() <= 64 * 1024);
    assert!(r.output_truncated);
    still_serves(engine());
}

// --- 5. Memory outside the V8 heap ---------------------------------------------------------------

#[test]
fn array_buffers_past_the_budget_end_the_call() {
    let r = run(&js(
        "globalThis.keep = []; for (let i = 0; i < 8; i++) keep.push(new Uint8Array(512 * 1024 * 1024)); keep.length",
    ));
    let e = error_of(&r);
    assert_eq!(e.error_type, "MemoryLimitExceeded", "{e:?}");
    assert_eq!(e.kind, ErrorKind::Python);
    assert!(
        e.message.contains("workers.sandbox_memory_limit_mb"),
        "{}",
        e.message
    );
    still_serves(engine());
}

#[test]
fn files_past_the_budget_fail_with_enospc() {
    let r = run(
        "import errno\nn = 0\ntry:\n    for n in range(16):\n        with open(f'f{n}.bin', 'wb') as f:\n            f.write(bytes(256 * 1024 * 1024))\nexcept OSError as e:\n    print('errno', e.errno == errno.ENOSPC, 'after', n)\n    import os\n    for name in os.listdir('.'):\n        os.remove(name)\n'survived'",
    );
    let r = ok(&r);
    assert_eq!(r.result.as_deref(), Some("survived"));
    assert!(r.stdout.starts_with("errno True after "), "{}", r.stdout);
    still_serves(engine());
}

#[test]
fn no_second_webassembly_memory_can_be_made() {
    let r = run(&js(&format!(
        "[typeof WebAssembly.Memory, (() => {{ try {{ new WebAssembly.Module({MODULE_WITH_MEMORY}); return 'compiled' }} catch (e) {{ return e.message }} }})(), new WebAssembly.Instance(new WebAssembly.Module({EMPTY_MODULE})) instanceof WebAssembly.Instance].join('|')"
    )));
    let out = ok(&r).result.clone().unwrap();
    let parts: Vec<&str> = out.split('|').collect();
    assert_eq!(parts[0], "undefined");
    assert!(parts[1].contains("defines a memory of its own"), "{out}");
    assert_eq!(parts[2], "true", "modules without a memory still work");
    still_serves(engine());
}

#[test]
fn pythons_memory_counts_against_the_budget() {
    let engine = Engine::new(EngineSettings {
        sandbox_memory_limit_mb: 256,
        ..engine_settings()
    })
    .expect("engine");
    let r = engine.execute(crate::common::request(
        "keep = bytearray(400 * 1024 * 1024)\nkeep[-1] = 1\nlen(keep)",
    ));
    let e = error_of(&r);
    assert_eq!(e.error_type, "MemoryLimitExceeded", "{r:#?}");
    assert!(
        e.message.contains("sandbox_memory_limit_mb = 256"),
        "{}",
        e.message
    );
    // Copies of the standard library past the mapping cap are charged too.
    let r = engine.execute(crate::common::request(&js(
        "globalThis.keep = []; for (let i = 0; i < 400; i++) keep.push(readbuffer('/pyodide/python_stdlib.zip')); keep.length",
    )));
    assert_eq!(error_of(&r).error_type, "MemoryLimitExceeded", "{r:#?}");
    still_serves(&engine);
}

// --- 6. Outcomes classified by who caused them ---------------------------------------------------

#[test]
fn user_caused_failures_are_never_runtime_errors() {
    let r = run(
        "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Odd()",
    );
    let e = error_of(&r);
    assert_eq!(e.kind, ErrorKind::Python);
    assert_eq!(e.error_type, "Odd");
    assert!(e.message.contains("str() failed"), "{}", e.message);

    let r = run(&js(
        "Promise.reject(new Error('nobody handles this')); 'went on'",
    ));
    let r = ok(&r);
    assert_eq!(r.result.as_deref(), Some("went on"));
    assert!(r.stderr.contains("nobody handles this"), "{}", r.stderr);

    let r = run(
        "import js, asyncio\njs.setTimeout(js.eval(\"() => { throw new Error('from a timer') }\"), 0)\nawait asyncio.sleep(0.05)\n'went on'",
    );
    let r = ok(&r);
    assert!(r.stderr.contains("from a timer"), "{}", r.stderr);

    // Breaking the sandbox's own JavaScript is the code's doing: it is said, and nothing is
    // blamed on the engine. (Reading a new file goes through MEMFS's stream operations, which the
    // code can reach.)
    let r = run(concat!(
        "import js, pyodide_js\n",
        "open('new.txt', 'w').write('x')\n",
        "file_ops = pyodide_js.FS.filesystems.MEMFS.ops_table.file.stream\n",
        "file_ops.read = js.eval(\"() => { throw new Error('broken'); }\")\n",
        "1",
    ));
    let r = ok(&r);
    assert!(
        r.stderr.contains("could not collect the files"),
        "{}",
        r.stderr
    );
    assert!(r.output_truncated);
    still_serves(engine());
}
