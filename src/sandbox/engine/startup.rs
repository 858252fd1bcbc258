//! V8 start-up for the process and for each isolate: the process-wide flags ([`init_v8`]), the V8
//! startup snapshot and the keeper isolate.
//!
//! The V8 startup snapshot (not to be confused with the Pyodide memory snapshot of
//! `memory_snapshot.rs`): the sandbox's JavaScript realm (deno_core's own JavaScript, `runtime.js`
//! and Pyodide's two modules as sandboxes are served them) evaluated once per process and serialised
//! by V8, so that each new isolate deserialises a ready heap instead of compiling and evaluating
//! ~1.3 MB of JavaScript. It holds no Python and no WebAssembly: those come afterwards, in each
//! isolate of its own (from the Pyodide memory snapshot, or a full start-up).
//!
//! It is made when the process creates its first engine, before any sandbox isolate exists, and
//! never after one does: V8 cannot serialise a heap while another isolate of the process instantiates
//! WebAssembly (seen here: an abort in V8's WebAssembly type canonicalisation). Engines with the same
//! modules share it. It is never stored: a V8 snapshot fits only the V8 build and flags that made it.
//! Where there is none, sandboxes load the modules themselves, as they would without this module.
//! Each engine also keeps one idle isolate of its snapshot alive ([`Keeper`]), so that V8 keeps the
//! read-only heap it shares between isolates.

use std::rc::Rc;
use std::sync::{Arc, Mutex, Once};
use std::time::Instant;

use deno_core::{JsRuntime, JsRuntimeForSnapshot, RuntimeOptions, v8};

use crate::sandbox::engine::modules;
use crate::sandbox::engine::shared::{EngineError, EngineShared};
use crate::sandbox::isolate::callbacks;
use crate::sandbox::isolate::memory::{self, MemoryBudget};
use crate::sandbox::isolate::ops;
use crate::sandbox::isolate::ops::Role;

/// 1 MB in the configuration's sense.
const MB: u64 = 1024 * 1024;

static V8_FLAGS: Once = Once::new();

/// Sets V8's process-wide flags and initialises V8, once per process (the first engine's WebAssembly
/// memory cap applies to all). Each flag is tuned for isolates that live for one call; the
/// measurements behind them are in docs/performance.md.
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

/// A new isolate for `role`, from the engine's V8 startup snapshot, made in `tokio`'s context (V8
/// posts delayed tasks to the runtime that is current when the isolate is created): its heap limited
/// to `memory_limit_mb`, its ArrayBuffers allocated against `budget`, and the sandbox's own V8
/// callbacks installed (see `callbacks.rs`).
pub(crate) fn new_runtime(
    shared: &Arc<EngineShared>,
    role: Role,
    budget: Arc<MemoryBudget>,
    tokio: &tokio::runtime::Runtime,
) -> Result<JsRuntime, EngineError> {
    let heap_bytes =
        usize::try_from(shared.config.memory_limit_mb.saturating_mul(MB)).unwrap_or(usize::MAX);
    let _context = tokio.enter();
    isolate_starting();
    let params = v8::CreateParams::default()
        .heap_limits(0, heap_bytes)
        .array_buffer_allocator(memory::allocator(&budget));
    let mut runtime = JsRuntime::try_new(RuntimeOptions {
        extensions: vec![ops::sandbox::init(shared.clone(), role, budget.clone())],
        module_loader: Some(Rc::new(modules::AssetModuleLoader(shared.modules.clone()))),
        create_params: Some(params),
        startup_snapshot: shared.startup_snapshot.get().copied(),
        ..Default::default()
    })
    .map_err(|e| EngineError::Boot(e.to_string()))?;
    let isolate = runtime.v8_isolate();
    callbacks::install(isolate);
    budget.watch(isolate.thread_safe_handle());
    Ok(runtime)
}

/// The memory budget of an isolate that runs no user code (the keeper, the startup snapshot's).
fn unlimited() -> Arc<MemoryBudget> {
    MemoryBudget::new(usize::MAX)
}

/// Evaluates Pyodide's modules into the realm (see `preloadPyodide` in `runtime.js`).
const PRELOAD: &str = "__sandboxPreload()";

