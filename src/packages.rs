//! Where Pyodide package wheels come from (a local mirror directory or an HTTPS base URL), their
//! verification against the sha256 recorded in `pyodide-lock.json`, the in-memory cache that keeps
//! every verified wheel for the life of the server, and the names of micropip requirements.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::assets::Assets;
use crate::fetch::Fetcher;
use crate::protocol::limits::MAX_WHEEL_CACHE_BYTES;

/// The configured package source.
#[derive(Debug, Clone)]
pub enum PackageSource {
    /// A directory holding the wheels (an offline mirror of the Pyodide package directory).
    Dir(PathBuf),
    /// An HTTPS base URL (the Pyodide CDN directory of the pinned version, or a mirror of it).
    Url(String),
}

impl PackageSource {
    /// `package_base_url` as configured: an `https://` URL, a `file://` URL or a plain path.
    pub fn parse(value: &str) -> Self {
        if let Some(path) = value.strip_prefix("file://") {
            PackageSource::Dir(PathBuf::from(path))
        } else if value.starts_with("https://") || value.starts_with("http://") {
            let mut url = value.to_string();
            if !url.ends_with('/') {
                url.push('/');
            }
            PackageSource::Url(url)
        } else {
            PackageSource::Dir(PathBuf::from(value))
        }
    }

    /// The Pyodide CDN directory for the pinned version.
    pub fn default_cdn() -> Self {
        PackageSource::Url(format!(
            "https://cdn.jsdelivr.net/pyodide/v{}/full/",
            crate::assets::PYODIDE_VERSION
        ))
    }
}

/// `package_base_url` as an operator wrote it.
impl std::fmt::Display for PackageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PackageSource::Dir(dir) => write!(f, "{}", dir.display()),
            PackageSource::Url(url) => f.write_str(url),
        }
    }
}

/// Why a wheel could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("{0} is not a package of the Pyodide lock file")]
    NotInLock(String),
    #[error("cannot read wheel {file} from package directory {dir}: {source}")]
    Read {
        file: String,
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Download(String),
    #[error("sha256 mismatch for package {package} ({file}): expected {expected}, got {actual}")]
    Sha256Mismatch {
        package: String,
        file: String,
        expected: String,
        actual: String,
    },
}

/// Fetches, verifies and caches lock-file wheels.
pub struct Packages {
    source: PackageSource,
    assets: Arc<Assets>,
    fetcher: Fetcher,
    cache: Mutex<WheelCache>,
}

/// Verified wheels by file name, most recently used last, at most `MAX_WHEEL_CACHE_BYTES` in all.
#[derive(Default)]
struct WheelCache {
    entries: Vec<(String, Arc<[u8]>)>,
    bytes: usize,
}

impl WheelCache {
    fn get(&mut self, file_name: &str) -> Option<Arc<[u8]>> {
        let at = self.entries.iter().position(|(k, _)| k == file_name)?;
        let entry = self.entries.remove(at);
        let hit = entry.1.clone();
        self.entries.push(entry);
        Some(hit)
    }

    fn insert(&mut self, file_name: String, bytes: Arc<[u8]>) {
        if bytes.len() > MAX_WHEEL_CACHE_BYTES || self.entries.iter().any(|(k, _)| *k == file_name)
        {
            return;
        }
        while self.bytes + bytes.len() > MAX_WHEEL_CACHE_BYTES && !self.entries.is_empty() {
            let (_, evicted) = self.entries.remove(0);
            self.bytes -= evicted.len();
        }
        self.bytes += bytes.len();
        self.entries.push((file_name, bytes));
    }
}

impl Packages {
    pub fn new(source: PackageSource, assets: Arc<Assets>, fetcher: Fetcher) -> Self {
        Self {
            source,
            assets,
            fetcher,
            cache: Mutex::default(),
        }
    }

    /// The verified bytes of the lock-file wheel `file_name`, downloaded (when not cached) before
    /// `deadline`: this runs on a sandbox's thread, where the watchdog cannot interrupt Rust code.
    pub fn wheel(
        &self,
        file_name: &str,
        deadline: Option<std::time::Instant>,
    ) -> Result<Arc<[u8]>, PackageError> {
        if let Some(hit) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(file_name)
        {
            return Ok(hit);
        }
        let entry = self
            .assets
            .lock_by_file
            .get(file_name)
            .ok_or_else(|| PackageError::NotInLock(file_name.to_string()))?;
        let bytes = match &self.source {
            PackageSource::Dir(dir) => {
                std::fs::read(dir.join(file_name)).map_err(|source| PackageError::Read {
                    file: file_name.to_string(),
                    dir: dir.clone(),
                    source,
                })?
            }
            PackageSource::Url(base) => {
                let url = format!("{base}{file_name}");
                let response = futures::executor::block_on(self.fetcher.download(&url, deadline))
                    .map_err(|e| PackageError::Download(e.to_string()))?;
                if response.status != 200 {
                    return Err(PackageError::Download(format!(
                        "download failed (HTTP {}) for {url}",
                        response.status
                    )));
                }
                response.body
            }
        };
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != entry.sha256 {
            return Err(PackageError::Sha256Mismatch {
                package: entry.name.clone(),
                file: file_name.to_string(),
                expected: entry.sha256.clone(),
                actual,
            });
        }
        let bytes: Arc<[u8]> = bytes.into();
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(file_name.to_string(), bytes.clone());
        Ok(bytes)
    }
}

