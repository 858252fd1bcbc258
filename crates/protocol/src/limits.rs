//! The fixed per-request limits (not configuration keys): one copy of each, used by validation, the
//! engine and the tool schemas, and listed in the generated reference from the one table [`ALL`].

/// Largest accepted Python source (1 MiB).
pub const MAX_SOURCE_BYTES: usize = 1024 * 1024;
/// Most input files per request.
pub const MAX_INPUT_FILES: usize = 64;
/// Largest accepted `timeout_ms`.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// Largest `timeout_ms` of a task (the server's `tasks.max_timeout_ms` may be lower): 24 h.
pub const MAX_TASK_TIMEOUT_MS: u64 = 86_400_000;
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
/// At most 64 rich outputs (`displays`) are returned per call.
pub const MAX_DISPLAYS: usize = 64;
/// One representation of a rich output may be at most 4 MiB.
pub const MAX_DISPLAY_VALUE_BYTES: usize = 4 * 1024 * 1024;
/// All rich outputs of one call together may be at most 16 MiB.
pub const MAX_DISPLAY_TOTAL_BYTES: usize = 16 * 1024 * 1024;
/// A path (input or returned) is at most this long, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// A path has at most this many components.
pub const MAX_PATH_COMPONENTS: usize = 32;
/// One path component is at most this long, in bytes.
pub const MAX_PATH_COMPONENT_BYTES: usize = 255;
/// An error's type name is cut at this many bytes.
pub const MAX_ERROR_TYPE_BYTES: usize = 256;
/// An error's message is cut at this many bytes.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 16 * 1024;
/// A traceback keeps at most this many bytes (its start and its end).
pub const MAX_TRACEBACK_BYTES: usize = 64 * 1024;
/// An outbound connection must be made within this many seconds.
pub const FETCH_CONNECT_TIMEOUT_S: u64 = 10;
/// A response must start arriving (and keep arriving) within this many seconds.
pub const FETCH_READ_TIMEOUT_S: u64 = 30;
/// One request may take at most this many seconds in all (and never beyond its call's deadline).
pub const FETCH_TOTAL_TIMEOUT_S: u64 = 120;
/// Requests one call may have in flight at once.
pub const MAX_FETCHES_IN_FLIGHT: usize = 8;
/// Response bytes one call may receive in all.
pub const MAX_FETCH_BYTES_PER_CALL: u64 = 512 * 1024 * 1024;
/// The shared cache of downloaded artifacts (header-less GETs) keeps at most this many bytes.
pub const MAX_FETCH_CACHE_BYTES: usize = 256 * 1024 * 1024;
/// The cache of verified lock-file wheels keeps at most this many bytes.
pub const MAX_WHEEL_CACHE_BYTES: usize = 1024 * 1024 * 1024;

/// Text from a request or a sandbox as an error message quotes it: at most 200 characters, escaped.
pub fn shown(text: &str) -> String {
    const MAX: usize = 200;
    let mut quoted: String = text
        .chars()
        .take(MAX)
        .collect::<String>()
        .escape_debug()
        .to_string();
    if text.chars().nth(MAX).is_some() {
        quoted.push('…');
    }
    format!("\"{quoted}\"")
}

/// One fixed limit as the reference lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LimitInfo {
    pub name: &'static str,
    pub value: u64,
    pub unit: &'static str,
    pub doc: &'static str,
}

const fn limit(name: &'static str, value: u64, unit: &'static str, doc: &'static str) -> LimitInfo {
    LimitInfo {
        name,
        value,
        unit,
        doc,
    }
}

/// Every fixed limit, for the generated reference: one row each.
pub const ALL: &[LimitInfo] = &[
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
    limit(
        "timeout_ms",
        MAX_TIMEOUT_MS,
        "ms",
        "largest timeout_ms of a synchronous call",
    ),
    limit(
        "task_timeout_ms",
        MAX_TASK_TIMEOUT_MS,
        "ms",
        "largest timeout_ms of a task",
    ),
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
        "displays",
        MAX_DISPLAYS as u64,
        "outputs",
        "rich outputs (displays) of one call",
    ),
    limit(
        "display_value",
        MAX_DISPLAY_VALUE_BYTES as u64,
        "bytes",
        "one representation of a rich output",
    ),
    limit(
        "displays_total",
        MAX_DISPLAY_TOTAL_BYTES as u64,
        "bytes",
        "all rich outputs of one call",
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
    limit(
        "path",
        MAX_PATH_BYTES as u64,
        "bytes",
        "an input or returned file path",
    ),
    limit(
        "path_components",
        MAX_PATH_COMPONENTS as u64,
        "components",
        "of one path",
    ),
    limit(
        "path_component",
        MAX_PATH_COMPONENT_BYTES as u64,
        "bytes",
        "one path component",
    ),
    limit(
        "error_type",
        MAX_ERROR_TYPE_BYTES as u64,
        "bytes",
        "an error's type name",
    ),
    limit(
        "error_message",
        MAX_ERROR_MESSAGE_BYTES as u64,
        "bytes",
        "an error's message",
    ),
    limit(
        "traceback",
        MAX_TRACEBACK_BYTES as u64,
        "bytes",
        "a traceback (its start and end kept)",
    ),
    limit(
        "fetch_connect",
        FETCH_CONNECT_TIMEOUT_S,
        "s",
        "to connect to a host",
    ),
    limit(
        "fetch_read",
        FETCH_READ_TIMEOUT_S,
        "s",
        "between response bytes, the first included",
    ),
    limit(
        "fetch_total",
        FETCH_TOTAL_TIMEOUT_S,
        "s",
        "one request in all",
    ),
    limit(
        "fetches_in_flight",
        MAX_FETCHES_IN_FLIGHT as u64,
        "requests",
        "at once per call",
    ),
    limit(
        "fetch_bytes",
        MAX_FETCH_BYTES_PER_CALL,
        "bytes",
        "response bytes per call",
    ),
    limit(
        "fetch_cache",
        MAX_FETCH_CACHE_BYTES as u64,
        "bytes",
        "the shared cache of downloaded artifacts",
    ),
    limit(
        "wheel_cache",
        MAX_WHEEL_CACHE_BYTES as u64,
        "bytes",
        "the cache of verified wheels",
    ),
];
