//! One sandbox's isolate lifecycle: a new `deno_core::JsRuntime` (its own V8 isolate, from the
//! engine's V8 startup snapshot), Pyodide booted in it for a role (see `ops::Role`), one request run,
//! and the outcome read back. A sandbox is not `Send`: boot and execute it on one dedicated thread,
//! never on an async runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use deno_core::JsRuntime;
use serde::Deserialize;

use super::memory_snapshot::SharedSnapshot;
use super::ops::{Role, SandboxState};
use super::output;
use super::shared::{EngineError, EngineShared};
use super::startup;
use super::types::{ErrorKind, ExecError, ExecRequest, ExecResult};
use super::watchdog::{self, Watchdog};
use crate::config::limits::MAX_STREAM_BYTES;

/// Makes `runtime.js` register its entry points with Rust (see `__sandboxEntry` there).
const ENTRY: &str = "__sandboxEntry()";

/// The longest a sandbox (or the snapshot maker) may take to start.
const BOOT_DEADLINE: Duration = Duration::from_secs(120);

/// A booted, never-used sandbox.
pub struct Sandbox {
    runtime: JsRuntime,
    tokio: tokio::runtime::Runtime,
    heap_exhausted: Arc<AtomicBool>,
    boot_time: Duration,
    used: bool,
}

impl Sandbox {
    /// Boots a sandbox that runs one request, restoring `snapshot` (none: a full start-up).
    pub(crate) fn boot(
        shared: Arc<EngineShared>,
        snapshot: Option<Arc<SharedSnapshot>>,
    ) -> Result<Self, EngineError> {
        Self::boot_as(shared, Role::Sandbox { snapshot })
    }

    /// What `f` takes out of the sandbox's role (what a snapshot maker or an installer produced).
    pub(crate) fn take_role<T>(&self, f: impl FnOnce(&mut Role) -> T) -> T {
        let state = self.runtime.op_state();
        let mut state = state.borrow_mut();
        f(&mut state.borrow_mut::<SandboxState>().role)
    }

