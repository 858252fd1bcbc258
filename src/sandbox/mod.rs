//! The execution engine: one request in, one result out, each in a fresh sandbox — a new
//! `deno_core::JsRuntime` (its own V8 isolate), a new Pyodide interpreter and a new Emscripten MEMFS
//! whose `/workspace` is the working directory. Nothing survives a call.
//!
//! It has two wings:
//! - [`engine`]: what is prepared once per process and only read by sandboxes — the engine itself,
//!   the V8 startup snapshot, the Pyodide memory snapshots, the package layer, Pyodide's JavaScript as
//!   served, WebAssembly compiled once;
//! - [`isolate`]: what runs per sandbox — its isolate, the ops (its only doors to Rust) beside the
//!   JavaScript and Python they serve, its watchdog, memory budget, copy-on-write mappings, output
//!   and the outcome of a call;
//!
//! and [`types`], what goes in and comes out.
//!
//! A sandbox is not `Send`: boot and execute it on one dedicated thread, never on an async runtime.

mod engine;
mod isolate;
mod types;

pub mod image;

pub use engine::Engine;
pub use engine::layer;
pub use engine::memory_snapshot::SnapshotOrigin;
pub use engine::shared::{BootMode, EngineConfig, EngineError};
pub use engine::snapshots::Flavor;
pub use image::{SessionImage, join};
pub use isolate::output::valid_image;
pub use isolate::{FileListing, FileRead, MAX_LISTED_FILES, ParkedSandbox, Sandbox};
pub use types::{
    Display, DisplaySource, ErrorKind, ErrorType, ExecError, ExecRequest, ExecResult, InputFile,
    LIVE_CHUNK_BYTES, LiveOutput, OutputFile, SandboxEnd,
};

pub use crate::protocol::limits::{
    MAX_RESULT_BYTES, MAX_RETURNED_FILE_BYTES, MAX_RETURNED_FILES, MAX_RETURNED_TOTAL_BYTES,
    MAX_STREAM_BYTES,
};
