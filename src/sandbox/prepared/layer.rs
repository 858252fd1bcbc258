//! The durable local package layer: the files that micropip and `preinstall_packages` add to a fresh
//! Pyodide (under `/lib` and `/usr/lib`), captured once by an installer sandbox, kept on disk under
//! `package_cache_dir` and copied into every new sandbox's MEMFS. Only files travel; interpreter state
//! never does.
//!
//! The layer on disk is reused while its key (layer format, Pyodide version, requirement list) matches
//! the configuration, and rebuilt otherwise. A cache directory that cannot be written is not fatal: the
//! layer then lives in memory for this process only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::assets::PYODIDE_VERSION;
use crate::sandbox::cow::CowBytes;

/// Bumped whenever the on-disk format or what the installer captures changes.
const LAYER_FORMAT: u32 = 1;
const MANIFEST: &str = "manifest.json";
const FILES: &str = "files";

/// What decides whether a layer on disk may be reused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerKey {
    pub format: u32,
    pub pyodide_version: String,
    pub requirements: Vec<String>,
}

impl LayerKey {
    pub fn new(requirements: &[String]) -> Self {
        Self {
            format: LAYER_FORMAT,
            pyodide_version: PYODIDE_VERSION.to_string(),
            requirements: requirements.to_vec(),
        }
    }
}

/// The manifest stored next to the files.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    key: LayerKey,
    /// Pyodide's `loadedPackages` entries the installer added (name, channel).
    loaded_packages: Vec<(String, String)>,
    /// Absolute paths inside the sandbox, in the order they are written.
    files: Vec<String>,
}

/// The files and package records every sandbox receives.
pub struct PackageLayer {
    /// All file contents back to back, held once: in the sealed in-memory file every sandbox maps
    /// (`cow.rs`), not also in the engine's heap. `index` says where each file starts and ends.
    pub(crate) contents: CowBytes,
    /// The length of `contents`.
    len: usize,
    /// See [`PackageLayer::digest`].
    digest: String,
    /// (absolute path in the sandbox, offset, length).
    pub index: Vec<(String, u32, u32)>,
    /// Pyodide `loadedPackages` entries to restore, so imports of layer packages are not re-fetched.
    pub loaded_packages: Vec<(String, String)>,
    /// Where this layer came from.
    pub origin: LayerOrigin,
    /// The layer as a tree: each directory's entries (made on first use; see `children`).
    tree: std::sync::OnceLock<HashMap<String, Vec<Child>>>,
}

/// One entry of a directory of the layer: (name, is a directory, offset, length); a directory's
/// offset and length are 0.
pub type Child = (String, bool, u32, u32);

/// Where a prepared layer came from (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerOrigin {
    /// Installed now and written to `package_cache_dir`.
    #[default]
    Built,
    /// Read back from `package_cache_dir`.
    Reused,
    /// Installed now; the cache directory could not be written.
    BuiltInMemory,
    /// Empty: no package source was reachable at start-up and nothing was asked to be preinstalled,
    /// so the server runs without micropip (its wheel is refused, so it is never loaded without the
    /// installation policy the layer adds to it).
    Offline,
}

/// Files captured by the installer.
#[derive(Debug, Default)]
pub struct Captured {
    pub files: Vec<(String, Vec<u8>)>,
    pub loaded_packages: Vec<(String, String)>,
}

impl PackageLayer {
    /// Builds the in-memory form. `patch` may rewrite a file's contents (micropip's policy hook).
    pub fn from_files(
        files: Vec<(String, Vec<u8>)>,
        loaded_packages: Vec<(String, String)>,
        origin: LayerOrigin,
        mut patch: impl FnMut(&str, Vec<u8>) -> Vec<u8>,
    ) -> Result<Self, String> {
        let mut blob = Vec::with_capacity(files.iter().map(|(_, data)| data.len()).sum());
        let mut index = Vec::with_capacity(files.len());
        for (path, data) in files {
            let data = patch(&path, data);
            let offset = u32::try_from(blob.len())
                .map_err(|_| "the package layer exceeds 4 GiB".to_string())?;
            let len = u32::try_from(data.len())
                .map_err(|_| format!("{path} in the package layer exceeds 4 GiB"))?;
            blob.extend_from_slice(&data);
            index.push((path, offset, len));
        }
        Ok(PackageLayer {
            digest: digest(&index, &blob),
            len: blob.len(),
            contents: CowBytes::new(&blob),
            index,
            loaded_packages,
            origin,
            tree: Default::default(),
        })
    }

