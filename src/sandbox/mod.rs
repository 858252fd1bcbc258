//! The execution engine: one request in, one result out, each in a fresh sandbox — a new
//! `deno_core::JsRuntime` (its own V8 isolate), a new Pyodide interpreter and a new Emscripten MEMFS
//! whose `/workspace` is the working directory. Nothing survives a call.
//!
//! Layers, top-down; a module imports only modules below it, and names another as
//! `crate::sandbox::NAME` (tests/it/layers.rs checks this):
//! - [`engine`]: the [`Engine`], which prepares at start-up (partly by booting sandboxes: the
//!   snapshot makers, the package installer, the pre-import check) and then hands sandboxes out;
//! - [`isolate`]: what runs per sandbox — its isolate and V8 startup snapshot, the ops (its only
//!   doors to Rust) beside the JavaScript and Python they serve, its watchdog, output and the
//!   outcome of a call; it reads what was prepared, never prepares it;
//! - [`prepared`]: what is prepared once per process and only read by sandboxes — V8's flags, the
//!   Pyodide memory snapshots, the package layer, Pyodide's JavaScript as served, WebAssembly
//!   compiled once; it knows no sandbox, op or isolate;
//! - [`cow`] (bytes every sandbox maps copy-on-write, as V8 ArrayBuffers);
//! - [`pages`] (the memory wing: every system call on memory and the types owning what they make;
//!   no V8), [`memory`] (one sandbox's memory budget), [`image`] (a session's saved state),
//!   [`types`] (what goes in and comes out).
//!
//! A sandbox is not `Send`: boot and execute it on one dedicated thread, never on an async runtime.

mod cow;
mod engine;
mod isolate;
mod memory;
mod pages;
mod prepared;
mod types;

pub mod image;

pub use engine::Engine;
pub use image::{ImageError, SessionImage, join};
pub use isolate::boot::ParkedSandbox;
pub use isolate::output::valid_image;
pub use isolate::session::SessionSandboxError;
pub use isolate::{FileListing, FileRead, MAX_LISTED_FILES, Sandbox};
pub use pages::PagesError;
pub use prepared::layer;
pub use prepared::memory_snapshot::SnapshotOrigin;
pub use prepared::shared::{BootMode, EngineError, EngineSettings};
pub use prepared::snapshots::Flavor;
pub use types::{
    Display, DisplaySource, ErrorKind, ErrorType, ExecError, ExecRequest, ExecResult, InputFile,
    LIVE_CHUNK_BYTES, LiveOutput, OutputFile, SandboxEnd, TABLE_MIME,
};

pub use crate::protocol::limits::{
    MAX_RESULT_BYTES, MAX_RETURNED_FILE_BYTES, MAX_RETURNED_FILES, MAX_RETURNED_TOTAL_BYTES,
    MAX_STREAM_BYTES,
};
