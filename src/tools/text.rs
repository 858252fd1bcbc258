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
use super::era::Era;

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

/// How a result is shown: the text budget and the client's protocol era.
#[derive(Debug, Clone, Copy)]
pub struct View {
    /// `results.max_text_chars` (0: no cap).
    pub max_chars: usize,
    /// Without structured content (before 2025-06-18), what the text cuts comes as embedded
    /// resources and the text says so.
    pub era: Era,
}

/// Where the whole of a cut field is for a client without structured content: the embedded
/// resource `output://{field}` (see [`cut_fields`]).
pub fn output_uri(field: &str) -> String {
    format!("output://{field}")
}

/// The text content for a result whose structured form is `value`; `file_blocks` are the content
/// blocks each of its files gets, in order (`content::file_blocks`), which the text names.
pub fn model_text(
    value: &Value,
    view: View,
    kept: &Kept,
    file_blocks: &[Vec<rmcp::model::ContentBlock>],
) -> String {
    let View { max_chars, era } = view;
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
        _ if !era.structured() => format!(
            "the whole {field} is the embedded resource {}",
            output_uri(field)
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
        let whole = if era.structured() {
            "the whole traceback is in the structured content (`error.traceback`)".to_string()
        } else {
            format!(
                "the whole traceback is the embedded resource {}",
                output_uri("traceback")
            )
        };
        let cut_text = cut(text, share("traceback", max_chars), &whole);
        view["error"]["traceback"] = Value::String(cut_text);
    }
    if let Some(Value::Array(files)) = view.get_mut("files") {
        for (file, blocks) in files.iter_mut().zip(file_blocks) {
            let base64 = file["content_base64"].as_str().unwrap_or_default();
            *file = json!({
                "path": file["path"],
                "mime_type": file["mime_type"],
                "bytes": super::content::decoded_len(base64),
                "content": where_file(blocks, era),
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
                "content": if era.structured() {
                    "in its own content block and the structured content"
                } else {
                    "in its own content block"
                },
            });
        }
    }
    view.to_string()
}

/// The fields whose text [`model_text`] cuts, with their whole text: a client without structured
/// content gets each as an embedded resource ([`output_uri`]) unless a session keeps it as a file.
pub fn cut_fields(value: &Value, max_chars: usize, kept: &Kept) -> Vec<(&'static str, String)> {
    if max_chars == 0 {
        return Vec::new();
    }
    let in_session = value.get("session_id").is_some_and(Value::is_string);
    [
        ("stdout", value.get("stdout"), kept.stdout.is_some()),
        ("stderr", value.get("stderr"), kept.stderr.is_some()),
        ("result", value.get("result"), false),
        ("traceback", value.pointer("/error/traceback"), false),
    ]
    .into_iter()
    .filter(|(_, _, kept)| !(*kept && in_session))
    .filter_map(|(field, text, _)| {
        let text = text?.as_str()?;
        (text.chars().count() > share(field, max_chars)).then(|| (field, text.to_string()))
    })
    .collect()
}

/// Where a returned file's bytes are, from the blocks that show it: an image block, an SVG's text,
/// a `session://` resource link, an embedded resource, and (where it exists) the structured content.
fn where_file(blocks: &[rmcp::model::ContentBlock], era: Era) -> String {
    use rmcp::model::ContentBlock;
    let mut places: Vec<String> = blocks
        .iter()
        .map(|block| match block {
            ContentBlock::Image(_) => "in an image block".to_string(),
            ContentBlock::ResourceLink(_) => {
                "as a session:// resource link (resources/read)".to_string()
            }
            ContentBlock::Resource(embedded) => {
                let uri = match &embedded.resource {
                    rmcp::model::ResourceContents::TextResourceContents { uri, .. }
                    | rmcp::model::ResourceContents::BlobResourceContents { uri, .. } => {
                        uri.as_str()
                    }
                    _ => "",
                };
                format!("in the embedded resource {uri}")
            }
            _ => "as text in its own block".to_string(),
        })
        .collect();
    if !era.structured() {
        return places.join(" and ");
    }
    if places.is_empty() {
        return "only in the structured content (`files`, Base64): no content block".to_string();
    }
    places.push("in the structured content (`files`)".to_string());
    let last = places.pop().unwrap_or_default();
    format!("{}, and {last}", places.join(", "))
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
        use crate::sandbox::OutputFile;
        let file = |path: &str, mime: &str, b64: &str| OutputFile {
            path: path.into(),
            content_base64: b64.into(),
            mime_type: mime.into(),
        };
        let files = [
            file("a.csv", "text/csv", "YQo="),
            file("p.png", "image/png", "iVBORw0KGgo="),
            file("fake.png", "image/png", "PHN2Zy8+"),
        ];
        let text_of = |session: Option<&str>, era| -> Value {
            let value = json!({"session_id": session, "files": files});
            let blocks = super::super::content::file_blocks(&files, session, 1024, era);
            let view = View {
                max_chars: 1000,
                era,
            };
            serde_json::from_str(&model_text(&value, view, &Kept::default(), &blocks)).unwrap()
        };
        let text = text_of(None, Era::Resumable);
        let said = |i: usize| text["files"][i]["content"].as_str().unwrap().to_string();
        assert!(said(0).contains("no content block"), "{}", said(0));
        assert!(said(1).starts_with("in an image block"), "{}", said(1));
        assert!(said(2).contains("no content block"), "{}", said(2));
        let text = text_of(Some("s1"), Era::Resumable);
        assert!(
            text["files"][0]["content"]
                .as_str()
                .unwrap()
                .starts_with("as a session:// resource link")
        );
        // Before structured content, each file is in a block of its own.
        let text = text_of(None, Era::Unstructured);
        let said = |i: usize| text["files"][i]["content"].as_str().unwrap().to_string();
        assert_eq!(said(0), "in the embedded resource workspace:///a.csv");
        assert_eq!(said(1), "in an image block");
        assert_eq!(said(2), "in the embedded resource workspace:///fake.png");
    }

    #[test]
    fn what_the_text_cuts_is_named_for_clients_without_structured_content() {
        let long = "x".repeat(2000);
        let value = json!({"stdout": long, "stderr": "", "result": null,
            "error": {"traceback": long}});
        let fields = cut_fields(&value, 1000, &Kept::default());
        let names: Vec<&str> = fields.iter().map(|(f, _)| *f).collect();
        assert_eq!(names, ["stdout", "traceback"]);
        assert_eq!(fields[0].1, long);
        assert!(cut_fields(&value, 0, &Kept::default()).is_empty());
        let view = View {
            max_chars: 1000,
            era: Era::Unstructured,
        };
        let text = model_text(&value, view, &Kept::default(), &[]);
        assert!(text.contains("the whole stdout is the embedded resource output://stdout"));
        assert!(text.contains("the whole traceback is the embedded resource output://traceback"));
        // A session keeps its long stdout as a file: that is where the text points.
        let mut in_session = value.clone();
        in_session["session_id"] = json!("s1");
        let kept = Kept {
            stdout: Some(".outputs/1.stdout".into()),
            stderr: None,
        };
        let names: Vec<&str> = cut_fields(&in_session, 1000, &kept)
            .iter()
            .map(|(f, _)| *f)
            .collect();
        assert_eq!(names, ["traceback"]);
    }
}