    pub(crate) fn boot_as(shared: Arc<EngineShared>, role: Role) -> Result<Self, EngineError> {
        let installer = matches!(role, Role::Installer { .. });
        let started = Instant::now();
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut runtime = startup::new_runtime(&shared, role, &tokio)?;
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

        let boot = {
            let state = runtime.op_state();
            let state = state.borrow();
            let entry = state.borrow::<SandboxState>().entry.as_ref();
            entry
                .map(|e| e.boot.clone())
                .ok_or_else(|| EngineError::Boot("runtime.js did not register".into()))?
        };
        // A sandbox that has not started within BOOT_DEADLINE never will (e.g. a Pyodide that cannot
        // read its standard library); the installer may take as long as its downloads need.
        let watchdog = (!installer).then(|| {
            let w = Watchdog::start(runtime.v8_isolate().thread_safe_handle(), BOOT_DEADLINE);
            let _ = w.sender().send(watchdog::WatchMsg::Arm(Instant::now()));
            w
        });
        let wake = watchdog.as_ref().map(|w| w.wake.clone());
        let call = runtime.call(&boot);
        let booted = tokio.block_on(async {
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r),
                _ = async {
                    match &wake {
                        Some(wake) => wake.notified().await,
                        None => std::future::pending().await,
                    }
                } => None,
            }
        });
        if watchdog.as_ref().is_some_and(|w| w.fired()) || booted.is_none() {
            return Err(EngineError::Boot(format!(
                "Pyodide did not finish starting within {} s",
                BOOT_DEADLINE.as_secs()
            )));
        }
        drop(watchdog);
        booted
            .expect("checked above")
            .map_err(|e| {
                if heap_exhausted.load(Ordering::SeqCst) {
                    EngineError::Boot(format!(
                        "the V8 heap budget (workers.memory_limit_mb = {} MiB) is too small to start Pyodide",
                        shared.config.memory_limit_mb
                    ))
                } else {
                    // What Python or Emscripten printed usually says more than the JS exception.
                    let state = runtime.op_state();
                    let state = state.borrow();
                    let s = state.borrow::<SandboxState>();
                    let printed = format!("{}{}", s.stdout.text(), s.stderr.text());
                    let printed = printed.trim();
                    let tail = &printed[printed.floor_char_boundary(printed.len().saturating_sub(1000))..];
                    if tail.is_empty() {
                        EngineError::Boot(e.to_string())
                    } else {
                        EngineError::Boot(format!("{e}; output: {tail}"))
                    }
                }
            })?;
        if !shared.config.runtime_package_installation {
            runtime
                .op_state()
                .borrow_mut()
                .borrow_mut::<SandboxState>()
                .downloads_enabled = false;
        }
        // Output printed while booting is not the user's.
        {
            let state = runtime.op_state();
            let mut state = state.borrow_mut();
            let s = state.borrow_mut::<SandboxState>();
            s.stdout = output::CappedBuffer::new(MAX_STREAM_BYTES);
            s.stderr = output::CappedBuffer::new(MAX_STREAM_BYTES);
        }
        Ok(Self {
            runtime,
            tokio,
            heap_exhausted,
            boot_time: started.elapsed(),
            used: false,
        })
    }

    /// Finishes the garbage collection that booting started, for a sandbox prepared ahead of a call:
    /// otherwise its mark-compact pause (measured 4-6 ms) lands in the first milliseconds of the
    /// user's code. Costs ~15 ms of CPU, so callers that run code right away skip it.
    pub fn collect_garbage(&mut self) {
        self.runtime.v8_isolate().low_memory_notification();
    }

    /// How long booting took.
    pub fn boot_time(&self) -> Duration {
        self.boot_time
    }

    /// Runs one request. The sandbox is consumed: its isolate is discarded afterwards.
    pub fn execute(mut self, request: ExecRequest) -> ExecResult {
        self.run(request)
    }

    /// Runs one request and leaves the used sandbox to the caller, who drops it (tearing down the
    /// isolate takes a while) after the result has been handed on. A sandbox runs one request only;
    /// a second call returns a runtime error.
    pub fn run(&mut self, request: ExecRequest) -> ExecResult {
        if std::mem::replace(&mut self.used, true) {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                "a sandbox runs one request only",
            ));
        }
        let timeout_ms = request.timeout.as_millis();
        let watchdog = Watchdog::start(
            self.runtime.v8_isolate().thread_safe_handle(),
            request.timeout,
        );
        let (run, memory_limit_mb) = {
            let state = self.runtime.op_state();
            let mut state = state.borrow_mut();
            let s = state.borrow_mut::<SandboxState>();
            s.code = Some(request.code);
            s.input_files = request
                .files
                .into_iter()
                .map(|f| (f.path, Some(f.content)))
                .collect();
            s.watchdog = Some(watchdog.sender());
            let run = s.entry.as_ref().map(|e| e.run.clone());
            (run, s.shared.config.memory_limit_mb)
        };
        let Some(run) = run else {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                "the sandbox has no run entry point",
            ));
        };

        let wake = watchdog.wake.clone();
        let runtime = &mut self.runtime;
        let outcome = self.tokio.block_on(async {
            let call = runtime.call(&run);
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r),
                _ = wake.notified() => None,
            }
        });
        let timed_out = watchdog.fired();
        drop(watchdog);

        let state = self.runtime.op_state();
        let mut state = state.borrow_mut();
        let s = state.borrow_mut::<SandboxState>();
        let report: Option<Report> = s.report.take().and_then(|j| serde_json::from_str(&j).ok());
        let files = std::mem::take(&mut s.files);
        let mut result = ExecResult {
            success: false,
            stdout: s.stdout.text(),
            stderr: s.stderr.text(),
            result: None,
            output_truncated: s.stdout.truncated() || s.stderr.truncated() || files.truncated(),
            files: files.into_files(),
            error: None,
            timed_out,
        };

        if timed_out {
            result.error = Some(ExecError::new(
                ErrorKind::Timeout,
                "TimeoutError",
                format!("execution exceeded timeout_ms = {timeout_ms} ms and was stopped"),
            ));
        } else if self.heap_exhausted.load(Ordering::SeqCst) {
            result.error = Some(ExecError::new(
                ErrorKind::Runtime,
                "MemoryLimitExceeded",
                format!(
                    "the sandbox exhausted its V8 heap budget (workers.memory_limit_mb = {memory_limit_mb} MiB)"
                ),
            ));
        } else {
            match (outcome, report) {
                (Some(Ok(_)), Some(report)) => {
                    result.success = report.success;
                    result.result = report.result;
                    result.output_truncated |= report.result_truncated;
                    result.error = report.error.map(|e| ExecError {
                        kind: ErrorKind::Python,
                        error_type: e.error_type,
                        message: e.message,
                        traceback: Some(e.traceback),
                    });
                }
                (Some(Err(e)), _) => {
                    result.error = Some(ExecError::new(
                        ErrorKind::Runtime,
                        "SandboxError",
                        stalled_or(e.to_string()),
                    ));
                }
                _ => {
                    result.error = Some(ExecError::new(
                        ErrorKind::Runtime,
                        "SandboxError",
                        "the sandbox ended without a result",
                    ));
                }
            }
        }
        result
    }
}

fn stalled_or(message: String) -> String {
    if message.contains("Promise resolution is still pending") {
        "the code awaited something that can never complete (the event loop ran out of work)".into()
    } else {
        message
    }
}

/// What `runtime.js` reports after running the Python runner.
#[derive(Deserialize)]
struct Report {
    success: bool,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    result_truncated: bool,
    #[serde(default)]
    error: Option<PyError>,
}

#[derive(Deserialize)]
struct PyError {
    #[serde(rename = "type")]
    error_type: String,
    message: String,
    traceback: String,
}
