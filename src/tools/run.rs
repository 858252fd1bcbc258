//! `run_python_code`: its arguments, its structured result (an execution's result, or a refusal
//! before one, with the error kinds the tool adds), the result as MCP content (the text sized for a
//! model, the displays and files as their own blocks), and the package sentences of its description.
//! Running it is `execute.rs`; as a task, `tasks.rs`.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};

use super::era::Era;
use super::execute::{Call, Ended, Outcome, Refusal, Runner, Setup};
use super::text::{self, Kept};
use super::validation::FileInput;
use super::{CodeInterpreter, InFlight, content};
use crate::pool::{JobError, SubmitError};
use crate::protocol::limits::{DEFAULT_TIMEOUT_MS, MAX_TASK_TIMEOUT_MS};
use crate::sandbox::{self, ErrorType, ExecError, ExecResult};
use crate::sessions::SessionError;

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

/// Arguments of `run_python_code`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct RunPythonCodeArgs {
    /// Python source to run. Top-level `await` is allowed; the value of a final expression is returned
    /// as `result`.
    pub code: String,
    /// Files to place under /workspace (the working directory) before the code runs.
    #[serde(default)]
    pub files: Vec<FileInput>,
    /// Time limit for the code in milliseconds (start-up and package loading are not counted): at
    /// most 120000 for a synchronous call; a task may run up to the server's tasks.max_timeout_ms.
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = 1, max = MAX_TASK_TIMEOUT_MS))]
    pub timeout_ms: u64,
    /// Run in a stateful session: "new" (or "") starts one and the result carries its session_id;
    /// an id from an earlier result runs in that session (variables, imports and /workspace files
    /// persist). Omit it, or pass "none", for a fresh sandbox, as by default. Mirrored in the
    /// Mcp-Param-Session-Id HTTP header (x-mcp-header), so load balancers can route a session's
    /// calls to its replica.
    #[serde(default)]
    #[schemars(extend("x-mcp-header" = SESSION_ID_HEADER, "type" = "string"))]
    pub session_id: Option<String>,
    /// Not an argument: rows of a table's grid data for the client's view (set from its
    /// capabilities, see `CodeInterpreter::grid_rows`).
    #[serde(skip)]
    #[schemars(skip)]
    pub grid_rows: u32,
}

impl From<RunPythonCodeArgs> for Call {
    fn from(args: RunPythonCodeArgs) -> Self {
        Self {
            code: args.code,
            files: args.files,
            timeout_ms: args.timeout_ms,
            session_id: args
                .session_id
                .filter(|id| super::execute::names_a_session(id)),
            grid_rows: args.grid_rows,
        }
    }
}

/// The kind of a failed call: an execution's kinds, and the tool's own refusals.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
#[schemars(rename = "ErrorKind")]
pub enum CallErrorKind {
    /// The Python code raised.
    Python,
    /// `timeout_ms` ran out.
    Timeout,
    /// The client cancelled the call.
    Cancelled,
    /// The sandbox or the server failed (boot, engine error, shutdown).
    Runtime,
    /// The request was rejected before execution.
    Validation,
    /// The queue was full.
    Overload,
    /// The session does not exist, has expired, or no more can be created.
    Session,
}

impl From<sandbox::ErrorKind> for CallErrorKind {
    fn from(kind: sandbox::ErrorKind) -> Self {
        match kind {
            sandbox::ErrorKind::Python => CallErrorKind::Python,
            sandbox::ErrorKind::Timeout => CallErrorKind::Timeout,
            sandbox::ErrorKind::Cancelled => CallErrorKind::Cancelled,
            sandbox::ErrorKind::Runtime => CallErrorKind::Runtime,
        }
    }
}

/// `run_python_code`'s structured result: an execution's, and the session it ran in, if any.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct CallResult {
    #[serde(flatten)]
    pub result: ExecResult<CallErrorKind>,
    /// The session the code ran in (pass it again to continue there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The session the code ran in, and whether it is durable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionInfo>,
}

