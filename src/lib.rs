//! code-interpreter-mcp: an MCP server whose `run_python_code` tool runs untrusted Python in a fresh
//! Pyodide (CPython on WebAssembly) sandbox for every call, embedded in-process through deno_core/V8.
//!
//! Layers, top-down; a module imports only modules below it (tests/it/layers.rs checks this):
//! - [`cli`]: the command line, including the `exec` debugging subcommand.
//! - [`app`]: the one assembly point, from the configuration to the running parts.
//! - [`transport`]: MCP over HTTP (axum + rmcp Streamable HTTP at `/mcp`, bearer tokens, probes,
//!   shutdown) and stdio.
//! - [`tools`]: the MCP tools, their schemas, request validation, scopes and quotas, and the snippet
//!   catalog.
//! - [`pool`]: dedicated worker threads fed by a bounded queue fair between principals,
//!   prewarming, health atomics;
//!   [`sessions`]: stateful sessions, each one sandbox kept alive on a thread of its own;
//!   [`apps`]: the MCP Apps views (interactive results) and which clients get them.
//! - [`sandbox`]: the engine — one request in, one result out, each in a new isolate + interpreter.
//! - [`packages`]: where Pyodide wheels come from, their sha256 verification and the in-memory cache.
//! - [`fetch`]: the sandboxes' outbound HTTPS (allowlist, redirects, size caps, artifact cache).
//! - [`assets`]: the pinned Pyodide runtime files; [`store`]: saved session images at rest (a
//!   directory or S3-compatible storage; sealed with a key derived from the session id).
//! - [`upstream`]: the MCP servers whose tools sandboxed code may call, connected and granted here.
//! - [`telemetry`]: Prometheus metrics (the twenty-eight application families, the tokio reporter)
//!   and OpenTelemetry traces (a span per tool call, exported over OTLP).
//! - [`config`]: the one configuration type, its loading, its validation into typed settings, and
//!   its generated reference (a crate of its own, `crates/config`, free of V8);
//!   [`protocol`]: the tools' fixed per-request limits and request checks (`crates/protocol`).

pub mod app;
pub mod apps;
pub mod assets;
pub mod cli;
pub use code_interpreter_mcp_config as config;
pub use code_interpreter_mcp_protocol as protocol;
pub mod fetch;
pub mod packages;
pub mod pool;
pub mod sandbox;
pub mod sessions;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod transport;
pub mod upstream;
