//! The MCP tools and the server's MCP identity: `run_python_code` (validate, then execute on the
//! worker pool or in a session; see [`run`]), the session tools and session files as resources
//! ([`session`]), and the snippet tools over the configured catalog ([`snippets`]), with their input
//! and output schemas, titles and annotations. Request checks before anything is queued are in
//! [`validation`]; what results carry besides JSON (images, links) in [`content`].

pub mod content;
pub mod run;
pub mod session;
pub mod snippets;
pub mod validation;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolResult, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};

use crate::pool::ExecPool;
use crate::sessions::Sessions;
use crate::telemetry::{self, ToolOutcome};
use run::{CallResult, RunPythonCodeArgs};
use session::{ClearSessionResult, ListSessionFilesResult, SessionArgs};
use snippets::{Catalog, SnippetDetail, SnippetSummary};
use validation::InputLimits;

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

/// What the tools offer besides the pool: sessions, the package policy, inlined images.
#[derive(Clone, Default)]
pub struct ToolOptions {
    /// The session manager, or `None` when `[sessions] enabled = false`.
    pub sessions: Option<Sessions>,
    /// `preinstall_packages`, named in run_python_code's description.
    pub preinstall_packages: Vec<String>,
    /// Imports load packages and micropip installs are allowed.
    pub runtime_installation: bool,
    /// Sandboxes may reach some hosts (`allowed_hosts` is not empty).
    pub network: bool,
    /// Returned images up to this many bytes are inlined as image content.
    pub max_inline_image_bytes: u64,
}

/// The MCP server: tools over the worker pool, the sessions and the snippet catalog.
#[derive(Clone)]
pub struct CodeInterpreter {
    pool: ExecPool,
    limits: InputLimits,
    catalog: Arc<Catalog>,
    sessions: Option<Sessions>,
    max_inline_image_bytes: u64,
    tool_router: ToolRouter<Self>,
    /// run_python_code calls whose handler has not returned yet (see `calls_in_flight`).
    in_flight: Arc<AtomicUsize>,
}

/// Counts one run_python_code handler as in flight until it returns (or is dropped).
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl CodeInterpreter {
    /// `catalog` is `None` when `[code_snippets] enabled = false`: the snippet tools are then absent;
    /// without sessions, the session tools and run_python_code's `session_id` are absent. The
    /// package policy goes into run_python_code's description: the preinstalled packages by name
    /// (never versions or URLs) and, only when runtime installation is enabled, micropip.install.
    pub fn new(
        pool: ExecPool,
        limits: InputLimits,
        catalog: Option<Catalog>,
        options: ToolOptions,
    ) -> Self {
        let mut tool_router = Self::tool_router();
        if catalog.is_some() {
            tool_router += Self::snippet_router();
        }
        if options.sessions.is_some() {
            tool_router += Self::session_router();
        }
        if let Some(route) = tool_router.map.get_mut("run_python_code") {
            let base = route.attr.description.clone().unwrap_or_default();
            let packages = run::package_description(
                &options.preinstall_packages,
                options.runtime_installation,
            );
            let sessions = if options.sessions.is_some() {
                " With session_id = \"new\" the code runs in a stateful session instead: the result's \
session_id continues it, with variables, imports and /workspace files kept (list_session_files, \
clear_session, and session:// resources)."
            } else {
                ""
            };
            route.attr.description = Some(format!("{base}{packages}{sessions}").into());
            // Open world only when the code can reach the network through package installation.
            route.attr.annotations = Some(
                ToolAnnotations::with_title("Run Python code")
                    .read_only(false)
                    .destructive(false)
                    .idempotent(false)
                    .open_world(options.network && options.runtime_installation),
            );
            if options.sessions.is_none() {
                let mut schema = (*route.attr.input_schema).clone();
                if let Some(serde_json::Value::Object(properties)) = schema.get_mut("properties") {
                    properties.remove("session_id");
                }
                route.attr.input_schema = Arc::new(schema);
                let mut output = route
                    .attr
                    .output_schema
                    .as_deref()
                    .cloned()
                    .unwrap_or_default();
                if let Some(serde_json::Value::Object(properties)) = output.get_mut("properties") {
                    properties.remove("session_id");
                }
                route.attr.output_schema = Some(Arc::new(output));
            }
        }
        Self {
            pool,
            limits,
            catalog: Arc::new(catalog.unwrap_or_default()),
            sessions: options.sessions,
            max_inline_image_bytes: options.max_inline_image_bytes,
            tool_router,
            in_flight: Default::default(),
        }
    }

    /// The number of run_python_code calls whose handler has not returned yet. A graceful shutdown
    /// waits for it to reach zero before it closes the MCP transport, so a call that finished while
    /// draining still gets its reply.
    pub fn calls_in_flight(&self) -> Arc<AtomicUsize> {
        self.in_flight.clone()
    }

    /// Validates and runs one call; the structured result. Logs one line per call with its outcome and
    /// timings, never the code, file contents or paths.
    pub async fn run(
        &self,
        args: RunPythonCodeArgs,
        context: Option<RequestContext<RoleServer>>,
    ) -> CallResult {
        let started = std::time::Instant::now();
        let ended = run::validate_and_execute(
            &self.pool,
            self.sessions.as_ref(),
            self.limits,
            args,
            context,
        )
        .await;
        let outcome = ended.outcome.metric();
        let result = CallResult {
            result: ended.outcome.into_result(),
            session_id: ended.session_id,
        };
        telemetry::tool_call("run_python_code", outcome, started.elapsed());
        tracing::info!(
            tool = "run_python_code",
            outcome = outcome.label(),
            queue_wait_ms = ended.queue_wait.as_millis() as u64,
            execution_ms = ended.execution.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            output_truncated = result.output_truncated,
            session = result.session_id.as_deref().map(crate::sessions::short),
            "tool call"
        );
        result
    }

    /// Records a session tool's call.
    fn session_tool_call(tool: &'static str, success: bool, started: std::time::Instant) {
        let outcome = if success {
            ToolOutcome::Success
        } else {
            ToolOutcome::ValidationError
        };
        telemetry::tool_call(tool, outcome, started.elapsed());
        tracing::info!(tool, outcome = outcome.label(), "tool call");
    }
}

