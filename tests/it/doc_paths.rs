//! Docs that cannot drift (#49.5): every repository path named in README.md, SECURITY.md, docs/
//! (except the append-only measurement log, which is history) and the doc comments (`//!`, `///`)
//! of src/ and crates/ exists.

use std::path::{Path, PathBuf};

/// The top-level directories a named path starts with.
const ROOTS: [&str; 10] = [
    "src/",
    "crates/",
    "tests/",
    "benches/",
    "scripts/",
    "docs/",
    "deploy/",
    "fuzz/",
    "examples/",
    ".ci/",
];

/// The paths named in `text`: words starting with one of [`ROOTS`], without trailing punctuation;
/// patterns and placeholders (`*`, `<name>`, `{id}`, `$VAR`, `…`) are not paths.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in text.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '`' | '(' | ')' | '[' | ']' | '"' | '\'' | ',' | ';' | '|'
            )
    }) {
        let Some(start) = ROOTS.iter().filter_map(|r| word.find(r)).min() else {
            continue;
        };
        // (Only a word that is the path, or a path after `../` or `./`: not a URL's tail.)
        let before = &word[..start];
        if !(before.is_empty() || before == "./") {
            continue;
        }
        let path = word[start..].split("::").next().unwrap_or_default();
        let path = path.trim_end_matches(['.', ':', '!', '?']);
        if path.contains(['*', '<', '{', '$', '…', '#']) || path.contains("...") {
            continue;
        }
        out.push(path.to_string());
    }
    out
}

/// File names a doc comment names relative to its module (`ops/realm.js`, `prepared/layer.rs`).
const EXTENSIONS: [&str; 8] = [".rs", ".js", ".py", ".md", ".toml", ".sh", ".json", ".txt"];

/// The relative file paths in a doc comment's `text` (with a `/`, ending in a known extension, not
/// rooted at the repository's top, not a URL).
fn relative_paths(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '`' | '(' | ')' | '[' | ']' | '"' | ','))
        .map(|w| w.split("::").next().unwrap_or_default())
        .map(|w| w.trim_end_matches(['.', ':', '!', '?', ';']))
        .filter(|w| w.contains('/') && !w.contains("://"))
        .filter(|w| EXTENSIONS.iter().any(|e| w.ends_with(e)))
        .filter(|w| !ROOTS.iter().any(|r| w.starts_with(r)))
        .filter(|w| !w.contains(['*', '<', '{', '$', '…', '#']))
        .map(str::to_string)
        .collect()
}

fn files(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, keep, out);
        } else if keep(&path) {
            out.push(path);
        }
    }
}

#[test]
fn every_path_named_in_docs_and_module_comments_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![root.join("README.md"), root.join("SECURITY.md")];
    files(
        &root.join("docs"),
        &|p| p.extension().is_some_and(|e| e == "md") && !p.ends_with("performance-log.md"),
        &mut sources,
    );
    let mut rust = Vec::new();
    for dir in ["src", "crates"] {
        files(
            &root.join(dir),
            &|p| p.extension().is_some_and(|e| e == "rs"),
            &mut rust,
        );
    }
    let mut missing = Vec::new();
    let mut relative_missing = Vec::new();
    let mut checked = 0;
    let mut check = |file: &Path, line: usize, text: &str| {
        for path in named_paths(text) {
            checked += 1;
            if !root.join(&path).exists() {
                let shown = file
                    .strip_prefix(root)
                    .unwrap_or(file)
                    .display()
                    .to_string();
                missing.push(format!("{shown}:{line}: {path}"));
            }
        }
    };
    for file in &sources {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            check(file, n + 1, line);
        }
    }
    for file in &rust {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if let Some(doc) = trimmed
                .strip_prefix("//!")
                .or_else(|| trimmed.strip_prefix("///"))
            {
                check(file, n + 1, doc);
                // A relative path names a file beside the module or in a folder above it.
                for path in relative_paths(doc) {
                    let found = file
                        .ancestors()
                        .skip(1)
                        .take_while(|dir| dir.starts_with(root))
                        .any(|dir| dir.join(&path).exists());
                    if !found {
                        let shown = file.strip_prefix(root).unwrap_or(file).display();
                        relative_missing.push(format!("{shown}:{}: {path}", n + 1));
                    }
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: is the scan broken?"
    );
    missing.extend(relative_missing);
    assert!(
        missing.is_empty(),
        "paths named in docs or doc comments that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn named_paths_are_found_and_patterns_skipped() {
    assert_eq!(
        named_paths("see `src/tools/run.rs`, and (docs/performance.md). Also tests/it/*.rs"),
        ["src/tools/run.rs", "docs/performance.md"]
    );
    assert_eq!(
        named_paths("../shared/pyodide-packages and https://example.com/src/x.rs"),
        Vec::<String>::new()
    );
    assert_eq!(named_paths("./scripts/test:"), ["scripts/test"]);
    assert_eq!(
        named_paths("tests/it/preimport.rs::a_test"),
        ["tests/it/preimport.rs"]
    );
    assert_eq!(
        relative_paths("the glue (`ops/realm.js`), src/lib.rs, https://x.org/a/b.js"),
        ["ops/realm.js"]
    );
}
