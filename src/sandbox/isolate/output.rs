//! What an execution hands back, bounded in Rust whatever the sandbox's JavaScript and Python claim:
//! captured stdout/stderr, the runner's report (the final expression, the error's type, message and
//! traceback) and the new files under /workspace (paths checked by the input-path rules, sizes by the
//! bytes actually handed over), each with the per-request limits.

use std::collections::HashSet;

use base64::Engine as _;

use crate::protocol::limits::{
    MAX_DISPLAY_TOTAL_BYTES, MAX_DISPLAY_VALUE_BYTES, MAX_DISPLAYS, MAX_ERROR_MESSAGE_BYTES,
    MAX_ERROR_TYPE_BYTES, MAX_RESULT_BYTES, MAX_RETURNED_FILE_BYTES, MAX_RETURNED_FILES,
    MAX_RETURNED_TOTAL_BYTES, MAX_TRACEBACK_BYTES,
};
use crate::sandbox::types::{
    Display, DisplaySource, MAX_TABLE_BYTES, MAX_TABLES_BYTES, OutputFile, TABLE_MIME,
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

/// What the Python runner reports about the user's code, as `call.js` hands it over.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub success: bool,
    #[serde(default)]
    pub result: Option<String>,
    #[serde(default)]
    pub result_truncated: bool,
    #[serde(default)]
    pub error_type: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub traceback: Option<String>,
}

impl Report {
    /// The report within the limits; `result_truncated` also says whether an error field was cut.
    pub fn capped(mut self) -> Self {
        let mut cut = false;
        let mut cap = |text: Option<String>, limit: usize, keep_end: bool| {
            text.map(|t| {
                let (t, was_cut) = cap_text(t, limit, keep_end);
                cut |= was_cut;
                t
            })
        };
        self.result = cap(self.result, MAX_RESULT_BYTES, false);
        self.error_type = cap(self.error_type, MAX_ERROR_TYPE_BYTES, false);
        self.message = cap(self.message, MAX_ERROR_MESSAGE_BYTES, false);
        self.traceback = cap(self.traceback, MAX_TRACEBACK_BYTES, true);
        self.result_truncated |= cut;
        self
    }
}

/// `text` within `limit` bytes (cut at a character boundary); with `keep_end`, its start and end
/// with a marker between. Whether it was cut.
pub fn cap_text(text: String, limit: usize, keep_end: bool) -> (String, bool) {
    if text.len() <= limit {
        return (text, false);
    }
    if !keep_end {
        return (text[..text.floor_char_boundary(limit)].to_string(), true);
    }
    let marker = format!("\n… ({} bytes omitted) …\n", text.len() - limit);
    let half = limit.saturating_sub(marker.len()) / 2;
    let head = &text[..text.floor_char_boundary(half)];
    let tail = &text[text.ceil_char_boundary(text.len() - half)..];
    (format!("{head}{marker}{tail}"), true)
}

/// The rich outputs of a call as the runner publishes them (`display.py`), kept within the limits
/// whatever it sends: at most `MAX_DISPLAYS`, each representation at most `MAX_DISPLAY_VALUE_BYTES`
/// under a well-formed MIME type, `MAX_DISPLAY_TOTAL_BYTES` in all; what is left out marks the output
/// truncated.
#[derive(Debug, Default)]
pub struct DisplayCollector {
    displays: Vec<Display>,
    bytes: usize,
    /// Tables' grid data ([`TABLE_MIME`]) has a budget of its own: a grid never pushes out a figure.
    table_bytes: usize,
    truncated: bool,
}

/// A published bundle as it comes from the runner.
#[derive(serde::Deserialize)]
struct Published {
    source: DisplaySource,
    data: std::collections::BTreeMap<String, String>,
}

/// `type/subtype`, lower-case letters, digits and `.+-` only, at most 100 bytes.
fn mime_ok(mime: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
    };
    mime.len() <= 100 && mime.split_once('/').is_some_and(|(t, s)| ok(t) && ok(s))
}

