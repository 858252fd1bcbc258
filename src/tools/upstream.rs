//! The `list_upstream_tools` tool (routed only when `[upstream.NAME]` servers are configured): every
//! granted tool of every upstream server with its full description and input schema, for the model
//! writing code that calls them (run_python_code's description names them only).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock as Content};
use rmcp::{tool, tool_router};
use serde::Deserialize;

use super::CodeInterpreter;
use crate::telemetry::ToolOutcome;

/// list_upstream_tools's arguments.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct ListUpstreamToolsArgs {
    /// Only this server's tools (the name in `from upstream import NAME`); leave it out for all.
    #[serde(default)]
    pub server: Option<String>,
}

#[tool_router(router = upstream_router, vis = "pub(super)")]
impl CodeInterpreter {
    #[tool(
        name = "list_upstream_tools",
        title = "List upstream tools",
        description = "List the tools of the MCP servers that code run by run_python_code can call: \
for each server (imported as `from upstream import NAME`), whether it is connected, and each tool's \
name, description and JSON input schema. In the code, call a tool as an async function with keyword \
arguments, e.g. `await NAME.tool_name(arg=...)` (or `NAME[\"tool-name\"](...)`, or `.sync(...)` \
without await); results are Python objects.",
        annotations(
            title = "List upstream tools",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_upstream_tools(
        &self,
        Parameters(args): Parameters<ListUpstreamToolsArgs>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let Some(upstreams) = &self.upstreams else {
            return CallToolResult::error(vec![Content::text(
                "no upstream MCP servers are configured on this server",
            )]);
        };
        let catalog = upstreams.catalog(args.server.as_deref());
        let found = catalog["servers"].as_array().map_or(0, Vec::len);
        let outcome = if found == 0 && args.server.is_some() {
            ToolOutcome::ValidationError
        } else {
            ToolOutcome::Success
        };
        super::record(
            "list_upstream_tools",
            outcome,
            started,
            super::Details {
                results: Some(found),
                ..Default::default()
            },
        );
        if outcome == ToolOutcome::ValidationError {
            let names: Vec<&str> = upstreams.names().collect();
            return CallToolResult::error(vec![Content::text(format!(
                "no upstream server named {}; the servers are: {}",
                crate::protocol::limits::shown(args.server.as_deref().unwrap_or("")),
                names.join(", ")
            ))]);
        }
        let text = serde_json::to_string_pretty(&catalog).unwrap_or_default();
        CallToolResult::success(vec![Content::text(text)])
    }
}
