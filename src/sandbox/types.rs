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
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub code: String,
    pub files: Vec<InputFile>,
    pub timeout: std::time::Duration,
}

/// What kind of failure an execution reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// The Python code raised.
    Python,
    /// `timeout_ms` ran out.
    Timeout,
    /// The sandbox itself failed (boot, heap budget, engine error).
    Runtime,
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
}

impl<K> ExecError<K> {
    pub fn new(kind: K, error_type: &str, message: impl Into<String>) -> Self {
        Self {
            kind,
            error_type: error_type.to_string(),
            message: message.into(),
            traceback: None,
        }
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
            error: self.error.map(|e| ExecError {
                kind: f(e.kind),
                error_type: e.error_type,
                message: e.message,
                traceback: e.traceback,
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
            Some(ErrorKind::Runtime) => ExecutionOutcome::RuntimeFailure,
        }
    }
}
