//! The configured code-snippet catalog: include/exclude filtering, and the search behind
//! `list_code_snippets` — case-insensitive, query split on punctuation and whitespace into distinct
//! words matched as substrings of title and description, ranked by matched words, then title matches,
//! then id, with short lists filled up to `[search] min_hits` by the next best visible snippets; and
//! the two snippet tools with their arguments and results.

use std::collections::BTreeMap;

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{tool, tool_router};
use serde::Serialize;

use super::CodeInterpreter;
use crate::config::{CodeSnippetsConfig, Snippet};
use crate::telemetry::ToolOutcome;

/// A snippet as listed: metadata without the code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct SnippetSummary {
    pub id: String,
    pub title: String,
    pub description: String,
    pub required_python_packages: Vec<String>,
    pub tags: Vec<String>,
}

/// A snippet with its code, as returned by `get_code_snippet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct SnippetDetail {
    pub id: String,
    pub title: String,
    pub description: String,
    pub required_python_packages: Vec<String>,
    pub tags: Vec<String>,
    pub code_snippet: String,
}

/// The visible snippets (filters already applied), by id.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    snippets: BTreeMap<String, Snippet>,
    min_hits: usize,
}

impl Catalog {
    /// Applies the include and exclude filters of `config`: when either include list is non-empty a
    /// snippet is visible if its id is listed or it has a listed tag; excluded ids are never visible.
    pub fn new(config: &CodeSnippetsConfig, min_hits: usize) -> Self {
        let filtering =
            !config.include_snippet_ids.is_empty() || !config.include_snippet_tags.is_empty();
        let snippets = config
            .snippets
            .iter()
            .filter(|(id, s)| {
                !filtering
                    || config.include_snippet_ids.contains(id)
                    || s.tags
                        .iter()
                        .any(|t| config.include_snippet_tags.contains(t))
            })
            .filter(|(id, _)| !config.exclude_snippet_ids.contains(id))
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect();
        Self { snippets, min_hits }
    }

    /// Searches the visible snippets; an omitted, blank or punctuation-only query lists them all by id.
    pub fn search(&self, query: Option<&str>) -> Vec<SnippetSummary> {
        let words = query_words(query.unwrap_or(""));
        if words.is_empty() {
            return self.snippets.iter().map(|(id, s)| summary(id, s)).collect();
        }
        let mut ranked: Vec<(usize, usize, &String, &Snippet)> = self
            .snippets
            .iter()
            .map(|(id, s)| {
                let title = s.title.to_lowercase();
                let description = s.description.to_lowercase();
                let in_title = words.iter().filter(|w| title.contains(w.as_str())).count();
                let matched = words
                    .iter()
                    .filter(|w| title.contains(w.as_str()) || description.contains(w.as_str()))
                    .count();
                (matched, in_title, id, s)
            })
            .collect();
        // More matched words first, then more title matches, then id.
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
        let matches = ranked.iter().take_while(|r| r.0 > 0).count();
        let wanted = matches.max(self.min_hits.min(ranked.len()));
        ranked
            .into_iter()
            .take(wanted)
            .map(|(_, _, id, s)| summary(id, s))
            .collect()
    }

    /// The visible snippet `id`, with its code; `None` when there is none.
    pub fn get(&self, id: &str) -> Option<SnippetDetail> {
        self.snippets.get(id).map(|s| SnippetDetail {
            id: id.to_string(),
            title: s.title.clone(),
            description: s.description.clone(),
            required_python_packages: s.required_python_packages.clone(),
            tags: s.tags.clone(),
            code_snippet: s.code_snippet.clone(),
        })
    }
}

fn summary(id: &str, s: &Snippet) -> SnippetSummary {
    SnippetSummary {
        id: id.to_string(),
        title: s.title.clone(),
        description: s.description.clone(),
        required_python_packages: s.required_python_packages.clone(),
        tags: s.tags.clone(),
    }
}

/// Lower-cased words of `query`, split on anything that is not a letter or digit, without repeats, in
/// order of first appearance.
pub fn query_words(query: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    for word in query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let word = word.to_lowercase();
        if !words.contains(&word) {
            words.push(word);
        }
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_on_punctuation_and_repeat_once() {
        assert_eq!(
            query_words("DOCX, create--document docx!"),
            ["docx", "create", "document"]
        );
        assert!(query_words(" ,.;!? ").is_empty());
        assert_eq!(query_words("risk_register"), ["risk", "register"]);
    }
}

/// Arguments of `list_code_snippets`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct ListSnippetsArgs {
    /// Words describing the task, e.g. "XLSX risk register". Omit or leave blank to list every snippet.
    #[serde(default)]
    pub query: Option<String>,
}

/// Result of `list_code_snippets`.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct ListSnippetsResult {
    /// Best matches first; when fewer than the configured minimum match, the next best (possibly
    /// unrelated) snippets follow.
    pub snippets: Vec<SnippetSummary>,
}

/// Arguments of `get_code_snippet`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct GetSnippetArgs {
    /// A snippet id from list_code_snippets.
    pub id: String,
}

/// Result of `get_code_snippet`.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct GetSnippetResult {
    /// The snippet with its code, or null when no visible snippet has that id.
    pub snippet: Option<SnippetDetail>,
}

#[tool_router(router = snippet_router, vis = "pub(super)")]
impl CodeInterpreter {
    #[tool(
        name = "list_code_snippets",
        title = "Search code snippets",
        annotations(
            title = "Search code snippets",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        ),
        description = "Search the server's catalog of ready-made Python code snippets by words describing \
the task (matched against titles and descriptions, case-insensitive); an empty query lists them all. \
Returns ids with titles, descriptions, required packages and tags, best matches first. Short result \
lists are filled with other snippets that may be unrelated: read each description before using one. \
Then call get_code_snippet with an id to fetch the code, and run it (adapted) with run_python_code."
    )]
    async fn list_code_snippets(
        &self,
        Parameters(args): Parameters<ListSnippetsArgs>,
    ) -> Json<ListSnippetsResult> {
        let started = std::time::Instant::now();
        let snippets = self.catalog.search(args.query.as_deref());
        super::record(
            "list_code_snippets",
            ToolOutcome::Success,
            started,
            super::Details {
                results: Some(snippets.len()),
                ..Default::default()
            },
        );
        Json(ListSnippetsResult { snippets })
    }

    #[tool(
        name = "get_code_snippet",
        title = "Get a code snippet",
        annotations(
            title = "Get a code snippet",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        ),
        description = "Fetch one snippet from the catalog by the id that list_code_snippets returned: its \
metadata and Python source. Returns snippet = null when no snippet has that id."
    )]
    async fn get_code_snippet(
        &self,
        Parameters(args): Parameters<GetSnippetArgs>,
    ) -> Json<GetSnippetResult> {
        let started = std::time::Instant::now();
        let snippet = self.catalog.get(&args.id);
        super::record(
            "get_code_snippet",
            ToolOutcome::Success,
            started,
            super::Details {
                found: Some(snippet.is_some()),
                ..Default::default()
            },
        );
        Json(GetSnippetResult { snippet })
    }
}
