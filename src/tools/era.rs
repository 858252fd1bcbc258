//! What each negotiated MCP protocol version may receive. A client gets nothing newer than the
//! version it negotiated: before 2025-06-18 there were no structured content, output schemas or
//! `resource_link` blocks (a `mcp` 1.9.4 client refuses a result carrying a link), and before
//! 2025-11-25 no SSE priming events (an `id` with empty `data`, SEP-1699), which older clients try
//! to parse as a message. The tools shape their results with [`Era::shape`] and their list with
//! [`Era::tools`]; the transport leaves out priming events where [`Era::priming`] says so.

use rmcp::model::{CallToolResult, ContentBlock, Tool};

/// The first version with structured content, output schemas and resource links.
const STRUCTURED: &str = "2025-06-18";
/// The first version with SSE priming events.
const RESUMABLE: &str = "2025-11-25";

/// The features a protocol version has, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Era {
    /// 2024-11-05 and 2025-03-26: text, image, audio and embedded-resource content only.
    Unstructured,
    /// 2025-06-18: structured content, output schemas and resource links too.
    Structured,
    /// 2025-11-25 and later (and a version not told): SSE priming events too.
    Resumable,
}

impl Era {
    /// The era of a protocol version (dates compare as text; a version this server does not know is
    /// taken as the newest, and no version at all too: rmcp always knows a session's).
    pub fn of_version(version: Option<&str>) -> Self {
        match version {
            Some(v) if v < STRUCTURED => Self::Unstructured,
            Some(v) if v < RESUMABLE => Self::Structured,
            _ => Self::Resumable,
        }
    }

    /// The era of the request `context` belongs to (its `_meta`, or its session's `initialize`).
    pub fn of(context: &rmcp::service::RequestContext<rmcp::RoleServer>) -> Self {
        Self::of_version(context.protocol_version().as_ref().map(|v| v.as_str()))
    }

    /// Structured content, output schemas and resource links exist.
    pub fn structured(self) -> bool {
        self >= Self::Structured
    }

    /// SSE priming events exist.
    pub fn priming(self) -> bool {
        self >= Self::Resumable
    }

    /// `result` as this era can carry it: before structured content, without it (every tool's text
    /// block already carries the same JSON, sized for a model), and any resource link as a text
    /// naming the resource (resources/read existed).
    pub fn shape(self, mut result: CallToolResult) -> CallToolResult {
        if self.structured() {
            return result;
        }
        result.structured_content = None;
        for block in &mut result.content {
            if let ContentBlock::ResourceLink(link) = block {
                let text = format!(
                    "resource {} ({}): read it with resources/read",
                    link.uri,
                    link.mime_type
                        .as_deref()
                        .unwrap_or("application/octet-stream")
                );
                *block = ContentBlock::text(text);
            }
        }
        result
    }

    /// The tool list as this era knows it: no output schemas before structured content.
    pub fn tools(self, mut tools: Vec<Tool>) -> Vec<Tool> {
        if !self.structured() {
            for tool in &mut tools {
                tool.output_schema = None;
            }
        }
        tools
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_gets_its_era() {
        for (version, era) in [
            (Some("2024-11-05"), Era::Unstructured),
            (Some("2025-03-26"), Era::Unstructured),
            (Some("2025-06-18"), Era::Structured),
            (Some("2025-11-25"), Era::Resumable),
            (Some("2026-07-28"), Era::Resumable),
            (Some("2099-01-01"), Era::Resumable),
            (None, Era::Resumable),
        ] {
            assert_eq!(Era::of_version(version), era, "{version:?}");
        }
        assert!(!Era::Unstructured.structured() && Era::Structured.structured());
        assert!(!Era::Structured.priming() && Era::Resumable.priming());
    }

    #[test]
    fn an_unstructured_result_keeps_its_text_and_names_its_links() {
        use rmcp::model::Resource;
        let mut result = CallToolResult::structured(serde_json::json!({"a": 1}));
        result.content.push(ContentBlock::resource_link(
            Resource::new("session://s/a.csv", "a.csv").with_mime_type("text/csv"),
        ));
        let shaped = Era::Unstructured.shape(result.clone());
        assert!(shaped.structured_content.is_none());
        assert_eq!(shaped.content[0], result.content[0]);
        assert!(
            matches!(&shaped.content[1], ContentBlock::Text(t) if t.text.contains("session://s/a.csv"))
        );
        assert_eq!(Era::Structured.shape(result.clone()), result);
    }
}