/// A session call's session: its id, and whether it is durable (saved to the store when idle,
/// resumed on any replica, kept through a restart) or lives only in this process's memory, and why.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct SessionInfo {
    pub id: String,
    pub durable: bool,
    /// Why it is not durable (what it holds that a session image cannot carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl std::ops::Deref for CallResult {
    type Target = ExecResult<CallErrorKind>;
    fn deref(&self) -> &Self::Target {
        &self.result
    }
}

impl Outcome {
    /// The structured result the client gets (without its session id).
    pub fn into_result(self) -> ExecResult<CallErrorKind> {
        let refusal = match self {
            Outcome::Executed(result) => return result.map_kind(CallErrorKind::from),
            Outcome::Refused(refusal) => refusal,
        };
        let (kind, error_type, message) = match refusal {
            Refusal::Invalid(message) => (
                CallErrorKind::Validation,
                ErrorType::ValidationError,
                message,
            ),
            Refusal::Queue(e @ SubmitError::Overloaded { .. }) => (
                CallErrorKind::Overload,
                ErrorType::Overloaded,
                e.to_string(),
            ),
            Refusal::Queue(e @ SubmitError::ShuttingDown) => (
                CallErrorKind::Runtime,
                ErrorType::ServerShuttingDown,
                e.to_string(),
            ),
            Refusal::Queue(e @ SubmitError::LaneFull { .. }) => (
                CallErrorKind::Overload,
                ErrorType::QuotaExceeded,
                e.to_string(),
            ),
            Refusal::Queue(e @ SubmitError::Unavailable) => (
                CallErrorKind::Runtime,
                ErrorType::Unavailable,
                e.to_string(),
            ),
            Refusal::Job(e @ JobError::Boot(_)) => (
                CallErrorKind::Runtime,
                ErrorType::SandboxStartupError,
                e.to_string(),
            ),
            Refusal::Job(e @ JobError::ShuttingDown) => (
                CallErrorKind::Runtime,
                ErrorType::ServerShuttingDown,
                e.to_string(),
            ),
            Refusal::Job(e @ JobError::WorkerLost) => {
                (CallErrorKind::Runtime, ErrorType::WorkerLost, e.to_string())
            }
            Refusal::Session(e) => {
                return ExecResult::failure_of(session_error(&e), false);
            }
            Refusal::TaskQueue(message) => {
                (CallErrorKind::Overload, ErrorType::Overloaded, message)
            }
            Refusal::Quota(refusal) => {
                let mut error = ExecError::new(
                    CallErrorKind::Overload,
                    ErrorType::QuotaExceeded,
                    refusal.message,
                );
                error.quota = Some(refusal.quota.to_string());
                error.retry_after_ms = refusal
                    .retry_after
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                return ExecResult::failure_of(error, false);
            }
            Refusal::Cancelled => (
                CallErrorKind::Cancelled,
                ErrorType::Cancelled,
                "the client cancelled this call".to_string(),
            ),
        };
        ExecResult::failure_of(ExecError::new(kind, error_type, message), false)
    }
}

/// The `x-mcp-header` name of every `session_id` argument: clients of protocol 2026-07-28 send its
/// value as `Mcp-Param-Session-Id`, which rmcp checks against the body (400, -32020, on a mismatch).
pub const SESSION_ID_HEADER: &str = "Session-Id";

