//! The MCP tools: `run_python_code` (validate, then execute on the worker pool) with its input and
//! output schemas, and the server's MCP identity.

use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolResult, Implementation, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};

use crate::pool::{Completed, Pool, Ticket};
use crate::sandbox::{ErrorKind, ExecError, ExecRequest, ExecResult};
use crate::snippets::{Catalog, SnippetDetail, SnippetSummary};
use crate::telemetry::{self, Rejection, ToolOutcome};
use crate::validation::{FileInput, InputLimits, validate};

/// Largest accepted `timeout_ms`.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// `timeout_ms` when the client sends none.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

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
    #[schemars(range(min = 1, max = 120000))]
    pub timeout_ms: u64,
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

/// Arguments of `list_code_snippets`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct ListSnippetsArgs {
    /// Words describing the task, e.g. "XLSX risk register". Omit or leave blank to list every snippet.
    #[serde(default)]
    pub query: Option<String>,
}

/// Result of `list_code_snippets`.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct ListSnippetsResult {
    /// Best matches first; when fewer than the configured minimum match, the next best (possibly
    /// unrelated) snippets follow.
    pub snippets: Vec<SnippetSummary>,
}

/// Arguments of `get_code_snippet`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct GetSnippetArgs {
    /// A snippet id from list_code_snippets.
    pub id: String,
}

/// Result of `get_code_snippet`.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct GetSnippetResult {
    /// The snippet with its code, or null when no visible snippet has that id.
    pub snippet: Option<SnippetDetail>,
}