    /// Total bytes of file content.
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// The entries of directory `dir` (an absolute path without a trailing slash) in the layer:
    /// sandboxes put files into MEMFS a directory at a time, when first looked up.
    pub fn children(&self, dir: &str) -> &[Child] {
        let tree = self.tree.get_or_init(|| {
            let mut tree: HashMap<String, Vec<Child>> = HashMap::new();
            let mut dirs = std::collections::HashSet::new();
            for (path, offset, length) in &self.index {
                let Some((parent, name)) = path.rsplit_once('/') else {
                    continue;
                };
                tree.entry(parent.to_string()).or_default().push((
                    name.to_string(),
                    false,
                    *offset,
                    *length,
                ));
                // Each ancestor directory is an entry of its own parent, once.
                let mut dir = parent;
                while let Some((up, name)) = dir.rsplit_once('/') {
                    if !dirs.insert(dir.to_string()) {
                        break;
                    }
                    tree.entry(up.to_string())
                        .or_default()
                        .push((name.to_string(), true, 0, 0));
                    dir = up;
                }
            }
            tree
        });
        tree.get(dir).map_or(&[], Vec::as_slice)
    }

    /// Whether the layer holds the top-level Python module `name` in a `site-packages` directory: a
    /// package directory, a `.py` file or an extension module.
    pub fn has_top_level_module(&self, name: &str) -> bool {
        let (file, extension) = (format!("{name}.py"), format!("{name}."));
        self.index.iter().any(|(path, _, _)| {
            let Some((_, rest)) = path.split_once("/site-packages/") else {
                return false;
            };
            let first = rest.split('/').next().unwrap_or(rest);
            (first == name && rest.len() > name.len())
                || first == file
                || (first.starts_with(&extension) && first.ends_with(".so"))
        })
    }

    /// Where the file at `path` (an absolute path in the sandbox) is in `contents`: (offset,
    /// length). Looked up in its directory (`children`), not in the whole index: sandboxes that
    /// relink a snapshot's libraries ask for each of them.
    fn entry(&self, path: &str) -> Option<(u32, u32)> {
        let (dir, name) = path.rsplit_once('/')?;
        self.children(dir)
            .iter()
            .find(|(n, is_dir, _, _)| n == name && !is_dir)
            .map(|(_, _, offset, length)| (*offset, *length))
    }

    /// Whether the layer holds a file at `path` (an absolute path in the sandbox).
    pub fn has_file(&self, path: &str) -> bool {
        self.entry(path).is_some()
    }

    /// A copy of the contents of the file at `path` (an absolute path in the sandbox).
    pub fn file(&self, path: &str) -> Result<Vec<u8>, String> {
        let (offset, length) = self
            .entry(path)
            .ok_or_else(|| format!("{path} is not in the package layer"))?;
        self.contents
            .read(offset as usize, length as usize)
            .map_err(|e| format!("reading {path} from the package layer: {e}"))
    }

    /// A digest of every file's path and contents (what a snapshot with pre-imported packages was
    /// taken from).
    pub fn digest(&self) -> &str {
        &self.digest
    }
}

impl std::fmt::Debug for PackageLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackageLayer")
            .field("files", &self.index.len())
            .field("bytes", &self.len)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// The digest of a layer's index and contents (see [`PackageLayer::digest`]).
fn digest(index: &[(String, u32, u32)], blob: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for (path, offset, length) in index {
        hash.update((path.len() as u64).to_le_bytes());
        hash.update(path.as_bytes());
        hash.update(u64::from(*offset).to_le_bytes());
        hash.update(u64::from(*length).to_le_bytes());
    }
    hash.update(blob);
    hex::encode(&hash.finalize()[..12])
}

/// The layer directory for `cache_dir`.
pub fn layer_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("layer")
}

/// Reads the layer under `cache_dir` if its key matches; `Ok(None)` when it is missing or stale,
/// `Err` when it matches but cannot be read (it is then rebuilt).
pub fn load(cache_dir: &Path, key: &LayerKey) -> Result<Option<Captured>, String> {
    let dir = layer_dir(cache_dir);
    let manifest = match std::fs::read(dir.join(MANIFEST)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.join(MANIFEST).display())),
    };
    let manifest: Manifest = match serde_json::from_slice(&manifest) {
        Ok(m) => m,
        Err(e) => {
            return Err(format!(
                "{} is malformed: {e}",
                dir.join(MANIFEST).display()
            ));
        }
    };
    if &manifest.key != key {
        return Ok(None);
    }
    let mut files = Vec::with_capacity(manifest.files.len());
    for path in manifest.files {
        let local = local_path(&dir, &path)?;
        let data =
            std::fs::read(&local).map_err(|e| format!("cannot read {}: {e}", local.display()))?;
        files.push((path, data));
    }
    Ok(Some(Captured {
        files,
        loaded_packages: manifest.loaded_packages,
    }))
}

