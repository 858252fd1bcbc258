//! A request's checks against the limits, before anything is queued or executed: source size, file
//! count, path rules, strict Base64, the decoded per-file and aggregate size limits, and paths that
//! would be both a file and a directory. The path rules also apply to the files a sandbox returns
//! ([`normalize_path`]). Free of the engine, so that they are fuzzed on their own (`fuzz/`).

use std::collections::HashSet;

use base64::Engine as _;

use crate::InputLimits;
use crate::limits::{
    MAX_INPUT_FILES, MAX_PATH_BYTES, MAX_PATH_COMPONENT_BYTES, MAX_PATH_COMPONENTS,
    MAX_SOURCE_BYTES,
};

/// One decoded, checked input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedFile {
    /// Normalised, relative to /workspace.
    pub path: String,
    pub content: Vec<u8>,
}

/// Checks the request and decodes its files (`(path, content_base64)` pairs); the error message
/// names the rule that failed.
pub fn validate<'a>(
    code: &str,
    files: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    limits: InputLimits,
) -> Result<Vec<CheckedFile>, String> {
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
    for (raw_path, content_base64) in files {
        let path = normalize_path(raw_path)?;
        if !seen.insert(path.clone()) {
            return Err(format!(
                "duplicate file path {raw_path:?} (paths are compared after normalisation)"
            ));
        }
        let content = base64::engine::general_purpose::STANDARD
            .decode(content_base64.as_bytes())
            .map_err(|e| {
                format!("file {raw_path:?}: content_base64 is not strict standard Base64 ({e})")
            })?;
        let size = content.len() as u64;
        if size > per_file {
            return Err(format!(
                "file {raw_path:?} decodes to {size} bytes, over the per-file limit input_limits.max_file_kb = {} ({per_file} bytes)",
                limits.max_file_kb
            ));
        }
        total += size;
        if total > aggregate {
            return Err(format!(
                "input files decode to more than the aggregate limit input_limits.max_total_file_kb = {} ({aggregate} bytes)",
                limits.max_total_file_kb
            ));
        }
        decoded.push(CheckedFile { path, content });
    }
    // A path may not be both a file and a directory of another file.
    for file in &decoded {
        let mut dir = file.path.as_str();
        while let Some((parent, _)) = dir.rsplit_once('/') {
            if seen.contains(parent) {
                return Err(format!(
                    "file path {parent:?} is also a directory of {:?}; a path is either a file or a directory",
                    file.path
                ));
            }
            dir = parent;
        }
    }
    Ok(decoded)
}

/// The normalised path relative to /workspace, or why the path is not acceptable: not empty, no NUL
/// or other control characters, no backslash, not absolute, no `..`, at most [`MAX_PATH_BYTES`]
/// bytes, [`MAX_PATH_COMPONENTS`] components of at most [`MAX_PATH_COMPONENT_BYTES`] bytes, and
/// naming a file (`.` and empty components are dropped).
pub fn normalize_path(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("file path is empty".into());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "file path of {} bytes is longer than {MAX_PATH_BYTES} bytes",
            path.len()
        ));
    }
    if path.contains('\0') {
        return Err(format!("file path {path:?} contains a NUL character"));
    }
    if path.chars().any(char::is_control) {
        return Err(format!("file path {path:?} contains a control character"));
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
            other if other.len() > MAX_PATH_COMPONENT_BYTES => {
                return Err(format!(
                    "file path {path:?} has a component longer than {MAX_PATH_COMPONENT_BYTES} bytes"
                ));
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        return Err(format!("file path {path:?} names no file"));
    }
    if parts.len() > MAX_PATH_COMPONENTS {
        return Err(format!(
            "file path {path:?} has {} components; at most {MAX_PATH_COMPONENTS} are allowed",
            parts.len()
        ));
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(files: &[(&str, &str)], limits: InputLimits) -> Result<Vec<CheckedFile>, String> {
        validate("", files.iter().copied(), limits)
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
        let long_component = "x".repeat(MAX_PATH_COMPONENT_BYTES + 1);
        let deep = vec!["d"; MAX_PATH_COMPONENTS + 1].join("/");
        let long = "a/".repeat(MAX_PATH_BYTES / 2 + 1);
        for (p, needle) in [
            ("", "empty"),
            ("/etc/passwd", "absolute"),
            ("a/../b", "'..'"),
            ("a\\b", "backslash"),
            ("a\0b", "NUL"),
            ("a\nb", "control character"),
            ("a\u{7f}b", "control character"),
            ("./", "names no file"),
            (long_component.as_str(), "component longer than 255 bytes"),
            (deep.as_str(), "at most 32 are allowed"),
            (long.as_str(), "longer than 4096 bytes"),
        ] {
            let err = check(&[(p, "")], l).unwrap_err();
            assert!(err.contains(needle), "{p:?}: {err}");
        }
        let err = check(&[("a/b.txt", ""), ("./a//b.txt", "")], l).unwrap_err();
        assert!(err.contains("duplicate"), "{err}");
        let ok = check(&[("./data//x.txt", "aGk=")], l).unwrap();
        assert_eq!(ok[0].path, "data/x.txt");
        assert_eq!(ok[0].content, b"hi");
        let deepest = vec!["d"; MAX_PATH_COMPONENTS].join("/");
        assert!(check(&[(deepest.as_str(), "")], l).is_ok());
    }

    #[test]
    fn a_path_cannot_be_both_a_file_and_a_directory() {
        let l = InputLimits::default();
        for files in [[("a", ""), ("a/b", "")], [("x/y/z", ""), ("x/y", "")]] {
            let err = check(&files, l).unwrap_err();
            assert!(err.contains("is also a directory of"), "{err}");
        }
        assert!(check(&[("a/b", ""), ("a/c", ""), ("ab", "")], l).is_ok());
    }

    #[test]
    fn base64_must_be_strict() {
        let l = InputLimits::default();
        assert!(check(&[("a", "aGk")], l).unwrap_err().contains("Base64"));
        assert!(check(&[("a", "aG k=")], l).unwrap_err().contains("Base64"));
    }

    #[test]
    fn sizes_name_the_configuration_key_and_allowance() {
        let l = InputLimits {
            max_file_kb: 1,
            max_total_file_kb: 2,
        };
        let kib = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 1025]);
        let err = check(&[("a", &kib)], l).unwrap_err();
        assert!(
            err.contains("input_limits.max_file_kb = 1 (1024 bytes)"),
            "{err}"
        );
        let one = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 1024]);
        let err = check(&[("a", &one), ("b", &one), ("c", &one)], l).unwrap_err();
        assert!(
            err.contains("input_limits.max_total_file_kb = 2 (2048 bytes)"),
            "{err}"
        );
        let names: Vec<String> = (0..65).map(|i| format!("f{i}")).collect();
        let files: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "")).collect();
        assert!(
            check(&files, InputLimits::default())
                .unwrap_err()
                .contains("at most 64")
        );
        let big = "x".repeat(MAX_SOURCE_BYTES + 1);
        assert!(
            validate(&big, std::iter::empty(), InputLimits::default())
                .unwrap_err()
                .contains("1 MiB")
        );
    }
}