/// The MCP server: tools over the worker pool and the snippet catalog.
#[derive(Clone)]
pub struct CodeInterpreter {
    pool: Pool,
    limits: InputLimits,
    catalog: std::sync::Arc<Catalog>,
    tool_router: ToolRouter<Self>,
    /// run_python_code calls whose handler has not returned yet (see `calls_in_flight`).
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts one run_python_code handler as in flight until it returns (or is dropped).
struct InFlight(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn enter(counter: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Self {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl CodeInterpreter {
    /// `catalog` is `None` when `[code_snippets] enabled = false`: the snippet tools are then absent.
    pub fn new(pool: Pool, limits: InputLimits, catalog: Option<Catalog>) -> Self {
        let mut tool_router = Self::tool_router();
        if catalog.is_some() {
            tool_router += Self::snippet_router();
        }
        Self {
            pool,
            limits,
            catalog: std::sync::Arc::new(catalog.unwrap_or_default()),
            tool_router,
            in_flight: Default::default(),
        }
    }

    /// The number of run_python_code calls whose handler has not returned yet. A graceful shutdown
    /// waits for it to reach zero before it closes the MCP transport, so a call that finished while
    /// draining still gets its reply.
    pub fn calls_in_flight(&self) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
        self.in_flight.clone()
    }

    /// States the package policy in run_python_code's description: the preinstalled packages by name
    /// (never versions or URLs) and, only when runtime installation is enabled, micropip.install.
    pub fn with_packages(
        mut self,
        preinstall_packages: &[String],
        runtime_installation: bool,
    ) -> Self {
        if let Some(route) = self.tool_router.map.get_mut("run_python_code") {
            let base = route.attr.description.clone().unwrap_or_default();
            route.attr.description = Some(
                format!(
                    "{base}{}",
                    package_description(preinstall_packages, runtime_installation)
                )
                .into(),
            );
        }
        self
    }

    /// Validates and runs one call; the structured result. Logs one line per call with its outcome and
    /// timings, never the code, file contents or paths.
    pub async fn run(
        &self,
        args: RunPythonCodeArgs,
        context: Option<RequestContext<RoleServer>>,
    ) -> ExecResult {
        let started = std::time::Instant::now();
        let completed = self.validate_and_execute(args, context).await;
        let result = &completed.result;
        let outcome = match &result.error {
            None => ToolOutcome::Success,
            Some(e) if e.error_type == "Cancelled" => ToolOutcome::Cancelled,
            Some(e) => match e.kind {
                ErrorKind::Python => ToolOutcome::PythonError,
                ErrorKind::Timeout => ToolOutcome::Timeout,
                ErrorKind::Runtime => ToolOutcome::RuntimeFailure,
                ErrorKind::Validation => ToolOutcome::ValidationError,
                ErrorKind::Overload => ToolOutcome::Overload,
            },
        };
        telemetry::tool_call("run_python_code", outcome, started.elapsed());
        tracing::info!(
            tool = "run_python_code",
            outcome = outcome.label(),
            queue_wait_ms = completed.queue_wait.as_millis() as u64,
            execution_ms = completed.execution.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            output_truncated = result.output_truncated,
            "tool call"
        );
        completed.result
    }

    async fn validate_and_execute(
        &self,
        args: RunPythonCodeArgs,
        context: Option<RequestContext<RoleServer>>,
    ) -> Completed {
        if !(1..=MAX_TIMEOUT_MS).contains(&args.timeout_ms) {
            return validation_error(format!(
                "timeout_ms must be between 1 and {MAX_TIMEOUT_MS}, got {}",
                args.timeout_ms
            ));
        }
        let files = match validate(&args.code, &args.files, self.limits) {
            Ok(files) => files,
            Err(message) => return validation_error(message),
        };
        let ticket = match self.pool.submit(ExecRequest {
            code: args.code,
            files,
            timeout: Duration::from_millis(args.timeout_ms),
        }) {
            Ok(ticket) => ticket,
            Err(error) => return Completed::immediate(ExecResult::failure(error)),
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
            completed = wait_with_progress(ticket, progress) => completed,
            // The ticket is dropped with the other branch: a queued job leaves the queue, a running
            // one finishes and its result is discarded.
            _ = cancelled.cancelled() => Completed::immediate(ExecResult::failure(ExecError::new(
                ErrorKind::Runtime,
                "Cancelled",
                "the client cancelled this call",
            ))),
        }
    }
}

/// Waits for `ticket`, sending the queue position after one second of waiting and every five seconds
/// while still queued, then a heartbeat with the elapsed time every five seconds while running.
async fn wait_with_progress(mut ticket: Ticket, progress: Option<Progress>) -> Completed {
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

fn validation_error(message: String) -> Completed {
    telemetry::rejection(Rejection::Validation);
    Completed::immediate(ExecResult::failure(ExecError::new(
        ErrorKind::Validation,
        "ValidationError",
        message,
    )))
}

/// The package sentences of run_python_code's description.
pub fn package_description(preinstall_packages: &[String], runtime_installation: bool) -> String {
    let mut names: Vec<String> = Vec::new();
    for requirement in preinstall_packages {
        let name = crate::sandbox::layer::requirement_name(requirement);
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

#[tool_router]
impl CodeInterpreter {
    #[tool(
        name = "run_python_code",
        description = "Run Python 3 code in a fresh, isolated Pyodide (WebAssembly) sandbox and return \
stdout, stderr, the str() of the final expression, and any new files written under /workspace \
(the working directory). Every call starts from a clean interpreter: nothing persists between calls. \
Top-level await is supported. Pass input files as Base64 in `files`; they appear under /workspace.",
        output_schema = rmcp::handler::server::tool::schema_for_type::<ExecResult>()
    )]
    async fn run_python_code(
        &self,
        Parameters(args): Parameters<RunPythonCodeArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let _in_flight = InFlight::enter(&self.in_flight);
        let result = self.run(args, Some(context)).await;
        let value = serde_json::to_value(&result).unwrap_or_default();
        if result.success {
            CallToolResult::structured(value)
        } else {
            CallToolResult::structured_error(value)
        }
    }
}

#[tool_router(router = snippet_router)]
impl CodeInterpreter {
    #[tool(
        name = "list_code_snippets",
        description = "Search the server's catalog of ready-made Python code snippets by words describing \
the task (matched against titles and descriptions, case-insensitive); an empty query lists them all. \
Returns ids with titles, descriptions, required packages and tags, best matches first. Short result \
lists are filled with other snippets that may be unrelated: read each description before using one. \
Then call get_code_snippet with an id to fetch the code, and run it (adapted) with run_python_code."
    )]
    async fn list_code_snippets(
        &self,
        Parameters(args): Parameters<ListSnippetsArgs>,
    ) -> Json<ListSnippetsResult> {
        let started = std::time::Instant::now();
        let snippets = self.catalog.search(args.query.as_deref());
        telemetry::tool_call(
            "list_code_snippets",
            ToolOutcome::Success,
            started.elapsed(),
        );
        tracing::info!(
            tool = "list_code_snippets",
            outcome = "success",
            results = snippets.len(),
            "tool call"
        );
        Json(ListSnippetsResult { snippets })
    }

    #[tool(
        name = "get_code_snippet",
        description = "Fetch one snippet from the catalog by the id that list_code_snippets returned: its \
metadata and Python source. Returns snippet = null when no snippet has that id."
    )]
    async fn get_code_snippet(
        &self,
        Parameters(args): Parameters<GetSnippetArgs>,
    ) -> Json<GetSnippetResult> {
        let started = std::time::Instant::now();
        let snippet = self.catalog.get(&args.id);
        telemetry::tool_call("get_code_snippet", ToolOutcome::Success, started.elapsed());
        tracing::info!(
            tool = "get_code_snippet",
            outcome = "success",
            found = snippet.is_some(),
            "tool call"
        );
        Json(GetSnippetResult { snippet })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CodeInterpreter {
    fn get_info(&self) -> ServerConfig {
        // Prompts and resources are declared with empty lists so that clients (and the conformance
        // suite's caching checks) that list them get an answer rather than "method not found".
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .enable_resources()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(
                "code-interpreter-mcp",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Use run_python_code to execute Python in a fresh sandbox per call. State does not \
             persist between calls; send input files with each call.",
            )
    }
}
