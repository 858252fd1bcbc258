//! Interactive results as MCP Apps (the `io.modelcontextprotocol/ui` extension, SEP-1865): the
//! views, HTML documents composed once at start-up from the files in `views/` and two pinned npm
//! scripts checked by sha256 ([`assets`]); which clients want them ([`wants`]); and what the tools
//! add for those clients (a `ui://` resource per view, `_meta.ui` on the tool). A client that does
//! not declare the extension sees none of it.

pub mod assets;

use std::sync::Arc;

use rmcp::model::{JsonObject, MetaObject, ReadResourceResult, Resource, ResourceContents};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, model::ClientCapabilities};
use serde_json::{Value, json};

use crate::sandbox::{Display, TABLE_MIME};

pub use assets::{AppsError, Parts, Scripts};

/// The extension's identifier, in capabilities on both sides.
pub const EXTENSION: &str = "io.modelcontextprotocol/ui";
/// The MIME type of a view (the extension's `mimeTypes` value).
pub const MIME_TYPE: &str = "text/html;profile=mcp-app";
/// Every view's URI starts with this.
pub const URI_PREFIX: &str = "ui://code-interpreter-mcp/";

/// One composed view.
#[derive(Debug)]
pub struct View {
    /// `ui://code-interpreter-mcp/NAME-HASH.html`: the hash (of the HTML) changes with the content,
    /// so a host that caches a view by URI never shows a stale one.
    pub uri: String,
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub html: Arc<str>,
}

/// The views this server offers.
#[derive(Debug)]
pub struct Views {
    /// Renders a run_python_code result: plotly figures, tables, images, output and errors.
    pub result: View,
    /// Renders a list_session_files result: the files, previews, downloads.
    pub files: View,
    /// Rows of a DataFrame sent as a table's grid data (`results.max_table_rows_app`).
    pub grid_rows: u32,
}

impl Views {
    /// Reads and checks the scripts (see [`assets`]) and composes every view.
    pub fn load(asset_dir: Option<&std::path::Path>, grid_rows: u32) -> Result<Self, AppsError> {
        let scripts = Scripts::load(asset_dir)?;
        Ok(Self {
            grid_rows,
            result: assets::compose(
                &scripts,
                Parts {
                    name: "result",
                    title: "Python result",
                    description: "The interactive view of a run_python_code result: plotly figures \
(zoom, hover, legend), tables (sort, filter, pages), images, output and errors.",
                    css: include_str!("views/style.css"),
                    code: concat!(
                        include_str!("views/common.js"),
                        include_str!("views/result.js")
                    ),
                    plotly: true,
                },
            )?,
            files: assets::compose(
                &scripts,
                Parts {
                    name: "files",
                    title: "Session files",
                    description: "The interactive view of a list_session_files result: the \
session's files with previews (images, CSV as a table, text) and downloads.",
                    css: include_str!("views/style.css"),
                    code: concat!(
                        include_str!("views/common.js"),
                        include_str!("views/files.js")
                    ),
                    plotly: false,
                },
            )?,
        })
    }

    fn all(&self) -> [&View; 2] {
        [&self.result, &self.files]
    }

    /// Every view as a `resources/list` entry.
    pub fn resources(&self) -> Vec<Resource> {
        self.all()
            .into_iter()
            .map(|view| {
                Resource::new(view.uri.clone(), view.name)
                    .with_title(view.title)
                    .with_description(view.description)
                    .with_mime_type(MIME_TYPE)
                    .with_size(view.html.len() as u64)
                    .with_meta(ui_meta())
            })
            .collect()
    }

    /// The view at `uri`, as `resources/read` returns it; `None` for any other URI.
    pub fn read(&self, uri: &str) -> Option<ReadResourceResult> {
        let view = self.all().into_iter().find(|view| view.uri == uri)?;
        Some(ReadResourceResult::new(vec![
            ResourceContents::text(view.html.to_string(), view.uri.clone())
                .with_mime_type(MIME_TYPE)
                .with_meta(ui_meta()),
        ]))
    }

