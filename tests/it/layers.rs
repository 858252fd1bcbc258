//! The layer rule of `src/lib.rs` holds in the code: every `crate::` path in a top-level module names a
//! module of a lower layer (so there are no cycles between them either); and inside `sandbox`, the
//! same rule between its modules (see `src/sandbox/mod.rs`).

use std::path::{Path, PathBuf};

/// The top-level modules, top-down; a module may use only modules that come after it here. Modules
/// on one line are one layer: they may not use each other.
const LAYERS: &[&[&str]] = &[
    &["cli"],
    &["app"],
    &["transport"],
    &["tools"],
    &["pool", "sessions"],
    &["sandbox"],
    &["packages"],
    &["fetch", "assets", "store"],
    &["telemetry"],
    &["config"],
    &["protocol"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The modules of `src/sandbox`, top-down, as `LAYERS` lists the crate's.
const SANDBOX_LAYERS: &[&[&str]] = &[
    &["engine"],
    &["isolate"],
    &["prepared"],
    &["cow"],
    &["memory", "image", "types"],
];

/// The modules named by `crate::NAME` in `source`, outside comments.
fn crate_paths(source: &str) -> Vec<String> {
    paths_after(source, "crate::")
}

/// The names that follow `prefix` in `source`, outside comments.
fn paths_after(source: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let after = &rest[at + prefix.len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `use crate::{a, b}` is not used in this code base; a `{` would need a parser.
            assert!(
                !after.starts_with('{'),
                "grouped crate:: import in {line:?}"
            );
            out.push(name);
            rest = after;
        }
    }
    out
}

#[test]
fn modules_use_only_lower_layers() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let own = layer_of(&top).unwrap_or_else(|| panic!("{top} is not in LAYERS"));
        for used in crate_paths(&std::fs::read_to_string(&file).unwrap()) {
            checked += 1;
            if used == top {
                continue;
            }
            let layer = layer_of(&used).unwrap_or_else(|| panic!("{used} is not in LAYERS"));
            if layer <= own {
                violations.push(format!("{} uses crate::{used}", relative.display()));
            }
        }
    }
    assert!(checked > 20, "only {checked} crate:: paths found");
    assert!(violations.is_empty(), "imports that climb: {violations:#?}");
}

#[test]
fn the_layer_list_matches_the_modules_of_lib_rs() {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let mut declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .chain(lib.contains("as config;").then_some("config"))
        .chain(lib.contains("as protocol;").then_some("protocol"))
        .collect();
    declared.sort();
    let mut listed: Vec<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    listed.sort();
    assert_eq!(declared, listed);
}

#[test]
fn sandbox_modules_use_only_lower_ones() {
    let sandbox = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/sandbox");
    let layer = |module: &str| SANDBOX_LAYERS.iter().position(|l| l.contains(&module));
    let mut files = Vec::new();
    rust_files(&sandbox, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in files {
        let relative = file.strip_prefix(&sandbox).unwrap();
        let own = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if own == "mod" {
            continue;
        }
        let own_layer = layer(&own).unwrap_or_else(|| panic!("{own} is not in SANDBOX_LAYERS"));
        let source = std::fs::read_to_string(&file).unwrap();
        for used in paths_after(&source, "crate::sandbox::") {
            checked += 1;
            if used == own {
                continue;
            }
            match layer(&used) {
                None => violations.push(format!(
                    "sandbox/{} uses crate::sandbox::{used}: name the module, not a re-export",
                    relative.display()
                )),
                Some(l) if l <= own_layer => violations.push(format!(
                    "sandbox/{} uses crate::sandbox::{used}",
                    relative.display()
                )),
                Some(_) => {}
            }
        }
    }
    assert!(checked > 10, "only {checked} crate::sandbox:: paths found");
    assert!(violations.is_empty(), "imports that climb: {violations:#?}");
}

#[test]
fn the_sandbox_layer_list_matches_its_modules() {
    let root = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/sandbox/mod.rs"))
        .unwrap();
    let mut declared: Vec<&str> = root
        .lines()
        .filter_map(|l| {
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
        })
        .map(|l| l.trim_end_matches(';'))
        .collect();
    declared.sort();
    let mut listed: Vec<&str> = SANDBOX_LAYERS
        .iter()
        .flat_map(|l| l.iter().copied())
        .collect();
    listed.sort();
    assert_eq!(declared, listed);
}
