//! The execution engine: one request in, one result out, each in a fresh sandbox — a new
//! `deno_core::JsRuntime` (its own V8 isolate), a new Pyodide interpreter and a new Emscripten MEMFS
//! whose `/workspace` is the working directory. Nothing survives a call.
//!
//! - [`types`]: the request and the result;
//! - `shared`: what every sandbox of the process shares, and the engine's settings;
//! - [`engine`]: makes the shared parts once, then sandboxes ([`Engine`]);
//! - [`isolate`]: one sandbox's isolate, booted and run once ([`Sandbox`]);
//! - `startup`: V8's process flags, each isolate's creation, the V8 startup snapshot and its keeper;
//! - `memory_snapshot`: the Pyodide memory snapshot sandboxes restore, kept on disk;
//! - `ops` (Rust) with `runtime.js`, `web.js`, `call.js`, `pyodide.js` (JavaScript) and `runner.py`:
//!   the sandbox's realm and the only doors from it to Rust;
//! - `modules`: Pyodide's JavaScript as sandboxes are served it (with its patches) and its code cache;
//! - [`layer`]: the package layer every sandbox gets; `cow`: bytes shared copy-on-write;
//! - `output`: what comes back, capped in Rust; `outcome`: how a call ended, by who caused it;
//!   `watchdog`: deadlines, memory, cancellation;
//! - `memory`: the per-sandbox memory budget and its ArrayBuffer allocator; `wasm`: WebAssembly
//!   compiled only through Rust, once per process; `callbacks`: V8 callbacks that cannot panic.
//!
//! A sandbox is not `Send`: boot and execute it on one dedicated thread, never on an async runtime.

mod callbacks;
mod cow;
mod engine;
mod flavor;
mod isolate;
pub mod layer;
mod memory;
mod memory_snapshot;
mod modules;
mod ops;
mod outcome;
mod output;
mod shared;
mod startup;
mod types;
mod wasm;
mod watchdog;

pub use engine::Engine;
pub use flavor::Flavor;
pub use isolate::{FileListing, FileRead, MAX_LISTED_FILES, Sandbox};
pub use memory_snapshot::SnapshotOrigin;
pub use shared::{BootMode, EngineConfig, EngineError};
pub use types::{
    ErrorKind, ErrorType, ExecError, ExecRequest, ExecResult, InputFile, OutputFile, SandboxEnd,
};

pub use crate::protocol::limits::{
    MAX_RESULT_BYTES, MAX_RETURNED_FILE_BYTES, MAX_RETURNED_FILES, MAX_RETURNED_TOTAL_BYTES,
    MAX_STREAM_BYTES,
};
