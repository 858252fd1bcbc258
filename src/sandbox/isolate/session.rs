//! A session's sandbox between calls: its files under /workspace (listed, read, written) and its
//! image (saved), each through an entry point of `call.js` run under a short deadline of its own.

use std::time::Duration;

use deno_core::v8;

use super::ops::{CallState, EntryPoints};
use super::watchdog::{Phase, Watchdog};
use super::{FileListing, FileRead, Sandbox};
use crate::sandbox::image::SessionImage;
use crate::sandbox::prepared::shared::EngineError;
use crate::sandbox::types::SandboxEnd;

/// Why a session's sandbox could not be booted or restored, or list, read, write or save its state
/// between calls.
#[derive(Debug, thiserror::Error)]
pub enum SessionSandboxError {
    /// It could not be booted or restored.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The sandbox ended (see [`SandboxEnd::reason`]): it can do nothing more.
    #[error("the session has ended: {}", .0.reason())]
    Ended(SandboxEnd),
    /// It holds what an image cannot carry, or something that must end first: the reason.
    #[error("{0}")]
    Unsaveable(String),
    /// Its state could not be read, written or turned into an image (or an image into a sandbox).
    #[error("{0}")]
    Failed(String),
}

/// How long a session's file listing, read or image may take (its JavaScript is the session's own).
const INSPECT_DEADLINE: Duration = Duration::from_secs(5);

impl Sandbox {
    /// A session's regular files under /workspace with their sizes, sorted; at most
    /// [`MAX_LISTED_FILES`] (the listing says what it left out).
    pub fn list_files(&mut self) -> Result<FileListing, SessionSandboxError> {
        let listing = self.inspect(None, 0)?.listing;
        Ok(FileListing {
            files: listing.files,
            left_out: listing.left_out,
            truncated: listing.cut,
        })
    }

    /// A session's file at `path` (relative to /workspace), if it is a regular file of at most
    /// `limit` bytes reached without following a link.
    pub fn read_file(&mut self, path: &str, limit: u64) -> Result<FileRead, SessionSandboxError> {
        Ok(match self.inspect(Some(path), limit)?.read {
            Some((0, data)) if data.len() as u64 <= limit => FileRead::Found(data),
            Some((2, _)) | Some((0, _)) => FileRead::TooLarge,
            _ => FileRead::Missing,
        })
    }

    /// Writes `data` as the session's file at `path` (relative to /workspace; directories made as
    /// needed), charged to its memory budget.
    pub fn store_file(&mut self, path: &str, data: Vec<u8>) -> Result<(), SessionSandboxError> {
        self.inspect_with(Some(path), 0, Some(data)).map(drop)
    }

    fn inspect(
        &mut self,
        path: Option<&str>,
        limit: u64,
    ) -> Result<CallState, SessionSandboxError> {
        self.inspect_with(path, limit, None)
    }

    /// The session's state as an image (between calls), or why it cannot be saved: it holds
    /// something an image does not carry (see `sandbox/image.rs`), or the sandbox was not booted
    /// saveable.
    pub fn save_image(&mut self) -> Result<SessionImage, SessionSandboxError> {
        use SessionSandboxError::{Failed, Unsaveable};
        if let Some(reason) = self.upstream_pending() {
            return Err(Unsaveable(reason));
        }
        let parts = self.call_entry(|e| &e.image, None, 0, None)?.image;
        if let Some(reason) = parts.refused {
            return Err(Unsaveable(reason));
        }
        if let Some(reason) = self.unrelinkable(parts.dylibs.as_deref()) {
            return Err(Unsaveable(reason));
        }
        Ok(SessionImage {
            memory: parts
                .memory
                .ok_or_else(|| Failed("the sandbox produced no memory image".into()))?
                .into(),
            files: parts.files,
            dylibs: parts.dylibs,
            base: parts.base,
        })
    }

