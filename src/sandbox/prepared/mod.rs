//! What is prepared once per process and only read by sandboxes; it knows no sandbox, op or
//! isolate. What every sandbox of the process shares (`shared.rs`): V8's process flags
//! (`startup.rs`), the package layer (`layer.rs`), the Pyodide memory snapshots
//! (`memory_snapshot.rs` in memory, mapped copy-on-write through the memory wing's
//! `pages/mapped_image.rs`, `snapshot_files.rs` on disk, `snapshots.rs` by kind: taken now, or
//! read back from `package_cache_dir` and trusted once a sandbox boots from it), Pyodide's
//! JavaScript as served (`modules/`), WebAssembly compiled once (`wasm.rs`), and the base a session
//! image's pages are told apart from (`session_base.rs`).

pub mod layer;
pub(crate) mod memory_snapshot;
pub(crate) mod modules;
pub(crate) mod session_base;
pub(crate) mod shared;
pub(crate) mod snapshot_files;
pub(crate) mod snapshots;
pub(crate) mod startup;
pub(crate) mod wasm;
