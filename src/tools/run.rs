//! `run_python_code`: its arguments, its structured result (an execution's result, or a refusal
//! before one, with the error kinds the tool adds), validation, queueing on the worker pool, progress
//! notices while queued and running, and the package sentences of its description.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RequestContext};
use rmcp::{RoleServer, tool, tool_router};

use super::text::{self, Kept};
use super::validation::{FileInput, InputLimits, validate};
use super::{CodeInterpreter, InFlight, content};
use crate::pool::{Completed, ExecPool, JobError, SubmitError, Ticket};
use crate::protocol::limits::{DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS};
use crate::sandbox::{self, ErrorType, ExecError, ExecRequest, ExecResult};
use crate::sessions::{Caller, KeepOutputs, Principal, SessionError, Sessions};
use crate::telemetry::{self, Rejection, ToolOutcome};

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
    /// Time limit for the code in milliseconds (start-up and package loading are not counted).
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    pub timeout_ms: u64,
    /// Run in a stateful session: "new" (or "") starts one and the result carries its session_id;
    /// an id from an earlier result runs in that session (variables, imports and /workspace files
    /// persist). Omit it for a fresh sandbox, as by default. Mirrored in the Mcp-Param-Session-Id
    /// HTTP header (x-mcp-header), so load balancers can route a session's calls to its replica.
    #[serde(default)]
    #[schemars(extend("x-mcp-header" = SESSION_ID_HEADER, "type" = "string"))]
    pub session_id: Option<String>,
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
}

impl std::ops::Deref for CallResult {
    type Target = ExecResult<CallErrorKind>;
    fn deref(&self) -> &Self::Target {
        &self.result
    }
}

/// How a call ended.
#[derive(Debug)]
pub enum Outcome {
    /// It ran in a sandbox.
    Executed(ExecResult),
    /// It did not run.
    Refused(Refusal),
}

/// Why a call did not run.
#[derive(Debug)]
pub enum Refusal {
    Invalid(String),
    Queue(SubmitError),
    Job(JobError),
    Session(SessionError),
    Cancelled,
}

impl Outcome {
    /// The tool-call metric's outcome: the one mapping from a call to its label.
    pub fn metric(&self) -> ToolOutcome {
        match self {
            Outcome::Executed(result) => result.outcome().into(),
            Outcome::Refused(Refusal::Invalid(_)) => ToolOutcome::ValidationError,
            Outcome::Refused(Refusal::Queue(SubmitError::Overloaded { .. })) => {
                ToolOutcome::Overload
            }
            Outcome::Refused(Refusal::Cancelled) => ToolOutcome::Cancelled,
            Outcome::Refused(Refusal::Session(
                SessionError::NotFound(_)
                | SessionError::Ended { .. }
                | SessionError::OtherReplica { .. },
            )) => ToolOutcome::ValidationError,
            Outcome::Refused(Refusal::Session(
                SessionError::TooMany { .. } | SessionError::Busy { .. },
            )) => ToolOutcome::Overload,
            Outcome::Refused(Refusal::Queue(_) | Refusal::Job(_) | Refusal::Session(_)) => {
                ToolOutcome::RuntimeFailure
            }
        }
    }

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
        SessionError::TooMany { .. } => (CallErrorKind::Session, ErrorType::TooManySessions),
        SessionError::Busy { .. } => (CallErrorKind::Overload, ErrorType::Overloaded),
        SessionError::Boot(_) => (CallErrorKind::Runtime, ErrorType::SandboxStartupError),
        // The session is gone with this process: like an ended one, the caller starts a new one.
        SessionError::ShuttingDown => (CallErrorKind::Session, ErrorType::ServerShuttingDown),
    };
    ExecError::new(kind, error_type, error.to_string())
}

/// First queue-position notice after this long in the queue.
const FIRST_QUEUE_NOTICE: Duration = Duration::from_secs(1);
/// Then a notice (queued: position; running: elapsed time) this often.
const NOTICE_INTERVAL: Duration = Duration::from_secs(5);

/// Where progress notifications for one call go.
struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    sent: u32,
}

impl Progress {
    /// Sends one notice; `progress` counts notices so that it only increases, as MCP requires.
    async fn notify(&mut self, message: String) {
        self.sent += 1;
        let param = ProgressNotificationParam::new(self.token.clone(), f64::from(self.sent))
            .with_message(message);
        if let Err(e) = self.peer.notify_progress(param).await {
            tracing::debug!(error = %e, "progress notification not delivered");
        }
    }
}

