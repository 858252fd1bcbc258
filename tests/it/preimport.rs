//! Pre-imported modules: sandboxes restored from the snapshot taken after `import pandas` and
//! `import matplotlib.pyplot` (their shared libraries relinked at the recorded bases) find them
//! imported and working, still get a fresh interpreter each, and a snapshot that does not restore
//! is never used: the engine falls back to the plain snapshot with a warning. Only calls that import
//! what the snapshot holds get a sandbox from it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use code_interpreter_mcp::sandbox::{Engine, EngineSettings, Flavor};
use sha2::{Digest, Sha256};

use crate::common::{engine_settings, ok, request, returned_file, temp_dir};

const PREINSTALL: [&str; 2] = ["pandas", "matplotlib"];

fn config(cache: &Path, preimport: &[&str]) -> EngineSettings {
    EngineSettings {
        preinstall_packages: PREINSTALL.iter().map(|s| s.to_string()).collect(),
        preimport_modules: preimport.iter().map(|s| s.to_string()).collect(),
        package_cache_dir: cache.to_path_buf(),
        ..engine_settings()
    }
}

/// The stored snapshots with pre-imported modules under `cache`.
fn stored(cache: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache.join("snapshot-preimported"))
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'));
    files
}

fn result(engine: &Engine, code: &str) -> String {
    let r = engine.execute(request(code));
    ok(&r).result.clone().unwrap_or_default()
}

