//! Timeouts, memory budgets and output truncation.

use std::time::{Duration, Instant};

use code_interpreter_mcp::sandbox::{
    ErrorKind, MAX_RESULT_BYTES, MAX_RETURNED_FILE_BYTES, MAX_RETURNED_FILES, MAX_STREAM_BYTES,
};

use crate::common::{ok, run, run_with};

/// Runs `code` with a one-second timeout and checks that it was stopped within about a second of the
/// deadline, keeping the output printed before.
fn assert_stopped(code: &str) {
    let timeout = Duration::from_millis(1000);
    let started = Instant::now();
    let r = run_with(code, &[], timeout);
    let elapsed = started.elapsed();
    assert!(!r.success);
    assert!(r.timed_out);
    let e = r.error.as_ref().expect("an error");
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert!(e.message.contains("timeout_ms = 1000"), "{}", e.message);
    assert_eq!(r.stdout, "started\n", "output before the timeout is kept");
    // Boot (a few seconds in a debug build) plus the timeout plus at most ~1 s of slack.
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

#[test]
fn timeout_stops_a_pure_python_loop() {
    assert_stopped("print('started')\nwhile True:\n    pass");
}

#[test]
fn timeout_stops_a_catastrophic_regex() {
    assert_stopped("import re\nprint('started')\nre.match(r'(a+)+$', 'a' * 64 + 'b')");
}

#[test]
fn timeout_stops_time_sleep() {
    assert_stopped("import time\nprint('started')\ntime.sleep(100)");
}

#[test]
fn timeout_stops_an_asyncio_sleep() {
    assert_stopped("import asyncio\nprint('started')\nawait asyncio.sleep(100)");
}

#[test]
fn timeout_is_measured_from_the_start_of_user_code() {
    // The deadline is relative to when the code starts, so a stop lands close to it.
    let sandbox = crate::common::engine().boot().expect("boot");
    let started = Instant::now();
    let r = sandbox.execute(code_interpreter_mcp::sandbox::ExecRequest {
        code: "while True: pass".into(),
        files: Vec::new(),
        timeout: Duration::from_millis(1500),
        ..Default::default()
    });
    let elapsed = started.elapsed();
    assert!(r.timed_out);
    assert!(elapsed >= Duration::from_millis(1500), "{elapsed:?}");
    assert!(
        elapsed < Duration::from_millis(2500),
        "stopped {elapsed:?} after start"
    );
}

#[test]
fn v8_heap_exhaustion_ends_the_call_with_a_memory_limit_error() {
    // The code caused it: a `python` error (not `runtime`, which is the engine's own failures).
    let r = run(
        "import js\njs.eval(\"globalThis.keep = []; for (;;) keep.push(new Array(100000).fill('x' + Math.random()))\")",
    );
    assert!(!r.success);
    let e = r.error.expect("an error");
    assert_eq!(e.kind, ErrorKind::Python);
    assert_eq!(e.error_type, "MemoryLimitExceeded");
    assert!(
        e.message.contains("workers.memory_limit_mb = 512"),
        "{}",
        e.message
    );
    // The engine keeps serving.
    assert_eq!(ok(&run("1 + 1")).result.as_deref(), Some("2"));
}

#[test]
fn webassembly_memory_is_capped_per_sandbox() {
    // 3 GiB in 512 MiB pieces: the cap (2 GiB of linear memory) stops it with a MemoryError inside
    // this call.
    let r = run(
        "chunks = []\ntry:\n    for i in range(6):\n        chunks.append(bytearray(512 * 1024**2))\nexcept MemoryError:\n    pass\nlen(chunks)",
    );
    let n: usize = ok(&r).result.as_deref().unwrap().parse().unwrap();
    assert!((1..6).contains(&n), "allocated {n} chunks of 512 MiB");
    let r = run("bytearray(3 * 1024**3)");
    assert!(!r.success, "a 3 GiB allocation must fail");
    assert_eq!(
        ok(&run("'still serving'")).result.as_deref(),
        Some("still serving")
    );
}

#[test]
fn stdout_and_stderr_are_truncated_separately() {
    let r = run(&format!(
        "import sys\nsys.stdout.write('a' * {n})\nsys.stderr.write('b' * 10)\n",
        n = MAX_STREAM_BYTES + 100
    ));
    ok(&r);
    assert!(r.output_truncated);
    assert_eq!(r.stdout.len(), MAX_STREAM_BYTES);
    assert_eq!(r.stderr, "b".repeat(10));

    let r = run(&format!(
        "import sys\nsys.stderr.write('é' * {n})",
        n = MAX_STREAM_BYTES
    ));
    assert!(r.output_truncated);
    assert!(r.stderr.len() <= MAX_STREAM_BYTES);
    assert!(
        r.stderr.chars().all(|c| c == 'é'),
        "no broken character at the cut"
    );
}

#[test]
fn final_expression_is_truncated_at_64_kib() {
    let r = run(&format!("'x' * {}", MAX_RESULT_BYTES + 1));
    ok(&r);
    assert!(r.output_truncated);
    assert_eq!(r.result.unwrap().len(), MAX_RESULT_BYTES);
    let r = run(&format!("'x' * {}", MAX_RESULT_BYTES));
    assert!(!r.output_truncated);
}

#[test]
fn returned_files_are_limited_in_count() {
    let r = run(&format!(
        "for i in range({}):\n    open(f'f{{i:03}}.txt', 'w').write('x')",
        MAX_RETURNED_FILES + 1
    ));
    ok(&r);
    assert!(r.output_truncated);
    assert_eq!(r.files.len(), MAX_RETURNED_FILES);
    assert_eq!(
        r.files.last().unwrap().path,
        format!("f{:03}.txt", MAX_RETURNED_FILES - 1)
    );
}

#[test]
fn returned_files_are_limited_in_size_and_total() {
    let big = MAX_RETURNED_FILE_BYTES;
    let r = run(&format!(
        "open('a_too_big.bin', 'wb').write(b'x' * {over})\nfor i in range(6):\n    open(f'b{{i}}.bin', 'wb').write(b'y' * {big})\nopen('c_small.txt', 'w').write('z')",
        over = big + 1,
    ));
    ok(&r);
    assert!(r.output_truncated);
    let paths: Vec<_> = r.files.iter().map(|f| f.path.as_str()).collect();
    // a_too_big is over 10 MiB; b0..b4 fill the 50 MiB total; b5 is omitted; c_small no longer fits.
    assert_eq!(paths, ["b0.bin", "b1.bin", "b2.bin", "b3.bin", "b4.bin"]);
}

#[test]
fn deep_recursion_is_a_python_error_not_a_crash() {
    let r = run("def f(n):\n    return f(n + 1)\nf(0)");
    assert!(!r.success);
    assert_eq!(r.error.unwrap().kind, ErrorKind::Python);
}
