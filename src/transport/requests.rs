//! What a `/mcp` request must be before rmcp sees it, checked by one middleware:
//! - its body within the HTTP body ceiling (413 with an explanation), read in full here: a truncated
//!   body or broken chunked framing is the client's error (400), never a server fault;
//! - bodies being read bounded together ([`BODY_BYTES_IN_FLIGHT`] ceilings' worth: a request waits
//!   for room, and gets 503 if none comes within a few seconds), so many slow uploads cannot grow
//!   the server's memory without bound;
//! - an `Mcp-Param-Session-Id` header (x-mcp-header) that contradicts the body's `session_id` is
//!   refused with HTTP 400 and JSON-RPC -32020 in both protocol eras, with a message that names
//!   neither value (a session id is a credential);
//! - a new legacy-era MCP session (`initialize`) is refused with 503 while [`MAX_MCP_SESSIONS`] are
//!   open;
//! - the response leaves out SSE priming events for a client whose protocol has none
//!   ([`super::priming`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use tokio::sync::Semaphore;

pub use super::mcp_sessions::MAX_MCP_SESSIONS;
use super::mcp_sessions::ReplicaSessionManager;
use crate::sessions::Principal;
use crate::tools::access::{Access, Asked};

/// How many HTTP body ceilings' worth of request bodies may be read at once.
pub const BODY_BYTES_IN_FLIGHT: u64 = 4;
/// How long a request waits for room to read its body before it is refused (503).
const BODY_WAIT: Duration = Duration::from_secs(10);
/// Bodies up to this size without an MCP session are looked at for `initialize`.
const MAX_INITIALIZE_BYTES: usize = 64 * 1024;

/// What the checks need.
#[derive(Clone)]
pub struct Checks {
    /// The HTTP body ceiling in bytes, and the setting it derives from.
    pub body_limit: u64,
    pub max_total_file_kb: u64,
    /// Room for bodies being read, in KiB.
    pub reading: Arc<Semaphore>,
    pub mcp_sessions: Arc<ReplicaSessionManager>,
    /// The session manager, to hand sessions over while the server drains.
    pub sessions: Option<crate::sessions::Sessions>,
    /// The protected-resource metadata URL, named in 403 challenges (OAuth only).
    pub metadata_url: Option<Arc<str>>,
}

impl Checks {
    pub fn new(
        body_limit: u64,
        max_total_file_kb: u64,
        mcp_sessions: Arc<ReplicaSessionManager>,
        sessions: Option<crate::sessions::Sessions>,
    ) -> Self {
        let room = kib(body_limit.saturating_mul(BODY_BYTES_IN_FLIGHT));
        Self {
            body_limit,
            max_total_file_kb,
            reading: Arc::new(Semaphore::new(
                usize::try_from(room)
                    .unwrap_or(Semaphore::MAX_PERMITS)
                    .min(Semaphore::MAX_PERMITS),
            )),
            mcp_sessions,
            sessions,
            metadata_url: None,
        }
    }
}

fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024).max(1)
}