/// What this process has done with V8.
struct Made {
    /// Startup snapshots by the fingerprint of the modules they hold. Each is leaked once: deno_core
    /// needs a `'static` snapshot, and every engine with the same modules shares it.
    snapshots: Vec<(u64, &'static [u8])>,
    /// Whether a sandbox isolate has started: after that, no snapshot is made.
    isolates_started: bool,
}

static MADE: Mutex<Made> = Mutex::new(Made {
    snapshots: Vec::new(),
    isolates_started: false,
});

fn made() -> std::sync::MutexGuard<'static, Made> {
    MADE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Called before every sandbox isolate is created: waits while a snapshot is being made, and keeps
/// any from being made later.
fn isolate_starting() {
    made().isolates_started = true;
}

/// The startup snapshot for this engine's modules, made now if this process has none yet and no
/// sandbox isolate has started.
pub(crate) fn get_or_make(shared: &Arc<EngineShared>) -> Result<&'static [u8], EngineError> {
    if !shared.modules.snapshottable() {
        return Err(EngineError::Boot(
            "pyodide.mjs does not have the expected JsvError helper".into(),
        ));
    }
    let fingerprint = shared.modules.fingerprint();
    // Held while the snapshot is made, so that no sandbox isolate starts meanwhile.
    let mut made = made();
    if let Some((_, bytes)) = made.snapshots.iter().find(|(f, _)| *f == fingerprint) {
        return Ok(bytes);
    }
    if made.isolates_started {
        return Err(EngineError::Boot(
            "sandboxes of other modules already run in this process".into(),
        ));
    }
    let started = Instant::now();
    let maker = shared.clone();
    let bytes = std::thread::Builder::new()
        .name("startup-snapshot".into())
        .stack_size(8 * 1024 * 1024)
        .spawn(move || make(maker))?
        .join()
        .map_err(|_| EngineError::Boot("making the V8 startup snapshot panicked".into()))??;
    let bytes: &'static [u8] = Box::leak(bytes);
    tracing::info!(
        bytes = bytes.len(),
        ms = started.elapsed().as_millis() as u64,
        "V8 startup snapshot made"
    );
    made.snapshots.push((fingerprint, bytes));
    Ok(bytes)
}

/// An isolate of the engine's startup snapshot in which no JavaScript ever runs, alive on a thread
/// of its own as long as the engine. V8 shares one read-only heap among the isolates of a process
/// only while at least one of them lives; when the last one goes, the next deserialises it again and
/// restarts V8's compile-task executor. Without a keeper every sandbox that starts while no other one
/// lives (each of them, when calls come one at a time) pays for that: ~2 ms of its creation, measured
/// in the sandbox bench. The keeper costs one sandbox realm without Pyodide in it.
pub(crate) struct Keeper {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Starts the keeper and waits for its isolate; `None` (with a warning) if it cannot start.
    pub fn start(shared: &Arc<EngineShared>) -> Option<Self> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = std::sync::mpsc::channel::<()>();
        let shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("v8-keeper".into())
            .spawn(move || {
                let runtime = (|| -> Result<_, EngineError> {
                    let tokio = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    let runtime = new_runtime(
                        &shared,
                        Role::Sandbox {
                            snapshot: None,
                            saveable: false,
                        },
                        unlimited(),
                        &tokio,
                    )?;
                    // Dropped in this order: the isolate, then the runtime it was made in.
                    Ok((runtime, tokio))
                })();
                let _ = ready_tx.send(runtime.as_ref().err().map(ToString::to_string));
                // Until the engine goes (the sender is dropped).
                let _ = stop_rx.recv();
                drop(runtime);
            });
        let thread = match thread {
            Ok(thread) => thread,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the V8 keeper isolate");
                return None;
            }
        };
        let keeper = Self {
            stop: Some(stop),
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(None) => Some(keeper),
            Ok(Some(e)) => {
                tracing::warn!(error = %e, "cannot start the V8 keeper isolate");
                None
            }
            Err(_) => None,
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Builds a realm the way a sandbox's starts, evaluates Pyodide's modules in it and serialises it.
fn make(shared: Arc<EngineShared>) -> Result<Box<[u8]>, EngineError> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _context = tokio.enter();
    let loader = modules::AssetModuleLoader(shared.modules.clone());
    let mut runtime = JsRuntimeForSnapshot::try_new(RuntimeOptions {
        extensions: vec![ops::sandbox::init(
            shared,
            Role::StartupSnapshot,
            unlimited(),
        )],
        module_loader: Some(Rc::new(loader)),
        ..Default::default()
    })
    .map_err(|e| EngineError::Boot(e.to_string()))?;
    let promise = runtime
        .execute_script("<startup-snapshot>", PRELOAD)
        .map_err(|e| EngineError::Boot(e.to_string()))?;
    let resolved = runtime.resolve(promise);
    tokio
        .block_on(runtime.with_event_loop_promise(resolved, Default::default()))
        .map_err(|e| EngineError::Boot(format!("evaluating Pyodide's modules failed: {e}")))?;
    Ok(runtime.snapshot())
}
