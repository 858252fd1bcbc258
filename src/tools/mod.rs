//! The MCP tools and the server's MCP identity: `run_python_code` (validate, then execute on the
//! worker pool or in a session; see [`run`]), the session tools and session files as resources
//! ([`session`]), and the snippet tools over the configured catalog ([`snippets`]), with their input
//! and output schemas, titles and annotations. Request checks before anything is queued are in
//! [`validation`]; what results carry besides JSON (images, links) in [`content`].

pub mod access;
pub mod arguments;
pub mod content;
pub mod era;
pub mod execute;
pub mod quotas;
mod record;
pub mod run;
pub mod schema;
pub mod session;
pub mod snippets;
mod spans;
pub mod tasks;
pub mod text;
pub mod upstream;
pub mod validation;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Instant;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    GetTaskParams, GetTaskResult, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ResultType, ServerCapabilities, ServerConfig, ToolAnnotations,
    UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool_handler};

use crate::apps::{self, Views};
use crate::pool::ExecPool;
use crate::sessions::Sessions;
use crate::telemetry::{self, ToolOutcome};
pub(crate) use record::{Details, record};
use snippets::Catalog;
use validation::InputLimits;

/// What the tools offer besides the pool: sessions, the package policy, inlined images.
#[derive(Clone)]
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
    /// The text content of a result is sized to about this many characters (0: no cap).
    pub max_text_chars: usize,
    /// Results carry structured content where the client's protocol has it
    /// (`results.structured_content`).
    pub structured_content: bool,
    /// run_python_code as an MCP task, or `None` when `[tasks] enabled = false`.
    pub tasks: Option<tasks::Tasks>,
    /// The upstream MCP servers the code may call, named in run_python_code's description.
    pub upstreams: Option<Arc<crate::upstream::Upstreams>>,
    /// The MCP Apps views, when `results.apps` is on.
    pub apps: Option<Arc<Views>>,
    /// Per-principal quotas (`[quotas]`).
    pub quotas: Arc<quotas::Quotas>,
}

/// The MCP server: tools over the worker pool, the sessions and the snippet catalog.
#[derive(Clone)]
pub struct CodeInterpreter {
    pool: ExecPool,
    limits: InputLimits,
    catalog: Arc<Catalog>,
    sessions: Option<Sessions>,
    max_inline_image_bytes: u64,
    max_text_chars: usize,
    /// The newest era results are shaped for (older without `results.structured_content`).
    newest: era::Era,
    tasks: Option<tasks::Tasks>,
    /// The upstream MCP servers (list_upstream_tools), when configured.
    upstreams: Option<Arc<crate::upstream::Upstreams>>,
    /// The MCP Apps views, when on.
    apps: Option<Arc<Views>>,
    tool_router: ToolRouter<Self>,
    /// run_python_code calls whose handler has not returned yet (see `calls_in_flight`).
    in_flight: Arc<AtomicUsize>,
    quotas: Arc<quotas::Quotas>,
}

