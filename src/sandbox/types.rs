//! What goes into a sandbox and what comes out: the request (code, input files, timeout) and the
//! result (output, returned files, a structured error). The result is generic over the error kind so
//! that the layer above can add kinds of its own (a refused request) without a second result type.

use serde::{Deserialize, Serialize};

use crate::telemetry::ExecutionOutcome;

/// A file placed under /workspace before the code runs.
#[derive(Debug, Clone)]
pub struct InputFile {
    /// Path relative to /workspace (validated by the caller).
    pub path: String,
    pub content: Vec<u8>,
}

/// One execution request.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    pub code: String,
    pub files: Vec<InputFile>,
    pub timeout: std::time::Duration,
    /// Where stdout and stderr also go while the code runs, for a caller that streams them.
    pub live: Option<std::sync::Arc<LiveOutput>>,
    /// For a client that draws tables (an MCP Apps view): a DataFrame or Series displayed also
    /// comes as [`TABLE_MIME`] data of its first rows, at most this many. 0: not at all.
    pub grid_rows: u32,
    /// The trace context of the call it runs for, when its span is recorded: upstream calls are
    /// traced as its children and carry it on.
    pub trace: Option<crate::telemetry::traces::TraceParent>,
}

/// A table's data for an interactive grid, beside its Markdown (see `display.py`): JSON with
/// `columns`, `dtypes`, `index`, `data` (rows), `total_rows`, `total_columns`. Kept within
/// [`MAX_TABLE_BYTES`] each and [`MAX_TABLES_BYTES`] in all, apart from the other displays' budget.
pub const TABLE_MIME: &str = "application/vnd.code-interpreter-mcp.table+json";
/// One table's data at most (the runner sends fewer rows rather than more bytes).
pub const MAX_TABLE_BYTES: usize = 4 * 1024 * 1024;
/// A call's tables' data in all.
pub const MAX_TABLES_BYTES: usize = 8 * 1024 * 1024;

/// The output of a running call as it is written, for streaming: what was not taken yet (the newest
/// `LIVE_CHUNK_BYTES` of it), the newest `LIVE_CHUNK_BYTES` in all (for a status), and the byte
/// counts. Never more than the streams' caps is handed out in all.
#[derive(Debug, Default)]
pub struct LiveOutput {
    inner: std::sync::Mutex<Live>,
}

#[derive(Debug, Default)]
struct Live {
    unsent: String,
    /// Bytes that were written but fell out of `unsent` before they were taken.
    skipped: u64,
    tail: String,
    stdout_bytes: u64,
    stderr_bytes: u64,
    handed_out: u64,
}

/// One streamed piece of output, and a status's tail, are at most 4 KiB.
pub const LIVE_CHUNK_BYTES: usize = 4096;

/// Cuts `text` to its last at most `limit` bytes (on a character boundary) once it has grown past
/// twice that (so that a stream of small writes moves each byte O(1) times); the bytes cut.
fn trim(text: &mut String, limit: usize) -> u64 {
    if text.len() <= 2 * limit {
        return 0;
    }
    cut_to(text, limit)
}

/// Cuts `text` to its last at most `limit` bytes (on a character boundary); the bytes cut.
fn cut_to(text: &mut String, limit: usize) -> u64 {
    if text.len() <= limit {
        return 0;
    }
    let cut = text.ceil_char_boundary(text.len() - limit);
    text.drain(..cut);
    cut as u64
}

/// The last at most `limit` bytes of `text` (on a character boundary).
fn last(text: &str, limit: usize) -> &str {
    &text[text.ceil_char_boundary(text.len().saturating_sub(limit))..]
}

