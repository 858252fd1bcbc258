//! The session tools and resources: `list_session_files`, `clear_session`, and a session's files as
//! MCP resources (`session://{session_id}/{path}`: read in any era; listed only to the client that
//! created the session, so nothing is listed to clients without an identity). Listings are bounded
//! (a session lists at most `MAX_LISTED_FILES` files and says when it stopped; `resources/list`
//! pages through them), and no error or log line carries a whole session id.

use rmcp::ErrorData;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};

use super::content::{parse_session_uri, session_uri};
use super::execute::caller;
use super::run::{CallErrorKind, SESSION_ID_HEADER, session_error};
use super::{CodeInterpreter, structured};
use crate::protocol::limits::MAX_RETURNED_FILE_BYTES;
use crate::sandbox::{ExecError, MAX_LISTED_FILES};
use crate::sessions::{Caller, Sessions, short};
use crate::telemetry::ToolOutcome;

/// Arguments of `list_session_files` and `clear_session`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct SessionArgs {
    /// A session id from an earlier run_python_code result (mirrored in the Mcp-Param-Session-Id
    /// header).
    #[schemars(extend("x-mcp-header" = SESSION_ID_HEADER))]
    pub session_id: String,
}

/// One file of a session.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct SessionFileEntry {
    /// Path relative to /workspace.
    pub path: String,
    pub size: u64,
    pub mime_type: String,
    /// The file as an MCP resource (resources/read).
    pub uri: String,
}

/// Result of `list_session_files`.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct ListSessionFilesResult {
    pub success: bool,
    /// The session listed (after a failure, shortened as logs show it).
    pub session_id: String,
    /// The regular files under the session's /workspace, sorted by path: at most 1000, and none
    /// whose path is longer than 4096 bytes.
    pub files: Vec<SessionFileEntry>,
    /// Files not listed: past the 1000 listed, or with over-long paths.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub files_left_out: u64,
    /// The listing stopped at its 1000 files: the session holds more than it shows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecError<CallErrorKind>>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Result of `clear_session`.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct ClearSessionResult {
    pub success: bool,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecError<CallErrorKind>>,
}

fn mime_of(path: &str) -> String {
    mime_guess::from_path(path)
        .first_raw()
        .unwrap_or("application/octet-stream")
        .to_string()
}

pub async fn list_files(
    sessions: &Sessions,
    caller: &Caller,
    session_id: String,
) -> ListSessionFilesResult {
    match sessions.list_files(&session_id, caller).await {
        Ok(listing) => ListSessionFilesResult {
            success: true,
            files: listing
                .files
                .into_iter()
                .map(|f| SessionFileEntry {
                    uri: session_uri(&session_id, &f.path),
                    mime_type: mime_of(&f.path),
                    path: f.path,
                    size: f.size,
                })
                .collect(),
            files_left_out: listing.left_out,
            truncated: listing.truncated,
            session_id,
            error: None,
        },
        Err(e) => ListSessionFilesResult {
            success: false,
            // (Not echoed whole: an id is a credential, and errors get logged.)
            session_id: format!("{}…", short(&session_id)),
            files: Vec::new(),
            files_left_out: 0,
            truncated: false,
            error: Some(session_error(&e)),
        },
    }
}

pub async fn clear(sessions: &Sessions, caller: &Caller, session_id: &str) -> ClearSessionResult {
    match sessions.clear(session_id, caller).await {
        Ok(()) => ClearSessionResult {
            success: true,
            message: "the session was cleared: its interpreter and files are gone".into(),
            error: None,
        },
        Err(e) => ClearSessionResult {
            success: false,
            message: e.to_string(),
            error: Some(session_error(&e)),
        },
    }
}

/// Result of `fork_session`.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct ForkSessionResult {
    pub success: bool,
    /// The new session, holding a copy of the other's state: pass it as run_python_code's
    /// session_id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The session copied (shortened as logs show it).
    pub forked_from: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecError<CallErrorKind>>,
}

