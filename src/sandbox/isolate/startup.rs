//! Each isolate's start: a new isolate for a role ([`new_runtime`]), the V8 startup snapshot it
//! starts from and the keeper isolate (V8's process-wide flags are set first, by
//! `src/sandbox/prepared/startup.rs`).
//!
//! The V8 startup snapshot (not to be confused with the Pyodide memory snapshot of
//! `src/sandbox/prepared/memory_snapshot.rs`): the sandbox's JavaScript realm (deno_core's own
//! JavaScript, `runtime.js` and Pyodide's two modules as sandboxes are served them) evaluated once
//! per process and serialised by V8, so that each new isolate deserialises a ready heap instead of compiling and evaluating
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
use std::sync::{Arc, Mutex};
use std::time::Instant;

use deno_core::{JsRuntime, JsRuntimeForSnapshot, RuntimeOptions, v8};

use super::callbacks;
use super::ops::{self, Role};
use crate::sandbox::memory::{self, MemoryBudget};
use crate::sandbox::prepared::modules;
use crate::sandbox::prepared::shared::{EngineError, EngineShared};
use crate::sandbox::prepared::startup::MB;

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
        usize::try_from(shared.settings.memory_limit_mb.saturating_mul(MB)).unwrap_or(usize::MAX);
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
