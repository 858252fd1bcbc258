//! Request validation before anything is queued or executed: source size, file count, path rules,
//! strict Base64, and the decoded per-file and aggregate size limits.

use std::collections::HashSet;

use base64::Engine as _;

pub use crate::config::InputLimitsConfig as InputLimits;
use crate::config::limits::{MAX_INPUT_FILES, MAX_SOURCE_BYTES};
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
    if code.len() > MAX_SOURCE_BYTES {
        return Err(format!(
            "code is {} bytes; the Python source limit is {MAX_SOURCE_BYTES} bytes (1 MiB)",
            code.len()
        ));
    }
    if files.len() > MAX_INPUT_FILES {
        return Err(format!(
            "{} files were sent; at most {MAX_INPUT_FILES} files are allowed",
            files.len()
        ));
    }
    let per_file = limits.max_file_kb * 1024;
    let aggregate = limits.max_total_file_kb * 1024;
    let mut seen = HashSet::new();
    let mut total: u64 = 0;
    let mut decoded = Vec::with_capacity(files.len());
    for file in files {
        let path = normalize_path(&file.path)?;
        if !seen.insert(path.clone()) {
            return Err(format!(
                "duplicate file path {:?} (paths are compared after normalisation)",
                file.path
            ));
        }
        let content = base64::engine::general_purpose::STANDARD
            .decode(file.content_base64.as_bytes())
            .map_err(|e| {
                format!(
                    "file {:?}: content_base64 is not strict standard Base64 ({e})",
                    file.path
                )
            })?;
        let size = content.len() as u64;
        if size > per_file {
            return Err(format!(
                "file {:?} decodes to {size} bytes, over the per-file limit input_limits.max_file_kb = {} ({per_file} bytes)",
                file.path, limits.max_file_kb
            ));
        }
        total += size;
        if total > aggregate {
            return Err(format!(
                "input files decode to more than the aggregate limit input_limits.max_total_file_kb = {} ({aggregate} bytes)",
                limits.max_total_file_kb
            ));
        }
        decoded.push(InputFile { path, content });
    }
    Ok(decoded)
}

/// The normalised relative path, or why the path is not acceptable.
fn normalize_path(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("file path is empty".into());
    }
    if path.contains('\0') {
        return Err(format!("file path {path:?} contains a NUL character"));
    }
    if path.contains('\\') {
        return Err(format!("file path {path:?} contains a backslash; use '/'"));
    }
    if path.starts_with('/') {
        return Err(format!(
            "file path {path:?} is absolute; paths are relative to /workspace"
        ));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(format!("file path {path:?} contains a '..' component")),
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        return Err(format!("file path {path:?} names no file"));
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, content: &str) -> FileInput {
        FileInput {
            path: path.into(),
            content_base64: content.into(),
        }
    }

    #[test]
    fn default_http_ceiling_matches_the_specification() {
        assert_eq!(InputLimits::default().http_body_limit(), 78_293_928);
        let raised = InputLimits {
            max_file_kb: 51200,
            max_total_file_kb: 102400,
        };
        assert_eq!(raised.http_body_limit(), 148_198_996);
    }

    #[test]
    fn path_rules() {
        let l = InputLimits::default();
        for (p, needle) in [
            ("", "empty"),
            ("/etc/passwd", "absolute"),
            ("a/../b", "'..'"),
            ("a\\b", "backslash"),
            ("a\0b", "NUL"),
            ("./", "names no file"),
        ] {
            let err = validate("", &[file(p, "")], l).unwrap_err();
            assert!(err.contains(needle), "{p:?}: {err}");
        }
        let err = validate("", &[file("a/b.txt", ""), file("./a//b.txt", "")], l).unwrap_err();
        assert!(err.contains("duplicate"), "{err}");
        let ok = validate("", &[file("./data//x.txt", "aGk=")], l).unwrap();
        assert_eq!(ok[0].path, "data/x.txt");
        assert_eq!(ok[0].content, b"hi");
    }

    #[test]
    fn base64_must_be_strict() {
        let l = InputLimits::default();
        assert!(
            validate("", &[file("a", "aGk")], l)
                .unwrap_err()
                .contains("Base64")
        );
        assert!(
            validate("", &[file("a", "aG k=")], l)
                .unwrap_err()
                .contains("Base64")
        );
    }

    #[test]
    fn sizes_name_the_configuration_key_and_allowance() {
        let l = InputLimits {
            max_file_kb: 1,
            max_total_file_kb: 2,
        };
        let kib = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 1025]);
        let err = validate("", &[file("a", &kib)], l).unwrap_err();
        assert!(
            err.contains("input_limits.max_file_kb = 1 (1024 bytes)"),
            "{err}"
        );
        let one = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 1024]);
        let err =
            validate("", &[file("a", &one), file("b", &one), file("c", &one)], l).unwrap_err();
        assert!(
            err.contains("input_limits.max_total_file_kb = 2 (2048 bytes)"),
            "{err}"
        );
        let files: Vec<_> = (0..65).map(|i| file(&format!("f{i}"), "")).collect();
        assert!(
            validate("", &files, InputLimits::default())
                .unwrap_err()
                .contains("at most 64")
        );
        let big = "x".repeat(MAX_SOURCE_BYTES + 1);
        assert!(
            validate(&big, &[], InputLimits::default())
                .unwrap_err()
                .contains("1 MiB")
        );
    }
}
