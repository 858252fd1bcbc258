//! One sandbox's isolate lifecycle: a new `deno_core::JsRuntime` (its own V8 isolate, from the
//! engine's V8 startup snapshot), Pyodide booted in it for a role (see `ops::Role`), one request run,
//! and the outcome read back and classified by who caused it. A sandbox is not `Send`: boot and
//! execute it on one dedicated thread, never on an async runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use deno_core::{JsRuntime, v8};

use super::memory::MemoryBudget;
use super::memory_snapshot::SharedSnapshot;
use super::ops::{Phase as OpPhase, Role, SandboxState};
use super::output::{self, Report};
use super::shared::{EngineError, EngineShared};
use super::startup;
use super::types::{ErrorKind, ExecError, ExecRequest, ExecResult};
use super::wasm::CodegenAllowed;
use super::watchdog::{Phase, Stop, Watchdog};
use crate::config::limits::MAX_STREAM_BYTES;

/// Makes `runtime.js` register its entry points with Rust (see `__sandboxEntry` there).
const ENTRY: &str = "__sandboxEntry()";

/// The longest a sandbox (or the snapshot maker) may take to start.
const BOOT_DEADLINE: Duration = Duration::from_secs(120);

/// 1 MB in the configuration's sense.
const MB: u64 = 1024 * 1024;

/// A booted sandbox: it runs one request, or, kept for a session, one after another.
pub struct Sandbox {
    runtime: JsRuntime,
    tokio: tokio::runtime::Runtime,
    heap_exhausted: Arc<AtomicBool>,
    budget: Arc<MemoryBudget>,
    boot_time: Duration,
    used: bool,
    /// Kept for a session: runs request after request, timeouts interrupt first.
    session: bool,
    /// Why the sandbox can run nothing more (it was terminated), once it cannot.
    ended: Option<String>,
}

/// A file of a session, read for a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead {
    Found(Vec<u8>),
    Missing,
    TooLarge,
}

