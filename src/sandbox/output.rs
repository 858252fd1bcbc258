//! What an execution hands back, bounded: captured stdout/stderr and the new files under /workspace,
//! each with the per-request limits of the specification.

use base64::Engine as _;

use super::types::OutputFile;
use crate::config::limits::{
    MAX_RETURNED_FILE_BYTES, MAX_RETURNED_FILES, MAX_RETURNED_TOTAL_BYTES,
};

/// A byte stream captured up to a limit.
#[derive(Debug, Default)]
pub struct CappedBuffer {
    data: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl CappedBuffer {
    pub fn new(limit: usize) -> Self {
        Self {
            data: Vec::new(),
            limit,
            truncated: false,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let room = self.limit - self.data.len();
        if bytes.len() > room {
            self.data.extend_from_slice(&bytes[..room]);
            self.truncated = true;
        } else {
            self.data.extend_from_slice(bytes);
        }
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The captured text. A multi-byte character cut by the limit is dropped, not replaced.
    pub fn text(&self) -> String {
        let bytes = match std::str::from_utf8(&self.data) {
            Err(e) if e.error_len().is_none() => &self.data[..e.valid_up_to()],
            _ => &self.data[..],
        };
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// Decides which new files fit the limits and keeps them.
#[derive(Debug, Default)]
pub struct FileCollector {
    files: Vec<OutputFile>,
    accepted: usize,
    total: u64,
    truncated: bool,
}

impl FileCollector {
    /// Called for each new file in path order: whether it fits the remaining allowance. A file that
    /// does not fit is omitted whole and marks the output truncated; later, smaller files may still fit.
    pub fn offer(&mut self, size: u64) -> bool {
        if self.accepted >= MAX_RETURNED_FILES
            || size > MAX_RETURNED_FILE_BYTES
            || self.total + size > MAX_RETURNED_TOTAL_BYTES
        {
            self.truncated = true;
            return false;
        }
        self.accepted += 1;
        self.total += size;
        true
    }

    pub fn collect(&mut self, path: String, data: &[u8]) {
        let mime_type = mime_guess::from_path(&path)
            .first_raw()
            .unwrap_or("application/octet-stream")
            .to_string();
        self.files.push(OutputFile {
            content_base64: base64::engine::general_purpose::STANDARD.encode(data),
            path,
            mime_type,
        });
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    pub fn into_files(self) -> Vec<OutputFile> {
        self.files
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_keeps_only_the_limit_and_whole_characters() {
        let mut b = CappedBuffer::new(5);
        b.push("abcd".as_bytes());
        b.push("é".as_bytes()); // 2 bytes, only one fits
        assert!(b.truncated());
        assert_eq!(b.text(), "abcd");
    }

    #[test]
    fn files_beyond_any_limit_are_omitted_whole() {
        let mut c = FileCollector::default();
        assert!(c.offer(MAX_RETURNED_FILE_BYTES));
        assert!(!c.offer(MAX_RETURNED_FILE_BYTES + 1));
        assert!(c.truncated());
        for _ in 0..4 {
            assert!(c.offer(MAX_RETURNED_FILE_BYTES));
        }
        assert!(!c.offer(1), "50 MiB total reached");

        let mut c = FileCollector::default();
        for _ in 0..MAX_RETURNED_FILES {
            assert!(c.offer(1));
        }
        assert!(!c.offer(1), "65th file");
    }

    #[test]
    fn mime_type_comes_from_the_path() {
        let mut c = FileCollector::default();
        c.collect("out/results.csv".into(), b"a\n");
        c.collect("blob".into(), b"x");
        let files = c.into_files();
        assert_eq!(files[0].mime_type, "text/csv");
        assert_eq!(files[1].mime_type, "application/octet-stream");
        assert_eq!(files[0].content_base64, "YQo=");
    }
}