/// Counts one run_python_code handler as in flight until it returns (or is dropped).
pub(crate) struct InFlight(Arc<AtomicUsize>);

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
    /// The session manager, when sessions are on.
    pub fn sessions(&self) -> Option<&Sessions> {
        self.sessions.as_ref()
    }

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
        if options.upstreams.is_some() {
            tool_router += Self::upstream_router();
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
clear_session, fork_session, and session:// resources). An idle session is saved out of memory and \
resumed on its next call; the result's session.durable says whether it can be (and why not)."
            } else {
                ""
            };
            let upstream = options
                .upstreams
                .as_deref()
                .map(upstream_description)
                .unwrap_or_default();
            route.attr.description = Some(format!("{base}{packages}{sessions}{upstream}").into());
            // Open world only when the code can reach the network through package installation.
            route.attr.annotations = Some(
                ToolAnnotations::with_title("Run Python code")
                    .read_only(false)
                    .destructive(false)
                    .idempotent(false)
                    .open_world(
                        (options.network && options.runtime_installation)
                            || options.upstreams.is_some(),
                    ),
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
                    properties.remove("session");
                }
                route.attr.output_schema = Some(Arc::new(output));
            }
        }
        // Every schema in the subset all clients' dialects read.
        for route in tool_router.map.values_mut() {
            route.attr.input_schema = Arc::new(schema::input(&route.attr.input_schema));
            if let Some(output) = &route.attr.output_schema {
                route.attr.output_schema = Some(Arc::new(schema::output(output)));
            }
        }
        Self {
            pool,
            limits,
            catalog: Arc::new(catalog.unwrap_or_default()),
            sessions: options.sessions,
            max_inline_image_bytes: options.max_inline_image_bytes,
            max_text_chars: options.max_text_chars,
            newest: if options.structured_content {
                era::Era::Resumable
            } else {
                era::Era::Unstructured
            },
            tasks: options.tasks,
            upstreams: options.upstreams,
            apps: options.apps,
            tool_router,
            in_flight: Default::default(),
            quotas: options.quotas,
        }
    }

    /// The era results for `context` are shaped for: its protocol's, no newer than
    /// `results.structured_content` allows.
    pub(crate) fn era(&self, context: &RequestContext<RoleServer>) -> era::Era {
        era::Era::of(context).min(self.newest)
    }

    /// The tasks, when offered.
    pub fn tasks(&self) -> Option<&tasks::Tasks> {
        self.tasks.as_ref()
    }

    /// The number of run_python_code calls whose handler has not returned yet. A graceful shutdown
    /// waits for it to reach zero before it closes the MCP transport, so a call that finished while
    /// draining still gets its reply.
    pub fn calls_in_flight(&self) -> Arc<AtomicUsize> {
        self.in_flight.clone()
    }

    /// The per-principal quotas.
    pub(crate) fn quotas(&self) -> &Arc<quotas::Quotas> {
        &self.quotas
    }
}

impl CodeInterpreter {
    /// Rows of a DataFrame's grid data for `context`'s client: `results.max_table_rows_app` for a
    /// client that draws the views, else 0 (no grid data is made).
    fn grid_rows(&self, context: &RequestContext<RoleServer>) -> u32 {
        match self.apps.as_deref() {
            Some(views) if apps::wants(context) => views.grid_rows,
            _ => 0,
        }
    }

    /// The answer to a call whose arguments do not fit the tool's schema: a tool error naming the
    /// argument (run_python_code's in its usual structured form), counted as a validation error.
    fn wrong_arguments(&self, tool: &str, message: String, era: era::Era) -> CallToolResult {
        let message = format!("invalid arguments for {tool}: {message}");
        if tool == "run_python_code" {
            let started = Instant::now();
            let (result, kept) = self.finish(execute::invalid(message), started);
            return self.reply(&result, &kept, era);
        }
        let label = telemetry::TOOLS
            .iter()
            .find(|t| **t == tool)
            .copied()
            .unwrap_or("unknown");
        record(
            label,
            ToolOutcome::ValidationError,
            Instant::now(),
            Details::default(),
        );
        CallToolResult::error(vec![rmcp::model::ContentBlock::text(message)])
    }
}

fn no_tasks() -> ErrorData {
    ErrorData::method_not_found::<rmcp::model::GetTaskMethod>()
}

/// A tool result with `value` as structured content and its JSON text, an error unless `ok`.
pub(crate) fn structured(value: &impl serde::Serialize, ok: bool) -> CallToolResult {
    let value = serde_json::to_value(value).unwrap_or_default();
    if ok {
        CallToolResult::structured(value)
    } else {
        CallToolResult::structured_error(value)
    }
}