/// How long a session's file listing or read may take (its JavaScript is the session's own).
const INSPECT_DEADLINE: Duration = Duration::from_secs(5);

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
        self.with_state(|s| f(&mut s.role))
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut SandboxState) -> T) -> T {
        let state = self.runtime.op_state();
        let mut state = state.borrow_mut();
        f(state.borrow_mut::<SandboxState>())
    }

    pub(crate) fn boot_as(shared: Arc<EngineShared>, role: Role) -> Result<Self, EngineError> {
        let installer = matches!(role, Role::Installer { .. });
        let started = Instant::now();
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let budget_bytes =
            usize::try_from(shared.config.sandbox_memory_limit_mb.saturating_mul(MB))
                .unwrap_or(usize::MAX);
        let budget = MemoryBudget::new(budget_bytes);
        let mut runtime = startup::new_runtime(&shared, role, budget.clone(), &tokio)?;
        // While Pyodide starts it compiles small WebAssembly modules of its own; afterwards only
        // `op_sandbox_compile_wasm` may (see `wasm.rs`).
        let codegen = CodegenAllowed::new();
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
        let watchdog = if installer {
            None
        } else {
            let w = Watchdog::start(
                runtime.v8_isolate().thread_safe_handle(),
                Some(budget.clone()),
                None,
                None,
            )?;
            w.arming().arm(Phase::Boot, BOOT_DEADLINE);
            Some(w)
        };
        let call = runtime.call(&boot);
        let booted = tokio.block_on(async {
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
        if stopped == Some(Stop::Deadline(Phase::Boot)) || booted.is_none() {
            return Err(EngineError::Boot(format!(
                "Pyodide did not finish starting within {} s",
                BOOT_DEADLINE.as_secs()
            )));
        }
        booted.expect("checked above").map_err(|e| {
            if heap_exhausted.load(Ordering::SeqCst) {
                EngineError::Boot(format!(
                    "the V8 heap budget (workers.memory_limit_mb = {} MiB) is too small to start Pyodide",
                    shared.config.memory_limit_mb
                ))
            } else if budget.exceeded() {
                EngineError::Boot(format!(
                    "the sandbox memory budget (workers.sandbox_memory_limit_mb = {} MiB) is too small to start Pyodide",
                    shared.config.sandbox_memory_limit_mb
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
        let sandbox = Self {
            runtime,
            tokio,
            heap_exhausted,
            budget,
            boot_time: started.elapsed(),
            used: false,
            session: false,
            ended: None,
        };
        let mut sandbox = sandbox;
        super::callbacks::after_boot(sandbox.runtime.v8_isolate());
        sandbox.with_state(|s| {
            // From here on, the start-up ops refuse (their JavaScript callers stay reachable).
            s.phase = OpPhase::Booted;
            if !s.shared.config.runtime_package_installation {
                s.downloads_enabled = false;
            }
            // Output printed while booting is not the user's.
            s.stdout = output::CappedBuffer::new(MAX_STREAM_BYTES);
            s.stderr = output::CappedBuffer::new(MAX_STREAM_BYTES);
        });
        Ok(sandbox)
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
        self.run(request, None)
    }

    /// Keeps this sandbox for a session: its interpreter, namespace and files persist between
    /// calls, files changed by a call are returned too, and a call's timeout first interrupts Python
    /// (KeyboardInterrupt), terminating the isolate only if it does not stop within a second.
    pub fn keep_for_session(&mut self) {
        self.session = true;
        self.with_state(|s| {
            s.persistent = true;
            s.interrupt = Some(Arc::new(std::sync::atomic::AtomicI32::new(0)));
        });
    }

    /// Why this sandbox can run nothing more (a session's, after a hard stop), if so.
    pub fn ended(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    /// Runs one request and leaves the used sandbox to the caller, who drops it (tearing down the
    /// isolate takes a while) after the result has been handed on. A sandbox runs one request only,
    /// unless kept for a session; otherwise a second call returns a runtime error. With `cancel`,
    /// setting the flag stops the run.
    pub fn run(&mut self, request: ExecRequest, cancel: Option<Arc<AtomicBool>>) -> ExecResult {
        if std::mem::replace(&mut self.used, true) && !self.session {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                "a sandbox runs one request only",
            ));
        }
        if let Some(reason) = &self.ended {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                reason.clone(),
            ));
        }
        let timeout_ms = request.timeout.as_millis();
        let interrupt = self.with_state(|s| {
            // What the previous call left is not this call's.
            s.report = None;
            s.glue_error = None;
            s.user_started = false;
            s.stdout = output::CappedBuffer::new(MAX_STREAM_BYTES);
            s.stderr = output::CappedBuffer::new(MAX_STREAM_BYTES);
            s.files = output::FileCollector::default();
            s.fetches = Arc::default();
            let interrupt = s.interrupt.clone();
            if let Some(buffer) = &interrupt {
                buffer.store(0, Ordering::SeqCst);
            }
            interrupt
        });
        let watchdog = match Watchdog::start(
            self.runtime.v8_isolate().thread_safe_handle(),
            Some(self.budget.clone()),
            cancel,
            interrupt,
        ) {
            Ok(w) => w,
            Err(e) => {
                return ExecResult::failure(ExecError::new(
                    ErrorKind::Runtime,
                    "SandboxError",
                    format!("cannot start the sandbox's watchdog: {e}"),
                ));
            }
        };
        let arming = watchdog.arming();
        let (run, config) = self.with_state(|s| {
            s.code = Some(request.code);
            s.input_files = request
                .files
                .into_iter()
                .map(|f| (f.path, Some(f.content)))
                .collect();
            s.user_timeout = request.timeout;
            s.watchdog = Some(arming.clone());
            (
                s.entry.as_ref().map(|e| e.run.clone()),
                s.shared.config.clone(),
            )
        });
        let Some(run) = run else {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                "the sandbox has no run entry point",
            ));
        };
        arming.arm(Phase::Setup, config.setup_timeout);

        let runtime = &mut self.runtime;
        let outcome = self.tokio.block_on(async {
            let call = runtime.call(&run);
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r.map_err(|e| e.to_string())),
                _ = watchdog.fired() => None,
            }
        });
        let stopped = watchdog.stopped();
        drop(watchdog);

        let heap_exhausted = self.heap_exhausted.load(Ordering::SeqCst);
        // An exception `run()` ended in counts as its failure (it never reached deno_core).
        let budget_exceeded = self.budget.exceeded();
        let (mut result, report, user_started, glue_error) = self.with_state(|s| {
            s.fetches.cancel();
            s.watchdog = None;
            let files = std::mem::take(&mut s.files);
            let result = ExecResult {
                success: false,
                stdout: s.stdout.text(),
                stderr: s.stderr.text(),
                result: None,
                output_truncated: s.stdout.truncated() || s.stderr.truncated() || files.truncated(),
                files: files.into_files(),
                error: None,
                timed_out: false,
            };
            (result, s.report.take(), s.user_started, s.glue_error.take())
        });

        let outcome = match (outcome, glue_error) {
            (Some(Ok(_)), Some(text)) => Some(Err(text)),
            (outcome, _) => outcome,
        };
        let session = self.session;
        result.error = match (stopped, outcome, report) {
            (Some(Stop::Interrupted), ..) => {
                result.timed_out = true;
                Some(ExecError::new(
                    ErrorKind::Timeout,
                    "TimeoutError",
                    format!(
                        "execution exceeded timeout_ms = {timeout_ms} ms and was interrupted \
(KeyboardInterrupt); the session's state is kept"
                    ),
                ))
            }
            (Some(Stop::Deadline(phase)), ..) => {
                result.timed_out = true;
                Some(if phase == Phase::User && session {
                    ExecError::new(
                        ErrorKind::Timeout,
                        "TimeoutError",
                        format!(
                            "execution exceeded timeout_ms = {timeout_ms} ms and did not stop within {} s \
of its interrupt (a long call outside Python); it was terminated and the session has ended",
                            super::watchdog::INTERRUPT_GRACE.as_secs()
                        ),
                    )
                } else if phase == Phase::User {
                    ExecError::new(
                        ErrorKind::Timeout,
                        "TimeoutError",
                        format!("execution exceeded timeout_ms = {timeout_ms} ms and was stopped"),
                    )
                } else {
                    ExecError::new(
                        ErrorKind::Timeout,
                        "SetupTimeout",
                        format!(
                            "setting up the call (writing its input files, loading the packages its imports \
need) exceeded workers.setup_timeout_s = {} s and was stopped",
                            config.setup_timeout.as_secs()
                        ),
                    )
                })
            }
            _ if budget_exceeded || stopped == Some(Stop::MemoryBudget) => Some(ExecError::new(
                ErrorKind::Python,
                "MemoryLimitExceeded",
                format!(
                    "the sandbox exceeded its memory budget (workers.sandbox_memory_limit_mb = {} MiB: \
ArrayBuffers, in-memory files, network responses and Python's WebAssembly memory together)",
                    config.sandbox_memory_limit_mb
                ),
            )),
            _ if heap_exhausted => Some(ExecError::new(
                ErrorKind::Python,
                "MemoryLimitExceeded",
                format!(
                    "the sandbox exhausted its V8 heap budget (workers.memory_limit_mb = {} MiB)",
                    config.memory_limit_mb
                ),
            )),
            (Some(Stop::Cancelled), ..) => Some(ExecError::new(
                ErrorKind::Timeout,
                "Cancelled",
                "the client cancelled the call; its execution was stopped",
            )),
            (_, outcome, Some(report)) => {
                apply_report(&mut result, report);
                // The code finished, then the sandbox's JavaScript failed collecting its files (the
                // code changed the JavaScript environment): its result stands, without those files.
                if let Some(Err(e)) = outcome {
                    result.output_truncated = true;
                    result.stderr.push_str(&format!(
                        "\nThe sandbox could not collect the files the code wrote (did the code change the \
JavaScript environment?): {}\n",
                        stalled_or(e)
                    ));
                }
                result.error.take()
            }
            // The sandbox's own JavaScript failed after the user's code started: something the code
            // did (it can change any JavaScript object it reaches) made it fail.
            (_, Some(Err(e)), None) if user_started => Some(ExecError::new(
                ErrorKind::Python,
                "SandboxError",
                format!(
                    "the sandbox's JavaScript failed after the code started (did the code change the \
JavaScript environment?): {}",
                    stalled_or(e)
                ),
            )),
            (_, Some(Err(e)), None) => Some(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                stalled_or(e),
            )),
            (_, _, None) if user_started => Some(ExecError::new(
                ErrorKind::Python,
                "SandboxError",
                "the code ended without a result (did it change the sandbox's runner?)",
            )),
            (_, _, None) => Some(ExecError::new(
                ErrorKind::Runtime,
                "SandboxError",
                "the sandbox ended without a result",
            )),
        };
        // A sandbox stopped by force (not by an interrupt Python answered) runs nothing more.
        let forced = matches!(stopped, Some(s) if s != Stop::Interrupted)
            || heap_exhausted
            || budget_exceeded;
        if forced && session {
            let reason = result
                .error
                .as_ref()
                .map_or("the session was stopped", |e| e.message.as_str());
            self.ended = Some(format!("the session has ended: {reason}"));
            if let Some(error) = &mut result.error
                && !error.message.contains("session has ended")
            {
                error.message.push_str("; the session has ended");
            }
        }
        result
    }

    /// A session's regular files under /workspace with their sizes.
    pub fn list_files(&mut self) -> Result<Vec<(String, u64)>, String> {
        self.inspect(None, 0)?;
        let listed = self.with_state(|s| s.listed.take()).unwrap_or_default();
        Ok(listed
            .into_iter()
            .map(|(path, size)| {
                (
                    path,
                    if size.is_finite() && size > 0.0 {
                        size as u64
                    } else {
                        0
                    },
                )
            })
            .collect())
    }

    /// A session's file at `path` (relative to /workspace), if it is a regular file of at most
    /// `limit` bytes.
    pub fn read_file(&mut self, path: &str, limit: u64) -> Result<FileRead, String> {
        self.inspect(Some(path), limit)?;
        Ok(match self.with_state(|s| s.read.take()) {
            Some((0, data)) if data.len() as u64 <= limit => FileRead::Found(data),
            Some((2, _)) | Some((0, _)) => FileRead::TooLarge,
            _ => FileRead::Missing,
        })
    }

    /// Runs `inspect` in call.js under a short deadline; a session whose JavaScript hangs there ends.
    fn inspect(&mut self, path: Option<&str>, limit: u64) -> Result<(), String> {
        if let Some(reason) = &self.ended {
            return Err(reason.clone());
        }
        let inspect = self
            .with_state(|s| s.entry.as_ref().map(|e| e.inspect.clone()))
            .ok_or("the sandbox has no inspect entry point")?;
        let watchdog = Watchdog::start(
            self.runtime.v8_isolate().thread_safe_handle(),
            None,
            None,
            None,
        )
        .map_err(|e| e.to_string())?;
        watchdog.arming().arm(Phase::Setup, INSPECT_DEADLINE);
        let runtime = &mut self.runtime;
        let args = {
            deno_core::scope!(scope, runtime);
            let path: v8::Local<v8::Value> = match path {
                Some(p) => v8::String::new(scope, p)
                    .map(Into::into)
                    .unwrap_or_else(|| v8::undefined(scope).into()),
                None => v8::undefined(scope).into(),
            };
            let limit: v8::Local<v8::Value> = v8::Number::new(scope, limit as f64).into();
            [v8::Global::new(scope, path), v8::Global::new(scope, limit)]
        };
        let outcome = self.tokio.block_on(async {
            let call = runtime.call_with_args(&inspect, &args);
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r.map_err(|e| e.to_string())),
                _ = watchdog.fired() => None,
            }
        });
        let stopped = watchdog.stopped();
        drop(watchdog);
        match (stopped, outcome) {
            (None, Some(Ok(_))) => Ok(()),
            (None, Some(Err(e))) => Err(format!("reading the session's files failed: {e}")),
            _ => {
                let reason = "the session has ended: reading its files did not finish in time";
                self.ended = Some(reason.into());
                Err(reason.into())
            }
        }
    }
}

/// The runner's (capped) report as the result's outcome.
fn apply_report(result: &mut ExecResult, report: Report) {
    result.success = report.success;
    result.result = report.result;
    result.output_truncated |= report.result_truncated;
    if !report.success {
        result.error = Some(ExecError {
            kind: ErrorKind::Python,
            error_type: report.error_type.unwrap_or_else(|| "Exception".into()),
            message: report.message.unwrap_or_default(),
            traceback: Some(report.traceback.unwrap_or_default()),
        });
    }
}

fn stalled_or(message: String) -> String {
    if message.contains("Promise resolution is still pending") {
        "the code awaited something that can never complete (the event loop ran out of work)".into()
    } else {
        message
    }
}
