//! The fixed per-request limits (not configuration keys): one copy of each, used by validation, the
//! engine and the tool schemas, and listed in the generated reference.

/// Largest accepted Python source (1 MiB).
pub const MAX_SOURCE_BYTES: usize = 1024 * 1024;
/// Most input files per request.
pub const MAX_INPUT_FILES: usize = 64;
/// Largest accepted `timeout_ms`.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// `timeout_ms` when the client sends none.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// stdout and stderr are each capped at 512 KiB.
pub const MAX_STREAM_BYTES: usize = 512 * 1024;
/// The largest final-expression string returned (64 KiB).
pub const MAX_RESULT_BYTES: usize = 64 * 1024;
/// At most 64 files are returned.
pub const MAX_RETURNED_FILES: usize = 64;
/// One returned file may be at most 10 MiB.
pub const MAX_RETURNED_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// All returned files together may be at most 50 MiB.
pub const MAX_RETURNED_TOTAL_BYTES: u64 = 50 * 1024 * 1024;
/// Largest response body a sandbox may receive over HTTPS (100 MiB).
pub const MAX_RESPONSE_BYTES: usize = 100 * 1024 * 1024;

/// One fixed limit as the reference lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LimitInfo {
    pub name: &'static str,
    pub value: u64,
    pub unit: &'static str,
    pub doc: &'static str,
}

/// Every fixed limit, for the generated reference.
pub fn all() -> Vec<LimitInfo> {
    let limit = |name, value: u64, unit, doc| LimitInfo {
        name,
        value,
        unit,
        doc,
    };
    vec![
        limit(
            "source",
            MAX_SOURCE_BYTES as u64,
            "bytes",
            "Python source of one call",
        ),
        limit(
            "input_files",
            MAX_INPUT_FILES as u64,
            "files",
            "input files of one call",
        ),
        limit("timeout_ms", MAX_TIMEOUT_MS, "ms", "largest timeout_ms"),
        limit(
            "default_timeout_ms",
            DEFAULT_TIMEOUT_MS,
            "ms",
            "timeout_ms when none is sent",
        ),
        limit(
            "stream",
            MAX_STREAM_BYTES as u64,
            "bytes",
            "stdout, and stderr, each",
        ),
        limit(
            "result",
            MAX_RESULT_BYTES as u64,
            "bytes",
            "the final expression's str()",
        ),
        limit(
            "returned_files",
            MAX_RETURNED_FILES as u64,
            "files",
            "files returned by one call",
        ),
        limit(
            "returned_file",
            MAX_RETURNED_FILE_BYTES,
            "bytes",
            "one returned file",
        ),
        limit(
            "returned_total",
            MAX_RETURNED_TOTAL_BYTES,
            "bytes",
            "all returned files of one call",
        ),
        limit(
            "network_response",
            MAX_RESPONSE_BYTES as u64,
            "bytes",
            "one HTTPS response to a sandbox",
        ),
    ]
}
