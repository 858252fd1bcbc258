//! The snippet catalog: the search rules as a table of queries against a fixed catalog, filters,
//! min_hits, blank queries, get by id; and the two tools through a real server, enabled and disabled.

use std::collections::BTreeMap;

use code_interpreter_mcp::config::{CodeSnippetsConfig, Snippet};
use code_interpreter_mcp::tools::snippets::Catalog;
use serde_json::json;

use crate::fixture::{Server, call_tool_stateless, list_tools_stateless};

fn snippet(title: &str, description: &str, tags: &[&str]) -> Snippet {
    Snippet {
        title: title.into(),
        description: description.into(),
        required_python_packages: vec!["pandas".into()],
        tags: tags.iter().map(|t| t.to_string()).collect(),
        code_snippet: format!("# {title}\nprint('{title}')\n"),
    }
}

fn config() -> CodeSnippetsConfig {
    let snippets: BTreeMap<String, Snippet> = [
        (
            "a_docx_notes",
            snippet("Meeting notes", "Writes meeting notes to a DOCX file", &[]),
        ),
        (
            "convert_docx_to_pdf",
            snippet(
                "Convert DOCX to PDF",
                "Takes a DOCX file as input and converts it to a PDF",
                &["provider_eratolabs"],
            ),
        ),
        (
            "csv_summary",
            snippet(
                "CSV summary statistics",
                "Summarise a CSV file with pandas",
                &["data"],
            ),
        ),
        (
            "excel_workbook",
            snippet(
                "Excel workbook builder",
                "Creates an XLSX workbook with formatted sheets",
                &["office"],
            ),
        ),
        (
            "plot_line",
            snippet(
                "Line chart",
                "Draw a line chart with matplotlib and save it as PNG",
                &["data", "plot"],
            ),
        ),
        (
            "text_document_conversion",
            snippet(
                "Text document conversion",
                "Converts plain text files into DOCX documents",
                &["docs"],
            ),
        ),
    ]
    .into_iter()
    .map(|(id, s)| (id.to_string(), s))
    .collect();
    CodeSnippetsConfig {
        snippets,
        ..CodeSnippetsConfig::default()
    }
}

fn ids(catalog: &Catalog, query: Option<&str>) -> Vec<String> {
    catalog.search(query).into_iter().map(|s| s.id).collect()
}

#[test]
fn search_rules_table() {
    let catalog = Catalog::new(&config(), 3);
    let zero = Catalog::new(&config(), 0);
    let cases: &[(&Catalog, &str, &[&str], &str)] = &[
        (
            &catalog,
            "DOCX create document",
            &[
                "text_document_conversion",
                "convert_docx_to_pdf",
                "a_docx_notes",
                "excel_workbook",
            ],
            "the spec's example: two words beat one; title match breaks the tie; 'create' matches 'Creates'",
        ),
        (
            &catalog,
            "XLSX risk register",
            &["excel_workbook", "a_docx_notes", "convert_docx_to_pdf"],
            "the spec's example: found through its description; filled to min_hits by id",
        ),
        (
            &zero,
            "XLSX risk register",
            &["excel_workbook"],
            "unmatched words do not disqualify",
        ),
        (&zero, "LINE Chart", &["plot_line"], "case-insensitive"),
        (
            &zero,
            "chart matplotlib",
            &["plot_line"],
            "words match across title and description",
        ),
        (
            &zero,
            "docx",
            &[
                "convert_docx_to_pdf",
                "a_docx_notes",
                "text_document_conversion",
            ],
            "title matches rank before description matches, then ids",
        ),
        (
            &zero,
            "docx docx DOCX, pdf",
            &[
                "convert_docx_to_pdf",
                "a_docx_notes",
                "text_document_conversion",
            ],
            "repeated words count once",
        ),
        (
            &zero,
            "docu",
            &["text_document_conversion"],
            "substring match ('documents')",
        ),
        (
            &zero,
            "zebra",
            &[],
            "min_hits = 0 returns only matches, here none",
        ),
        (
            &catalog,
            "zebra",
            &["a_docx_notes", "convert_docx_to_pdf", "csv_summary"],
            "min_hits = 3 fills an empty result with the first snippets by id",
        ),
        (&zero, "office provider", &[], "tags are not searched"),
    ];
    for (catalog, query, expected, why) in cases {
        assert_eq!(ids(catalog, Some(query)), *expected, "{query:?}: {why}");
    }
}

#[test]
fn blank_queries_list_everything_by_id() {
    let catalog = Catalog::new(&config(), 0);
    let all = [
        "a_docx_notes",
        "convert_docx_to_pdf",
        "csv_summary",
        "excel_workbook",
        "plot_line",
        "text_document_conversion",
    ];
    for query in [None, Some(""), Some("   "), Some(" ,.;!? -- ")] {
        assert_eq!(ids(&catalog, query), all, "{query:?}");
    }
}