    /// Why the shared libraries `record` lists cannot be relinked on restore, if so: a restore
    /// compiles each from the package layer, so one that is not the layer's (a package installed
    /// in the session) cannot be carried.
    fn unrelinkable(&self, record: Option<&str>) -> Option<String> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Load {
            lib_name: String,
        }
        #[derive(serde::Deserialize)]
        struct Record {
            loads: Vec<Load>,
        }
        let record = record?;
        let Ok(record) = serde_json::from_str::<Record>(record) else {
            return Some("its record of shared libraries is malformed".into());
        };
        let layer = self.with_state(|s| s.shared.layer.get().cloned());
        let foreign: Vec<&str> = record
            .loads
            .iter()
            .map(|l| l.lib_name.as_str())
            .filter(|name| layer.as_ref().is_none_or(|layer| !layer.has_file(name)))
            .collect();
        (!foreign.is_empty()).then(|| {
            let shown: Vec<&str> = foreign
                .iter()
                .take(3)
                .map(|n| n.rsplit('/').next().unwrap_or(n))
                .collect();
            format!(
                "it loaded native extension modules that are not among the server's preinstalled packages ({}), which a session image cannot carry",
                shown.join(", ")
            )
        })
    }

    /// Why the session cannot be saved as an image now, if it cannot (the checks of
    /// [`save_image`](Self::save_image), without copying memory: fit for after every call).
    pub fn check_image(&mut self) -> Option<String> {
        if let Some(reason) = self.upstream_pending() {
            return Some(reason);
        }
        match self.call_entry(|e| &e.image, None, 1, None) {
            Ok(call) => call
                .image
                .refused
                .or_else(|| self.unrelinkable(call.image.dylibs.as_deref())),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Why the session cannot be saved while upstream calls are pending (decided here, not by its
    /// JavaScript).
    fn upstream_pending(&self) -> Option<String> {
        let pending = self.with_state(|s| s.upstream_pending.get());
        (pending > 0).then(|| {
            format!(
                "it has {pending} upstream tool call(s) pending; await them (or let them end) first"
            )
        })
    }

    /// Runs `inspect` in call.js under a short deadline, in a call state of its own; a session
    /// whose JavaScript hangs there ends.
    fn inspect_with(
        &mut self,
        path: Option<&str>,
        limit: u64,
        data: Option<Vec<u8>>,
    ) -> Result<CallState, SessionSandboxError> {
        self.call_entry(|e| &e.inspect, path, limit, data)
    }

    /// Runs the entry point `pick` chooses (`inspect` or `saveImage` in call.js) with `(path, limit,
    /// data)` under a short deadline, in a call state of its own; a session whose JavaScript hangs
    /// there ends.
    fn call_entry(
        &mut self,
        pick: fn(&EntryPoints) -> &v8::Global<v8::Function>,
        path: Option<&str>,
        limit: u64,
        data: Option<Vec<u8>>,
    ) -> Result<CallState, SessionSandboxError> {
        use SessionSandboxError::{Ended, Failed};
        if let Some(end) = self.ended {
            return Err(Ended(end));
        }
        let inspect = self
            .with_state(|s| s.entry.as_ref().map(|e| pick(e).clone()))
            .ok_or_else(|| Failed("the sandbox has no such entry point".into()))?;
        let watchdog = Watchdog::start(
            self.runtime.v8_isolate().thread_safe_handle(),
            None,
            None,
            None,
        )
        .map_err(|e| Failed(e.to_string()))?;
        watchdog.arming().arm(Phase::Setup, INSPECT_DEADLINE);
        self.runtime.op_state().borrow_mut().put(CallState::idle());
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
            let data: v8::Local<v8::Value> = match data {
                Some(bytes) => self
                    .budget
                    .array_buffer(scope, bytes)
                    .map_err(|e| Failed(e.to_string()))?
                    .into(),
                None => v8::undefined(scope).into(),
            };
            [
                v8::Global::new(scope, path),
                v8::Global::new(scope, limit),
                v8::Global::new(scope, data),
            ]
        };
        let outcome = self.tokio.block_on(async {
            let call = super::waker::released(runtime.call_with_args(&inspect, &args));
            tokio::select! {
                r = runtime.with_event_loop_promise(call, Default::default()) => Some(r.map_err(|e| e.to_string())),
                _ = watchdog.fired() => None,
            }
        });
        let stopped = watchdog.stopped();
        drop(watchdog);
        let call = self.take_call();
        match (stopped, outcome) {
            (None, Some(Ok(_))) => Ok(call),
            (None, Some(Err(e))) => Err(Failed(format!("reading the session's files failed: {e}"))),
            _ => {
                self.ended = Some(SandboxEnd::Unresponsive);
                Err(Ended(SandboxEnd::Unresponsive))
            }
        }
    }
}
