//! The sandbox's wing: what runs per sandbox. One sandbox's isolate lifecycle: a new
//! `deno_core::JsRuntime` (its own V8 isolate, from the V8 startup snapshot), Pyodide booted in it
//! for a role (see `ops::Role`), one request run, and the outcome read back and classified by who
//! caused it. A sandbox is not `Send`: boot and execute it on one dedicated thread, never on an
//! async runtime.
//!
//! Beside it: `startup.rs` (a new isolate, the V8 startup snapshot, the keeper), `boot.rs` (making
//! the isolate and booting it, or parking a session's sandbox until its snapshot is chosen), `ops/`
//! (the only doors from the isolate to Rust, each beside the JavaScript and Python it serves),
//! `watchdog.rs` (deadlines, memory, cancellation), `output.rs` (what comes back, capped in Rust),
//! `outcome.rs` (how a call ended, by who caused it), `callbacks.rs` (V8 callbacks that cannot
//! panic), `session.rs` (a session's files and image, between calls). The memory budget, the
//! copy-on-write bytes and the memory wing (a dropped sandbox's restored memory moved to the next
//! one, the pages written since a restore) are below (`src/sandbox/memory.rs`, `src/sandbox/cow.rs`,
//! `src/sandbox/pages/`).

pub(crate) mod boot;
pub(crate) mod callbacks;
pub(crate) mod ops;
pub(crate) mod outcome;
pub(crate) mod output;
mod realm;
pub(crate) mod session;
pub(crate) mod startup;
mod waker;
pub(crate) mod watchdog;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use deno_core::JsRuntime;

use self::ops::{BootState, CallState, Role, SandboxState, SessionState};
use self::outcome::{Limits, Observed, Verdict};
use self::output::Report;
use self::watchdog::{Phase, Stop, Watchdog};
use crate::sandbox::memory::MemoryBudget;
use crate::sandbox::pages::{MappedImage, PagesError, RestoredMemory};
use crate::sandbox::prepared::memory_snapshot::SharedSnapshot;
use crate::sandbox::types::{ErrorKind, ErrorType, ExecError, ExecRequest, ExecResult, SandboxEnd};

/// 1 MB in the configuration's sense.
const MB: u64 = 1024 * 1024;

/// A booted sandbox: it runs one request, or, kept for a session, one after another.
pub struct Sandbox {
    runtime: JsRuntime,
    tokio: tokio::runtime::Runtime,
    heap_exhausted: Arc<AtomicBool>,
    /// Declared after `runtime`, so dropped after the isolate: it keeps what the isolate's backing
    /// stores point to (`MemoryBudget::keep_until_disposed`).
    budget: Arc<MemoryBudget>,
    used: bool,
    /// Kept for a session: runs request after request, timeouts interrupt first.
    session: bool,
    /// Why the sandbox can run nothing more, once it cannot.
    ended: Option<SandboxEnd>,
}

impl Drop for Sandbox {
    /// Before the isolate goes: a pool worker keeps the pages the snapshot was copied into for the
    /// next sandbox it boots (see `pages/spare.rs`).
    fn drop(&mut self) {
        // (No panic in a drop: a state that cannot be borrowed keeps its pages where they are.)
        let state = self.runtime.op_state();
        let restored = state.try_borrow_mut().ok().and_then(|mut state| {
            state
                .try_borrow_mut::<BootState>()
                .and_then(|b| b.restored.take())
        });
        // Nothing runs in the isolate any more, and V8 only unmaps the memory when it disposes it.
        if let Some(restored) = restored {
            restored.into_spare();
        }
    }
}

/// A file of a session, read for a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRead {
    Found(Vec<u8>),
    Missing,
    TooLarge,
}

/// A session's files: at most `MAX_LISTED_FILES` (path, size) pairs, sorted, with how many were left
/// out (past the cap, or with paths over the path limit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileListing {
    pub files: Vec<(String, u64)>,
    pub left_out: u64,
    /// The listing stopped at its cap: there may be more files than `left_out` counts.
    pub truncated: bool,
}

/// Most files a session's listing holds.
pub const MAX_LISTED_FILES: usize = self::ops::MAX_LISTED_FILES;

