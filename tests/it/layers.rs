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
    &["pool", "sessions", "apps"],
    &["sandbox"],
    &["packages", "upstream"],
    &["fetch", "assets", "store"],
    &["telemetry"],
    &["config"],
    &["protocol"],
];

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
    &["pages", "memory", "image", "types"],
];

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
                "grouped {prefix} import in {line:?}"
            );
            out.push(name);
            rest = after;
        }
    }
    out
}

/// Every use of `PREFIX NAME` under `dir` (relative to the crate) that does not name a module of
/// a layer below the file's own, with how many such paths were read. A file's module is its first
/// path component under `dir`; the files named in `roots` (the folder's root module) are skipped.
fn climbs(dir: &str, layers: &[&[&str]], prefix: &str, roots: &[&str]) -> (usize, Vec<String>) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let layer = |module: &str| layers.iter().position(|l| l.contains(&module));
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in files {
        let relative = file.strip_prefix(&root).unwrap();
        let own = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if roots.contains(&own.as_str()) {
            continue;
        }
        let own_layer = layer(&own).unwrap_or_else(|| panic!("{dir}: {own} is not in the list"));
        let source = std::fs::read_to_string(&file).unwrap();
        for used in paths_after(&source, prefix) {
            checked += 1;
            if used == own {
                continue;
            }
            match layer(&used) {
                None => violations.push(format!(
                    "{dir}/{} uses {prefix}{used}: name a module of the list, not a re-export",
                    relative.display()
                )),
                Some(l) if l <= own_layer => {
                    violations.push(format!("{dir}/{} uses {prefix}{used}", relative.display()))
                }
                Some(_) => {}
            }
        }
    }
    (checked, violations)
}

#[test]
fn modules_use_only_lower_layers() {
    let (checked, violations) = climbs("src", LAYERS, "crate::", &["lib", "main"]);
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
    let (checked, violations) = climbs("src/sandbox", SANDBOX_LAYERS, "crate::sandbox::", &["mod"]);
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

/// The `.rs` files under `dir` (relative to the crate), with their text.
fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut pending = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, text));
            }
        }
    }
    out
}

/// The memory wing (`src/sandbox/pages/`, #49.1) builds without V8 and imports nothing else of the
/// sandbox; no file outside it makes a system call on memory.
#[test]
fn the_memory_wing_knows_no_v8_and_holds_every_memory_system_call() {
    let wing = sources("src/sandbox/pages");
    assert!(wing.len() >= 6, "{} files in the wing", wing.len());
    for (path, text) in &wing {
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            assert!(
                !line.contains("v8") && !line.contains("deno_core"),
                "{} names V8: {line}",
                path.display()
            );
            let outside = line
                .match_indices("crate::sandbox::")
                .any(|(at, _)| !line[at..].starts_with("crate::sandbox::pages"));
            assert!(
                !outside,
                "{} imports outside the wing: {line}",
                path.display()
            );
        }
    }
    const CALLS: [&str; 9] = [
        "rustix::mm",
        "rustix::ioctl",
        "linux_raw_sys",
        "libc::mmap",
        "libc::munmap",
        "libc::mremap",
        "libc::madvise",
        "libc::memfd_create",
        "libc::ioctl",
    ];
    for (path, text) in sources("src") {
        if path.components().any(|c| c.as_os_str() == "pages") {
            continue;
        }
        for call in CALLS {
            assert!(
                !text.contains(call),
                "{} calls {call} outside the memory wing",
                path.display()
            );
        }
    }
}