/// Whether `base64` decodes to an image of type `mime` (PNG, JPEG, GIF or WebP, by its signature);
/// anything else under those types (text, SVG, garbage) would be an invalid image block.
pub fn valid_image(mime: &str, base64: &str) -> bool {
    use base64::engine::general_purpose::STANDARD;
    let Ok(bytes) = STANDARD.decode(base64) else {
        return false;
    };
    match mime {
        "image/png" => bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "image/jpeg" => bytes.starts_with(&[0xff, 0xd8, 0xff]),
        "image/gif" => bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a"),
        "image/webp" => bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP",
        _ => false,
    }
}

/// The representations published as images, each checked with [`valid_image`].
const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

impl DisplayCollector {
    /// One published message: a bundle (JSON), or `clear` (the call's `clear_output()`). Returns a
    /// note for the call's stderr when a representation was dropped as not what its type says (an
    /// image that is not one).
    pub fn publish(&mut self, text: &str) -> Option<String> {
        if text == "clear" {
            self.displays.clear();
            self.bytes = 0;
            self.table_bytes = 0;
            return None;
        }
        let Ok(published) = serde_json::from_str::<Published>(text) else {
            self.truncated = true;
            return None;
        };
        if self.displays.len() >= MAX_DISPLAYS {
            self.truncated = true;
            return None;
        }
        let mut data = std::collections::BTreeMap::new();
        let mut note = None;
        for (mime, value) in published.data {
            if IMAGE_TYPES.contains(&mime.as_str()) && !valid_image(&mime, &value) {
                self.truncated = true;
                note = Some(format!(
                    "[a displayed {mime} was left out: it is not a valid {mime} image in Base64]\n"
                ));
                continue;
            }
            if mime == TABLE_MIME {
                if value.len() > MAX_TABLE_BYTES
                    || self.table_bytes + value.len() > MAX_TABLES_BYTES
                {
                    // (The Markdown table stays: only the grid is left out.)
                    continue;
                }
                self.table_bytes += value.len();
                data.insert(mime, value);
                continue;
            }
            if !mime_ok(&mime)
                || value.len() > MAX_DISPLAY_VALUE_BYTES
                || self.bytes + value.len() > MAX_DISPLAY_TOTAL_BYTES
            {
                self.truncated = true;
                continue;
            }
            self.bytes += value.len();
            data.insert(mime, value);
        }
        if !data.is_empty() {
            self.displays.push(Display {
                source: published.source,
                data,
            });
        }
        note
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    pub fn into_displays(self) -> Vec<Display> {
        self.displays
    }
}

/// Decides which new files fit the limits and keeps them.
#[derive(Debug, Default)]
pub struct FileCollector {
    files: Vec<OutputFile>,
    paths: HashSet<String>,
    total: u64,
    truncated: bool,
}

impl FileCollector {
    /// Whether a file of `size` bytes would still fit (so that the sandbox reads only files that
    /// may be returned). A file that does not fit is omitted whole and marks the output truncated;
    /// later, smaller files may still fit. Only `collect` decides.
    pub fn offer(&mut self, size: u64) -> bool {
        let fits = self.fits(size);
        self.truncated |= !fits;
        fits
    }

    fn fits(&self, size: u64) -> bool {
        self.files.len() < MAX_RETURNED_FILES
            && size <= MAX_RETURNED_FILE_BYTES
            && self.total.saturating_add(size) <= MAX_RETURNED_TOTAL_BYTES
    }

