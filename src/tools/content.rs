//! What a `run_python_code` result carries besides its structured JSON (which stays, with its text
//! form sized for a model, see `text.rs`, for clients that read only that): every rich output
//! (`displays`) as one content block in the order the code made them, every returned image as MCP
//! image content, so that multimodal clients see it (PNG, JPEG, GIF and WebP inlined up to a size;
//! SVG as text), and, in a session, a `resource_link` to every returned file under its `session://`
//! URI.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use rmcp::model::{ContentBlock, Resource, ResourceContents};

use super::era::Era;
use crate::sandbox::{Display, OutputFile, valid_image};

/// Image types clients render from Base64 image content.
const INLINE_IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Characters a path component keeps as they are in a URI (RFC 3986 unreserved).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The URI of a session's file: `session://{session_id}/{path}`, each path component
/// percent-encoded.
pub fn session_uri(session_id: &str, path: &str) -> String {
    format!("session://{session_id}/{}", encoded(path))
}

/// The URI an embedded stateless file goes by: `workspace:///{path}`, components percent-encoded.
pub fn workspace_uri(path: &str) -> String {
    format!("workspace:///{}", encoded(path))
}

/// `path` with each component percent-encoded.
fn encoded(path: &str) -> String {
    let components: Vec<String> = path
        .split('/')
        .map(|c| utf8_percent_encode(c, COMPONENT).to_string())
        .collect();
    components.join("/")
}

/// The session id and path a `session://` URI names, if it is one (the path obeying the input-path
/// rules).
pub fn parse_session_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix("session://")?;
    let (id, path) = rest.split_once('/')?;
    let mut decoded = Vec::new();
    for component in path.split('/') {
        decoded.push(
            percent_decode_str(component)
                .decode_utf8()
                .ok()?
                .into_owned(),
        );
    }
    if decoded.iter().any(|c| c.contains('/')) {
        return None;
    }
    let path = crate::protocol::request::normalize_path(&decoded.join("/")).ok()?;
    (!id.is_empty()).then(|| (id.to_string(), path))
}

/// The decoded size of Base64 `text` (standard, padded).
pub fn decoded_len(text: &str) -> u64 {
    let padding = text.bytes().rev().take_while(|b| *b == b'=').count();
    (text.len() / 4 * 3).saturating_sub(padding) as u64
}

/// The content blocks of each of `files`, in order ([`file_content`]): the text says where each
/// file is from them, and they follow it.
pub fn file_blocks(
    files: &[OutputFile],
    session: Option<&str>,
    max_inline_bytes: u64,
    era: Era,
) -> Vec<Vec<ContentBlock>> {
    files
        .iter()
        .map(|file| file_content(file, session, max_inline_bytes, era))
        .collect()
}

/// The blocks one returned file gets: an image block or an SVG's text up to `max_inline_bytes`
/// ([`file_block`]); in a session, a `resource_link` to its `session://` URI where links exist;
/// where they do not (nor structured content), the file itself as an embedded resource unless it
/// is shown whole already (its text for text types, else Base64), under its `session://` URI or,
/// stateless, `workspace:///path`.
pub fn file_content(
    file: &OutputFile,
    session: Option<&str>,
    max_inline_bytes: u64,
    era: Era,
) -> Vec<ContentBlock> {
    let (path, mime, base64) = (&file.path, &file.mime_type, &file.content_base64);
    let shown = file_block(mime, base64, max_inline_bytes);
    let uri = match session {
        Some(id) => session_uri(id, path),
        None => workspace_uri(path),
    };
    let mut blocks: Vec<ContentBlock> = shown.into_iter().collect();
    if era.structured() {
        if session.is_some() {
            blocks.push(ContentBlock::resource_link(
                Resource::new(uri, path.clone())
                    .with_mime_type(mime.clone())
                    .with_size(decoded_len(base64)),
            ));
        }
    } else if blocks.is_empty() {
        let contents = match base64_text(base64).filter(|_| is_text(mime)) {
            Some(text) => ResourceContents::text(text, uri),
            None => ResourceContents::blob(base64.clone(), uri),
        };
        blocks.push(ContentBlock::resource(contents.with_mime_type(mime)));
    }
    blocks
}

/// Types whose UTF-8 bytes are embedded as text rather than Base64.
fn is_text(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json" | "application/xml" | "application/javascript" | "image/svg+xml"
        )
}

/// The content block a returned file of `mime` (its bytes in `base64`) gets besides a session's
/// link, if any: an image block for a valid image of an inline type up to `max_inline_bytes`, the
/// text of an SVG up to that size.
pub fn file_block(mime: &str, base64: &str, max_inline_bytes: u64) -> Option<ContentBlock> {
    if decoded_len(base64) > max_inline_bytes {
        return None;
    }
    // (A file is named by its path: an image block only for bytes that are that image.)
    if INLINE_IMAGE_TYPES.contains(&mime) && valid_image(mime, base64) {
        return Some(ContentBlock::image(base64.to_string(), mime.to_string()));
    }
    if mime == "image/svg+xml" {
        return base64_text(base64).map(ContentBlock::text);
    }
    None
}

/// Representations that become embedded resources (with their MIME type), most useful first.
const RESOURCE_TYPES: [&str; 6] = [
    "image/svg+xml",
    "application/vnd.plotly.v1+json",
    "application/json",
    "text/latex",
    "text/html",
    "application/javascript",
];

