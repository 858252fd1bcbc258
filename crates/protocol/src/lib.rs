//! The wire protocol of code-interpreter-mcp's tools, free of V8 and of the configuration: the fixed
//! per-request limits ([`limits`], one table that the generated reference lists) and the checks of a
//! request's code and input files before anything is queued ([`request`], fuzzed on its own).

pub mod limits;
pub mod request;

/// The configurable input-file allowances of one request, in KB (1 KB = 1024 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    /// Decoded KB allowed per input file.
    pub max_file_kb: u64,
    /// Decoded KB allowed across the input files of one request.
    pub max_total_file_kb: u64,
}

impl Default for InputLimits {
    /// 10 MiB per file, 50 MiB per request.
    fn default() -> Self {
        Self {
            max_file_kb: 10240,
            max_total_file_kb: 51200,
        }
    }
}

impl InputLimits {
    /// The HTTP body ceiling derived from the aggregate allowance T:
    /// 4 * ceil(T / 3) + 4 * (64 - 1) + 8 MiB.
    pub fn http_body_limit(&self) -> u64 {
        let t = self.max_total_file_kb * 1024;
        4 * t.div_ceil(3) + 4 * (limits::MAX_INPUT_FILES as u64 - 1) + 8 * 1024 * 1024
    }
}
