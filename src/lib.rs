//! code-interpreter-mcp: an MCP server whose `run_python_code` tool runs untrusted Python in a fresh
//! Pyodide (CPython on WebAssembly) sandbox for every call, embedded in-process through deno_core/V8.
//!
//! Layers, top-down:
//! - [`server`]: the HTTP transport (axum + rmcp Streamable HTTP at `/mcp`).
//! - [`tools`]: the MCP tools and their schemas; [`validation`]: request checks before queueing;
//!   [`snippets`]: the configured snippet catalog and its search.
//! - [`pool`]: dedicated worker threads fed by a bounded FIFO queue, prewarming, health atomics.
//! - [`sandbox`]: the engine — one request in, one result out, each in a new isolate + interpreter.
//! - [`packages`]: where Pyodide wheels come from, their sha256 verification and the in-memory cache.
//! - [`assets`]: the pinned Pyodide runtime files.
//! - [`cli`]: the command line, including the `exec` debugging subcommand.
//! - [`telemetry`]: Prometheus metrics (the ten application families, the tokio reporter).
//! - [`config`]: the one configuration type, its loading, validation and generated reference.

pub mod assets;
pub mod cli;
pub mod config;
pub mod packages;
pub mod pool;
pub mod sandbox;
pub mod server;
pub mod snippets;
pub mod telemetry;
pub mod tools;
pub mod validation;