pub async fn fork(sessions: &Sessions, caller: &Caller, session_id: &str) -> ForkSessionResult {
    let forked_from = format!("{}…", short(session_id));
    match sessions.fork(session_id, caller).await {
        Ok(id) => ForkSessionResult {
            success: true,
            session_id: Some(id),
            forked_from,
            message: "a new session holds a copy of the session's variables, imports and files; the two go on independently"
                .into(),
            error: None,
        },
        Err(e) => ForkSessionResult {
            success: false,
            session_id: None,
            forked_from,
            message: e.to_string(),
            error: Some(session_error(&e)),
        },
    }
}

/// The resource template of session files.
pub fn templates() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![
        ResourceTemplate::new("session://{session_id}/{path}", "session-file")
            .with_title("A file of a session")
            .with_description(
                "A file under a session's /workspace (text for text types, else Base64).",
            ),
    ])
}

/// Resources in one page of `resources/list`.
pub const RESOURCES_PAGE: usize = MAX_LISTED_FILES;

/// One page of the files of the sessions `caller`'s client created, as resources: the sessions in
/// id order, each session's files in path order, at most [`RESOURCES_PAGE`] per page; `cursor`
/// (from the previous page's `nextCursor`) says where the page starts. A session lists at most
/// `MAX_LISTED_FILES` files.
pub async fn list_resources(
    sessions: &Sessions,
    caller: &Caller,
    cursor: Option<&str>,
) -> Result<ListResourcesResult, ErrorData> {
    let (mut session, mut skip) = match cursor {
        None => (0, 0),
        Some(cursor) => parse_cursor(cursor).ok_or_else(|| {
            ErrorData::invalid_params("the cursor is not one this server gave out", None)
        })?,
    };
    let ids = sessions.owned_by(caller.client.as_deref());
    let mut resources = Vec::new();
    let mut next = None;
    while let Some(id) = ids.get(session) {
        if let Ok(listing) = sessions.list_files(id, caller).await {
            let files = listing.files.into_iter().skip(skip);
            for (n, file) in files.enumerate() {
                if resources.len() == RESOURCES_PAGE {
                    next = Some(format!("{session}:{}", skip + n));
                    break;
                }
                resources.push(
                    Resource::new(session_uri(id, &file.path), file.path.clone())
                        .with_mime_type(mime_of(&file.path))
                        .with_size(file.size),
                );
            }
        }
        if next.is_some() {
            break;
        }
        session += 1;
        skip = 0;
    }
    let mut result = ListResourcesResult::with_all_items(resources);
    result.next_cursor = next;
    Ok(result)
}

/// `"{session index}:{files to skip}"`, both small numbers.
fn parse_cursor(cursor: &str) -> Option<(usize, usize)> {
    let (session, skip) = cursor.split_once(':')?;
    let session: usize = session.parse().ok()?;
    let skip: usize = skip.parse().ok()?;
    (session <= 100_000 && skip <= MAX_LISTED_FILES).then_some((session, skip))
}

/// A URI as errors show it (rmcp logs error data at WARN, and logs reach more people than the
/// client): of a `session://` URI only the session id's short form as in logs (an id is its
/// session's credential) and the path's length, of any other only its scheme and length; with the
/// first bytes of its SHA-256, so that an operator can match the line with the URI a client
/// reports. Nothing else of the client's text: a path can name another session.
fn shown_uri(uri: &str) -> String {
    use sha2::Digest as _;
    let digest = hex::encode(&sha2::Sha256::digest(uri.as_bytes())[..4]);
    match uri.strip_prefix("session://") {
        Some(rest) => {
            let (id, path) = rest.split_once('/').unwrap_or((rest, ""));
            let id: String = short(id).chars().take(70).collect();
            format!(
                "session://{id}…/({} characters, #{digest})",
                path.chars().count()
            )
        }
        None => {
            let scheme: String = uri
                .split(':')
                .next()
                .unwrap_or_default()
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(16)
                .collect();
            format!("{scheme}:({} characters, #{digest})", uri.chars().count())
        }
    }
}

