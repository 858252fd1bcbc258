//! What a model reads of a `run_python_code` result: the text content, sized by
//! `results.max_text_chars`. It is the result's JSON with long stdout, stderr, result and traceback
//! cut to their head and tail around a marker that says how much was cut and where the whole is (a
//! session keeps its long outputs as files under `/workspace/.outputs/`, readable as `session://`
//! resources; otherwise the structured content has them), files named without their contents (the
//! text says where each really is: an image block, a session link, or only the structured content),
//! and displays named by
//! their types (they come as their own content blocks). The structured content keeps the per-request
//! caps and is never cut here.

use serde_json::{Value, json};

use super::content::session_uri;

/// The shares of the budget: stdout, stderr, the final expression, the traceback.
const SHARES: [(&str, usize); 4] = [
    ("stdout", 50),
    ("stderr", 20),
    ("result", 15),
    ("traceback", 15),
];

/// Where the whole of a stream is, when it was kept in a session.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Kept {
    pub stdout: Option<String>,
    pub stderr: Option<String>,
}

/// How many characters a stream may keep in the text (0 budget: no cap).
pub fn share(stream: &str, max_chars: usize) -> usize {
    let percent = SHARES
        .iter()
        .find(|(name, _)| *name == stream)
        .map_or(10, |(_, p)| *p);
    max_chars * percent / 100
}

/// `text` cut to at most about `limit` characters: its head and tail around a marker saying how much
/// was cut and where the whole is.
pub fn cut(text: &str, limit: usize, whole: &str) -> String {
    let count = text.chars().count();
    if count <= limit {
        return text.to_string();
    }
    let head = limit * 3 / 5;
    let tail = limit - head;
    let cut = count - head - tail;
    let head_end = text.char_indices().nth(head).map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .nth(count - tail)
        .map_or(text.len(), |(i, _)| i);
    format!(
        "{}\n[… {cut} characters cut here; {whole}]\n{}",
        &text[..head_end],
        &text[tail_start..]
    )
}

/// The text content for a result whose structured form is `value` (images up to
/// `max_inline_bytes` come as image blocks).
pub fn model_text(value: &Value, max_chars: usize, kept: &Kept, max_inline_bytes: u64) -> String {
    if max_chars == 0 {
        return value.to_string();
    }
    let mut view = value.clone();
    let session = value.get("session_id").and_then(Value::as_str);
    let whole = |field: &str, kept: Option<&String>| match (kept, session) {
        (Some(path), Some(id)) => format!(
            "the whole {field} is the session file {} (resources/read)",
            session_uri(id, path)
        ),
        _ => format!("the whole {field} is in the structured content (`{field}`)"),
    };
    for (field, kept) in [
        ("stdout", kept.stdout.as_ref()),
        ("stderr", kept.stderr.as_ref()),
        ("result", None),
    ] {
        if let Some(Value::String(text)) = view.get(field) {
            let cut_text = cut(text, share(field, max_chars), &whole(field, kept));
            view[field] = Value::String(cut_text);
        }
    }
    if let Some(Value::String(text)) = view.pointer("/error/traceback") {
        let cut_text = cut(
            text,
            share("traceback", max_chars),
            "the whole traceback is in the structured content (`error.traceback`)",
        );
        view["error"]["traceback"] = Value::String(cut_text);
    }
    if let Some(Value::Array(files)) = view.get_mut("files") {
        for file in files.iter_mut() {
            let base64 = file["content_base64"].as_str().unwrap_or_default();
            let mime = file["mime_type"].as_str().unwrap_or_default();
            let block = super::content::file_block(mime, base64, max_inline_bytes);
            *file = json!({
                "path": file["path"],
                "mime_type": file["mime_type"],
                "bytes": super::content::decoded_len(base64),
                "content": where_file(block.as_ref(), session.is_some()),
            });
        }
    }
    if let Some(Value::Array(displays)) = view.get_mut("displays") {
        for display in displays.iter_mut() {
            let types: Vec<&String> = display["data"]
                .as_object()
                .map(|data| data.keys().collect())
                .unwrap_or_default();
            *display = json!({
                "source": display["source"],
                "types": types,
                "content": "in its own content block and the structured content",
            });
        }
    }
    view.to_string()
}

/// Where a returned file's bytes are, besides the structured content: in the block `block` (an
/// image, or an SVG's text), as a `session://` resource link when `linked`, both, or nowhere else.
fn where_file(block: Option<&rmcp::model::ContentBlock>, linked: bool) -> &'static str {
    use rmcp::model::ContentBlock;
    match (block, linked) {
        (Some(ContentBlock::Image(_)), true) => {
            "in an image block, as a session:// resource link (resources/read), and in the structured content (`files`)"
        }
        (Some(_), true) => {
            "as text in its own block, as a session:// resource link (resources/read), and in the structured content (`files`)"
        }
        (None, true) => {
            "as a session:// resource link (resources/read) and in the structured content (`files`)"
        }
        (Some(ContentBlock::Image(_)), false) => {
            "in an image block and in the structured content (`files`)"
        }
        (Some(_), false) => "as text in its own block and in the structured content (`files`)",
        (None, false) => "only in the structured content (`files`, Base64): no content block",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_keeps_its_head_and_tail_around_a_marker() {
        assert_eq!(cut("short", 10, "x"), "short");
        let text: String = (0..1000)
            .map(|n| char::from(b'a' + (n % 26) as u8))
            .collect();
        let out = cut(&text, 100, "the whole stdout is elsewhere");
        assert!(out.starts_with(&text[..60]), "{out}");
        assert!(out.ends_with(&text[960..]), "{out}");
        assert!(out.contains("[… 900 characters cut here; the whole stdout is elsewhere]"));
        // Multi-byte characters are never split.
        let wide = "é".repeat(500);
        let out = cut(&wide, 50, "w");
        assert!(out.starts_with(&"é".repeat(30)));
        assert_eq!(share("stdout", 20_000), 10_000);
    }

    #[test]
    fn the_text_says_where_each_file_really_is() {
        let value = |session: Option<&str>| {
            json!({"session_id": session, "files": [
                {"path": "a.csv", "mime_type": "text/csv", "content_base64": "YQo="},
                {"path": "p.png", "mime_type": "image/png", "content_base64": "iVBORw0KGgo="},
                {"path": "fake.png", "mime_type": "image/png", "content_base64": "PHN2Zy8+"},
            ]})
        };
        let text: Value =
            serde_json::from_str(&model_text(&value(None), 1000, &Kept::default(), 1024)).unwrap();
        let said = |i: usize| text["files"][i]["content"].as_str().unwrap().to_string();
        assert!(said(0).contains("no content block"), "{}", said(0));
        assert!(said(1).starts_with("in an image block"), "{}", said(1));
        assert!(said(2).contains("no content block"), "{}", said(2));
        let text: Value = serde_json::from_str(&model_text(
            &value(Some("s1")),
            1000,
            &Kept::default(),
            1024,
        ))
        .unwrap();
        assert!(
            text["files"][0]["content"]
                .as_str()
                .unwrap()
                .starts_with("as a session:// resource link")
        );
    }
}
