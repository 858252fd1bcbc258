//! What the session manager needs of sandboxes ([`Backend`]: the real engine in `engine.rs`, a
//! fake in the tests) and of time ([`Clock`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use bytes::Bytes;

use crate::sandbox::{ExecRequest, ExecResult, FileListing, FileRead, SandboxEnd};

/// What the session manager needs of sandboxes. A sandbox is booted and used on its session's
/// thread only (it need not be `Send`).
pub trait Backend: Send + Sync + 'static {
    type Sandbox;
    /// A sandbox started as far as it goes before it knows what it will be (see `park`).
    type Parked;
    /// Why a sandbox could not boot, be restored, or read, write or save its state (its message
    /// is the reason the caller is given).
    type Error: std::error::Error + Send + 'static;

    /// Starts a sandbox ahead of the session it will serve, on the thread that will use it, as far
    /// as it goes before it knows its first code or image; `None` when this backend cannot.
    fn park(&self) -> Option<Self::Parked>;

    /// Boots a sandbox kept for a session (finishing `parked` when given), of the kind that serves
    /// `first_code` (the code of the session's first call); the error is the reason.
    fn boot(
        &self,
        parked: Option<Self::Parked>,
        first_code: &str,
    ) -> Result<Self::Sandbox, Self::Error>;

    /// Runs one call; setting `cancel` stops it (interrupting the code first).
    fn run(
        &self,
        sandbox: &mut Self::Sandbox,
        request: ExecRequest,
        cancel: Arc<AtomicBool>,
    ) -> ExecResult;

    /// The session's files (bounded).
    fn list(&self, sandbox: &mut Self::Sandbox) -> Result<FileListing, Self::Error>;

    /// One of the session's files, if it is a regular file of at most `limit` bytes.
    fn read(
        &self,
        sandbox: &mut Self::Sandbox,
        path: &str,
        limit: u64,
    ) -> Result<FileRead, Self::Error>;

    /// Writes `data` as the session's file at `path` (relative to /workspace).
    fn store(
        &self,
        sandbox: &mut Self::Sandbox,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), Self::Error>;

    /// Why the sandbox can run nothing more, if so.
    fn ended(&self, sandbox: &Self::Sandbox) -> Option<SandboxEnd>;

    /// Why the sandbox cannot be saved as an image now, if it cannot (checked after every call,
    /// so it must be cheap).
    fn unsaveable(&self, sandbox: &mut Self::Sandbox) -> Option<String>;

    /// The sandbox's state as an image payload in parts (between calls), or why it cannot be saved.
    fn save(&self, sandbox: &mut Self::Sandbox) -> Result<Vec<Bytes>, Self::Error>;

    /// A sandbox restored from a payload `save` made (in this process or another of this build),
    /// finishing `parked` when given.
    fn restore(
        &self,
        parked: Option<Self::Parked>,
        payload: Bytes,
    ) -> Result<Self::Sandbox, Self::Error>;

    /// Called on a session's thread once its sandbox is dropped: the backend may give the memory
    /// it freed back to the system.
    fn dropped(&self) {}
}

/// Where the manager reads the time (injected by tests).
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}
