//! code-interpreter-mcp: an MCP server whose `run_python_code` tool runs untrusted Python in a fresh
//! Pyodide (CPython on WebAssembly) sandbox for every call, embedded in-process through deno_core/V8.
//!
//! Layers, top-down:
//! - [`sandbox`]: the engine — one request in, one result out, each in a new isolate + interpreter.
//! - [`packages`]: where Pyodide wheels come from, their sha256 verification and the in-memory cache.
//! - [`assets`]: the pinned Pyodide runtime files.
//! - [`cli`]: the command line, including the `exec` debugging subcommand.

pub mod assets;
pub mod cli;
pub mod packages;
pub mod sandbox;