/// resources/read of a `session://` URI: the file as text (text types) or a Base64 blob, at most
/// the returned-file limit; the protocol's not-found error otherwise.
pub async fn read(
    sessions: &Sessions,
    caller: &Caller,
    uri: &str,
) -> Result<ReadResourceResult, ErrorData> {
    let shown = shown_uri(uri);
    let not_found = |message: &str| {
        ErrorData::resource_not_found(
            message.to_string(),
            Some(serde_json::json!({ "uri": shown })),
        )
    };
    let Some((id, path)) = parse_session_uri(uri) else {
        return Err(not_found("Resource not found"));
    };
    let data = match sessions
        .read_file(&id, caller, &path, MAX_RETURNED_FILE_BYTES)
        .await
    {
        Ok(Some(Ok(data))) => data,
        Ok(Some(Err(limit))) => {
            return Err(ErrorData::invalid_params(
                format!("the file is larger than the returned-file limit of {limit} bytes"),
                Some(serde_json::json!({ "uri": shown })),
            ));
        }
        Ok(None) => return Err(not_found("Resource not found: no such file in the session")),
        Err(e) => return Err(not_found(&format!("Resource not found: {e}"))),
    };
    let mime = mime_of(&path);
    let textual = mime.starts_with("text/")
        || matches!(
            mime.as_str(),
            "application/json" | "application/xml" | "image/svg+xml" | "application/javascript"
        );
    let contents = match (textual, String::from_utf8(data)) {
        (true, Ok(text)) => ResourceContents::text(text, uri),
        (_, Ok(text)) => blob(text.into_bytes(), uri),
        (_, Err(e)) => blob(e.into_bytes(), uri),
    }
    .with_mime_type(mime);
    Ok(ReadResourceResult::new(vec![contents]))
}

fn blob(data: Vec<u8>, uri: &str) -> ResourceContents {
    use base64::Engine as _;
    ResourceContents::blob(base64::engine::general_purpose::STANDARD.encode(data), uri)
}

/// A session tool's metric and log line: success, or a refused session (the caller's error).
fn record_session_tool(tool: &'static str, success: bool, started: std::time::Instant) {
    let outcome = if success {
        ToolOutcome::Success
    } else {
        ToolOutcome::ValidationError
    };
    super::record(tool, outcome, started, super::Details::default());
}

impl CodeInterpreter {
    /// The session manager (the session tools exist only with sessions) and who calls.
    fn session_caller(&self, context: &RequestContext<RoleServer>) -> (&Sessions, Caller) {
        let sessions = self
            .sessions
            .as_ref()
            .expect("the session tools exist with sessions");
        (sessions, caller(Some(context)))
    }
}

#[tool_router(router = session_router, vis = "pub(super)")]
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
        let (sessions, caller) = self.session_caller(&context);
        let result = list_files(sessions, &caller, args.session_id).await;
        record_session_tool("list_session_files", result.success, started);
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
        let (sessions, caller) = self.session_caller(&context);
        let result = clear(sessions, &caller, &args.session_id).await;
        record_session_tool("clear_session", result.success, started);
        structured(&result, result.success)
    }

    #[tool(
        name = "fork_session",
        title = "Fork a session",
        description = "Copy a session: a new session_id whose interpreter (variables, imports) and /workspace files start as a copy of the session's, to try something on the copy while the original stays as it is. A session holding what a session image cannot carry (its results say durable: false, and why) cannot be copied.",
        annotations(
            title = "Fork a session",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        ),
        output_schema = rmcp::handler::server::tool::schema_for_type::<ForkSessionResult>()
    )]
    async fn fork_session(
        &self,
        Parameters(args): Parameters<SessionArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let (sessions, caller) = self.session_caller(&context);
        let result = fork(sessions, &caller, &args.session_id).await;
        record_session_tool("fork_session", result.success, started);
        structured(&result, result.success)
    }
}