impl LiveOutput {
    /// What a sandbox's stdout (`fd` 1) or stderr wrote.
    pub fn push(&self, fd: u32, bytes: &[u8]) {
        let mut live = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if fd == 1 {
            live.stdout_bytes += bytes.len() as u64;
        } else {
            live.stderr_bytes += bytes.len() as u64;
        }
        let text = String::from_utf8_lossy(bytes);
        live.unsent.push_str(&text);
        live.tail.push_str(&text);
        let skipped = trim(&mut live.unsent, LIVE_CHUNK_BYTES);
        live.skipped += skipped;
        trim(&mut live.tail, LIVE_CHUNK_BYTES);
    }

    /// The output written since the last take (at most `LIVE_CHUNK_BYTES`, a note first when more
    /// was written in between), or `None`; nothing once the streams' caps have been handed out.
    pub fn take(&self) -> Option<String> {
        let mut live = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let cap = 2 * crate::protocol::limits::MAX_STREAM_BYTES as u64;
        if live.unsent.is_empty() || live.handed_out >= cap {
            return None;
        }
        let mut text = std::mem::take(&mut live.unsent);
        let skipped = std::mem::take(&mut live.skipped) + cut_to(&mut text, LIVE_CHUNK_BYTES);
        live.handed_out += text.len() as u64;
        Some(if skipped > 0 {
            format!("[… {skipped} bytes of output not streamed …]\n{text}")
        } else {
            text
        })
    }

    /// The newest output (at most `LIVE_CHUNK_BYTES`) and the bytes written to stdout and stderr.
    pub fn status(&self) -> (String, u64, u64) {
        let live = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let tail = last(&live.tail, LIVE_CHUNK_BYTES).to_string();
        (tail, live.stdout_bytes, live.stderr_bytes)
    }
}

/// What kind of failure an execution reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// The Python code raised, or caused the failure (a memory limit it exceeded, an interpreter it
    /// crashed, a JavaScript environment it broke).
    Python,
    /// `timeout_ms` (or the set-up budget) ran out.
    Timeout,
    /// The client cancelled the call.
    Cancelled,
    /// The sandbox itself failed (boot, engine error).
    Runtime,
}

/// The error types the server reports itself (`ExecError.error_type`); an exception raised by the
/// code is reported under its own class name instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorType {
    /// `timeout_ms` ran out.
    TimeoutError,
    /// Setting up the call ran past its budget.
    SetupTimeout,
    /// The sandbox's memory budget or V8 heap ran out.
    MemoryLimitExceeded,
    /// The client cancelled the call.
    Cancelled,
    /// The interpreter failed fatally (a WebAssembly trap or stack overflow).
    InterpreterCrashed,
    /// The sandbox's own JavaScript failed, or it ended without a result.
    SandboxError,
    /// A sandbox could not start.
    SandboxStartupError,
    /// The request was refused before it ran.
    ValidationError,
    /// A queue was full.
    Overloaded,
    /// The server is shutting down.
    ServerShuttingDown,
    /// The execution queue is broken.
    Unavailable,
    /// The worker running the call ended unexpectedly.
    WorkerLost,
    /// The session does not exist (here), or has ended.
    SessionNotFound,
    /// No more sessions can be created.
    TooManySessions,
    /// The session runs on another replica now (it holds the session's lease).
    SessionElsewhere,
    /// The session is saved in a store that cannot be reached now.
    SessionStoreUnavailable,
    /// The session's saved image was refused (damaged, tampered with, or made by another build).
    SessionUnrestorable,
    /// The session holds state a session image cannot carry (it cannot be forked).
    SessionNotDurable,
    /// The caller's principal is over one of its quotas (`[quotas]`).
    QuotaExceeded,
}