#[tool_router]
impl CodeInterpreter {
    #[tool(
        name = "run_python_code",
        title = "Run Python code",
        description = "Run Python 3 code in a fresh, isolated Pyodide (WebAssembly) sandbox and return \
stdout, stderr, the str() of the final expression, and any new files written under /workspace \
(the working directory). Every call starts from a clean interpreter: nothing persists between calls. \
Top-level await is supported. Pass input files as Base64 in `files`; they appear under /workspace.",
        output_schema = rmcp::handler::server::tool::schema_for_type::<CallResult>()
    )]
    async fn run_python_code(
        &self,
        Parameters(args): Parameters<RunPythonCodeArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let _in_flight = InFlight::enter(&self.in_flight);
        let result = self.run(args, Some(context)).await;
        let value = serde_json::to_value(&result).unwrap_or_default();
        let mut reply = if result.success {
            CallToolResult::structured(value)
        } else {
            CallToolResult::structured_error(value)
        };
        reply.content.extend(content::file_blocks(
            &result.files,
            result.session_id.as_deref(),
            self.max_inline_image_bytes,
        ));
        reply
    }
}

#[tool_router(router = session_router)]
impl CodeInterpreter {
    #[tool(
        name = "list_session_files",
        title = "List session files",
        description = "List the regular files under a session's /workspace: path, size, MIME type \
and the session:// URI to read each one as an MCP resource.",
        annotations(
            title = "List session files",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        ),
        output_schema = rmcp::handler::server::tool::schema_for_type::<ListSessionFilesResult>()
    )]
    async fn list_session_files(
        &self,
        Parameters(args): Parameters<SessionArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let sessions = self
            .sessions
            .as_ref()
            .expect("the session tools exist with sessions");
        let caller = run::caller(Some(&context));
        let result = session::list_files(sessions, &caller, args.session_id).await;
        Self::session_tool_call("list_session_files", result.success, started);
        structured(&result, result.success)
    }

    #[tool(
        name = "clear_session",
        title = "Clear a session",
        description = "End a session at once: its interpreter, variables and files are discarded \
(a call running in it is stopped).",
        annotations(
            title = "Clear a session",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        ),
        output_schema = rmcp::handler::server::tool::schema_for_type::<ClearSessionResult>()
    )]
    async fn clear_session(
        &self,
        Parameters(args): Parameters<SessionArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let sessions = self
            .sessions
            .as_ref()
            .expect("the session tools exist with sessions");
        let caller = run::caller(Some(&context));
        let result = session::clear(sessions, &caller, &args.session_id);
        Self::session_tool_call("clear_session", result.success, started);
        structured(&result, result.success)
    }
}

/// A tool result with `value` as structured content and its JSON text, an error unless `ok`.
fn structured(value: &impl serde::Serialize, ok: bool) -> CallToolResult {
    let value = serde_json::to_value(value).unwrap_or_default();
    if ok {
        CallToolResult::structured(value)
    } else {
        CallToolResult::structured_error(value)
    }
}

#[tool_router(router = snippet_router)]
impl CodeInterpreter {
    #[tool(
        name = "list_code_snippets",
        title = "Search code snippets",
        annotations(
            title = "Search code snippets",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        ),
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
        title = "Get a code snippet",
        annotations(
            title = "Get a code snippet",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        ),
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
        let instructions = if self.sessions.is_some() {
            "Use run_python_code to execute Python. By default every call gets a fresh sandbox and \
nothing persists; send input files with each call. For state across calls, pass session_id = \"new\" \
and then the returned session_id: variables, imports and /workspace files persist in that session \
until it is cleared or expires."
        } else {
            "Use run_python_code to execute Python in a fresh sandbox per call. State does not \
persist between calls; send input files with each call."
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(
                "code-interpreter-mcp",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(instructions)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        match &self.sessions {
            Some(sessions) => {
                let caller = run::caller(Some(&context));
                let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
                session::list_resources(sessions, &caller, cursor).await
            }
            None => Ok(ListResourcesResult::with_all_items(Vec::new())),
        }
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(match &self.sessions {
            Some(_) => session::templates(),
            None => ListResourceTemplatesResult::with_all_items(Vec::new()),
        })
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        match &self.sessions {
            Some(sessions) => {
                let caller = run::caller(Some(&context));
                Ok(session::read(sessions, &caller, &request.uri).await?.into())
            }
            None => Err(ErrorData::resource_not_found(
                "Resource not found".to_string(),
                None,
            )),
        }
    }
}
