//! V8's process-wide flags ([`init_v8`]), set once per process before any isolate exists. The
//! isolates themselves, and the V8 startup snapshot they start from, are made in
//! `src/sandbox/isolate/startup.rs`.

use std::sync::Once;

use deno_core::JsRuntime;

/// 1 MB in the configuration's sense.
pub(crate) const MB: u64 = 1024 * 1024;

static V8_FLAGS: Once = Once::new();

/// Sets V8's process-wide flags and initialises V8, once per process (the first engine's WebAssembly
/// memory cap applies to all). Each flag is tuned for isolates that live for one call; the
/// measurements behind them are in docs/performance-log.md.
pub(crate) fn init_v8(wasm_memory_limit_mb: u64) {
    V8_FLAGS.call_once(|| {
        let pages = wasm_memory_limit_mb.saturating_mul(MB) / 65536;
        let mut flags = vec![
            "code-interpreter-mcp".into(),
            format!("--wasm-max-mem-pages={pages}"),
            // Compile every JS function when its script is compiled: the V8 startup snapshot (or,
            // without one, the shared code cache) then holds all of Pyodide's functions and no
            // isolate compiles them lazily again.
            "--no-lazy".into(),
            // A sandbox's heap grows to about 20 MB during start-up: a young generation and a first
            // old-generation limit that hold it avoid the scavenges and the mark-compact V8 would
            // otherwise run in every sandbox. The old-generation limit also sizes V8's global limit,
            // which counts the WebAssembly memory: a pre-imported sandbox's grows to ~94 MB while
            // it restores, which 64 MB let start two mark-compacts in every such sandbox.
            "--min-semi-space-size=16".into(),
            "--initial-old-space-size=128".into(),
            // Optimised JavaScript code dies with its isolate: higher thresholds leave the start-up's
            // loops (run once per sandbox) to the interpreter, while code that keeps running (a
            // user's loop calling into JavaScript) still gets optimised.
            "--invocation-count-for-maglev=4000".into(),
            "--invocation-count-for-maglev-osr=1000".into(),
            "--invocation-count-for-osr=5000".into(),
            "--invocation-count-for-early-optimization=300".into(),
            // Nor does baseline (Sparkplug) code outlive its isolate.
            "--no-sparkplug".into(),
            // WebAssembly is the opposite case: optimised code lives in the module all isolates
            // share, but V8 counts tier-up per instance; a smaller budget optimises the start-up's
            // functions during the first sandboxes, once for the process.
            "--wasm-tiering-budget=1000000".into(),
            // A heap snapshot (`Sandbox::heap_snapshot`, for audits such as tests/it/secrets.rs)
            // keeps strings whole rather than their first 1024 characters; nothing else reads it.
            "--heap-snapshot-string-limit=1073741823".into(),
        ];
        // For profiling and diagnosis only (e.g. "--perf-basic-prof"); not a configuration key.
        if let Ok(extra) = std::env::var("CODE_INTERPRETER_MCP_V8_FLAGS") {
            flags.extend(extra.split_whitespace().map(String::from));
        }
        let unknown = deno_core::v8_set_flags(flags);
        // V8 hands back argv[0] followed by the flags it did not recognise.
        if let Some(unknown) = unknown.get(1..).filter(|u| !u.is_empty()) {
            tracing::warn!(?unknown, "V8 did not recognise some flags");
        }
        // Initialise V8 in its normal mode now: if the first isolate were the startup snapshot's,
        // deno_core would set V8 up for snapshotting (single-threaded, with a fixed random seed) for
        // the whole process.
        JsRuntime::init_platform(None);
    });
}
