//! The real engine as the pool's [`Backend`]: a job is an [`ExecRequest`], its output an
//! [`ExecResult`]; Python execution time is recorded here, where it is measured.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::{Backend, WorkerSettings};
use crate::sandbox::{Engine, EngineError, ExecRequest, ExecResult, Flavor, Sandbox};
use crate::telemetry;

impl Backend for Engine {
    type Sandbox = Sandbox;
    type Job = ExecRequest;
    type Error = EngineError;
    type Output = ExecResult;
    type Flavor = Flavor;

    fn flavor(&self, job: &ExecRequest) -> Flavor {
        self.flavor_for(&job.code)
    }

    fn boot(&self, flavor: Flavor) -> Result<Sandbox, EngineError> {
        // Workers boot right after they drop a used sandbox: its memory serves the next one.
        self.keep_spare_memory_on_this_thread();
        self.boot_flavor(flavor)
    }

    /// Sandboxes with pre-imported modules hold about three times a plain one's memory: a worker
    /// keeps `ready_preimported_sandboxes` of them (docs/performance.md).
    fn stock_size(&self, flavor: Flavor, settings: &WorkerSettings) -> usize {
        match flavor {
            Flavor::Plain => settings.ready_sandboxes,
            Flavor::Preimported => settings
                .ready_preimported_sandboxes
                .min(settings.ready_sandboxes),
        }
    }

    fn rest(&self) {
        self.release_free_memory();
    }

    /// Finishes the garbage collection that booting started (see `Sandbox::collect_garbage`).
    fn settle(&self, sandbox: &mut Sandbox) {
        sandbox.collect_garbage();
    }

    /// A sandbox gives back the pages of its memory that hold the snapshot's bytes
    /// (`Sandbox::give_back_unchanged_memory`).
    fn give_back(&self, sandbox: &mut Sandbox) -> Result<(), EngineError> {
        let bytes = sandbox.give_back_unchanged_memory()?;
        tracing::debug!(
            mib = bytes as f64 / f64::from(1 << 20),
            "an idle ready sandbox gave back memory"
        );
        Ok(())
    }

    fn run(
        &self,
        sandbox: &mut Sandbox,
        job: ExecRequest,
        cancelled: Arc<AtomicBool>,
    ) -> ExecResult {
        test_fault(&job);
        let executing = Instant::now();
        let result = sandbox.run(job, Some(cancelled));
        telemetry::python_execution(result.outcome(), executing.elapsed());
        result
    }
}

/// Debug builds only: panics when the code contains the marker named by
/// CODE_INTERPRETER_MCP_TEST_PANIC_MARKER, so tests can exercise worker loss.
#[cfg(debug_assertions)]
fn test_fault(request: &ExecRequest) {
    static MARKER: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let marker = MARKER.get_or_init(|| {
        std::env::var("CODE_INTERPRETER_MCP_TEST_PANIC_MARKER")
            .ok()
            .filter(|m| !m.is_empty())
    });
    if let Some(marker) = marker
        && request.code.contains(marker.as_str())
    {
        panic!("test fault hook: the worker panics on request");
    }
}

#[cfg(not(debug_assertions))]
fn test_fault(_request: &ExecRequest) {}