impl CodeInterpreter {
    /// One tool call: the scope check, the arguments, then a task or the tool's handler.
    async fn dispatch(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let era = self.era(&context);
        if let Some(access) = access::of(&context) {
            let arguments = request.arguments.as_ref();
            let asked = access::Asked {
                method: "tools/call",
                tool: Some(request.name.as_ref()),
                session: arguments
                    .and_then(|a| a.get("session_id"))
                    .is_some_and(|v| !v.is_null()),
                uri: None,
            };
            if let Some(needed) = access.lacks(&asked) {
                return Err(ErrorData::invalid_request(
                    format!(
                        "{} needs the scopes {}: get a token that grants them",
                        request.name,
                        needed.join(" ")
                    ),
                    None,
                ));
            }
        }
        if let Some(route) = self.tool_router.map.get(request.name.as_ref()) {
            let mut arguments = request.arguments.take().unwrap_or_default();
            if let Err(message) = arguments::check(&route.attr.input_schema, &mut arguments) {
                let refused = self.wrong_arguments(&request.name, message, era);
                return Ok(CallToolResponse::Complete(era.shape(refused)));
            }
            request.arguments = Some(arguments);
        }
        let wants_task = context
            .protocol_version()
            .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28)
            && context
                .client_capabilities()
                .is_some_and(|caps| caps.supports_tasks());
        if let Some(tasks) = &self.tasks
            && wants_task
            && request.name == "run_python_code"
        {
            let arguments =
                serde_json::Value::Object(request.arguments.clone().unwrap_or_default());
            let mut args: run::RunPythonCodeArgs =
                serde_json::from_value(arguments).map_err(|e| {
                    ErrorData::invalid_params(
                        format!("invalid arguments for run_python_code: {e}"),
                        None,
                    )
                })?;
            args.grid_rows = self.grid_rows(&context);
            return Ok(tasks.spawn(self, args, &context).await);
        }
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        Ok(match self.tool_router.call(call).await? {
            CallToolResponse::Complete(result) => CallToolResponse::Complete(era.shape(result)),
            other => other,
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CodeInterpreter {
    fn get_info(&self) -> ServerConfig {
        // Prompts and resources are declared with empty lists so that clients (and the conformance
        // suite's caching checks) that list them get an answer rather than "method not found".
        let builder = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .enable_resources();
        let mut capabilities = if self.tasks.is_some() {
            builder.enable_tasks().build()
        } else {
            builder.build()
        };
        if self.apps.is_some() {
            capabilities
                .extensions
                .get_or_insert_default()
                .insert(apps::EXTENSION.into(), Default::default());
        }
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

    /// Arguments are checked against the tool's schema first ([`arguments`]). run_python_code may
    /// become a task for a 2026-07-28 client that declared the tasks extension; every other call
    /// goes to its tool as usual, and its result is shaped for the client's era ([`era`]).
    ///
    /// (A client of the session era that declares the extension in `initialize` gets synchronous
    /// calls: the one such client tried, the Inspector CLI 2.12.0 in its legacy era, declares it as
    /// "harmless on legacy" and then fails every call that comes back as a task.)
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let known = self.tool_router.map.contains_key(request.name.as_ref());
        let span = spans::of_call(&request, &context, known);
        let who = execute::caller(Some(&context));
        let call = record::as_caller(who, self.dispatch(request, context));
        let response = span.clone().scope(call).await;
        spans::settle(&span, &response);
        response
    }

    /// Every tool, as the client's protocol era knows tools (see [`era`]); cache hints from
    /// 2026-07-28 on, as rmcp's generated list does. For a client that declared the MCP Apps
    /// extension, run_python_code and list_session_files name their views (and the list is then
    /// private to that client).
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let cache_hints = context
            .protocol_version()
            .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28);
        let mut tools = self.era(&context).tools(self.tool_router.list_all());
        // An OAuth principal sees only the tools its scopes allow (a call naming no session).
        let access = access::of(&context);
        if let Some(access) = &access {
            tools.retain(|tool| {
                let asked = access::Asked {
                    method: "tools/call",
                    tool: Some(tool.name.as_ref()),
                    ..access::Asked::default()
                };
                access.lacks(&asked).is_none()
            });
        }
        let views = self.apps.as_deref().filter(|_| apps::wants(&context));
        if let Some(views) = views {
            for tool in &mut tools {
                match tool.name.as_ref() {
                    "run_python_code" => tool.meta = Some(Views::tool_meta(&views.result)),
                    "list_session_files" => tool.meta = Some(Views::tool_meta(&views.files)),
                    _ => {}
                }
            }
        }
        let mut list = ListToolsResult::with_all_items(tools);
        list.result_type = Some(ResultType::COMPLETE);
        list.ttl_ms = cache_hints.then_some(0);
        let scope = if views.is_some() || access.is_some() {
            CacheScope::Private
        } else {
            CacheScope::Public
        };
        list.cache_scope = cache_hints.then_some(scope);
        Ok(list)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let tasks = self.tasks.as_ref().ok_or_else(no_tasks)?;
        tasks.get(&request.task_id, execute::caller(Some(&context)).principal)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let tasks = self.tasks.as_ref().ok_or_else(no_tasks)?;
        tasks.cancel(&request.task_id, execute::caller(Some(&context)).principal)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let tasks = self.tasks.as_ref().ok_or_else(no_tasks)?;
        tasks.update(
            &request.task_id,
            execute::caller(Some(&context)).principal,
            request.input_responses,
        )
    }

    /// The session files, after the MCP Apps views on the first page for a client that declared
    /// the extension.
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let mut list = match &self.sessions {
            Some(sessions) => {
                let caller = execute::caller(Some(&context));
                session::list_resources(sessions, &caller, cursor).await?
            }
            None => ListResourcesResult::with_all_items(Vec::new()),
        };
        if let Some(views) = &self.apps
            && cursor.is_none()
            && apps::wants(&context)
        {
            list.resources.splice(0..0, views.resources());
        }
        Ok(list)
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

    /// A view (any client may read one), or a session file.
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if let Some(read) = self.apps.as_deref().and_then(|v| v.read(&request.uri)) {
            return Ok(read.into());
        }
        match &self.sessions {
            Some(sessions) => {
                let caller = execute::caller(Some(&context));
                Ok(session::read(sessions, &caller, &request.uri).await?.into())
            }
            None => Err(ErrorData::resource_not_found(
                "Resource not found".to_string(),
                None,
            )),
        }
    }
}

