//! The sandboxes' only network door: HTTPS requests to allowlisted hosts, performed in Rust on the
//! engine's I/O runtime, with redirects re-checked against the allowlist, a cap on response size,
//! optional extra trusted CA certificates, and an in-memory cache of downloaded package artifacts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use url::Url;

pub use crate::config::limits::MAX_RESPONSE_BYTES;
const MAX_REDIRECTS: usize = 10;
/// The artifact cache stops taking new entries beyond this many bytes (1 GiB).
const MAX_CACHE_BYTES: usize = 1024 * 1024 * 1024;

/// Which hosts sandboxes may reach, and the client and runtime that reach them.
#[derive(Clone)]
pub struct Fetcher {
    allowed_hosts: Arc<Vec<String>>,
    client: reqwest::Client,
    io: tokio::runtime::Handle,
    cache: Arc<Mutex<ArtifactCache>>,
}

/// Successful GET responses for package artifacts (wheels and source archives), by URL, for the life
/// of the server.
#[derive(Default)]
struct ArtifactCache {
    entries: HashMap<String, Arc<FetchResponse>>,
    bytes: usize,
}

/// Why the HTTPS client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read extra_ca_certs file {path}: {source}")]
    ReadCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("extra_ca_certs file {path} holds no usable PEM certificate: {reason}")]
    BadCa { path: PathBuf, reason: String },
    #[error("cannot create the HTTPS client: {0}")]
    Client(#[from] reqwest::Error),
}

/// A completed response.
#[derive(Debug, Clone)]
pub struct FetchResponse {
    pub status: u16,
    pub status_text: String,
    pub url: String,
    pub redirected: bool,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Why a request was refused or failed; the message reaches Python as the exception text.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("invalid URL {0:?}")]
    InvalidUrl(String),
    #[error("only https:// URLs may be fetched from the sandbox, not {0}")]
    NotHttps(String),
    #[error("host not on the allowlist: {0} (see allowed_hosts)")]
    HostNotAllowed(String),
    #[error("Runtime package installation is disabled: sandbox HTTPS downloads are refused")]
    Disabled,
    #[error("response from {0} exceeds the 100 MiB limit")]
    TooLarge(String),
    #[error("download failed ({0})")]
    Failed(String),
    #[error("download failed (HTTP {status}) for {url}")]
    Status { status: u16, url: String },
}

