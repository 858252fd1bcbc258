//! The real engine as the session manager's [`Backend`]: a session's sandbox is booted from the
//! snapshot that serves its first call, saveable as an image made of the pages that differ from
//! that snapshot, and kept for the session; saved and restored as a [`SessionImage`] payload;
//! Python execution time is recorded here, where it is measured. A session's sandbox is parked
//! ahead of the session (`Engine::park_session`), so starting or resuming one waits only for its
//! snapshot's restore.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use bytes::Bytes;

use super::Backend;
use crate::sandbox::{
    Engine, EngineError, ExecRequest, ExecResult, FileListing, FileRead, ParkedSandbox, Sandbox,
    SandboxEnd, SessionImage, SessionSandboxError,
};
use crate::telemetry;

impl Backend for Engine {
    type Sandbox = Sandbox;
    type Parked = ParkedSandbox;
    type Error = SessionSandboxError;

    fn park(&self) -> Option<ParkedSandbox> {
        self.park_session()
    }

    fn boot(
        &self,
        parked: Option<ParkedSandbox>,
        first_code: &str,
    ) -> Result<Sandbox, SessionSandboxError> {
        Ok(self.boot_session_flavor(parked, self.flavor_for(first_code))?)
    }

    fn run(
        &self,
        sandbox: &mut Sandbox,
        request: ExecRequest,
        cancel: Arc<AtomicBool>,
    ) -> ExecResult {
        let started = Instant::now();
        let result = sandbox.run(request, Some(cancel));
        telemetry::python_execution(result.outcome(), started.elapsed());
        result
    }

    fn list(&self, sandbox: &mut Sandbox) -> Result<FileListing, SessionSandboxError> {
        sandbox.list_files()
    }

    fn read(
        &self,
        sandbox: &mut Sandbox,
        path: &str,
        limit: u64,
    ) -> Result<FileRead, SessionSandboxError> {
        sandbox.read_file(path, limit)
    }

    fn store(
        &self,
        sandbox: &mut Sandbox,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), SessionSandboxError> {
        sandbox.store_file(path, data)
    }

    fn ended(&self, sandbox: &Sandbox) -> Option<SandboxEnd> {
        sandbox.ended()
    }

    fn unsaveable(&self, sandbox: &mut Sandbox) -> Option<String> {
        sandbox.check_image()
    }

    fn save(&self, sandbox: &mut Sandbox) -> Result<Vec<Bytes>, SessionSandboxError> {
        let started = Instant::now();
        let image = sandbox.save_image()?;
        let bytes = image.memory.len();
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            memory_bytes = bytes,
            "session image made"
        );
        Ok(image.encode())
    }

    fn restore(
        &self,
        parked: Option<ParkedSandbox>,
        payload: Bytes,
    ) -> Result<Sandbox, SessionSandboxError> {
        let started = Instant::now();
        let image = SessionImage::decode(payload).map_err(EngineError::from)?;
        let sandbox = self.restore_session(parked, image)?;
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            "session sandbox restored"
        );
        Ok(sandbox)
    }

    /// Sessions end and spill all day: each session thread allocates in a glibc arena of its own,
    /// so its freed memory is given back, at most once a second (see `Engine::release_free_memory`).
    fn dropped(&self) {
        self.release_free_memory_now_and_then();
    }
}