#[test]
fn preimported_modules_work_in_every_fresh_sandbox_and_nothing_leaks_between_them() {
    let cache = temp_dir("preimport-fresh");
    // (Mapped copy-on-write, the opt-in way, so that every check below holds for it too; the
    // copied way is the other tests'.)
    let engine = Engine::new(EngineSettings {
        map_snapshot_memory: true,
        ..config(&cache, &["pandas", "matplotlib.pyplot"])
    })
    .expect("engine");
    assert!(engine.preimported(), "the snapshot with pandas is in use");
    assert_eq!(stored(&cache).len(), 1);

    // Imported before the call starts: the import itself is only a dictionary lookup.
    let started = Instant::now();
    let out = result(
        &engine,
        "import sys\nalready = 'pandas' in sys.modules and 'matplotlib.pyplot' in sys.modules\nimport pandas as pd\ndf = pd.DataFrame({'k': ['a', 'b', 'a'], 'v': [1, 2, 3], 't': pd.date_range('2024-01-01', periods=3)})\n(already, df.groupby('k').v.sum().to_dict(), df.t.dt.day.tolist())",
    );
    assert_eq!(out, "(True, {'a': 4, 'b': 2}, [1, 2, 3])");
    let first = started.elapsed();

    // A plot with text (matplotlib's fonts are opened again after the restore) saved as PNG.
    let r = engine.execute(request(
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3], [2, 3, 1])\nax.set_title('restored')\nfig.savefig('plot.png')",
    ));
    ok(&r);
    assert!(returned_file(&r, "plot.png").starts_with(b"\x89PNG"));

    // Libraries loaded after the restore link next to the relinked ones: numpy.fft's (in the
    // layer) and regex's (a package loaded from its import). Telling their data symbols from
    // their mutable globals leaves `Error.stackTraceLimit` as it was (the linker lowers it while
    // it tests them: see IMMUTABLE_GLOBAL_CHECK in modules/mod.rs).
    assert_eq!(
        result(
            &engine,
            "import js\nbefore = js.Error.stackTraceLimit\nimport numpy as np\nimport numpy.fft\nimport regex\n(np.fft.fft([1, 0, 0, 0]).real.tolist(), regex.sub(r'\\d', '#', 'a1b2'), before, js.Error.stackTraceLimit)",
        ),
        "([1.0, 1.0, 1.0, 1.0], 'a#b#', 10, 10)"
    );

    // The relinked libraries' functions are where the GOT says (relinking takes their slots from
    // the snapshot's record instead of reading the function table): each GOT entry of a function a
    // library exports names a slot holding that function, or the main module's or another
    // library's function of the same name (the one that wins).
    let got = result(
        &engine,
        r#"import js, pyodide_js, pandas
get = js.Reflect.get
m = pyodide_js._module
dsos = m.LDSO.loadedLibsByName
libs = {name: get(dsos, name).exports for name in js.Object.keys(dsos) if name != "__main__"}
main = get(dsos, "__main__").exports
same = elsewhere = wrong = 0
for exports in libs.values():
    for sym in js.Object.keys(exports):
        f = get(exports, sym)
        entry = get(m.GOT, sym)
        if not callable(f) or entry is None or entry.value <= 0:
            continue
        held = m.wasmTable.get(entry.value)
        if held == f:
            same += 1
        elif get(main, sym) == held or any(get(o, sym) == held for o in libs.values()):
            elsewhere += 1
        else:
            wrong += 1
(same > 1000, elsewhere < 100, wrong)"#,
    );
    assert_eq!(got, "(True, True, 0)");

    // What one call does to the pre-imported modules is gone in the next sandbox.
    ok(&engine.execute(request(
        "import pandas as pd, numpy as np\npd.leaked = 1\nnp.set_printoptions(precision=1)\npd.set_option('display.max_rows', 3)",
    )));
    assert_eq!(
        result(
            &engine,
            "import pandas as pd, numpy as np\n(hasattr(pd, 'leaked'), np.get_printoptions()['precision'], pd.get_option('display.max_rows'))",
        ),
        "(False, 8, 60)"
    );

    // Every sandbox draws its own random numbers (the snapshot froze the generators' state).
    let draw = "import numpy as np, random\n(float(np.random.random()), random.random(), int(np.random.default_rng().integers(1 << 30)))";
    assert_ne!(result(&engine, draw), result(&engine, draw));

    // Code that imports none of them runs in a plain sandbox (cheaper to start).
    assert_eq!(
        result(&engine, "import sys\n'pandas' in sys.modules"),
        "False"
    );

    // A Python error in a restored sandbox is an ordinary one.
    let r = engine.execute(request(
        "import pandas as pd\npd.DataFrame({'a': [1]})['b']",
    ));
    let error = r.error.expect("KeyError");
    assert_eq!(error.error_type, "KeyError");

    eprintln!("first call with pandas pre-imported: {first:?}");

    // A session started from this snapshot holds relinked native modules: its image carries their
    // record (the snapshot's, and what the session loaded after), and a restore relinks them. (This
    // one is finished from a parked sandbox, which relinks once its snapshot is chosen.)
    let parked = engine.park_session();
    assert!(parked.is_some());
    let mut session = engine
        .boot_session_flavor(parked, code_interpreter_mcp::sandbox::Flavor::Preimported)
        .unwrap();
    let kept = session.run(
        request("import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\nx = pd.Series([1, 2]).sum()\nint(x)"),
        None,
    );
    ok(&kept);
    let image = session.save_image().unwrap();
    let mut restored = engine.restore_session(None, image).unwrap();
    let r = restored.run(
        request("(int(x) + 1, int(df['a'].sum()), str(df.describe().loc['mean', 'a']))"),
        None,
    );
    assert_eq!(ok(&r).result.as_deref(), Some("(4, 499500, '499.5')"));

    // A session from the plain snapshot that loads a preinstalled package's libraries itself: its
    // record starts empty and holds them; restored twice over, it goes on from the record it was
    // relinked from.
    let mut plain = engine
        .boot_session_flavor(None, code_interpreter_mcp::sandbox::Flavor::Plain)
        .unwrap();
    ok(&plain.run(request("import numpy as np\na = np.arange(10)"), None));
    assert_eq!(plain.check_image(), None);
    let image = plain.save_image().unwrap();
    assert!(image.dylibs.is_some(), "the record of numpy's libraries");
    let mut restored = engine
        .restore_session(engine.park_session(), image)
        .unwrap();
    let r = restored.run(
        request("b = np.fft.fft(np.ones(8))\n(int(a.sum()), float(np.linalg.norm(np.ones(4))))"),
        None,
    );
    assert_eq!(ok(&r).result.as_deref(), Some("(45, 2.0)"));
    let again = restored.save_image().unwrap();
    let mut third = engine.restore_session(None, again).unwrap();
    let r = third.run(request("(int(a.sum()), complex(b[0]))"), None);
    assert_eq!(ok(&r).result.as_deref(), Some("(45, (8+0j))"));
}

