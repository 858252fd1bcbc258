//! The pinned Pyodide distribution: finding its directory, checking that every runtime file is there
//! and is the pinned version, and holding the files in memory so every sandbox boots from the same bytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The npm `pyodide` version this build is written against.
pub const PYODIDE_VERSION: &str = "314.0.3";

/// Files the pinned npm package installs that the engine needs at run time.
pub const REQUIRED_FILES: [&str; 6] = [
    "package.json",
    "pyodide.mjs",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
];

/// Why the asset directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error(
        "Pyodide asset directory {dir} is missing {file} (run `npm install --ignore-scripts` in the project \
         directory, or point asset_dir / CODE_INTERPRETER_MCP_ASSET_DIR at the files of the npm package \
         pyodide@{PYODIDE_VERSION})"
    )]
    Missing { dir: PathBuf, file: &'static str },
    #[error("cannot read {file} in Pyodide asset directory {dir}: {source}")]
    Unreadable {
        dir: PathBuf,
        file: &'static str,
        source: std::io::Error,
    },
    #[error(
        "Pyodide asset directory {dir} holds pyodide {found}, but this build needs pyodide@{PYODIDE_VERSION}"
    )]
    WrongVersion { dir: PathBuf, found: String },
    #[error("{file} in Pyodide asset directory {dir} is malformed: {reason}")]
    Malformed {
        dir: PathBuf,
        file: &'static str,
        reason: String,
    },
}

/// One package entry of `pyodide-lock.json`, as far as the engine needs it.
#[derive(Debug, Clone)]
pub struct LockPackage {
    pub name: String,
    pub file_name: String,
    pub sha256: String,
}

/// The Pyodide runtime files, read once and shared by every sandbox.
#[derive(Debug)]
pub struct Assets {
    pub dir: PathBuf,
    pub loader_js: Arc<str>,
    pub asm_js: Arc<str>,
    pub wasm: Arc<[u8]>,
    pub stdlib: Arc<[u8]>,
    pub lock_json: Arc<str>,
    /// Lock-file packages by wheel file name.
    pub lock_by_file: HashMap<String, LockPackage>,
    /// The modules each lock-file package provides (its `imports`), by package name.
    pub imports_by_package: HashMap<String, Vec<String>>,
}

/// `node_modules/PATH` (a file an npm package installs) in the working directory if it is there,
/// else beside this crate's manifest if it is there (a development checkout), else the first.
pub fn npm_path(path: &str) -> PathBuf {
    let local = Path::new("node_modules").join(path);
    if local.exists() {
        return local;
    }
    let dev = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("node_modules")
        .join(path);
    if dev.exists() { dev } else { local }
}

impl Assets {
    /// The directory used when no `asset_dir` is configured: `node_modules/pyodide` in the working
    /// directory, else the one next to this crate's manifest (a development checkout).
    pub fn default_dir() -> PathBuf {
        let wasm = npm_path("pyodide/pyodide.asm.wasm");
        wasm.parent().map(Path::to_path_buf).unwrap_or(wasm)
    }

    /// Checks and loads every required file from `dir`.
    pub fn load(dir: &Path) -> Result<Self, AssetError> {
        for file in REQUIRED_FILES {
            if !dir.join(file).is_file() {
                return Err(AssetError::Missing {
                    dir: dir.to_path_buf(),
                    file,
                });
            }
        }
        let read = |file: &'static str| {
            std::fs::read(dir.join(file)).map_err(|source| AssetError::Unreadable {
                dir: dir.to_path_buf(),
                file,
                source,
            })
        };
        let text = |file: &'static str| {
            String::from_utf8(read(file)?).map_err(|_| AssetError::Malformed {
                dir: dir.to_path_buf(),
                file,
                reason: "not UTF-8 text".into(),
            })
        };
        let malformed = |file: &'static str, reason: String| AssetError::Malformed {
            dir: dir.to_path_buf(),
            file,
            reason,
        };

        let package: serde_json::Value = serde_json::from_str(&text("package.json")?)
            .map_err(|e| malformed("package.json", e.to_string()))?;
        let version = package["version"].as_str().unwrap_or("(none)");
        if version != PYODIDE_VERSION {
            return Err(AssetError::WrongVersion {
                dir: dir.to_path_buf(),
                found: version.to_string(),
            });
        }

        let lock_json = text("pyodide-lock.json")?;
        let lock: serde_json::Value = serde_json::from_str(&lock_json)
            .map_err(|e| malformed("pyodide-lock.json", e.to_string()))?;
        let packages = lock["packages"]
            .as_object()
            .ok_or_else(|| malformed("pyodide-lock.json", "no `packages` table".into()))?;
        let lock_by_file = packages
            .iter()
            .filter_map(|(name, entry)| {
                let file_name = entry["file_name"].as_str()?.to_string();
                let sha256 = entry["sha256"].as_str()?.to_ascii_lowercase();
                Some((
                    file_name.clone(),
                    LockPackage {
                        name: name.clone(),
                        file_name,
                        sha256,
                    },
                ))
            })
            .collect();

        let imports_by_package = packages
            .iter()
            .map(|(name, entry)| {
                let imports = entry["imports"]
                    .as_array()
                    .map(|list| {
                        list.iter()
                            .filter_map(|m| m.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                (name.clone(), imports)
            })
            .collect();

        let wasm = read("pyodide.asm.wasm")?;
        if !wasm.starts_with(b"\0asm") {
            return Err(malformed(
                "pyodide.asm.wasm",
                "not a WebAssembly module".into(),
            ));
        }

        Ok(Self {
            dir: dir.to_path_buf(),
            loader_js: text("pyodide.mjs")?.into(),
            asm_js: text("pyodide.asm.mjs")?.into(),
            wasm: wasm.into(),
            stdlib: read("python_stdlib.zip")?.into(),
            lock_json: lock_json.into(),
            lock_by_file,
            imports_by_package,
        })
    }
}