fn plain(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

/// The middleware (see the module's doc).
pub async fn check_request(State(checks): State<Checks>, request: Request, next: Next) -> Response {
    // A legacy MCP session answers only to the principal that opened it; to any other its id is
    // unknown, with rmcp's own answer for one.
    let principal = request.extensions().get::<Principal>().copied();
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &session
        && !checks.mcp_sessions.owned_by(id, principal.as_ref())
    {
        tracing::warn!("refused a request for an MCP session another principal opened");
        return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    let is_delete = request.method() == Method::DELETE;
    let response = check_body(&checks, request, next).await;
    match (&session, principal) {
        (Some(id), _) if is_delete && response.status().is_success() => {
            checks.mcp_sessions.unbind(id);
        }
        (None, Some(principal)) => {
            if let Some(opened) = response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
            {
                checks.mcp_sessions.bind(opened, principal).await;
            }
        }
        _ => {}
    }
    response
}

async fn check_body(checks: &Checks, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        let era = super::priming::era(request.headers(), None);
        return super::priming::filter(era, next.run(request).await);
    }
    if let Some(response) = hand_over(checks, request.headers()).await {
        return response;
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared
        && len > checks.body_limit
    {
        return too_large(checks, len, request).await;
    }
    let (parts, body) = request.into_parts();
    let wanted = kib(declared.unwrap_or(checks.body_limit));
    let permit = match tokio::time::timeout(
        BODY_WAIT,
        checks
            .reading
            .clone()
            .acquire_many_owned(u32::try_from(wanted).unwrap_or(u32::MAX)),
    )
    .await
    {
        Ok(Ok(permit)) => permit,
        _ => {
            tracing::warn!(
                "refused a /mcp request: too many request bodies are being read at once"
            );
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [
                    (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                    (header::RETRY_AFTER, "5"),
                ],
                "the server is reading too many request bodies at once; retry shortly\n",
            )
                .into_response();
        }
    };
    let bytes = match http_body_util::Limited::new(body, checks.body_limit as usize)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                ceiling_message(checks, "a chunked body"),
            );
        }
        Err(e) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!(
                    "the request body could not be read (truncated, or broken chunked framing): {}\n",
                    crate::protocol::limits::shown(&e.to_string())
                ),
            );
        }
    };
    drop(permit);
    // The body is read as JSON-RPC once, and only when a check below needs it.
    let peek = (parts.extensions.get::<Access>().is_some()
        || parts.headers.contains_key("mcp-param-session-id")
        || may_initialize(&parts.headers, &bytes))
    .then(|| serde_json::from_slice::<Peek>(&bytes).ok())
    .flatten();
    if let Some(response) = refuse_by_scope(checks, &parts, &bytes, peek.as_ref()) {
        return response;
    }
    if let Some(response) = refuse_by_body(checks, &parts.headers, &bytes, peek.as_ref()).await {
        return response;
    }
    let initialize = may_initialize(&parts.headers, &bytes).then_some(&bytes[..]);
    let era = super::priming::era(&parts.headers, initialize);
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    super::priming::filter(era, response)
}

/// While the server drains, a call for a session (named by `Mcp-Param-Session-Id`) waits until the
/// session is saved to the store here (or ended), then gets 503 with `Retry-After`: a proxy sends it
/// to another replica (deploy/nginx does), which resumes the session from the store.
async fn hand_over(checks: &Checks, headers: &HeaderMap) -> Option<Response> {
    let sessions = checks.sessions.as_ref()?;
    if !sessions.draining() {
        return None;
    }
    let id = headers
        .get("mcp-param-session-id")
        .and_then(|v| v.to_str().ok())?;
    use crate::tools::execute::{names_a_session, starts_a_session};
    if !names_a_session(id) || starts_a_session(id) {
        return None;
    }
    sessions.handed_over(id).await;
    Some(
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::RETRY_AFTER, "1"),
            ],
            "this replica is shutting down: the session was saved to the session store; retry (another replica resumes it)\n",
        )
            .into_response(),
    )
}

fn ceiling_message(checks: &Checks, what: &str) -> String {
    format!(
        "HTTP request body of {what} exceeds the HTTP body limit of {} bytes, which is derived from \
input_limits.max_total_file_kb = {} (raise that setting to accept larger input files)\n",
        checks.body_limit, checks.max_total_file_kb
    )
}

/// 413 for a body declared larger than the ceiling. A moderately oversized body is read (and
/// discarded) first, so the client sees the 413 instead of a connection reset while it is still
/// sending; far larger bodies are cut off.
async fn too_large(checks: &Checks, len: u64, request: Request) -> Response {
    tracing::warn!(
        content_length = len,
        http_body_limit = checks.body_limit,
        "rejected an HTTP request body over the limit"
    );
    if len <= checks.body_limit.saturating_mul(2) {
        use futures::StreamExt as _;
        let mut body = request.into_body().into_data_stream();
        while let Some(Ok(_)) = body.next().await {}
    }
    plain(
        StatusCode::PAYLOAD_TOO_LARGE,
        ceiling_message(checks, &format!("{len} bytes")),
    )
}

/// What this middleware reads of a JSON-RPC request (everything else is skipped unread).
#[derive(serde::Deserialize)]
struct Peek {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<PeekParams>,
}

#[derive(serde::Deserialize)]
struct PeekParams {
    /// The tool of a `tools/call`.
    #[serde(default)]
    name: Option<String>,
    /// The resource of a `resources/read`.
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    arguments: Option<PeekArguments>,
}