/// One content block per rich output, in order: an image as image content (PNG or JPEG, up to
/// `max_inline_bytes`), else Markdown as text, else SVG, plotly's JSON, JSON, LaTeX or HTML as an
/// embedded resource with its MIME type (`display://N`), else the plain text.
pub fn display_blocks(displays: &[Display], max_inline_bytes: u64) -> Vec<ContentBlock> {
    displays
        .iter()
        .enumerate()
        .filter_map(|(n, display)| {
            let data = &display.data;
            for mime in ["image/png", "image/jpeg"] {
                if let Some(b64) = data.get(mime)
                    && decoded_len(b64) <= max_inline_bytes
                {
                    return Some(ContentBlock::image(b64.clone(), mime.to_string()));
                }
            }
            if let Some(markdown) = data.get("text/markdown") {
                return Some(ContentBlock::text(markdown.clone()));
            }
            for mime in RESOURCE_TYPES {
                if let Some(text) = data.get(mime) {
                    return Some(ContentBlock::resource(
                        ResourceContents::text(text.clone(), format!("display://{n}"))
                            .with_mime_type(mime),
                    ));
                }
            }
            data.get("text/plain")
                .map(|text| ContentBlock::text(text.clone()))
        })
        .collect()
}

fn base64_text(text: &str) -> Option<String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_uris_round_trip_and_refuse_traversal() {
        let uri = session_uri("abc", "plots/figure 1.png");
        assert_eq!(uri, "session://abc/plots/figure%201.png");
        assert_eq!(
            parse_session_uri(&uri),
            Some(("abc".into(), "plots/figure 1.png".into()))
        );
        assert_eq!(parse_session_uri("session://abc/../etc/passwd"), None);
        assert_eq!(parse_session_uri("session://abc/%2E%2E/x"), None);
        assert_eq!(parse_session_uri("file:///etc/passwd"), None);
        assert_eq!(parse_session_uri("session:///x"), None);
    }

    #[test]
    fn each_display_becomes_its_most_useful_block_in_order() {
        use crate::sandbox::DisplaySource;
        let display = |pairs: &[(&str, &str)]| Display {
            source: DisplaySource::Display,
            data: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let displays = [
            display(&[("text/plain", "<Figure>"), ("image/png", "iVBORw0KGgo=")]),
            display(&[
                ("text/plain", "df"),
                ("text/html", "<table/>"),
                ("text/markdown", "| a |"),
            ]),
            display(&[
                ("text/plain", "fig"),
                ("application/vnd.plotly.v1+json", "{}"),
            ]),
            display(&[("text/plain", "just text")]),
        ];
        let blocks = display_blocks(&displays, 1024);
        assert_eq!(blocks.len(), 4);
        assert!(matches!(blocks[0], ContentBlock::Image(_)));
        assert!(matches!(&blocks[1], ContentBlock::Text(t) if t.text == "| a |"));
        let ContentBlock::Resource(resource) = &blocks[2] else {
            panic!("{:?}", blocks[2]);
        };
        assert!(format!("{resource:?}").contains("application/vnd.plotly.v1+json"));
        assert!(matches!(&blocks[3], ContentBlock::Text(t) if t.text == "just text"));
        // An image over the inline cap falls back to the next representation.
        assert!(matches!(
            display_blocks(&displays[..1], 2)[0],
            ContentBlock::Text(_)
        ));
    }

    /// Every file's blocks, one after the other, as the result carries them.
    fn flat(files: &[OutputFile], session: Option<&str>, cap: u64, era: Era) -> Vec<ContentBlock> {
        file_blocks(files, session, cap, era).concat()
    }

    #[test]
    fn images_are_inlined_up_to_the_cap_and_session_files_linked() {
        let file = |path: &str, mime: &str, b64: &str| OutputFile {
            path: path.into(),
            content_base64: b64.into(),
            mime_type: mime.into(),
        };
        let files = [
            file("a.png", "image/png", "iVBORw0KGgo="),
            file("b.svg", "image/svg+xml", "PHN2Zy8+"),
            file("c.csv", "text/csv", "YQo="),
        ];
        let blocks = flat(&files, None, 1024, Era::Resumable);
        assert_eq!(blocks.len(), 2, "the PNG and the SVG");
        assert!(matches!(blocks[0], ContentBlock::Image(_)));
        assert!(matches!(blocks[1], ContentBlock::Text(_)));
        assert!(
            flat(&files, None, 4, Era::Resumable).is_empty(),
            "over the cap"
        );
        let linked = flat(&files, Some("s1"), 0, Era::Resumable);
        assert_eq!(linked.len(), 3);
        assert!(
            linked
                .iter()
                .all(|b| matches!(b, ContentBlock::ResourceLink(_)))
        );
        // Before links and structured content, what is not shown whole is embedded.
        let old = |session| flat(&files, session, 1024, Era::Unstructured);
        let embedded = old(None);
        assert_eq!(embedded.len(), 3);
        assert!(matches!(embedded[0], ContentBlock::Image(_)));
        let ContentBlock::Resource(csv) = &embedded[2] else {
            panic!("{:?}", embedded[2]);
        };
        let csv = serde_json::to_value(&csv.resource).unwrap();
        assert_eq!(csv["uri"], "workspace:///c.csv");
        assert_eq!(csv["text"], "a\n");
        assert_eq!(csv["mimeType"], "text/csv");
        let in_session = old(Some("s1"));
        assert!(
            !in_session
                .iter()
                .any(|b| matches!(b, ContentBlock::ResourceLink(_)))
        );
        assert!(format!("{:?}", in_session[2]).contains("session://s1/c.csv"));
        let binary = flat(
            &[file("d.bin", "application/octet-stream", "AAE=")],
            None,
            1024,
            Era::Unstructured,
        );
        let ContentBlock::Resource(bin) = &binary[0] else {
            panic!("{binary:?}");
        };
        assert_eq!(serde_json::to_value(&bin.resource).unwrap()["blob"], "AAE=");
        assert_eq!(workspace_uri("a b/c.csv"), "workspace:///a%20b/c.csv");
        assert_eq!(decoded_len("YQo="), 2);
    }
}
