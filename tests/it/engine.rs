//! The request/result contract: output streams, final expression, top-level await, files in and out,
//! Python errors with the user's line numbers, freshness between calls, fresh entropy.

use std::time::{Duration, Instant};

use code_interpreter_mcp::sandbox::{ErrorKind, ExecRequest};

use crate::common::{engine, ok, returned_file, run, run_with};

#[test]
fn stdout_stderr_and_final_expression_are_separate() {
    let r = run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7");
    ok(&r);
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");
    assert_eq!(r.result.as_deref(), Some("42"));
    assert!(r.error.is_none());
    assert!(!r.timed_out && !r.output_truncated);
}

#[test]
fn final_expression_is_str_and_none_is_null() {
    assert_eq!(
        run("'text'").result.as_deref(),
        Some("text"),
        "str(), not repr()"
    );
    assert_eq!(run("None").result, None);
    assert_eq!(
        run("x = 1").result,
        None,
        "an assignment is not an expression"
    );
    assert_eq!(run("print(1)").result, None, "print() returns None");
}

#[test]
fn top_level_await_works() {
    let r =
        run("import asyncio\nawait asyncio.sleep(0.01)\nasync def f():\n    return 5\nawait f()");
    assert_eq!(ok(&r).result.as_deref(), Some("5"));
}

#[test]
fn python_errors_are_structured_with_user_line_numbers() {
    let r = run("x = 1\n\ndef f():\n    return 1 / 0\n\nf()\n");
    assert!(!r.success);
    let e = r.error.expect("an error");
    assert_eq!(e.kind, ErrorKind::Python);
    assert_eq!(e.error_type, "ZeroDivisionError");
    assert_eq!(e.message, "division by zero");
    let tb = e.traceback.expect("a traceback");
    assert!(tb.contains("line 6, in <module>"), "{tb}");
    assert!(tb.contains("line 4, in f"), "{tb}");
    assert!(
        !tb.contains("_pyodide") && !tb.contains("sandbox-runner"),
        "runner frames leak: {tb}"
    );
}

#[test]
fn syntax_errors_point_at_the_user_line() {
    let r = run("a = 1\nb = (\n");
    let e = r.error.expect("an error");
    assert_eq!(e.kind, ErrorKind::Python);
    assert_eq!(e.error_type, "SyntaxError");
    assert!(e.traceback.unwrap().contains("line 2"));
}

#[test]
fn output_before_an_error_is_kept() {
    let r = run("print('partial')\nraise ValueError('boom')");
    assert!(!r.success);
    assert_eq!(r.stdout, "partial\n");
    assert_eq!(r.error.unwrap().message, "boom");
}

#[test]
fn sys_exit_zero_is_success_and_nonzero_is_an_error() {
    assert!(run("import sys\nsys.exit(0)").success);
    let r = run("import sys\nsys.exit(3)");
    assert!(!r.success);
    assert_eq!(r.error.unwrap().error_type, "SystemExit");
}

#[test]
fn input_files_are_readable_and_only_new_files_return() {
    let code = r#"
from pathlib import Path
import os
text = Path('data/input.txt').read_text()
Path('data/input.txt').write_text('changed')      # modified input: not returned
Path('out').mkdir()
Path('out/results.csv').write_text('value\n2\n3\n')
Path('image.png').write_bytes(b'\x89PNG')
Path('scratch.tmp').write_text('gone')
os.remove('scratch.tmp')                            # deleted before the end: not returned
os.symlink('out/results.csv', 'link.csv')           # not a regular file
print(os.getcwd())
text
"#;
    let r = run_with(
        code,
        &[("data/input.txt", b"hello\n")],
        Duration::from_secs(30),
    );
    ok(&r);
    assert_eq!(r.stdout, "/workspace\n");
    assert_eq!(r.result.as_deref(), Some("hello\n"));
    let paths: Vec<_> = r.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["image.png", "out/results.csv"]);
    assert_eq!(r.files[1].mime_type, "text/csv");
    assert_eq!(returned_file(&r, "out/results.csv"), b"value\n2\n3\n");
    assert_eq!(r.files[0].mime_type, "image/png");
}

#[test]
fn binary_input_files_round_trip() {
    let data: Vec<u8> = (0..=255u8).collect();
    let r = run_with(
        "from pathlib import Path\nPath('copy.bin').write_bytes(Path('in.bin').read_bytes())",
        &[("in.bin", &data)],
        Duration::from_secs(30),
    );
    ok(&r);
    assert_eq!(returned_file(&r, "copy.bin"), data);
}

#[test]
fn nothing_survives_a_call() {
    let first = run(
        "import sys, builtins\nleaked = 1\nbuiltins.leaked_builtin = 2\nsys.modules['leaked_module'] = sys\nopen('/tmp/leak', 'w').write('x')\nopen('leak.txt', 'w').write('x')",
    );
    ok(&first);
    let second = run(
        "import sys, os, builtins\n[('leaked' in globals()), hasattr(builtins, 'leaked_builtin'), ('leaked_module' in sys.modules), os.path.exists('/tmp/leak'), os.path.exists('leak.txt')]",
    );
    assert_eq!(
        ok(&second).result.as_deref(),
        Some("[False, False, False, False, False]")
    );
}

