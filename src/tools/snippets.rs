//! The configured code-snippet catalog: include/exclude filtering, and the search behind
//! `list_code_snippets` — case-insensitive, query split on punctuation and whitespace into distinct
//! words matched as substrings of title and description, ranked by matched words, then title matches,
//! then id, with short lists filled up to `[search] min_hits` by the next best visible snippets.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{CodeSnippetsConfig, Snippet};

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
