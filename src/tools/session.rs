//! The session tools and resources: `list_session_files`, `clear_session`, and a session's files as
//! MCP resources (`session://{session_id}/{path}`: read in any era; listed only to the client that
//! created the session, so nothing is listed to clients without an identity).

use rmcp::ErrorData;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};

use super::content::{parse_session_uri, session_uri};
use super::run::{CallErrorKind, SESSION_ID_HEADER, session_error};
use crate::config::limits::MAX_RETURNED_FILE_BYTES;
use crate::sandbox::ExecError;
use crate::sessions::Sessions;

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
    pub session_id: String,
    /// Every regular file under the session's /workspace.
    pub files: Vec<SessionFileEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecError<CallErrorKind>>,
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

pub async fn list_files(sessions: &Sessions, session_id: String) -> ListSessionFilesResult {
    match sessions.list_files(&session_id).await {
        Ok(files) => ListSessionFilesResult {
            success: true,
            files: files
                .into_iter()
                .map(|f| SessionFileEntry {
                    uri: session_uri(&session_id, &f.path),
                    mime_type: mime_of(&f.path),
                    path: f.path,
                    size: f.size,
                })
                .collect(),
            session_id,
            error: None,
        },
        Err(e) => ListSessionFilesResult {
            success: false,
            session_id,
            files: Vec::new(),
            error: Some(session_error(&e)),
        },
    }
}

pub fn clear(sessions: &Sessions, session_id: &str) -> ClearSessionResult {
    match sessions.clear(session_id) {
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

/// The files of the sessions `owner` created, as resources.
pub async fn list_resources(sessions: &Sessions, owner: Option<&str>) -> ListResourcesResult {
    let mut resources = Vec::new();
    for id in sessions.owned_by(owner) {
        if let Ok(files) = sessions.list_files(&id).await {
            for file in files {
                resources.push(
                    Resource::new(session_uri(&id, &file.path), file.path.clone())
                        .with_mime_type(mime_of(&file.path))
                        .with_size(file.size),
                );
            }
        }
    }
    ListResourcesResult::with_all_items(resources)
}

/// resources/read of a `session://` URI: the file as text (text types) or a Base64 blob, at most
/// the returned-file limit; the protocol's not-found error otherwise.
pub async fn read(sessions: &Sessions, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let not_found = |message: &str| {
        ErrorData::resource_not_found(message.to_string(), Some(serde_json::json!({ "uri": uri })))
    };
    let Some((id, path)) = parse_session_uri(uri) else {
        return Err(not_found("Resource not found"));
    };
    let data = match sessions
        .read_file(&id, &path, MAX_RETURNED_FILE_BYTES)
        .await
    {
        Ok(Some(Ok(data))) => data,
        Ok(Some(Err(limit))) => {
            return Err(ErrorData::invalid_params(
                format!("the file is larger than the returned-file limit of {limit} bytes"),
                Some(serde_json::json!({ "uri": uri })),
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