/// The structured error of a session that cannot be used, for every tool that names one.
pub fn session_error(error: &SessionError) -> ExecError<CallErrorKind> {
    let (kind, error_type) = match error {
        SessionError::NotFound(_)
        | SessionError::Ended { .. }
        | SessionError::OtherReplica { .. } => (CallErrorKind::Session, ErrorType::SessionNotFound),
        SessionError::TooMany { .. } | SessionError::TooManyResident { .. } => {
            (CallErrorKind::Session, ErrorType::TooManySessions)
        }
        SessionError::Elsewhere { .. } => (CallErrorKind::Session, ErrorType::SessionElsewhere),
        SessionError::StoreUnavailable { .. } => {
            (CallErrorKind::Session, ErrorType::SessionStoreUnavailable)
        }
        SessionError::Unrestorable { .. } => {
            (CallErrorKind::Session, ErrorType::SessionUnrestorable)
        }
        SessionError::NotDurable { .. } => (CallErrorKind::Session, ErrorType::SessionNotDurable),
        SessionError::Busy { .. } => (CallErrorKind::Overload, ErrorType::Overloaded),
        SessionError::TooManyOwned { .. } => {
            let mut quota = ExecError::new(
                CallErrorKind::Overload,
                ErrorType::QuotaExceeded,
                error.to_string(),
            );
            quota.quota = Some("max_sessions".into());
            return quota;
        }
        SessionError::Boot(_) => (CallErrorKind::Runtime, ErrorType::SandboxStartupError),
        // The session is gone with this process: like an ended one, the caller starts a new one.
        SessionError::ShuttingDown => (CallErrorKind::Session, ErrorType::ServerShuttingDown),
    };
    ExecError::new(kind, error_type, error.to_string())
}

/// The package sentences of run_python_code's description.
pub fn package_description(preinstall_packages: &[String], runtime_installation: bool) -> String {
    let mut names: Vec<String> = Vec::new();
    for requirement in preinstall_packages {
        let name = crate::packages::requirement_name(requirement);
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    let mut text = String::new();
    if !names.is_empty() {
        text.push_str(&format!(" Preinstalled packages: {}.", names.join(", ")));
    }
    if runtime_installation {
        text.push_str(
            " Packages of the Pyodide distribution (numpy, pandas, matplotlib, scipy, ...) load \
automatically on import; other pure-Python packages can be installed from the code with \
`import micropip` and `await micropip.install(\"name\")`.",
        );
    } else if names.is_empty() {
        text.push_str(
            " Package installation is disabled on this server: only the Python standard library \
can be imported.",
        );
    } else {
        text.push_str(
            " Package installation is disabled on this server: only the Python standard library \
and the preinstalled packages (with their dependencies) can be imported.",
        );
    }
    text
}

impl CodeInterpreter {
    /// Validates and runs one call; the structured result. Logs one line per call with its outcome and
    /// timings, never the code, file contents or paths.
    pub async fn run(&self, args: RunPythonCodeArgs, setup: Setup) -> (CallResult, Kept) {
        let started = std::time::Instant::now();
        let ended = self.runner().execute(args.into(), setup).await;
        self.finish(ended, started)
    }

    pub(super) fn runner(&self) -> Runner<'_> {
        Runner {
            pool: &self.pool,
            quotas: &self.quotas,
            sessions: self.sessions.as_ref(),
            limits: self.limits,
            max_text_chars: self.max_text_chars,
        }
    }

    /// The structured result of a call that ended, its metric and its log line.
    pub(super) fn finish(&self, ended: Ended, started: std::time::Instant) -> (CallResult, Kept) {
        let outcome = ended.outcome.metric();
        if let Outcome::Executed(run) = &ended.outcome {
            trace_sizes(run);
        }
        let session = ended.session_id.as_ref().map(|id| SessionInfo {
            id: id.clone(),
            durable: ended.unsaveable.is_none(),
            reason: ended.unsaveable,
        });
        let result = CallResult {
            result: ended.outcome.into_result(),
            session_id: ended.session_id,
            session,
        };
        super::record(
            "run_python_code",
            outcome,
            started,
            super::Details {
                queue_wait: Some(ended.queue_wait),
                execution: Some(ended.execution),
                output_truncated: Some(result.output_truncated),
                session: result.session_id.as_deref(),
                ..Default::default()
            },
        );
        (result, ended.kept)
    }
}