impl ErrorType {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::TimeoutError => "TimeoutError",
            ErrorType::SetupTimeout => "SetupTimeout",
            ErrorType::MemoryLimitExceeded => "MemoryLimitExceeded",
            ErrorType::Cancelled => "Cancelled",
            ErrorType::InterpreterCrashed => "InterpreterCrashed",
            ErrorType::SandboxError => "SandboxError",
            ErrorType::SandboxStartupError => "SandboxStartupError",
            ErrorType::ValidationError => "ValidationError",
            ErrorType::Overloaded => "Overloaded",
            ErrorType::ServerShuttingDown => "ServerShuttingDown",
            ErrorType::Unavailable => "Unavailable",
            ErrorType::WorkerLost => "WorkerLost",
            ErrorType::SessionNotFound => "SessionNotFound",
            ErrorType::TooManySessions => "TooManySessions",
            ErrorType::SessionElsewhere => "SessionElsewhere",
            ErrorType::SessionStoreUnavailable => "SessionStoreUnavailable",
            ErrorType::SessionUnrestorable => "SessionUnrestorable",
            ErrorType::SessionNotDurable => "SessionNotDurable",
            ErrorType::QuotaExceeded => "QuotaExceeded",
        }
    }
}

impl std::fmt::Display for ErrorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A structured error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "ExecError")]
pub struct ExecError<K = ErrorKind> {
    pub kind: K,
    #[serde(rename = "type")]
    pub error_type: String,
    pub message: String,
    pub traceback: Option<String>,
    /// For `QuotaExceeded`: which quota (its `[quotas]` key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// For refusals that pass with time (`QuotaExceeded`): about when to retry, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl<K> ExecError<K> {
    /// An error of the server's own `error_type`.
    pub fn new(kind: K, error_type: ErrorType, message: impl Into<String>) -> Self {
        Self {
            kind,
            error_type: error_type.as_str().to_string(),
            message: message.into(),
            traceback: None,
            quota: None,
            retry_after_ms: None,
        }
    }
}

/// Why a sandbox kept for a session can run nothing more: the session ends with it, and says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxEnd {
    /// `timeout_ms` ran out and the code did not stop within the grace after its interrupt.
    Timeout,
    /// The client cancelled and the code did not stop within the grace after its interrupt.
    Cancelled,
    /// Setting up a call ran past its budget and was terminated.
    SetupTimeout,
    /// The memory budget or the V8 heap ran out.
    Memory,
    /// The interpreter failed fatally (a WebAssembly trap or stack overflow).
    Crashed,
    /// The code changed the sandbox's JavaScript so that a call could no longer reach it.
    Broken,
    /// Reading the session's files did not finish in time.
    Unresponsive,
}

impl SandboxEnd {
    /// Why, as the end of a sentence ("the session has ended: ...").
    pub fn reason(self) -> &'static str {
        match self {
            SandboxEnd::Timeout => {
                "its code ran past timeout_ms and did not stop when interrupted, so it was terminated"
            }
            SandboxEnd::Cancelled => {
                "its call was cancelled and the code did not stop when interrupted, so it was terminated"
            }
            SandboxEnd::SetupTimeout => "setting up a call ran past its budget and was terminated",
            SandboxEnd::Memory => "its memory budget ran out",
            SandboxEnd::Crashed => "its Python interpreter failed fatally",
            SandboxEnd::Broken => {
                "its code changed the sandbox's JavaScript so that calls can no longer run in it"
            }
            SandboxEnd::Unresponsive => "reading its files did not finish in time",
        }
    }

    /// Whether a limit ended it (else the code broke it).
    pub fn is_limit(self) -> bool {
        matches!(
            self,
            SandboxEnd::Timeout
                | SandboxEnd::Cancelled
                | SandboxEnd::SetupTimeout
                | SandboxEnd::Memory
        )
    }
}

/// A file returned to the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OutputFile {
    /// Path relative to /workspace.
    pub path: String,
    pub content_base64: String,
    pub mime_type: String,
}

/// Where a rich output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DisplaySource {
    /// `display()`, `fig.show()`, `IPython.display`.
    Display,
    /// The final expression, when it has a representation richer than text.
    Result,
}

