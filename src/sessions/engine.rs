//! The real engine as the session manager's [`Backend`]: a session's sandbox is booted from the
//! snapshot that serves its first call, saveable as an image, and kept for the session; saved and
//! restored as a [`SessionImage`] payload; Python execution time is recorded here, where it is
//! measured.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::Backend;
use crate::sandbox::{
    Engine, ExecRequest, ExecResult, FileListing, FileRead, Flavor, Sandbox, SandboxEnd,
    SessionImage,
};
use crate::telemetry;

/// A session's sandbox and the snapshot its memory started from (its image is saved as the
/// differences from that snapshot).
pub struct SessionSandbox {
    sandbox: Sandbox,
    base: Flavor,
}

impl std::ops::Deref for SessionSandbox {
    type Target = Sandbox;
    fn deref(&self) -> &Sandbox {
        &self.sandbox
    }
}

impl std::ops::DerefMut for SessionSandbox {
    fn deref_mut(&mut self) -> &mut Sandbox {
        &mut self.sandbox
    }
}

impl Backend for Engine {
    type Sandbox = SessionSandbox;

    fn boot(&self, first_code: &str) -> Result<SessionSandbox, String> {
        let base = self.flavor_for(first_code);
        let sandbox = self.boot_session_flavor(base).map_err(|e| e.to_string())?;
        Ok(SessionSandbox { sandbox, base })
    }

    fn run(
        &self,
        sandbox: &mut SessionSandbox,
        request: ExecRequest,
        cancel: Arc<AtomicBool>,
    ) -> ExecResult {
        let started = Instant::now();
        let result = sandbox.run(request, Some(cancel));
        telemetry::python_execution(result.outcome(), started.elapsed());
        result
    }

    fn list(&self, sandbox: &mut SessionSandbox) -> Result<FileListing, String> {
        sandbox.list_files()
    }

    fn read(
        &self,
        sandbox: &mut SessionSandbox,
        path: &str,
        limit: u64,
    ) -> Result<FileRead, String> {
        sandbox.read_file(path, limit)
    }

    fn store(&self, sandbox: &mut SessionSandbox, path: &str, data: Vec<u8>) -> Result<(), String> {
        sandbox.store_file(path, data)
    }

    fn ended(&self, sandbox: &SessionSandbox) -> Option<SandboxEnd> {
        sandbox.ended()
    }

    fn unsaveable(&self, sandbox: &mut SessionSandbox) -> Option<String> {
        sandbox.check_image()
    }

    fn save(&self, sandbox: &mut SessionSandbox) -> Result<Vec<u8>, String> {
        let started = Instant::now();
        let mut image = sandbox.save_image()?;
        let made = started.elapsed();
        self.thin_image(sandbox.base, &mut image)
            .map_err(|e| e.to_string())?;
        let thinned = started.elapsed();
        let payload = image.encode();
        tracing::debug!(
            made_ms = made.as_secs_f64() * 1e3,
            thinned_ms = (thinned - made).as_secs_f64() * 1e3,
            encoded_ms = (started.elapsed() - thinned).as_secs_f64() * 1e3,
            bytes = payload.len(),
            "session image made"
        );
        Ok(payload)
    }

    fn restore(&self, payload: Vec<u8>) -> Result<SessionSandbox, String> {
        let started = Instant::now();
        let image = SessionImage::decode(&payload)?;
        drop(payload);
        tracing::debug!(
            decoded_ms = started.elapsed().as_secs_f64() * 1e3,
            "session image decoded"
        );
        let base = match image.base.as_deref() {
            Some(name) if name.starts_with("preimported:") => Flavor::Preimported,
            _ => Flavor::Plain,
        };
        let sandbox = self.restore_session(image).map_err(|e| e.to_string())?;
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            "session sandbox restored"
        );
        Ok(SessionSandbox { sandbox, base })
    }
}