    /// Keeps the file at `path` (relative to /workspace) if the path follows the input-path rules in
    /// canonical form, is new, and `data` fits the limits; otherwise it is omitted and the output
    /// marked truncated.
    pub fn collect(&mut self, path: String, data: &[u8]) {
        let canonical = crate::protocol::request::normalize_path(&path).is_ok_and(|p| p == path);
        if !canonical || self.paths.contains(&path) || !self.fits(data.len() as u64) {
            self.truncated = true;
            return;
        }
        self.total += data.len() as u64;
        self.paths.insert(path.clone());
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
    fn only_an_image_of_its_type_is_a_valid_image() {
        use super::valid_image;
        assert!(valid_image("image/png", "iVBORw0KGgo="));
        assert!(!valid_image("image/png", "!!! not base64 <script>"));
        assert!(
            !valid_image("image/png", "PHN2Zy8+"),
            "SVG under a PNG type"
        );
        assert!(
            !valid_image("image/jpeg", "iVBORw0KGgo="),
            "PNG under a JPEG type"
        );
        assert!(valid_image("image/jpeg", "/9j/4A=="));
        assert!(valid_image("image/gif", "R0lGODlh"));
        assert!(
            !valid_image("image/svg+xml", "PHN2Zy8+"),
            "not a raster type"
        );
    }

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
        let ten_mib = vec![0u8; MAX_RETURNED_FILE_BYTES as usize];
        let mut c = FileCollector::default();
        assert!(c.offer(MAX_RETURNED_FILE_BYTES));
        c.collect("f0".into(), &ten_mib);
        assert!(!c.offer(MAX_RETURNED_FILE_BYTES + 1));
        assert!(c.truncated());
        for i in 1..5 {
            assert!(c.offer(MAX_RETURNED_FILE_BYTES));
            c.collect(format!("f{i}"), &ten_mib);
        }
        assert!(!c.offer(1), "50 MiB total reached");
        c.collect("late".into(), b"x");
        assert_eq!(c.into_files().len(), 5);

        let mut c = FileCollector::default();
        for i in 0..MAX_RETURNED_FILES {
            assert!(c.offer(1));
            c.collect(format!("f{i}"), b"x");
        }
        assert!(!c.offer(1), "65th file");
    }

    #[test]
    fn only_the_bytes_handed_over_count_and_paths_must_be_canonical_and_new() {
        let mut c = FileCollector::default();
        // The size offered is not trusted: the data is what counts.
        assert!(c.offer(1));
        c.collect(
            "big".into(),
            &vec![0u8; MAX_RETURNED_FILE_BYTES as usize + 1],
        );
        assert!(c.truncated());
        let mut c = FileCollector::default();
        for bad in [
            "../tmp/evil.sh",
            "/etc/passwd",
            "a//b",
            "./a",
            "a\\b",
            "a\nb",
            "",
        ] {
            c.collect(bad.into(), b"x");
        }
        c.collect("ok.txt".into(), b"x");
        c.collect("ok.txt".into(), b"again");
        assert!(c.truncated());
        let files = c.into_files();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path, "ok.txt");
        assert_eq!(files[0].content_base64, "eA==");
    }

    #[test]
    fn reports_are_capped() {
        let report = Report {
            success: false,
            result: Some("r".repeat(MAX_RESULT_BYTES + 10)),
            error_type: Some("T".repeat(1000)),
            message: Some("é".repeat(MAX_ERROR_MESSAGE_BYTES)),
            traceback: Some(format!("start{}end", "x".repeat(MAX_TRACEBACK_BYTES * 4))),
            ..Report::default()
        }
        .capped();
        assert!(report.result_truncated);
        assert_eq!(report.result.unwrap().len(), MAX_RESULT_BYTES);
        assert_eq!(report.error_type.unwrap().len(), MAX_ERROR_TYPE_BYTES);
        assert!(report.message.unwrap().len() <= MAX_ERROR_MESSAGE_BYTES);
        let tb = report.traceback.unwrap();
        assert!(tb.len() <= MAX_TRACEBACK_BYTES);
        assert!(tb.starts_with("start") && tb.ends_with("end") && tb.contains("bytes omitted"));
        let small = Report {
            success: true,
            result: Some("6".into()),
            ..Report::default()
        };
        assert_eq!(small.clone().capped(), small);
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