/// One rich output of a call, as a notebook shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Display {
    pub source: DisplaySource,
    /// Its representations by MIME type (`text/plain`, `text/markdown`, `text/html`, `image/png`,
    /// `application/vnd.plotly.v1+json`, ...): text, or Base64 for `image/png` and `image/jpeg`.
    pub data: std::collections::BTreeMap<String, String>,
}

/// The result of one execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "ExecResult")]
pub struct ExecResult<K = ErrorKind> {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    /// `str()` of the final expression; `None` when there is none or it is `None`.
    pub result: Option<String>,
    pub files: Vec<OutputFile>,
    /// Rich outputs in the order the code produced them (`display()`, figures shown, a final
    /// expression with a rich representation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displays: Vec<Display>,
    pub error: Option<ExecError<K>>,
    pub timed_out: bool,
    pub output_truncated: bool,
}

impl<K> ExecResult<K> {
    /// A failed result with no output; `timed_out` says whether the failure is a timeout.
    pub fn failure_of(error: ExecError<K>, timed_out: bool) -> Self {
        Self {
            success: false,
            stdout: String::new(),
            stderr: String::new(),
            result: None,
            files: Vec::new(),
            displays: Vec::new(),
            timed_out,
            error: Some(error),
            output_truncated: false,
        }
    }

    /// The same result with its error kind mapped (to the kinds of a layer above).
    pub fn map_kind<L>(self, f: impl FnOnce(K) -> L) -> ExecResult<L> {
        ExecResult {
            success: self.success,
            stdout: self.stdout,
            stderr: self.stderr,
            result: self.result,
            files: self.files,
            displays: self.displays,
            error: self.error.map(|e| ExecError {
                kind: f(e.kind),
                error_type: e.error_type,
                message: e.message,
                traceback: e.traceback,
                quota: e.quota,
                retry_after_ms: e.retry_after_ms,
            }),
            timed_out: self.timed_out,
            output_truncated: self.output_truncated,
        }
    }
}

impl ExecResult {
    /// A failed result with no output.
    pub fn failure(error: ExecError) -> Self {
        let timed_out = error.kind == ErrorKind::Timeout;
        Self::failure_of(error, timed_out)
    }

    /// How the execution ended, as the metrics label it.
    pub fn outcome(&self) -> ExecutionOutcome {
        match self.error.as_ref().map(|e| e.kind) {
            None => ExecutionOutcome::Success,
            Some(ErrorKind::Python) => ExecutionOutcome::PythonError,
            Some(ErrorKind::Timeout) => ExecutionOutcome::Timeout,
            Some(ErrorKind::Cancelled) => ExecutionOutcome::Cancelled,
            Some(ErrorKind::Runtime) => ExecutionOutcome::RuntimeFailure,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LIVE_CHUNK_BYTES, LiveOutput};

    #[test]
    fn live_output_keeps_the_newest_bytes_and_counts_the_rest() {
        let live = LiveOutput::default();
        for i in 0..100_000 {
            live.push(1, format!("line {i}\n").as_bytes());
        }
        live.push(2, "é".repeat(3000).as_bytes());
        let (tail, stdout, stderr) = live.status();
        assert_eq!(
            stdout,
            (0..100_000)
                .map(|i| format!("line {i}\n").len() as u64)
                .sum::<u64>()
        );
        assert_eq!(stderr, 6000);
        assert!(tail.len() <= LIVE_CHUNK_BYTES && tail.len() > LIVE_CHUNK_BYTES - 4);
        assert!(tail.chars().all(|c| c == 'é'));
        let taken = live.take().unwrap();
        let (note, text) = taken.split_once('\n').unwrap();
        assert!(note.starts_with("[… ") && note.ends_with(" bytes of output not streamed …]"));
        assert!(text.len() <= LIVE_CHUNK_BYTES, "{}", text.len());
        assert!(text.ends_with('é'));
        assert_eq!(live.take(), None, "nothing new");
        live.push(1, b"more\n");
        assert_eq!(live.take().as_deref(), Some("more\n"));
    }
}