impl Sandbox {
    /// Gives back the pages of its memory that hold the snapshot's bytes (see
    /// `pages/mapped_image.rs`): a ready sandbox that waits long then holds only what its boot
    /// changed. A mapped memory drops its copies of such pages; a copied one becomes a mapping of
    /// the snapshot's sealed file with the pages that differ written back, if the engine keeps one
    /// (`give_back_idle_memory`), and is then no spare for the next sandbox
    /// (`RestoredMemory::give_back`). Returns how many bytes. An error means the memory may have
    /// lost pages: the sandbox must be dropped unused.
    pub fn give_back_unchanged_memory(&mut self) -> Result<usize, PagesError> {
        self.with_restored(|restored, image| restored.give_back(image))
            .unwrap_or(Ok(0))
    }

    /// What `f` takes out of the sandbox's role (what a snapshot maker or an installer produced).
    pub(crate) fn take_role<T>(&self, f: impl FnOnce(&mut Role) -> T) -> T {
        self.with::<BootState, _>(|b| f(&mut b.role))
    }

    /// Measures the working set of the image the sandbox's memory is mapped from, if it is mapped
    /// (see `pages/mapped_image.rs`). Returns how many bytes it is.
    pub(crate) fn measure_working_set(&self) -> usize {
        self.with_restored(|restored, image| restored.measure_working_set(image))
            .unwrap_or(0)
    }

    /// `f` applied to the memory the snapshot was restored into and that snapshot's sealed-file
    /// image, if the sandbox has both.
    fn with_restored<T>(
        &self,
        f: impl FnOnce(&mut RestoredMemory, &MappedImage) -> T,
    ) -> Option<T> {
        self.with::<BootState, _>(|b| {
            let snapshot = b.restore_from().cloned()?;
            Some(f(b.restored.as_mut()?, snapshot.image()?))
        })
    }