/// What run_python_code's description says of the upstream servers: how to import each and its
/// tools' names (about 1,500 characters at most; the tools' own descriptions come with `help()`).
fn upstream_description(upstreams: &crate::upstream::Upstreams) -> String {
    const MAX: usize = 1500;
    let mut text = String::from(
        " The code can call the tools of these MCP servers as async Python functions (keyword \
arguments; `await`, or `.sync(...)`; `help()` or list_upstream_tools shows a tool's parameters; \
results are Python objects; `upstream.ToolError` when a tool fails):",
    );
    for name in upstreams.names() {
        let tools = upstreams.tool_names(name);
        let mut line = format!(" `from upstream import {name}`");
        if tools.is_empty() {
            line.push_str(" (not connected yet);");
        } else {
            line.push_str(&format!(" ({}: {});", tools.len(), tools.join(", ")));
        }
        if text.len() + line.len() > MAX {
            let head: String = line.chars().take(MAX.saturating_sub(text.len())).collect();
            text.push_str(&head);
            text.push_str("...");
            break;
        }
        text.push_str(&line);
    }
    if text.ends_with(';') {
        text.pop();
        text.push('.');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metric_labels_are_the_routers_tools() {
        let router = CodeInterpreter::tool_router()
            + CodeInterpreter::session_router()
            + CodeInterpreter::snippet_router()
            + CodeInterpreter::upstream_router();
        let mut routed: Vec<String> = router
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        routed.sort();
        let mut labels: Vec<String> = telemetry::TOOLS.iter().map(|t| t.to_string()).collect();
        labels.sort();
        assert_eq!(routed, labels);
    }
}
