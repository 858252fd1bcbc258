//! The MCP tools and the server's MCP identity: `run_python_code` (validate, then execute on the
//! worker pool; see [`run`]) and the snippet tools over the configured catalog ([`snippets`]), with
//! their input and output schemas. Request checks before anything is queued are in [`validation`].

pub mod run;
pub mod snippets;
pub mod validation;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};

use crate::pool::ExecPool;
use crate::telemetry::{self, ToolOutcome};
use run::{CallResult, RunPythonCodeArgs};
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

/// The MCP server: tools over the worker pool and the snippet catalog.
#[derive(Clone)]
pub struct CodeInterpreter {
    pool: ExecPool,
    limits: InputLimits,
    catalog: Arc<Catalog>,
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
    /// `catalog` is `None` when `[code_snippets] enabled = false`: the snippet tools are then absent.
    /// `preinstall_packages` and `runtime_installation` state the package policy in
    /// run_python_code's description: the preinstalled packages by name (never versions or URLs)
    /// and, only when runtime installation is enabled, micropip.install.
    pub fn new(
        pool: ExecPool,
        limits: InputLimits,
        catalog: Option<Catalog>,
        preinstall_packages: &[String],
        runtime_installation: bool,
    ) -> Self {
        let mut tool_router = Self::tool_router();
        if catalog.is_some() {
            tool_router += Self::snippet_router();
        }
        if let Some(route) = tool_router.map.get_mut("run_python_code") {
            let base = route.attr.description.clone().unwrap_or_default();
            let packages = run::package_description(preinstall_packages, runtime_installation);
            route.attr.description = Some(format!("{base}{packages}").into());
        }
        Self {
            pool,
            limits,
            catalog: Arc::new(catalog.unwrap_or_default()),
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
        let ended = run::validate_and_execute(&self.pool, self.limits, args, context).await;
        let outcome = ended.outcome.metric();
        let result = ended.outcome.into_result();
        telemetry::tool_call("run_python_code", outcome, started.elapsed());
        tracing::info!(
            tool = "run_python_code",
            outcome = outcome.label(),
            queue_wait_ms = ended.queue_wait.as_millis() as u64,
            execution_ms = ended.execution.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            output_truncated = result.output_truncated,
            "tool call"
        );
        result
    }
}

#[tool_router]
impl CodeInterpreter {
    #[tool(
        name = "run_python_code",
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