/// The memory a pre-imported sandbox restores is its own whether it is mapped copy-on-write or
/// copied (the default), and when copied into the pages of the sandbox dropped before it (as pool
/// workers do: `pages/spare.rs`, rewriting only the pages the kernel recorded as written
/// where it can: `pages/written.rs`): bytes a call reads and then overwrites are as they
/// were in the next sandbox, and the modules work the same every way. An idle ready sandbox gives
/// back what it holds unchanged, mapped or copied (a copied memory becomes a mapping of the
/// snapshot's file, the pages that differ written back), unless the engine keeps no file.
#[test]
fn the_restored_memory_is_each_sandboxs_own_whether_mapped_or_copied() {
    let cache = temp_dir("preimport-mapped");
    // The probes read the middle of large strings the snapshot holds and nothing rewrites (in
    // Pyodide `id()` is the object's address in the wasm heap), and the heap's top: not arbitrary
    // live-heap addresses, where each sandbox's fresh random seeds (drawn at every start, on
    // purpose) can lie in a given snapshot's layout and differ from one sandbox to the next.
    let probe = "import sys, numpy, pandas, pyodide_js\nheap = pyodide_js._module.HEAPU8\ndocs = [pandas.DataFrame.__doc__, pandas.Series.__doc__, numpy.ndarray.__doc__]\nat = [id(s) + sys.getsizeof(s) // 2 for s in docs] + [heap.length - (1 << 20)]\nprint([bytes(heap.subarray(a, a + 64).to_py()).hex() for a in at])\n";
    let mut seen = Vec::new();
    for (map, give_back) in [(true, true), (false, true), (false, false)] {
        let case = format!("map: {map}, give back: {give_back}");
        let engine = Engine::new(EngineSettings {
            map_snapshot_memory: map,
            give_back_idle_memory: give_back,
            ..config(&cache, &["pandas"])
        })
        .expect("engine");
        assert!(engine.preimported(), "{case}");
        // This thread reuses a dropped sandbox's pages, as a pool worker does (only copied
        // memories are reused).
        engine.keep_spare_memory_on_this_thread();
        let reuses = engine.spare_memory_reuses();
        let recorded = engine.spare_memory_recorded_reuses();
        // (Overwriting the interpreter's heap may well end that call: only its output counts.)
        let first = engine.execute(request(&format!(
            "{probe}for a in reversed(at):\n    heap.fill(0x5a, a, a + 65536)"
        )));
        let second = engine.execute(request(probe));
        let line = |out: &str| out.lines().next().unwrap_or_default().to_string();
        assert_eq!(line(&first.stdout), line(&ok(&second).stdout), "{case}");
        assert!(!second.stdout.contains(&"5a".repeat(64)), "{case}");
        if !map {
            assert!(
                engine.spare_memory_reuses() > reuses,
                "the copied memory went into the first sandbox's pages"
            );
            // Where the kernel records writes, the restore rewrote only the pages the first
            // sandbox wrote: the probes' writes must be among them.
            assert_eq!(
                engine.spare_memory_recorded_reuses() > recorded,
                engine.records_sandbox_writes(),
                "the recorded writes were used where the kernel records them"
            );
        }
        // A ready sandbox left idle (as a pool's stock after `workers.idle_give_back_s`) gives
        // back the pages it holds unchanged, and reads and runs the same.
        let mut idle = engine.boot_flavor(Flavor::Preimported).expect("boot");
        idle.collect_garbage();
        let given = idle.give_back_unchanged_memory().expect("given back");
        if give_back {
            assert!(given > 8 << 20, "{case}: given back {given} bytes");
            assert_eq!(
                idle.give_back_unchanged_memory().expect("given back"),
                0,
                "{case}: all of it at once"
            );
        } else {
            assert_eq!(given, 0, "{case}: no file, nothing to give back");
        }
        // (Its writes after the give-back must stay its own too: it overwrites the probes last.)
        let after = idle.run(
            request(&format!(
                "{probe}import pandas as pd\nprint(pd.DataFrame({{'k': [1, 1, 2], 'v': [1, 2, 3]}}).groupby('k').v.sum().to_dict())\nfor a in reversed(at):\n    heap.fill(0x5a, a, a + 65536)"
            )),
            None,
        );
        let mut lines = after.stdout.lines();
        assert_eq!(lines.next(), second.stdout.lines().next(), "{case}");
        assert_eq!(lines.next(), Some("{1: 3, 2: 3}"), "{}", after.stdout);
        drop(idle);
        let reuses = engine.spare_memory_reuses();
        let next = engine.execute(request(probe));
        assert_eq!(line(&ok(&next).stdout), line(&second.stdout), "{case}");
        assert!(!next.stdout.contains(&"5a".repeat(64)), "{case}");
        if !map {
            assert_eq!(
                engine.spare_memory_reuses() > reuses,
                !give_back,
                "{case}: a memory that became a mapping is no spare"
            );
        }
        assert_eq!(
            result(
                &engine,
                "import pandas as pd\nint(pd.Series([1, 2, 3]).sum())"
            ),
            "6"
        );
        seen.push(second.stdout);
    }
    assert!(
        seen.iter().all(|s| *s == seen[0]),
        "mapped and copied memories hold the same bytes"
    );
}

