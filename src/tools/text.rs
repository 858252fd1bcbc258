//! What a model reads of a `run_python_code` result: the text content, sized by
//! `results.max_text_chars`. It is the result's JSON with long stdout, stderr, result and traceback
//! cut to their head and tail around a marker that says how much was cut and where the whole is (a
//! session keeps its long outputs as files under `/workspace/.outputs/`, readable as `session://`
//! resources; otherwise the structured content has them), files named without their contents (they
//! come as their own content blocks, and whole in the structured content), and displays named by
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

/// The text content for a result whose structured form is `value`.
pub fn model_text(value: &Value, max_chars: usize, kept: &Kept) -> String {
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
            let bytes = file["content_base64"]
                .as_str()
                .map_or(0, super::content::decoded_len);
            *file = json!({
                "path": file["path"],
                "mime_type": file["mime_type"],
                "bytes": bytes,
                "content": "in its own content block and the structured content",
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
}