/// Writes a freshly built layer under `cache_dir`, replacing any previous one. The new layer is
/// assembled in a temporary directory and renamed into place, so a crash never leaves a half layer
/// that looks valid.
pub fn store(cache_dir: &Path, key: &LayerKey, captured: &Captured) -> Result<(), String> {
    let io = |what: &str, path: &Path, e: std::io::Error| {
        format!("cannot {what} {}: {e}", path.display())
    };
    std::fs::create_dir_all(cache_dir).map_err(|e| io("create", cache_dir, e))?;
    let tmp = cache_dir.join(format!("layer.tmp-{}", unique_suffix()));
    let write = || -> Result<(), String> {
        for (path, data) in &captured.files {
            let local = local_path(&tmp, path)?;
            if let Some(parent) = local.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io("create", parent, e))?;
            }
            std::fs::write(&local, data).map_err(|e| io("write", &local, e))?;
        }
        let manifest = Manifest {
            key: key.clone(),
            loaded_packages: captured.loaded_packages.clone(),
            files: captured.files.iter().map(|(p, _)| p.clone()).collect(),
        };
        let manifest_path = tmp.join(MANIFEST);
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?;
        std::fs::write(&manifest_path, json).map_err(|e| io("write", &manifest_path, e))?;
        let dir = layer_dir(cache_dir);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| io("remove", &dir, e))?;
        }
        std::fs::rename(&tmp, &dir).map_err(|e| io("rename", &tmp, e))
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&tmp);
    })
}

/// A temporary-name suffix no other writer (thread or process) uses at the same time.
pub(super) fn unique_suffix() -> String {
    let mut random = [0u8; 8];
    let _ = getrandom::fill(&mut random);
    format!("{}-{}", std::process::id(), hex::encode(random))
}

/// Maps an absolute sandbox path to its place under `root/files`, refusing anything that could
/// escape it.
fn local_path(root: &Path, sandbox_path: &str) -> Result<PathBuf, String> {
    let relative = sandbox_path
        .strip_prefix('/')
        .ok_or_else(|| format!("layer path {sandbox_path:?} is not absolute"))?;
    let mut out = root.join(FILES);
    for part in relative.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("layer path {sandbox_path:?} is not canonical"));
        }
        out.push(part);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_lists_each_directory_with_its_files_and_subdirectories() {
        let files = ["/sp/a/x.py", "/sp/a/b/y.so", "/sp/c.pth", "/sp/a/z.py"]
            .map(|p| (p.to_string(), p.as_bytes().to_vec()))
            .to_vec();
        let layer =
            PackageLayer::from_files(files, Vec::new(), LayerOrigin::Built, |_, d| d).unwrap();
        let names = |dir: &str| {
            let mut v: Vec<(String, bool)> = layer
                .children(dir)
                .iter()
                .map(|(n, d, _, _)| (n.clone(), *d))
                .collect();
            v.sort();
            v
        };
        let e = |n: &str, d: bool| (n.to_string(), d);
        assert_eq!(names(""), [e("sp", true)]);
        assert_eq!(names("/sp"), [e("a", true), e("c.pth", false)]);
        assert_eq!(
            names("/sp/a"),
            [e("b", true), e("x.py", false), e("z.py", false)]
        );
        assert_eq!(names("/sp/a/b"), [e("y.so", false)]);
        assert!(names("/sp/a/b/y.so").is_empty());
        assert!(names("/nowhere").is_empty());
        let (_, _, offset, length) = layer.children("/sp/a/b")[0].clone();
        assert_eq!(
            layer
                .contents
                .read(offset as usize, length as usize)
                .unwrap(),
            b"/sp/a/b/y.so"
        );
        assert_eq!(layer.file("/sp/a/b/y.so").unwrap(), b"/sp/a/b/y.so");
        assert!(layer.has_file("/sp/a/b/y.so"));
        assert!(!layer.has_file("/sp/a/b"));
    }

    #[test]
    fn layer_paths_cannot_escape() {
        let root = Path::new("/cache/layer");
        assert!(local_path(root, "/lib/python3.14/site-packages/a.py").is_ok());
        assert!(local_path(root, "lib/a.py").is_err());
        assert!(local_path(root, "/lib/../../etc/passwd").is_err());
        assert!(local_path(root, "/lib//a").is_err());
    }

    #[test]
    fn a_layer_round_trips_through_disk_and_only_its_own_key_reuses_it() {
        let dir = std::env::temp_dir().join(format!("cim-layer-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let key = LayerKey::new(&["pandas".to_string()]);
        let captured = Captured {
            files: vec![("/lib/x/a.py".into(), b"print(1)".to_vec())],
            loaded_packages: vec![("pandas".into(), "default channel".into())],
        };
        store(&dir, &key, &captured).unwrap();
        let back = load(&dir, &key).unwrap().unwrap();
        assert_eq!(back.files, captured.files);
        assert_eq!(back.loaded_packages, captured.loaded_packages);
        let other = LayerKey::new(&["numpy".to_string()]);
        assert!(load(&dir, &other).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