/// The stored file's body (without its sha256 trailer), its record and Pyodide's snapshot.
fn split(file: &Path) -> (serde_json::Value, Vec<u8>) {
    let bytes = std::fs::read(file).unwrap();
    let body = &bytes[..bytes.len() - 32];
    let len = u64::from_le_bytes(body[..8].try_into().unwrap()) as usize;
    let record = serde_json::from_slice(&body[8..8 + len]).unwrap();
    (record, body[8 + len..].to_vec())
}

/// Writes a stored snapshot back with a checksum that holds.
fn write(file: &Path, record: &serde_json::Value, snapshot: &[u8]) {
    let record = serde_json::to_vec(record).unwrap();
    let mut body = (record.len() as u64).to_le_bytes().to_vec();
    body.extend_from_slice(&record);
    body.extend_from_slice(snapshot);
    let digest = Sha256::digest(&body);
    body.extend_from_slice(&digest);
    std::fs::write(file, body).unwrap();
}

#[test]
fn a_snapshot_that_does_not_restore_is_never_used_and_a_changed_list_makes_a_new_one() {
    let cache = temp_dir("preimport-fallback");
    let engine = Engine::new(config(&cache, &["pandas"])).expect("engine");
    assert!(engine.preimported());
    drop(engine);
    let [file] = stored(&cache).try_into().expect("one stored snapshot");

    // A damaged file fails its checksum: taken again.
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let engine = Engine::new(config(&cache, &["pandas"])).expect("engine");
    assert!(engine.preimported(), "taken again");
    drop(engine);

    // A file whose checksum holds but whose libraries do not relink as recorded (a library's
    // recorded table base moved): the check sandbox fails, the file is discarded, and sandboxes
    // restore the plain snapshot and import pandas themselves.
    let (mut record, snapshot) = split(&file);
    let before = record["loads"][0]["tableLenBefore"].as_u64().unwrap();
    record["loads"][0]["tableLenBefore"] = (before + 7).into();
    write(&file, &record, &snapshot);
    let engine = Engine::new(config(&cache, &["pandas"])).expect("engine");
    assert!(!engine.preimported(), "the broken snapshot is not used");
    assert!(stored(&cache).is_empty(), "and it is discarded");
    assert_eq!(
        result(
            &engine,
            "import sys\nbefore = 'pandas' in sys.modules\nimport pandas as pd\n(before, int(pd.Series([1, 2]).sum()))"
        ),
        "(False, 3)"
    );
    drop(engine);

    // Another list of modules is another snapshot (and replaces the old one on disk).
    let engine = Engine::new(config(&cache, &["pandas"])).expect("engine");
    assert!(engine.preimported());
    let [pandas_only] = stored(&cache).try_into().expect("one stored snapshot");
    drop(engine);
    let engine = Engine::new(config(&cache, &["numpy"])).expect("engine");
    assert!(engine.preimported());
    let [numpy_only] = stored(&cache).try_into().expect("one stored snapshot");
    assert_ne!(pandas_only, numpy_only);
    assert_eq!(
        result(
            &engine,
            "import sys\nbefore = 'numpy' in sys.modules\nimport numpy\n(before, 'pandas' in sys.modules)"
        ),
        "(True, False)"
    );
}