/// A call's outcome, where its time went, and the session it ran in.
pub struct Ended {
    pub outcome: Outcome,
    pub queue_wait: Duration,
    pub execution: Duration,
    pub session_id: Option<String>,
    /// The session files that hold the whole of its long outputs.
    pub kept: Kept,
}

impl Ended {
    fn refused(refusal: Refusal) -> Self {
        Self {
            outcome: Outcome::Refused(refusal),
            queue_wait: Duration::ZERO,
            execution: Duration::ZERO,
            session_id: None,
            kept: Kept::default(),
        }
    }
}

/// Validates the arguments, queues the execution and waits for it (with progress notices when the
/// client sent a progress token). Cancellation by the client drops the ticket: a queued job leaves
/// the queue, a running one finishes and its result is discarded.
pub async fn validate_and_execute(
    pool: &ExecPool,
    sessions: Option<&Sessions>,
    limits: InputLimits,
    max_text_chars: usize,
    args: RunPythonCodeArgs,
    context: Option<RequestContext<RoleServer>>,
) -> Ended {
    if !(1..=MAX_TIMEOUT_MS).contains(&args.timeout_ms) {
        return invalid(format!(
            "timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, got {}",
            args.timeout_ms
        ));
    }
    let files = match validate(&args.code, &args.files, limits) {
        Ok(files) => files,
        Err(message) => return invalid(message),
    };
    let request = ExecRequest {
        code: args.code,
        files,
        timeout: Duration::from_millis(args.timeout_ms),
    };
    if let Some(session_id) = args.session_id {
        let Some(sessions) = sessions else {
            return invalid(
                "sessions are disabled on this server (sessions.enabled = false)".into(),
            );
        };
        let keep = (max_text_chars > 0).then(|| KeepOutputs {
            stem: output_stem(),
            stdout_over: text::share("stdout", max_text_chars),
            stderr_over: text::share("stderr", max_text_chars),
        });
        return in_session(sessions, session_id, request, keep, context).await;
    }
    let ticket = match pool.submit(request) {
        Ok(ticket) => ticket,
        Err(error) => return Ended::refused(Refusal::Queue(error)),
    };
    let progress = context.as_ref().and_then(|c| {
        c.meta.get_progress_token().map(|token| Progress {
            peer: c.peer.clone(),
            token,
            sent: 0,
        })
    });
    let cancelled = context.map(|c| c.ct).unwrap_or_default();
    tokio::select! {
        completed = wait_with_progress(ticket, progress) => Ended {
            outcome: match completed.result {
                Ok(result) => Outcome::Executed(result),
                Err(error) => Outcome::Refused(Refusal::Job(error)),
            },
            queue_wait: completed.queue_wait,
            execution: completed.execution,
            session_id: None,
            kept: Kept::default(),
        },
        _ = cancelled.cancelled() => Ended::refused(Refusal::Cancelled),
    }
}

/// Runs `request` in the session `session_id` names ("new" or "": a new one, owned by the client
/// behind `context`). Cancellation stops the call (interrupting the code; the session lives on if it
/// stops), and a new session whose id never reached its client is ended at once.
async fn in_session(
    sessions: &Sessions,
    session_id: String,
    request: ExecRequest,
    keep: Option<KeepOutputs>,
    context: Option<RequestContext<RoleServer>>,
) -> Ended {
    let started = std::time::Instant::now();
    let cancelled = context.as_ref().map(|c| c.ct.clone()).unwrap_or_default();
    let caller = caller(context.as_ref());
    let run = async {
        let mut created = None;
        let id = if session_id.is_empty() || session_id == "new" {
            let id = sessions.create(caller.clone(), &request.code).await?;
            created = Some(Abandon {
                sessions,
                id: Some(id.clone()),
            });
            id
        } else {
            session_id
        };
        let result = sessions.run(&id, &caller, request, keep).await?;
        // The id goes back to the client with this result: the session is the client's now.
        if let Some(mut created) = created {
            created.id = None;
        }
        Ok::<_, SessionError>((id, result))
    };
    tokio::select! {
        outcome = run => match outcome {
            Ok((id, run)) => Ended {
                outcome: Outcome::Executed(run.result),
                queue_wait: Duration::ZERO,
                execution: started.elapsed(),
                session_id: Some(id),
                kept: Kept {
                    stdout: run.kept_stdout,
                    stderr: run.kept_stderr,
                },
            },
            Err(e) => Ended::refused(Refusal::Session(e)),
        },
        _ = cancelled.cancelled() => Ended::refused(Refusal::Cancelled),
    }
}