/// 403 `insufficient_scope` when an OAuth principal's token lacks a scope the request needs
/// ([`crate::tools::access`]); a body that is not one readable JSON-RPC message needs every scope
/// (a batch, duplicate keys and bad JSON fail closed; rmcp refuses them anyway).
fn refuse_by_scope(
    checks: &Checks,
    parts: &Parts,
    body: &Bytes,
    peek: Option<&Peek>,
) -> Option<Response> {
    let access = parts.extensions.get::<Access>()?;
    // (serde reads a struct from an array too: only an object is one message.)
    let object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let peek = peek.filter(|_| object);
    let (needed, what) = match peek {
        Some(peek) => {
            let params = peek.params.as_ref();
            let asked = Asked {
                method: peek.method.as_deref().unwrap_or(""),
                tool: params.and_then(|p| p.name.as_deref()),
                session: params
                    .and_then(|p| p.arguments.as_ref())
                    .and_then(|a| a.session_id.as_ref())
                    .is_some_and(|v| !v.is_null()),
                uri: params.and_then(|p| p.uri.as_deref()),
            };
            let what = match asked.tool {
                Some(tool) if asked.method == "tools/call" => tool,
                _ => asked.method,
            };
            let plain = !what.is_empty()
                && what.len() <= 64
                && what
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-/.".contains(&b));
            let what = if plain { what } else { "this request" };
            (access.lacks(&asked)?, what.to_string())
        }
        None => (access.lacks_any()?, "this request".to_string()),
    };
    let metadata_url = checks.metadata_url.as_deref().unwrap_or_default();
    let challenge = super::oauth::insufficient_scope(metadata_url, &needed, &what);
    tracing::warn!(needed = %needed.join(" "), request = %what, "refused a request: the token lacks a scope");
    crate::telemetry::auth_refused(crate::telemetry::AuthRefusal::InsufficientScope);
    Some(
        (
            StatusCode::FORBIDDEN,
            [
                (
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_str(&challenge).unwrap_or_else(|_| {
                        HeaderValue::from_static("Bearer error=\"insufficient_scope\"")
                    }),
                ),
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                ),
            ],
            format!("forbidden: {what} needs the scopes {}\n", needed.join(" ")),
        )
            .into_response(),
    )
}

#[derive(serde::Deserialize)]
struct PeekArguments {
    #[serde(default)]
    session_id: Option<serde_json::Value>,
}

/// The value the `Mcp-Param-Session-Id` header carries (plain, or `=?base64?…?=`).
fn header_value(raw: &str) -> Option<String> {
    use base64::Engine as _;
    match raw
        .strip_prefix("=?base64?")
        .and_then(|inner| inner.strip_suffix("?="))
    {
        Some(inner) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(inner)
                .ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(raw.to_string()),
    }
}

/// Whether a body may be an `initialize` request: one without an MCP session (an initialize request
/// is small: large bodies are not read for it).
fn may_initialize(headers: &HeaderMap, body: &Bytes) -> bool {
    !headers.contains_key("mcp-session-id") && body.len() <= MAX_INITIALIZE_BYTES
}

/// A refusal decided by the body: a contradicting `Mcp-Param-Session-Id`, or a new MCP session
/// while the table is full. Bodies that are not one JSON-RPC request are left to rmcp.
async fn refuse_by_body(
    checks: &Checks,
    headers: &HeaderMap,
    body: &Bytes,
    peek: Option<&Peek>,
) -> Option<Response> {
    let header = headers.get("mcp-param-session-id");
    let initialize = may_initialize(headers, body);
    if header.is_none() && !initialize {
        return None;
    }
    let peek = peek?;
    if initialize
        && peek.method.as_deref() == Some("initialize")
        && checks.mcp_sessions.open().await >= MAX_MCP_SESSIONS
    {
        tracing::warn!(
            limit = MAX_MCP_SESSIONS,
            "refused a new MCP session: the session table is full"
        );
        return Some(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [
                    (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                    (header::RETRY_AFTER, "60"),
                ],
                format!(
                    "{MAX_MCP_SESSIONS} MCP sessions are open on this server; close one (DELETE) or \
retry later\n"
                ),
            )
                .into_response(),
        );
    }
    let header = header?;
    let body_value = peek
        .params
        .as_ref()
        .and_then(|p| p.arguments.as_ref())
        .and_then(|a| a.session_id.as_ref())
        .filter(|v| !v.is_null());
    let matches = match (header.to_str().ok().and_then(header_value), body_value) {
        (Some(header), Some(serde_json::Value::String(body))) => header == *body,
        _ => false,
    };
    if matches || peek.method.as_deref() != Some("tools/call") {
        return None;
    }
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": peek.id.clone(),
        "error": {
            "code": rmcp::model::ErrorCode::HEADER_MISMATCH.0,
            "message": "the Mcp-Param-Session-Id header does not match the body's session_id argument \
    (or the body has none): send the same session id in both",
        },
    });
    Some(
        (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            error.to_string(),
        )
            .into_response(),
    )
}