/// The standard library zip and the package layer's files are each sandbox's own (copy-on-write
/// mappings of one shared copy): what one call writes into them is absent in the next, and asking for
/// the zip again and again (past the mappings one sandbox gets) still gives whole copies.
#[test]
fn writes_to_the_standard_library_and_the_package_layer_stay_in_their_sandbox() {
    let code = "import sys, glob, js\nv = sys.version_info\nzip_path = f'/lib/python{v[0]}{v[1]}.zip'\nlayer_file = glob.glob(f'/lib/python{v[0]}.{v[1]}/site-packages/micropip/__init__.py')[0]\ndef heads():\n    return (open(zip_path, 'rb').read(4), open(layer_file, 'rb').read(8))\nbefore = heads()\nfor path in (zip_path, layer_file):\n    with open(path, 'r+b') as f:\n        f.write(b'XXXXXXXX')\nafter = heads()\ncopies = [js.Uint8Array.new(js.readbuffer('python_stdlib.zip')) for _ in range(20)]\n(before, after, len({c.length for c in copies}), all(c[0] == 0x50 and c[1] == 0x4B for c in copies))";
    let first = run(code);
    let first = ok(&first).result.clone().unwrap();
    assert!(
        first.starts_with("((b'PK\\x03\\x04', ")
            && first.ends_with(", (b'XXXX', b'XXXXXXXX'), 1, True)"),
        "{first}"
    );
    let second = run(code);
    assert_eq!(ok(&second).result.as_deref(), Some(first.as_str()));
}

/// Pyodide's package index is in place in every sandbox, although a restored one skips setting it
/// up again (modules.rs): the interpreter knows which package provides an import name, and the
/// package layer's packages count as loaded.
#[test]
fn the_package_index_and_loaded_packages_are_in_place() {
    let r = run(
        "import pyodide_js\nfrom _pyodide import _importhook\nnames = _importhook.REPODATA_PACKAGES_IMPORT_TO_PACKAGE_NAME\n(len(names) > 100, names.get('sklearn'), 'micropip' in pyodide_js.loadedPackages.object_keys())",
    );
    assert_eq!(
        ok(&r).result.as_deref(),
        Some("(True, 'scikit-learn', True)")
    );
}

#[test]
fn every_sandbox_sees_fresh_os_randomness() {
    let code = "import random, uuid, os\n(random.random(), str(uuid.uuid4()), os.urandom(8).hex(), open('/dev/urandom','rb').read(8).hex())";
    let a = run(code);
    let b = run(code);
    let (a, b) = (
        ok(&a).result.clone().unwrap(),
        ok(&b).result.clone().unwrap(),
    );
    assert_ne!(a, b);
    // Each of the four sources differs, not just the tuple.
    let parts = |s: &str| {
        s.trim_matches(|c| c == '(' || c == ')')
            .split(", ")
            .map(String::from)
            .collect::<Vec<_>>()
    };
    for (x, y) in parts(&a).iter().zip(parts(&b).iter()) {
        assert_ne!(x, y, "{a} vs {b}");
    }
}

#[test]
fn recognised_imports_load_packages_before_the_clock_starts() {
    // Loading scipy and numpy (read, sha256-verify, unpack, instantiate their Wasm) takes longer than
    // the timeout given here (over a second against 0.3 s); only the code itself is timed. The code
    // names scipy in an import statement (which is what loads it) but only lists site-packages, which
    // takes milliseconds: importing scipy itself takes about a second, too close to any timeout.
    let timeout = Duration::from_millis(300);
    let sandbox = engine().boot().expect("boot");
    let started = Instant::now();
    let r = sandbox.execute(ExecRequest {
        code: r#"if False:
    import scipy
import os, sys
site = next(p for p in sys.path if p.endswith("site-packages"))
next(n[6:-10] for n in os.listdir(site) if n.startswith("scipy-") and n.endswith(".dist-info"))"#
            .into(),
        files: Vec::new(),
        timeout,
        ..Default::default()
    });
    let elapsed = started.elapsed();
    assert_eq!(ok(&r).result.as_deref(), Some("1.18.0"));
    assert!(
        elapsed > timeout,
        "package loading took only {elapsed:?}, so this test proves nothing; lower the timeout"
    );
}

/// Sandboxes start from the V8 startup snapshot (Pyodide's JavaScript already evaluated), yet each
/// has its own clock origin: `performance.timeOrigin` is when that sandbox booted, not when the
/// snapshot was made.
#[test]
fn sandboxes_start_from_the_v8_startup_snapshot_with_their_own_time_origin() {
    let engine = crate::common::engine();
    assert!(
        engine
            .startup_snapshot_bytes()
            .is_some_and(|n| n > 1_000_000),
        "no V8 startup snapshot in use"
    );
    let origin = "import js, time\n(js.performance.timeOrigin, time.time() * 1000)";
    let parse = |r: &code_interpreter_mcp::sandbox::ExecResult| -> (f64, f64) {
        let text = ok(r).result.clone().unwrap();
        let (a, b) = text
            .trim_matches(|c| c == '(' || c == ')')
            .split_once(", ")
            .unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };
    let millis_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1000.0
    };
    // The origin falls within this sandbox's boot (not at the snapshot's making, long before).
    let before = millis_now();
    let sandbox = engine.boot().expect("boot");
    let after = millis_now();
    let (first, now) = parse(&sandbox.execute(crate::common::request(origin)));
    assert!(
        first >= before - 50.0 && first <= after + 50.0,
        "timeOrigin {first} is not this sandbox's start (it booted between {before} and {after}; now {now})"
    );
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (second, _) = parse(&run(origin));
    assert!(second > first, "{second} is not after {first}");
}