/// Where a session call keeps its long outputs: `.outputs/call-MILLIS-RANDOM` under /workspace.
fn output_stem() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut random = [0u8; 3];
    let _ = getrandom::fill(&mut random);
    format!(".outputs/call-{millis}-{}", hex::encode(random))
}

/// Ends a session created for a call that went away before its id reached the client.
struct Abandon<'a> {
    sessions: &'a Sessions,
    /// `None` once the id is the client's.
    id: Option<String>,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(id) = &self.id {
            self.sessions.abandon(id);
        }
    }
}

/// Who makes a call: the client, for listing its sessions' resources later (the MCP session of a
/// legacy-era client, its `Mcp-Session-Id`; the stdio client; nobody known for a 2026-07-28
/// stateless request), and the bearer token it was authenticated with, if any.
pub fn caller(context: Option<&RequestContext<RoleServer>>) -> Caller {
    let Some(context) = context else {
        return Caller::default();
    };
    match context.extensions.get::<axum::http::request::Parts>() {
        None => Caller {
            client: Some("stdio".into()),
            principal: None,
        },
        Some(parts) => Caller {
            client: parts
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(|v| format!("mcp-session:{v}")),
            principal: parts.extensions.get::<Principal>().copied(),
        },
    }
}

fn invalid(message: String) -> Ended {
    telemetry::rejection(Rejection::Validation);
    Ended::refused(Refusal::Invalid(message))
}

/// Waits for `ticket`, sending the queue position after one second of waiting and every five seconds
/// while still queued, then a heartbeat with the elapsed time every five seconds while running.
async fn wait_with_progress(
    mut ticket: Ticket<ExecRequest, ExecResult>,
    progress: Option<Progress>,
) -> Completed<ExecResult> {
    let Some(mut progress) = progress else {
        return ticket.wait().await;
    };
    let submitted = tokio::time::Instant::now();
    let mut running_since: Option<tokio::time::Instant> = None;
    let mut next_notice = submitted + FIRST_QUEUE_NOTICE;
    loop {
        {
            let wait = ticket.wait();
            tokio::pin!(wait);
            tokio::select! {
                completed = &mut wait => return completed,
                _ = tokio::time::sleep_until(next_notice) => {}
            }
        }
        match (ticket.started(), running_since) {
            (false, _) => {
                if let Some(position) = ticket.position() {
                    progress
                        .notify(format!(
                            "queued: position {position} in the execution queue"
                        ))
                        .await;
                }
                next_notice += NOTICE_INTERVAL;
            }
            (true, None) => {
                // Just started: the first heartbeat comes five seconds from now.
                let now = tokio::time::Instant::now();
                running_since = Some(now);
                next_notice = now + NOTICE_INTERVAL;
            }
            (true, Some(since)) => {
                let secs = since.elapsed().as_secs();
                progress.notify(format!("running for {secs} s")).await;
                next_notice += NOTICE_INTERVAL;
            }
        }
    }
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
    pub async fn run(
        &self,
        args: RunPythonCodeArgs,
        context: Option<RequestContext<RoleServer>>,
    ) -> (CallResult, Kept) {
        let started = std::time::Instant::now();
        let ended = validate_and_execute(
            &self.pool,
            self.sessions.as_ref(),
            self.limits,
            self.max_text_chars,
            args,
            context,
        )
        .await;
        let outcome = ended.outcome.metric();
        let result = CallResult {
            result: ended.outcome.into_result(),
            session_id: ended.session_id,
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
        Parameters(args): Parameters<RunPythonCodeArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let _in_flight = InFlight::enter(&self.in_flight);
        let (result, kept) = self.run(args, Some(context)).await;
        let value = serde_json::to_value(&result).unwrap_or_default();
        let text = text::model_text(&result, &value, self.max_text_chars, &kept);
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
        reply.content.extend(content::file_blocks(
            &result.files,
            result.session_id.as_deref(),
            self.max_inline_image_bytes,
        ));
        reply
    }
}