#[test]
fn min_hits_never_exceeds_a_small_catalog() {
    let mut small = config();
    small
        .snippets
        .retain(|id, _| id == "csv_summary" || id == "plot_line");
    let catalog = Catalog::new(&small, 3);
    assert_eq!(ids(&catalog, Some("zebra")), ["csv_summary", "plot_line"]);
    assert_eq!(
        ids(&catalog, Some("matplotlib")),
        ["plot_line", "csv_summary"]
    );
}

#[test]
fn include_and_exclude_filters_apply_before_searching() {
    let mut c = config();
    c.include_snippet_ids = vec!["csv_summary".into()];
    c.include_snippet_tags = vec!["office".into(), "provider_eratolabs".into()];
    c.exclude_snippet_ids = vec!["convert_docx_to_pdf".into(), "csv_summary".into()];
    let catalog = Catalog::new(&c, 3);
    assert_eq!(
        ids(&catalog, None),
        ["excel_workbook"],
        "excluded ids win over includes"
    );
    assert_eq!(
        ids(&catalog, Some("docx")),
        ["excel_workbook"],
        "fill stays within the visible catalog"
    );
    assert!(catalog.get("convert_docx_to_pdf").is_none());

    let mut c = config();
    c.include_snippet_tags = vec!["data".into()];
    let catalog = Catalog::new(&c, 0);
    assert_eq!(ids(&catalog, None), ["csv_summary", "plot_line"]);
}

#[test]
fn get_returns_the_code_or_none() {
    let catalog = Catalog::new(&config(), 3);
    let s = catalog.get("plot_line").unwrap();
    assert_eq!(s.title, "Line chart");
    assert_eq!(s.tags, ["data", "plot"]);
    assert_eq!(s.required_python_packages, ["pandas"]);
    assert_eq!(s.code_snippet, "# Line chart\nprint('Line chart')\n");
    assert!(catalog.get("missing").is_none());
}

const CONFIG_TOML: &str = r#"
[search]
min_hits = 0

[code_snippets.snippets.convert_docx_to_pdf]
title = "Convert DOCX to PDF"
description = "Takes a DOCX file as input and converts it to a PDF"
required_python_packages = ["magical_docx_to_pdf"]
tags = ["provider_eratolabs"]
code_snippet = '''
import magical_docx_to_pdf
'''
"#;

fn config_file(name: &str, text: &str) -> std::path::PathBuf {
    let path =
        std::env::temp_dir().join(format!("cim-snippets-{name}-{}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn snippet_tools_over_mcp() {
    let path = config_file("on", CONFIG_TOML);
    let server = Server::start_with_args(&["--config", path.to_str().unwrap()], &[]);
    let tools = list_tools_stateless(&server);
    let names: Vec<_> = tools
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "clear_session",
            "fork_session",
            "get_code_snippet",
            "list_code_snippets",
            "list_session_files",
            "run_python_code"
        ]
    );
    for tool in &tools {
        assert!(tool["outputSchema"].is_object(), "{tool}");
    }

    let listed = call_tool_stateless(&server, "list_code_snippets", json!({"query": "docx"}));
    assert_eq!(listed["result"]["isError"], false);
    let snippets = &listed["result"]["structuredContent"]["snippets"];
    assert_eq!(snippets[0]["id"], "convert_docx_to_pdf");
    assert_eq!(
        snippets[0]["required_python_packages"],
        json!(["magical_docx_to_pdf"])
    );
    assert!(
        snippets[0].get("code_snippet").is_none(),
        "listing carries no code"
    );

    let got = call_tool_stateless(
        &server,
        "get_code_snippet",
        json!({"id": "convert_docx_to_pdf"}),
    );
    assert_eq!(
        got["result"]["structuredContent"]["snippet"]["code_snippet"],
        "import magical_docx_to_pdf\n"
    );
    let missing = call_tool_stateless(&server, "get_code_snippet", json!({"id": "nope"}));
    assert_eq!(
        missing["result"]["isError"], false,
        "a missing id is a successful lookup"
    );
    assert_eq!(
        missing["result"]["structuredContent"]["snippet"],
        serde_json::Value::Null
    );
}

#[test]
fn disabled_snippet_tools_are_absent() {
    let path = config_file(
        "off",
        &format!("{CONFIG_TOML}\n[code_snippets]\nenabled = false\n"),
    );
    let server = Server::start_with_args(&["--config", path.to_str().unwrap()], &[]);
    let names: Vec<_> = list_tools_stateless(&server)
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "clear_session",
            "fork_session",
            "list_session_files",
            "run_python_code"
        ]
    );
}
