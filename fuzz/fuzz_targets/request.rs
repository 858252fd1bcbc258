//! Request validation on arbitrary input: it never panics, and whatever it accepts obeys the rules —
//! canonical paths within the length and depth limits, no `..`, no path both a file and a directory,
//! decoded sizes within the limits.
//!
//! The input is split on NUL bytes: the first part is the code, then (path, content) pairs, with the
//! limits taken from the first two bytes.

#![no_main]

use code_interpreter_mcp_protocol::InputLimits;
use code_interpreter_mcp_protocol::limits::{
    MAX_PATH_BYTES, MAX_PATH_COMPONENT_BYTES, MAX_PATH_COMPONENTS,
};
use code_interpreter_mcp_protocol::request::{normalize_path, validate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (max_file_kb, max_total_file_kb) = match data {
        [a, b, ..] => (u64::from(*a % 4) + 1, u64::from(*b % 8) + 1),
        _ => (1, 1),
    };
    let limits = InputLimits {
        max_file_kb: max_file_kb.min(max_total_file_kb),
        max_total_file_kb,
    };
    let text = String::from_utf8_lossy(data.get(2..).unwrap_or_default());
    let mut parts = text.split('\0');
    let code = parts.next().unwrap_or("");
    let rest: Vec<&str> = parts.collect();
    let files: Vec<(&str, &str)> = rest.chunks(2).map(|c| (c[0], c.get(1).copied().unwrap_or(""))).collect();

    for (path, _) in &files {
        if let Ok(normal) = normalize_path(path) {
            assert_eq!(normalize_path(&normal).as_deref(), Ok(normal.as_str()), "normalising is idempotent");
            assert!(!normal.split('/').any(|c| c == ".." || c == "." || c.is_empty()));
            assert!(normal.len() <= MAX_PATH_BYTES);
            assert!(normal.split('/').count() <= MAX_PATH_COMPONENTS);
            assert!(normal.split('/').all(|c| c.len() <= MAX_PATH_COMPONENT_BYTES));
            assert!(!normal.starts_with('/') && !normal.contains('\\'));
            assert!(!normal.chars().any(char::is_control));
        }
    }

    if let Ok(accepted) = validate(code, files.iter().copied(), limits) {
        let mut total = 0u64;
        for file in &accepted {
            assert_eq!(normalize_path(&file.path).as_deref(), Ok(file.path.as_str()));
            assert!(file.content.len() as u64 <= limits.max_file_kb * 1024);
            total += file.content.len() as u64;
            for other in &accepted {
                assert!(!other.path.starts_with(&format!("{}/", file.path)), "a file is also a directory");
            }
        }
        assert!(total <= limits.max_total_file_kb * 1024);
    }
});
