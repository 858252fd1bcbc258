//! How a sandbox comes to be: its isolate made from the engine's V8 startup snapshot, Pyodide booted
//! in it under the boot deadline, then locked into its booted phase. A session's sandbox can also
//! be *parked*: booted as far as Pyodide goes before it needs its memory snapshot (its WebAssembly
//! instantiated), then finished once the snapshot is chosen, so starting or resuming a session
//! waits only for the restore (see `park` in `ops/park.js`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deno_core::{JsRuntime, v8};

use super::ops::{
    BootState, CallState, EntryPoints, Phase as OpPhase, Role, SandboxState, WebState,
};
use super::startup;
use super::watchdog::{Phase, Stop, Watchdog};
use super::{MB, Sandbox};
use crate::sandbox::memory::MemoryBudget;
use crate::sandbox::prepared::memory_snapshot::SharedSnapshot;
use crate::sandbox::prepared::shared::{EngineError, EngineShared};
use crate::sandbox::prepared::wasm::CodegenAllowed;

/// Makes `runtime.js` register its entry points with Rust (see `__sandboxEntry` there).
const ENTRY: &str = "__sandboxEntry()";

/// The longest a sandbox (or the snapshot maker) may take to start.
const BOOT_DEADLINE: Duration = Duration::from_secs(120);

/// A sandbox's isolate while Pyodide starts in it.
pub(super) struct Starting {
    runtime: JsRuntime,
    tokio: tokio::runtime::Runtime,
    heap_exhausted: Arc<AtomicBool>,
    /// Declared after `runtime`, so dropped after the isolate: it keeps what the isolate's backing
    /// stores point to (`MemoryBudget::keep_until_disposed`).
    budget: Arc<MemoryBudget>,
}

impl Starting {
    /// A new isolate for `role`, its entry points registered, nothing booted yet.
    pub(super) fn new(shared: &Arc<EngineShared>, role: Role) -> Result<Self, EngineError> {
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let budget_bytes =
            usize::try_from(shared.settings.sandbox_memory_limit_mb.saturating_mul(MB))
                .unwrap_or(usize::MAX);
        let budget = MemoryBudget::new(budget_bytes);
        let mut runtime = startup::new_runtime(shared, role, budget.clone(), &tokio)?;
        // runtime.js hands over its entry points (it may have run long ago, for the startup snapshot).
        runtime
            .execute_script("<sandbox>", ENTRY)
            .map_err(|e| EngineError::Boot(e.to_string()))?;

        let heap_exhausted = Arc::new(AtomicBool::new(false));
        {
            let handle = runtime.v8_isolate().thread_safe_handle();
            let flag = heap_exhausted.clone();
            runtime.add_near_heap_limit_callback(move |current, _initial| {
                flag.store(true, Ordering::SeqCst);
                handle.terminate_execution();
                // Room to unwind; the isolate is discarded afterwards.
                current + current / 2
            });
        }
        Ok(Self {
            runtime,
            tokio,
            heap_exhausted,
            budget,
        })
    }