    /// `f` applied to the state of type `S` in the isolate's `OpState`.
    fn with<S: 'static, T>(&self, f: impl FnOnce(&mut S) -> T) -> T {
        let state = self.runtime.op_state();
        let mut state = state.borrow_mut();
        f(state.borrow_mut::<S>())
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut SandboxState) -> T) -> T {
        self.with::<SandboxState, T>(f)
    }

    /// The state of the call (or inspection) that just ended, an idle one in its place.
    fn take_call(&self) -> CallState {
        let state = self.runtime.op_state();
        let mut state = state.borrow_mut();
        std::mem::replace(state.borrow_mut::<CallState>(), CallState::idle())
    }

    /// Finishes the garbage collection that booting started, for a sandbox prepared ahead of a call:
    /// otherwise its mark-compact pause (measured 4-6 ms) lands in the first milliseconds of the
    /// user's code. Costs ~15 ms of CPU, so callers that run code right away skip it.
    pub fn collect_garbage(&mut self) {
        self.runtime.v8_isolate().low_memory_notification();
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
        self.with::<SessionState, _>(|s| {
            s.persistent = true;
            s.interrupt = Some(Arc::new(std::sync::atomic::AtomicI32::new(0)));
        });
    }

    /// Saves this session's image as the differences from `base` (the snapshot it started from),
    /// named `name` in the image.
    pub(crate) fn save_against(&mut self, base: Arc<SharedSnapshot>, name: String) {
        self.with::<SessionState, _>(|s| s.image_base = Some((base, name)));
    }

    /// The isolate's heap as a V8 heap snapshot (JSON; every string the JavaScript side still
    /// holds after a full collection), for audits such as tests/it/secrets.rs. Not reachable from
    /// the sandbox.
    #[doc(hidden)]
    pub fn heap_snapshot(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.runtime.v8_isolate().take_heap_snapshot(|chunk| {
            out.extend_from_slice(chunk);
            true
        });
        out
    }

    /// Why this sandbox can run nothing more (a session's, after a hard stop), if so.
    pub fn ended(&self) -> Option<SandboxEnd> {
        self.ended
    }

    /// Runs one request and leaves the used sandbox to the caller, who drops it (tearing down the
    /// isolate takes a while) after the result has been handed on. A sandbox runs one request only,
    /// unless kept for a session; otherwise a second call returns a runtime error. With `cancel`,
    /// setting the flag stops the run (a session's code is interrupted first).
    pub fn run(&mut self, request: ExecRequest, cancel: Option<Arc<AtomicBool>>) -> ExecResult {
        if std::mem::replace(&mut self.used, true) && !self.session {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                ErrorType::SandboxError,
                "a sandbox runs one request only",
            ));
        }
        if let Some(end) = self.ended {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                ErrorType::SandboxError,
                format!("the session has ended: {}", end.reason()),
            ));
        }
        let interrupt = self.with::<SessionState, _>(|s| s.interrupt.clone());
        let (tainted, shared) = self.with_state(|s| (s.user_code_ran, s.shared.clone()));
        let config = &shared.settings;
        if let Some(buffer) = &interrupt {
            buffer.store(0, Ordering::SeqCst);
        }
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
                    ErrorType::SandboxError,
                    format!("cannot start the sandbox's watchdog: {e}"),
                ));
            }
        };
        let arming = watchdog.arming();
        // What the previous call left is not this call's: its state is made new.
        let input_files = request
            .files
            .into_iter()
            .map(|f| (f.path, Some(f.content)))
            .collect();
        let mut call = CallState::new(
            Some(request.code),
            input_files,
            request.timeout,
            Some(arming.clone()),
        );
        call.live = request.live;
        call.grid_rows = request.grid_rows;
        call.upstream = std::sync::Arc::new(crate::upstream::CallUpstream::traced(request.trace));
        self.runtime.op_state().borrow_mut().put(call);
        let Some(run) = self.with_state(|s| s.entry.as_ref().map(|e| e.run.clone())) else {
            return ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                ErrorType::SandboxError,
                "the sandbox has no run entry point",
            ));
        };
        // In a session whose code has run, the set-up may run that code too (it can have replaced
        // any JavaScript or Python the set-up calls): it is bounded by timeout_ms as well.
        let setup_within_timeout = self.session && tainted;
        let setup_budget = if setup_within_timeout {
            config.setup_timeout.min(request.timeout)
        } else {
            config.setup_timeout
        };
        arming.arm(Phase::Setup, setup_budget);

        let runtime = &mut self.runtime;
        let returned = self.tokio.block_on(async {
            let call = waker::released(runtime.call(&run));
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r.map(drop).map_err(|e| e.to_string())),
                _ = watchdog.fired() => None,
            }
        });
        let stopped = watchdog.stopped();
        drop(watchdog);

        let limits = Limits {
            timeout_ms: request.timeout.as_millis(),
            setup_timeout_s: config.setup_timeout.as_secs(),
            setup_within_timeout,
            memory_limit_mb: config.memory_limit_mb,
            sandbox_memory_limit_mb: config.sandbox_memory_limit_mb,
        };
        self.finish(stopped, returned, tainted, limits)
    }

    /// The result of the call that just ended, classified (see `outcome.rs`); a session's sandbox
    /// that can run nothing more is marked ended.
    fn finish(
        &mut self,
        stopped: Option<Stop>,
        returned: Option<Result<(), String>>,
        tainted: bool,
        limits: Limits,
    ) -> ExecResult {
        let mut call = self.take_call();
        call.fetches.cancel();
        call.upstream.cancel();
        let fatal = self.with_state(|s| s.fatal.clone());
        // An exception `run()` ended in counts as its failure (it never reached deno_core).
        let returned = match (returned, call.glue_error.take()) {
            (Some(Ok(())), Some(text)) => Some(Err(text)),
            (returned, _) => returned,
        };
        let files = std::mem::take(&mut call.files);
        let displays = std::mem::take(&mut call.displays);
        let mut result = ExecResult {
            success: false,
            stdout: call.stdout.text(),
            stderr: call.stderr.text(),
            result: None,
            output_truncated: call.stdout.truncated()
                || call.stderr.truncated()
                || files.truncated()
                || displays.truncated(),
            files: files.into_files(),
            displays: displays.into_displays(),
            error: None,
            timed_out: false,
        };
        let classified = outcome::classify(
            Observed {
                stopped,
                returned,
                report: call.report.take(),
                user_started: call.user_started,
                tainted,
                heap_exhausted: self.heap_exhausted.load(Ordering::SeqCst),
                budget_exceeded: self.budget.exceeded(),
                fatal,
                session: self.session,
            },
            limits,
        );
        result.timed_out = classified.timed_out;
        match classified.verdict {
            Verdict::Reported {
                report,
                collect_failure,
            } => {
                apply_report(&mut result, report);
                // The code finished, then the sandbox's JavaScript failed collecting its files (the
                // code changed the JavaScript environment): its result stands, without those files.
                if let Some(e) = collect_failure {
                    result.output_truncated = true;
                    result.stderr.push_str(&format!(
                        "\nThe sandbox could not collect the files the code wrote (did the code change the \
JavaScript environment?): {e}\n"
                    ));
                }
            }
            Verdict::Failed(error) => result.error = Some(error),
        }
        if self.session {
            self.ended = classified.end;
        }
        result
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
            quota: None,
            retry_after_ms: None,
        });
    }
}