#[test]
fn preinstalled_packages_are_pre_imported_by_default_unless_turned_off() {
    let cache = temp_dir("preimport-preinstalled");
    let config = |on: bool| EngineSettings {
        preinstall_packages: vec!["numpy".to_string()],
        preimport_modules: Vec::new(),
        preimport_preinstalled: on,
        package_cache_dir: cache.clone(),
        ..engine_settings()
    };
    // Nothing listed in preimport_modules: numpy, the preinstalled package, is pre-imported.
    let engine = Engine::new(config(true)).expect("engine");
    assert!(engine.preimported());
    assert_eq!(stored(&cache).len(), 1);
    assert_eq!(
        result(
            &engine,
            "import sys\nbefore = 'numpy' in sys.modules\nimport numpy as np\n(before, int(np.arange(4).sum()))"
        ),
        "(True, 6)"
    );
    drop(engine);
    // Turned off: the same layer, no pre-imported modules.
    let engine = Engine::new(config(false)).expect("engine");
    assert!(!engine.preimported());
    assert_eq!(
        result(
            &engine,
            "import sys\nbefore = 'numpy' in sys.modules\nimport numpy as np\n(before, int(np.arange(4).sum()))"
        ),
        "(False, 6)"
    );
}

/// A server whose worker has stayed idle for `workers.idle_give_back_s` has its ready
/// pre-imported sandbox give back the pages it holds unchanged (the pool's `Backend::give_back`),
/// its memory copied (the default) or mapped, and the next call on that sandbox runs as any.
#[test]
fn an_idle_servers_stock_gives_back_memory_copied_or_mapped_and_the_next_call_runs_as_usual() {
    let cache = temp_dir("preimport-give-back");
    for map in ["false", "true"] {
        idle_server_gives_back(&cache, map);
    }
}

fn idle_server_gives_back(cache: &Path, map: &str) {
    use crate::fixture::{Server, call_stateless, server_command};

    let mut command = server_command();
    command
        .env("CODE_INTERPRETER_MCP_LOG_FORMAT", "json")
        .env("RUST_LOG", "warn,code_interpreter_mcp::pool=debug")
        .env("CODE_INTERPRETER_MCP_PACKAGE_CACHE_DIR", cache)
        .env("CODE_INTERPRETER_MCP_PREINSTALL_PACKAGES", "pandas")
        .env("CODE_INTERPRETER_MCP_PREIMPORT_MODULES", "pandas")
        .env("CODE_INTERPRETER_MCP_WORKERS_MAP_SNAPSHOT_MEMORY", map)
        .env("CODE_INTERPRETER_MCP_WORKERS_IDLE_GIVE_BACK_S", "1")
        .env("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "1")
        .env("CODE_INTERPRETER_MCP_WORKERS_PREWARMED_WORKERS", "1")
        .env("CODE_INTERPRETER_MCP_WORKERS_READY_SANDBOXES", "1");
    let server = Server::spawn(&mut command, true);
    server.wait_ready();
    let pandas = serde_json::json!({"code": "import pandas as pd\nint(pd.DataFrame({'k': [1, 1, 2], 'v': [1, 2, 3]}).groupby('k').v.sum()[1])"});
    let result = |reply: serde_json::Value| reply["result"]["structuredContent"]["result"].clone();
    // The first pandas call makes the worker keep pre-imported sandboxes.
    assert_eq!(result(call_stateless(&server, pandas.clone())), "3");
    // What the pre-imported stock gave back, once the worker has stayed idle (a plain sandbox
    // gives back nothing: its snapshot is kept in no file).
    let given_back = || -> f64 {
        server
            .log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|e| e["fields"]["message"] == "an idle ready sandbox gave back memory")
            .filter_map(|e| e["fields"]["mib"].as_f64())
            .fold(0.0, f64::max)
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while given_back() < 8.0 {
        assert!(
            Instant::now() < deadline,
            "map: {map}: no ready pre-imported sandbox gave back memory: {:?}",
            server.log.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        !server
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|line| line.contains("could not give back memory")),
        "map: {map}"
    );
    assert_eq!(
        result(call_stateless(&server, pandas.clone())),
        "3",
        "map: {map}"
    );
    assert_eq!(
        result(call_stateless(
            &server,
            serde_json::json!({"code": "import sys\n'pd' in dir() or 'k' in globals()"})
        )),
        "False",
        "map: {map}: nothing of the earlier calls is left"
    );
}