    /// Calls the boot step `pick` names and runs the isolate until the promise it returns settles,
    /// within BOOT_DEADLINE when `deadline` (the installer may take as long as its downloads need).
    pub(super) fn drive(
        &mut self,
        shared: &EngineShared,
        pick: fn(&EntryPoints) -> &v8::Global<v8::Function>,
        deadline: bool,
    ) -> Result<(), EngineError> {
        let step = {
            let state = self.runtime.op_state();
            let state = state.borrow();
            let entry = state.borrow::<SandboxState>().entry.as_ref();
            entry
                .map(|e| pick(e).clone())
                .ok_or_else(|| EngineError::Boot("runtime.js did not register".into()))?
        };
        // While Pyodide starts it compiles small WebAssembly modules of its own; afterwards only
        // `op_sandbox_compile_wasm` may (see `wasm.rs`).
        let codegen = CodegenAllowed::new();
        // A sandbox that has not started within BOOT_DEADLINE never will (e.g. a Pyodide that cannot
        // read its standard library).
        let watchdog = if deadline {
            let w = Watchdog::start(
                self.runtime.v8_isolate().thread_safe_handle(),
                Some(self.budget.clone()),
                None,
                None,
            )?;
            w.arming().arm(Phase::Boot, BOOT_DEADLINE);
            Some(w)
        } else {
            None
        };
        let runtime = &mut self.runtime;
        let call = super::waker::released(runtime.call(&step));
        let booted = self.tokio.block_on(async {
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r),
                _ = async {
                    match &watchdog {
                        Some(w) => w.fired().await,
                        None => std::future::pending().await,
                    }
                } => None,
            }
        });
        let stopped = watchdog.as_ref().and_then(Watchdog::stopped);
        drop(watchdog);
        drop(codegen);
        let booted = match booted {
            Some(booted) if stopped != Some(Stop::Deadline(Phase::Boot)) => booted,
            _ => {
                return Err(EngineError::Boot(format!(
                    "Pyodide did not finish starting within {} s",
                    BOOT_DEADLINE.as_secs()
                )));
            }
        };
        booted.map(drop).map_err(|e| self.failure(shared, e))
    }

    /// The booted sandbox: the start-up ops refuse from here on, and what the boot printed is gone.
    /// Every way a sandbox that runs user code comes to be ends here, with the check that its realm
    /// reaches nothing a fresh sandbox cannot (`realm.rs`).
    pub(super) fn finish(mut self) -> Result<Sandbox, EngineError> {
        let user_realm = {
            let state = self.runtime.op_state();
            let state = state.borrow();
            matches!(state.borrow::<BootState>().role, Role::Sandbox { .. })
        };
        if user_realm {
            super::realm::check(&mut self.runtime).map_err(EngineError::Boot)?;
        }
        let Self {
            runtime,
            tokio,
            heap_exhausted,
            budget,
        } = self;
        let mut sandbox = Sandbox {
            runtime,
            tokio,
            heap_exhausted,
            budget,
            used: false,
            session: false,
            ended: None,
        };
        super::callbacks::after_boot(sandbox.runtime.v8_isolate());
        // From here on, the start-up ops refuse (their JavaScript callers stay reachable).
        // The snapshot it restored is not needed any more: for a session resumed from its image
        // that is the image's own memory (tens of MB), which the sandbox must not keep alive. A
        // snapshot kept in a sealed file is kept, for the memory to give back its unchanged pages
        // once idle (the engine's pre-imported snapshot, alive anyway).
        sandbox.with::<BootState, _>(|b| {
            b.phase = OpPhase::Booted;
            if let Role::Sandbox { snapshot, .. } = &mut b.role
                && snapshot.as_ref().is_none_or(|s| s.image().is_none())
            {
                *snapshot = None;
            }
        });
        if !sandbox.with_state(|s| s.shared.settings.runtime_package_installation) {
            sandbox.with::<WebState, _>(|w| w.downloads_enabled = false);
        }
        // Output printed while booting is not the user's.
        sandbox
            .runtime
            .op_state()
            .borrow_mut()
            .put(CallState::idle());
        Ok(sandbox)
    }

    /// Why booting failed, as precisely as the sandbox can say: a budget too small for Pyodide, or
    /// the exception with what Python or Emscripten printed (which usually says more).
    fn failure(&self, shared: &EngineShared, error: impl std::fmt::Display) -> EngineError {
        if self.heap_exhausted.load(Ordering::SeqCst) {
            return EngineError::Boot(format!(
                "the V8 heap budget (workers.memory_limit_mb = {} MiB) is too small to start Pyodide",
                shared.settings.memory_limit_mb
            ));
        }
        if self.budget.exceeded() {
            return EngineError::Boot(format!(
                "the sandbox memory budget (workers.sandbox_memory_limit_mb = {} MiB) is too small to start Pyodide",
                shared.settings.sandbox_memory_limit_mb
            ));
        }
        let state = self.runtime.op_state();
        let state = state.borrow();
        let s = state.borrow::<CallState>();
        let printed = format!("{}{}", s.stdout.text(), s.stderr.text());
        let printed = printed.trim();
        let tail = &printed[printed.floor_char_boundary(printed.len().saturating_sub(1000))..];
        if tail.is_empty() {
            EngineError::Boot(error.to_string())
        } else {
            EngineError::Boot(format!("{error}; output: {tail}"))
        }
    }
}

/// A session's sandbox booted as far as it goes before it needs its memory snapshot, saveable;
/// `unpark` finishes it from the snapshot chosen then. Like a `Sandbox`, it stays on the thread
/// that made it.
pub struct ParkedSandbox {
    starting: Starting,
    shared: Arc<EngineShared>,
}

impl ParkedSandbox {
    /// Parks a new saveable sandbox (see the module doc).
    pub(crate) fn park(shared: Arc<EngineShared>) -> Result<Self, EngineError> {
        let role = Role::Sandbox {
            snapshot: None,
            saveable: true,
        };
        let mut starting = Starting::new(&shared, role)?;
        starting.drive(&shared, |e| &e.park, true)?;
        Ok(Self { starting, shared })
    }

    /// The sandbox, booted from `snapshot` (a plain snapshot, or a session image's memory).
    pub(crate) fn unpark(self, snapshot: Arc<SharedSnapshot>) -> Result<Sandbox, EngineError> {
        let Self {
            mut starting,
            shared,
        } = self;
        {
            let state = starting.runtime.op_state();
            let mut state = state.borrow_mut();
            if let Role::Sandbox {
                snapshot: chosen, ..
            } = &mut state.borrow_mut::<BootState>().role
            {
                *chosen = Some(snapshot);
            }
        }
        starting.drive(&shared, |e| &e.unpark, true)?;
        starting.finish()
    }
}

impl Sandbox {
    /// Boots a sandbox that runs one request, restoring `snapshot` (none: a full start-up).
    pub(crate) fn boot(
        shared: Arc<EngineShared>,
        snapshot: Option<Arc<SharedSnapshot>>,
    ) -> Result<Self, EngineError> {
        Self::boot_as(
            shared,
            Role::Sandbox {
                snapshot,
                saveable: false,
            },
        )
    }

    /// Boots a sandbox whose state can be saved as an image (a session's), restoring `snapshot`
    /// (a plain snapshot, or a session image's memory).
    pub(crate) fn boot_saveable(
        shared: Arc<EngineShared>,
        snapshot: Option<Arc<SharedSnapshot>>,
    ) -> Result<Self, EngineError> {
        Self::boot_as(
            shared,
            Role::Sandbox {
                snapshot,
                saveable: true,
            },
        )
    }

    /// Boots a sandbox for `role`: made, driven through Pyodide's start-up and checked.
    pub(crate) fn boot_as(shared: Arc<EngineShared>, role: Role) -> Result<Self, EngineError> {
        let installer = matches!(role, Role::Installer { .. });
        let mut starting = Starting::new(&shared, role)?;
        starting.drive(&shared, |e| &e.boot, !installer)?;
        starting.finish()
    }
}