/// The sizes of what a call returned, on its span (sizes only: never the text or the names).
fn trace_sizes(run: &crate::sandbox::ExecResult) {
    use opentelemetry::KeyValue;
    let size = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    crate::telemetry::traces::current().set(vec![
        KeyValue::new("code_interpreter.stdout_bytes", size(run.stdout.len())),
        KeyValue::new("code_interpreter.stderr_bytes", size(run.stderr.len())),
        KeyValue::new("code_interpreter.output_files", size(run.files.len())),
        KeyValue::new("code_interpreter.displays", size(run.displays.len())),
    ]);
}

#[tool_router(vis = "pub(super)")]
impl CodeInterpreter {
    #[tool(
        name = "run_python_code",
        title = "Run Python code",
        description = "Run Python 3 code in a fresh, isolated Pyodide (WebAssembly) sandbox and return \
stdout, stderr, the str() of the final expression, and any new files written under /workspace \
(the working directory). Every call starts from a clean interpreter: nothing persists between calls. \
Top-level await is supported. Pass input files as Base64 in `files`; they appear under /workspace. \
Notebook style works: display(obj) and IPython.display show rich output (tables, images, HTML), \
%pip install / !pip install, %time, %timeit, %%time, %%capture; matplotlib and plotly figures come \
back as images and files.",
        output_schema = rmcp::handler::server::tool::schema_for_type::<CallResult>()
    )]
    async fn run_python_code(
        &self,
        Parameters(mut args): Parameters<RunPythonCodeArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let _in_flight = InFlight::enter(&self.in_flight);
        args.grid_rows = self.grid_rows(&context);
        let era = self.era(&context);
        let (result, kept) = self.run(args, Setup::of(Some(&context))).await;
        self.reply(&result, &kept, era)
    }
}

impl CodeInterpreter {
    /// A result as MCP content for a client of `era`: its JSON (the text sized for a model), then
    /// a block per display and per file, and, where structured content does not exist, the whole of
    /// each field the text cut as an embedded resource.
    /// Tables' grid data goes in the result's `_meta` for the view (see `apps::take_tables`).
    pub(super) fn reply(&self, result: &CallResult, kept: &Kept, era: Era) -> CallToolResult {
        let stripped;
        let mut tables = Vec::new();
        let result = if result
            .displays
            .iter()
            .any(|d| d.data.contains_key(crate::sandbox::TABLE_MIME))
        {
            let mut copy = result.clone();
            tables = crate::apps::take_tables(&mut copy.result.displays);
            stripped = copy;
            &stripped
        } else {
            result
        };
        let value = serde_json::to_value(result).unwrap_or_default();
        let files = content::file_blocks(
            &result.files,
            result.session_id.as_deref(),
            self.max_inline_image_bytes,
            era,
        );
        let view = text::View {
            max_chars: self.max_text_chars,
            era,
        };
        let text = text::model_text(&value, view, kept, &files);
        let wholes = if era.structured() {
            Vec::new()
        } else {
            text::cut_fields(&value, self.max_text_chars, kept)
        };
        let mut reply = if result.success {
            CallToolResult::structured(value)
        } else {
            CallToolResult::structured_error(value)
        };
        reply.content = vec![rmcp::model::ContentBlock::text(text)];
        reply.content.extend(content::display_blocks(
            &result.displays,
            self.max_inline_image_bytes,
        ));
        reply.content.extend(files.into_iter().flatten());
        for (field, whole) in wholes {
            reply.content.push(rmcp::model::ContentBlock::resource(
                rmcp::model::ResourceContents::text(whole, text::output_uri(field)),
            ));
        }
        if !tables.is_empty() {
            let (key, value) = crate::apps::view_meta(tables);
            reply.meta.get_or_insert_default().0.insert(key, value);
        }
        era.shape(reply)
    }
}