    /// What a tool that renders in `view` carries in its `_meta`: the extension's key and the
    /// flat key its earlier drafts used, which hosts still read.
    pub fn tool_meta(view: &View) -> MetaObject {
        MetaObject(object(json!({
            "ui": {"resourceUri": view.uri},
            "ui/resourceUri": view.uri,
        })))
    }
}

/// The key of a result's `_meta` that carries what only the view draws: `{"tables": [...]}`.
pub const VIEW_META: &str = "code-interpreter-mcp/view";

/// Takes the tables' grid data ([`TABLE_MIME`]) out of `displays`, so that neither the text nor
/// the structured content a model reads ever carries it (a display left with nothing else goes
/// too). Each table is its JSON object with `display`, the index of its display among those left;
/// data that is not a JSON object is dropped.
pub fn take_tables(displays: &mut Vec<Display>) -> Vec<Value> {
    let mut tables = Vec::new();
    let mut n = 0_u64;
    displays.retain_mut(|display| {
        let table = display.data.remove(TABLE_MIME);
        if display.data.is_empty() {
            return false;
        }
        if let Some(Ok(Value::Object(mut table))) = table.map(|t| serde_json::from_str(&t)) {
            table.insert("display".into(), n.into());
            tables.push(Value::Object(table));
        }
        n += 1;
        true
    });
    tables
}

/// A result's `_meta` entry for its view, holding `tables` (see [`take_tables`]).
pub fn view_meta(tables: Vec<Value>) -> (String, Value) {
    (VIEW_META.to_string(), json!({ "tables": tables }))
}

/// A view resource's `_meta.ui`: it loads nothing from the network (every script is inline), and
/// it is drawn with the host's border.
fn ui_meta() -> MetaObject {
    MetaObject(object(json!({
        "ui": {
            "csp": {"connectDomains": [], "resourceDomains": [], "frameDomains": [], "baseUriDomains": []},
            "prefersBorder": true,
        }
    })))
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// Whether the request's client declared the extension with the views' MIME type: in the
/// request's `_meta` (2026-07-28) or in `initialize` (earlier eras).
pub fn wants(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|caps| declares(&caps))
}

/// Whether `caps` declares the extension with the views' MIME type.
pub fn declares(caps: &ClientCapabilities) -> bool {
    caps.extensions
        .as_ref()
        .and_then(|extensions| extensions.get(EXTENSION))
        .and_then(|settings| settings.get("mimeTypes"))
        .and_then(Value::as_array)
        .is_some_and(|types| types.iter().any(|t| t.as_str() == Some(MIME_TYPE)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(value: Value) -> ClientCapabilities {
        serde_json::from_value(value).unwrap()
    }

    /// Everything a view draws comes from user code: no view may hand text to an HTML parser or
    /// to the JavaScript compiler.
    #[test]
    fn the_views_never_parse_strings_as_html_or_code() {
        for (name, code) in [
            ("common.js", include_str!("views/common.js")),
            ("result.js", include_str!("views/result.js")),
            ("files.js", include_str!("views/files.js")),
        ] {
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "DOMParser",
                "createContextualFragment",
                "srcdoc",
                "eval(",
                "Function(",
                "setTimeout(\"",
                "setInterval(\"",
            ] {
                assert!(!code.contains(sink), "{name} uses {sink}");
            }
        }
    }

    #[test]
    fn only_a_client_naming_the_views_mime_type_wants_them() {
        assert!(declares(&caps(json!({
            "extensions": {EXTENSION: {"mimeTypes": [MIME_TYPE]}}
        }))));
        assert!(!declares(&caps(json!({}))));
        assert!(!declares(&caps(json!({"extensions": {EXTENSION: {}}}))));
        assert!(!declares(&caps(json!({
            "extensions": {EXTENSION: {"mimeTypes": ["text/html"]}}
        }))));
        assert!(!declares(&caps(json!({
            "extensions": {"other/ext": {"mimeTypes": [MIME_TYPE]}}
        }))));
    }
}