impl Fetcher {
    /// A fetcher for `allowed_hosts` that trusts the system and built-in roots plus the PEM
    /// certificates in `extra_ca_certs`.
    pub fn new(
        allowed_hosts: Vec<String>,
        extra_ca_certs: &[PathBuf],
        io: tokio::runtime::Handle,
    ) -> Result<Self, ClientError> {
        let allowed_hosts: Arc<Vec<String>> = Arc::new(
            allowed_hosts
                .into_iter()
                .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
        );
        let hosts = allowed_hosts.clone();
        let mut builder = reqwest::Client::builder();
        for path in extra_ca_certs {
            let pem = std::fs::read(path).map_err(|source| ClientError::ReadCa {
                path: path.clone(),
                source,
            })?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ClientError::BadCa {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            if certs.is_empty() {
                return Err(ClientError::BadCa {
                    path: path.clone(),
                    reason: "no BEGIN CERTIFICATE block".into(),
                });
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder
            .https_only(true)
            .user_agent(concat!("code-interpreter-mcp/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= MAX_REDIRECTS {
                    return attempt.error("too many redirects");
                }
                match check_url(&hosts, attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(e) => attempt.error(e),
                }
            }))
            .build()?;
        Ok(Self {
            allowed_hosts,
            client,
            io,
            cache: Arc::default(),
        })
    }

    /// Whether `url` may be fetched under the allowlist.
    pub fn check(&self, url: &str) -> Result<Url, FetchError> {
        let parsed = Url::parse(url).map_err(|_| FetchError::InvalidUrl(url.to_string()))?;
        check_url(&self.allowed_hosts, &parsed)?;
        Ok(parsed)
    }

    /// Performs one request on the I/O runtime; the returned future may be awaited anywhere.
    pub async fn fetch(
        &self,
        url: String,
        method: String,
        headers: Vec<(String, String)>,
        body: Option<Vec<u8>>,
    ) -> Result<FetchResponse, FetchError> {
        let parsed = self.check(&url)?;
        let cacheable = method.eq_ignore_ascii_case("GET") && is_artifact(&parsed);
        if cacheable
            && let Some(hit) = self
                .cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entries
                .get(&url)
        {
            return Ok((**hit).clone());
        }
        let response = self
            .fetch_uncached(url.clone(), parsed, method, headers, body)
            .await?;
        if cacheable && response.status == 200 {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.bytes + response.body.len() <= MAX_CACHE_BYTES {
                cache.bytes += response.body.len();
                cache.entries.insert(url, Arc::new(response.clone()));
            }
        }
        Ok(response)
    }

    async fn fetch_uncached(
        &self,
        url: String,
        parsed: Url,
        method: String,
        headers: Vec<(String, String)>,
        body: Option<Vec<u8>>,
    ) -> Result<FetchResponse, FetchError> {
        let client = self.client.clone();
        let task = self.io.spawn(async move {
            let method = reqwest::Method::from_bytes(method.as_bytes())
                .map_err(|_| FetchError::Failed(format!("invalid method {method}")))?;
            let mut request = client.request(method, parsed);
            for (k, v) in headers {
                request = request.header(k, v);
            }
            if let Some(body) = body {
                request = request.body(body);
            }
            let response = request.send().await.map_err(describe)?;
            if let Some(len) = response.content_length()
                && len as usize > MAX_RESPONSE_BYTES
            {
                return Err(FetchError::TooLarge(response.url().to_string()));
            }
            let status = response.status();
            let final_url = response.url().to_string();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let mut body = Vec::new();
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(describe)?;
                if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    return Err(FetchError::TooLarge(final_url));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(FetchResponse {
                status: status.as_u16(),
                status_text: status.canonical_reason().unwrap_or("").to_string(),
                redirected: final_url != url,
                url: final_url,
                headers,
                body,
            })
        });
        task.await
            .map_err(|e| FetchError::Failed(format!("request task failed: {e}")))?
    }
}

/// Package artifacts (immutable by convention) are cached; index pages and API answers are not.
fn is_artifact(url: &Url) -> bool {
    let path = url.path().to_ascii_lowercase();
    [".whl", ".tar.gz", ".zip", ".tar.bz2"]
        .iter()
        .any(|ext| path.ends_with(ext))
}

fn describe(e: reqwest::Error) -> FetchError {
    // The redirect policy's own refusals carry the allowlist message.
    let mut source: Option<&dyn std::error::Error> = Some(&e);
    while let Some(err) = source {
        if let Some(fetch) = err.downcast_ref::<FetchError>() {
            return match fetch {
                FetchError::HostNotAllowed(h) => FetchError::HostNotAllowed(h.clone()),
                FetchError::NotHttps(u) => FetchError::NotHttps(u.clone()),
                other => FetchError::Failed(other.to_string()),
            };
        }
        source = err.source();
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    FetchError::Failed(text)
}

fn check_url(allowed: &[String], url: &Url) -> Result<(), FetchError> {
    if url.scheme() != "https" {
        return Err(FetchError::NotHttps(url.to_string()));
    }
    let host = url
        .host_str()
        .ok_or_else(|| FetchError::InvalidUrl(url.to_string()))?
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if host_allowed(allowed, &host) {
        Ok(())
    } else {
        Err(FetchError::HostNotAllowed(host))
    }
}

/// `host` equals an allowlisted host or is a subdomain of one.
pub fn host_allowed(allowed: &[String], host: &str) -> bool {
    allowed.iter().any(|a| {
        host == a
            || (host.len() > a.len()
                && host.ends_with(a.as_str())
                && host.as_bytes()[host.len() - a.len() - 1] == b'.')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains_are_allowed_but_lookalikes_are_not() {
        let allowed = vec!["pypi.org".to_string()];
        assert!(host_allowed(&allowed, "pypi.org"));
        assert!(host_allowed(&allowed, "files.pypi.org"));
        assert!(!host_allowed(&allowed, "evilpypi.org"));
        assert!(!host_allowed(&allowed, "pypi.org.evil.com"));
    }

    #[test]
    fn only_https_is_allowed() {
        let allowed = vec!["example.com".to_string()];
        let http = Url::parse("http://example.com/").unwrap();
        assert!(matches!(
            check_url(&allowed, &http),
            Err(FetchError::NotHttps(_))
        ));
        let other = Url::parse("https://example.org/").unwrap();
        assert!(matches!(
            check_url(&allowed, &other),
            Err(FetchError::HostNotAllowed(_))
        ));
    }
}
