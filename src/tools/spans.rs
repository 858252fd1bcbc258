//! The trace span of each tool call (see `telemetry::traces`): made from the request when it comes
//! in, continuing the caller's trace context (`traceparent`/`tracestate` in the request's `_meta`,
//! else its HTTP headers), with the method, tool, request id and protocol version; ended by the
//! call's metric and log line (`record`) with its outcome, or here with how it returned.

use opentelemetry::KeyValue;
use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use crate::telemetry::traces::{CallSpan, TraceParent};

/// The span of `request` (`tools/call {tool}`; a tool this server does not have is `other`).
pub(super) fn of_call(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
    known: bool,
) -> CallSpan {
    let tool = if known {
        request.name.to_string()
    } else {
        "other".to_string()
    };
    let mut attributes = vec![
        KeyValue::new("mcp.method.name", "tools/call"),
        KeyValue::new("gen_ai.tool.name", tool.clone()),
        KeyValue::new("jsonrpc.request.id", context.id.to_string()),
    ];
    if let Some(version) = context.protocol_version() {
        attributes.push(KeyValue::new("mcp.protocol.version", version.to_string()));
    }
    let parent = received(context);
    CallSpan::start(format!("tools/call {tool}"), parent.as_ref(), attributes)
}

/// The caller's trace context: `_meta` first (SEP-414), else the HTTP headers.
fn received(context: &RequestContext<RoleServer>) -> Option<TraceParent> {
    let meta = &context.meta.0;
    let field = |name: &str| meta.get(name).and_then(|v| v.as_str());
    if let Some(traceparent) = field("traceparent") {
        return TraceParent::received(Some(traceparent), field("tracestate"));
    }
    let headers = &context
        .extensions
        .get::<axum::http::request::Parts>()?
        .headers;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    TraceParent::received(header("traceparent"), header("tracestate"))
}

/// Ends `span` as `response` returned, unless the call's record already ended it.
pub(super) fn settle(span: &CallSpan, response: &Result<CallToolResponse, ErrorData>) {
    match response {
        Ok(CallToolResponse::Task(_)) => span.end("task_created", None),
        Ok(_) => span.end("success", None),
        Err(_) => span.end("protocol_error", Some("protocol_error")),
    }
}