/// dlsym on the main module (`ctypes.pythonapi`, `CDLL(None)`) finds the interpreter's own symbols,
/// although the symbol table it searches is filled lazily (js/lazy_imports.js), and after it a
/// package's shared library still links (numpy's .so files import hundreds of interpreter symbols).
#[test]
fn ctypes_finds_the_interpreters_own_symbols() {
    let r = run(
        "import ctypes\nf = ctypes.pythonapi.Py_GetVersion\nf.restype = ctypes.c_char_p\nv = f().decode()[:2]\nimport numpy\n(v, ctypes.CDLL(None).Py_IsInitialized(), int(numpy.arange(4).sum()))",
    );
    assert_eq!(ok(&r).result.as_deref(), Some("('3.', 1, 6)"));
}

/// The full-boot fallback: the same contract without the memory snapshot.
#[test]
fn full_boot_mode_keeps_the_contract() {
    use code_interpreter_mcp::sandbox::{BootMode, Engine, EngineSettings};
    let engine = Engine::new(EngineSettings {
        boot: BootMode::Full,
        ..crate::common::engine_settings()
    })
    .expect("engine");
    let run = |code: &str| engine.execute(crate::common::request(code));
    let first = run(
        "import random, os\nx = 1\nopen('f.txt', 'w').write('x')\n(random.random(), os.urandom(8).hex())",
    );
    let second = run(
        "import random, os\n('x' in globals(), os.path.exists('f.txt'), random.random(), os.urandom(8).hex())",
    );
    let (a, b) = (
        ok(&first).result.clone().unwrap(),
        ok(&second).result.clone().unwrap(),
    );
    assert!(b.starts_with("(False, False, "), "{b}");
    assert!(!b.contains(&a[1..a.len() - 1]), "{a} vs {b}");
    let r = run("import js\nhasattr(js, 'Deno')");
    assert_eq!(ok(&r).result.as_deref(), Some("False"));
}

#[test]
fn snapshot_sandboxes_do_not_share_module_state_or_random_streams() {
    // The default engine restores a memory snapshot: module-level side effects and sys.modules entries
    // of one call must not appear in the next, and random generators are reseeded.
    let first = run(
        "import json, sys\njson.MARKER = 1\nsys.modules['planted'] = json\nimport random\nrandom.random()",
    );
    let second = run(
        "import json, sys, random\n(hasattr(json, 'MARKER'), 'planted' in sys.modules, random.random())",
    );
    let a = ok(&first).result.clone().unwrap();
    let b = ok(&second).result.clone().unwrap();
    assert!(b.starts_with("(False, False, "), "{b}");
    assert!(!b.contains(&a), "random stream repeated: {a} in {b}");
}

/// The snapshot is kept under package_cache_dir: the next engine restores from the stored file
/// (fresh random streams in every sandbox all the same), and a damaged file is replaced, never used.
#[test]
fn a_stored_snapshot_is_reused_and_a_damaged_one_is_replaced() {
    use code_interpreter_mcp::sandbox::{BootMode, Engine, EngineSettings};
    let cache = crate::common::temp_dir("stored-snapshot");
    let config = EngineSettings {
        package_cache_dir: cache.clone(),
        boot: BootMode::Snapshot,
        ..crate::common::engine_settings()
    };
    drop(Engine::new(config.clone()).expect("engine"));
    let stored: Vec<_> = std::fs::read_dir(cache.join("snapshot"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(stored.len(), 1, "{stored:?}");
    let original = std::fs::read(&stored[0]).unwrap();

    let engine = Engine::new(config.clone()).expect("engine from the stored snapshot");
    assert_eq!(
        std::fs::read(&stored[0]).unwrap(),
        original,
        "reused, not retaken"
    );
    let draw = "import random, uuid\n(random.random(), str(uuid.uuid4()))";
    let a = engine.execute(crate::common::request(draw));
    let b = engine.execute(crate::common::request(draw));
    assert_ne!(ok(&a).result, ok(&b).result);
    drop(engine);

    let mut damaged = original.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0xff;
    std::fs::write(&stored[0], &damaged).unwrap();
    let engine = Engine::new(config).expect("engine after a damaged snapshot");
    let r = engine.execute(crate::common::request("sum(range(10))"));
    assert_eq!(ok(&r).result.as_deref(), Some("45"));
    let replaced = std::fs::read(&stored[0]).unwrap();
    assert_ne!(replaced, damaged);
}