/// The distribution name of a micropip requirement: `pandas>=2` → `pandas`, `pkg[extra]` → `pkg`,
/// `name @ https://…` → `name`, a wheel URL → the name part of its file name. Names are for the tool
/// description only; versions and URLs are never shown.
pub fn requirement_name(requirement: &str) -> String {
    let requirement = requirement.trim();
    if let Some((name, _)) = requirement.split_once(" @ ") {
        return requirement_name(name);
    }
    if requirement.contains("://") || requirement.ends_with(".whl") {
        let file = requirement
            .rsplit('/')
            .next()
            .unwrap_or(requirement)
            .split(['?', '#'])
            .next()
            .unwrap_or("");
        return file.split('-').next().unwrap_or(file).replace('_', "-");
    }
    requirement
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .collect()
}

/// The modules `preimport_preinstalled` pre-imports for the preinstalled `requirement`: of the
/// modules its Pyodide lock entry provides (`imports_by_package`), the one named like the package if
/// there is one, else all but private ones (`scikit-learn` gives `sklearn`); a package outside the
/// lock gives its own name as a module. `matplotlib` gives `matplotlib.pyplot`: what plotting code
/// imports, and what loads the backend and the fonts.
pub fn top_level_modules(
    requirement: &str,
    imports_by_package: &std::collections::HashMap<String, Vec<String>>,
) -> Vec<String> {
    let name = requirement_name(requirement).to_ascii_lowercase();
    // The lock's package names: lower case, `-` between words (PEP 503).
    let normalized: String = name
        .split(['-', '_', '.'])
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    let own = normalized.replace('-', "_");
    let modules: Vec<String> = match imports_by_package.get(&normalized) {
        Some(listed) if listed.iter().any(|m| m.to_ascii_lowercase() == own) => listed
            .iter()
            .filter(|m| m.to_ascii_lowercase() == own)
            .take(1)
            .cloned()
            .collect(),
        Some(listed) if !listed.is_empty() => listed
            .iter()
            .filter(|m| !m.starts_with('_'))
            .cloned()
            .collect(),
        _ => vec![own],
    };
    modules
        .into_iter()
        .filter(|m| {
            m.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && m.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|m| {
            if m == "matplotlib" {
                "matplotlib.pyplot".to_string()
            } else {
                m
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preinstalled_packages_give_their_top_level_modules() {
        let lock: std::collections::HashMap<String, Vec<String>> = [
            ("pandas", vec!["pandas"]),
            ("matplotlib", vec!["pylab", "mpl_toolkits", "matplotlib"]),
            ("scikit-learn", vec!["sklearn"]),
            ("pyyaml", vec!["_yaml", "yaml"]),
            ("python-dateutil", vec!["dateutil"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
        .collect();
        let modules = |requirement| top_level_modules(requirement, &lock);
        assert_eq!(modules("pandas>=2"), ["pandas"]);
        assert_eq!(modules("matplotlib"), ["matplotlib.pyplot"]);
        assert_eq!(modules("scikit_learn==1.5"), ["sklearn"]);
        assert_eq!(modules("PyYAML"), ["yaml"]);
        assert_eq!(modules("python-dateutil"), ["dateutil"]);
        // Outside the lock: the package's own name.
        assert_eq!(modules("seaborn"), ["seaborn"]);
        assert_eq!(
            modules("snowballstemmer @ https://example.org/x.whl"),
            ["snowballstemmer"]
        );
        assert_eq!(modules("some-pkg[extra]"), ["some_pkg"]);
    }

    #[test]
    fn requirement_names_drop_versions_extras_and_urls() {
        assert_eq!(requirement_name("pandas"), "pandas");
        assert_eq!(
            requirement_name("snowballstemmer==3.0.1"),
            "snowballstemmer"
        );
        assert_eq!(requirement_name(" requests[socks] >= 2 "), "requests");
        assert_eq!(
            requirement_name("tiny @ https://example.org/tiny-1.0-py3-none-any.whl"),
            "tiny"
        );
        assert_eq!(
            requirement_name("https://example.org/a/my_pkg-1.0-py3-none-any.whl?x=1"),
            "my-pkg"
        );
        assert_eq!(requirement_name("emfs:/tmp/x-2.0-py3-none-any.whl"), "x");
    }
}
