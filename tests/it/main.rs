//! Integration tests against the real engine (deno_core + Pyodide), offline. One test binary, so V8 is
//! linked once; each concern is a module.

mod adversarial;
mod adversarial_fetch;
mod common;
mod config;
mod containment;
mod containment_transport;
mod deploy;
mod doc_paths;
mod durable_sessions;
mod engine;
mod eras;
mod exec_cli;
mod fidelity;
mod fixture;
mod growth;
mod isolation;
mod layers;
mod limits;
mod long_task;
mod metrics;
mod mirror_index;
mod no_growth;
mod notebook;
mod packages;
mod pool;
mod preimport;
mod restored_realm;
mod server;
mod session_image;
mod sessions;
mod snippets;
mod store;
mod tasks;
mod tls;
mod upstream;
