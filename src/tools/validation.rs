//! Request validation before anything is queued or executed: the tool's file type and its mapping to
//! the configuration crate's checks (source size, file count, path rules, strict Base64, the decoded
//! per-file and aggregate size limits; see `protocol::request`).

pub use crate::protocol::InputLimits;
use crate::sandbox::InputFile;

/// One file as sent by the client.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct FileInput {
    /// Path relative to /workspace, e.g. `data/input.csv`.
    pub path: String,
    /// File content, standard Base64 with padding.
    pub content_base64: String,
}

/// Checks the request and decodes its files; the error message names the rule that failed.
pub fn validate(
    code: &str,
    files: &[FileInput],
    limits: InputLimits,
) -> Result<Vec<InputFile>, String> {
    let files = files
        .iter()
        .map(|f| (f.path.as_str(), f.content_base64.as_str()));
    Ok(crate::protocol::request::validate(code, files, limits)?
        .into_iter()
        .map(|f| InputFile {
            path: f.path,
            content: f.content,
        })
        .collect())
}
