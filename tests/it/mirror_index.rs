//! The local wheel mirror's pure-Python wheels that are not in Pyodide's lock file (plotly, narwhals,
//! seaborn, tabulate, ...) served as a PEP 691 simple index over loopback HTTPS, so that sandboxes
//! install them with micropip (`%pip install`) as from any private index: `allowed_hosts` localhost,
//! the index's CA in `extra_ca_certs`, its URL in `package_index_urls`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::tls::TlsServer;

pub struct MirrorIndex {
    pub server: TlsServer,
}

impl MirrorIndex {
    /// Serves `mirror`'s `*-py3-none-any.whl` files not named in `lock_json`; the CA goes into `dir`.
    pub fn start(mirror: &Path, lock_json: &str, dir: &Path) -> Self {
        use axum::extract::Path as UrlPath;
        use axum::http::{StatusCode, header};
        use axum::response::IntoResponse;

        let lock: serde_json::Value = serde_json::from_str(lock_json).unwrap();
        let locked: Vec<String> = lock["packages"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(|p| p["file_name"].as_str().map(str::to_string))
            .collect();
        // project -> [(file name, path)]
        let mut projects: BTreeMap<String, Vec<(String, PathBuf)>> = BTreeMap::new();
        for entry in std::fs::read_dir(mirror).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if !name.ends_with("-none-any.whl") || locked.contains(&name) {
                continue;
            }
            let project = normalise(name.split('-').next().unwrap());
            projects.entry(project).or_default().push((name, path));
        }
        let projects = Arc::new(projects);
        let server = TlsServer::start(dir, move |port| {
            let listing = projects.clone();
            let files = projects.clone();
            axum::Router::new()
                .route(
                    "/simple/{project}/",
                    axum::routing::get(move |UrlPath(project): UrlPath<String>| {
                        let listing = listing.clone();
                        async move {
                            let Some(wheels) = listing.get(&normalise(&project)) else {
                                return StatusCode::NOT_FOUND.into_response();
                            };
                            let files: Vec<serde_json::Value> = wheels
                                .iter()
                                .map(|(name, path)| {
                                    use sha2::Digest as _;
                                    let digest = sha2::Sha256::digest(std::fs::read(path).unwrap());
                                    serde_json::json!({
                                        "filename": name,
                                        "url": format!("https://localhost:{port}/files/{name}"),
                                        "hashes": {"sha256": hex(&digest)},
                                    })
                                })
                                .collect();
                            let versions: Vec<&str> = wheels
                                .iter()
                                .filter_map(|(name, _)| name.split('-').nth(1))
                                .collect();
                            let body = serde_json::json!({
                                "meta": {"api-version": "1.1"},
                                "name": normalise(&project),
                                "versions": versions,
                                "files": files,
                            });
                            (
                                [(header::CONTENT_TYPE, "application/vnd.pypi.simple.v1+json")],
                                body.to_string(),
                            )
                                .into_response()
                        }
                    }),
                )
                .route(
                    "/files/{name}",
                    axum::routing::get(move |UrlPath(name): UrlPath<String>| {
                        let files = files.clone();
                        async move {
                            let found = files
                                .values()
                                .flatten()
                                .find(|(file, _)| *file == name)
                                .map(|(_, path)| path.clone());
                            match found {
                                Some(path) => std::fs::read(path).unwrap().into_response(),
                                None => StatusCode::NOT_FOUND.into_response(),
                            }
                        }
                    }),
                )
        });
        Self { server }
    }

    /// `https://localhost:PORT/simple`
    pub fn url(&self) -> String {
        format!("{}/simple", self.server.base())
    }

    /// The server environment that installs from this index.
    pub fn envs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CODE_INTERPRETER_MCP_ALLOWED_HOSTS", "localhost".into()),
            ("CODE_INTERPRETER_MCP_PACKAGE_INDEX_URLS", self.url()),
            (
                "CODE_INTERPRETER_MCP_EXTRA_CA_CERTS",
                self.server.ca_pem_path.display().to_string(),
            ),
        ]
    }
}

/// PEP 503's normalised project name.
fn normalise(name: &str) -> String {
    name.to_ascii_lowercase().replace(['_', '.'], "-")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
