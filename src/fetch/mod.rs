//! The sandboxes' only network door: HTTPS requests to allowlisted hosts and to the hosts the operator
//! grants (`grant.rs`: methods, paths, injected credentials, public addresses only), performed in
//! Rust on the engine's I/O runtime. Redirects are re-checked against the allowlist and the grants; methods and request headers
//! that a browser would not let a page set are refused before anything goes out; every request has a
//! connect, read and total timeout and never outlives its call's deadline; a call has a bounded number
//! of requests in flight and of response bytes, and its requests are aborted when it ends. Header-less
//! GETs of package artifacts are cached (keyed by the normalised URL, evicted least recently used
//! first); the engine's own wheel downloads ([`Fetcher::download`]) bypass that cache, since their
//! verified bytes are cached by `packages`.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use url::Url;

mod call;
mod grant;
mod policy;

pub use call::CallFetches;
use call::{ArtifactCache, InFlight};
use grant::{Grants, GuardedResolver};
pub use policy::host_allowed;
use policy::{
    DROPPED_HEADERS, FORBIDDEN_HEADERS, METHODS, cacheable_response, check_url, is_artifact, short,
};

pub use crate::protocol::limits::MAX_RESPONSE_BYTES;
use crate::protocol::limits::{
    FETCH_CONNECT_TIMEOUT_S, FETCH_READ_TIMEOUT_S, FETCH_TOTAL_TIMEOUT_S, MAX_FETCH_BYTES_PER_CALL,
    MAX_FETCHES_IN_FLIGHT, shown,
};

const MAX_REDIRECTS: usize = 10;

/// Which hosts sandboxes may reach, and the client and runtime that reach them.
#[derive(Clone)]
pub struct Fetcher {
    allowed_hosts: Arc<Vec<String>>,
    client: reqwest::Client,
    /// The operator's grants, and the client that carries their requests (redirects followed here,
    /// one hop at a time; granted names resolved by the guarded resolver).
    grants: Arc<Grants>,
    grant_client: reqwest::Client,
    io: tokio::runtime::Handle,
    cache: Arc<Mutex<ArtifactCache>>,
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
    #[error("{0}")]
    Grant(String),
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
    #[error("invalid URL {0}")]
    InvalidUrl(String),
    #[error("only https:// URLs may be fetched from the sandbox, not {0}")]
    NotHttps(String),
    #[error("host not on the allowlist: {0} (see allowed_hosts)")]
    HostNotAllowed(String),
    #[error("Runtime package installation is disabled: sandbox HTTPS downloads are refused")]
    Disabled,
    #[error(
        "the method {0} is not allowed from the sandbox (GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS are)"
    )]
    Method(String),
    #[error("the request header {0} may not be set from the sandbox")]
    Header(String),
    #[error("too many requests in flight (at most {MAX_FETCHES_IN_FLIGHT} at once per call)")]
    TooMany,
    #[error("response from {0} exceeds its size limit (100 MiB, or the grant's max_response_mb)")]
    TooLarge(String),
    #[error("this call has received its {MAX_FETCH_BYTES_PER_CALL} response bytes")]
    CallBudget,
    #[error("download timed out ({0})")]
    TimedOut(String),
    #[error("the request was aborted: its call ended")]
    Aborted,
    #[error("download failed ({0})")]
    Failed(String),
    #[error("download failed (HTTP {status}) for {url}")]
    Status { status: u16, url: String },
    #[error("the method {0} is not granted for {1} (see network.hosts)")]
    GrantMethod(String, String),
    #[error("the path {0} is not granted (see network.hosts)")]
    GrantPath(String),
    #[error("refused: {0} is not a public address (see network.hosts allow_private_addresses)")]
    PrivateAddress(String),
    #[error(
        "the request header {0} is set by the server for this host and may not be set from the sandbox"
    )]
    InjectedHeader(String),
    #[error(
        "the response from {0} contains a credential this server adds to its requests; refused"
    )]
    Reflected(String),
}

/// A client builder that trusts the system and built-in roots plus the PEM certificates in
/// `extra_ca_certs` (the fetcher's, and the upstream MCP servers' over HTTPS).
pub fn trusting(extra_ca_certs: &[PathBuf]) -> Result<reqwest::ClientBuilder, ClientError> {
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
    Ok(builder)
}

impl Fetcher {
    /// A fetcher for `allowed_hosts` that trusts the system and built-in roots plus the PEM
    /// certificates in `extra_ca_certs`.
    pub fn new(
        allowed_hosts: Vec<String>,
        grants: &[crate::config::HostGrant],
        extra_ca_certs: &[PathBuf],
        io: tokio::runtime::Handle,
    ) -> Result<Self, ClientError> {
        let grants = Arc::new(Grants::new(grants).map_err(ClientError::Grant)?);
        let grant_client = trusting(extra_ca_certs)?
            .https_only(true)
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver {
                grants: grants.clone(),
            }))
            .connect_timeout(Duration::from_secs(FETCH_CONNECT_TIMEOUT_S))
            .read_timeout(Duration::from_secs(FETCH_READ_TIMEOUT_S))
            .timeout(Duration::from_secs(FETCH_TOTAL_TIMEOUT_S))
            .user_agent(concat!("code-interpreter-mcp/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let allowed_hosts: Arc<Vec<String>> = Arc::new(
            allowed_hosts
                .into_iter()
                .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
        );
        let hosts = allowed_hosts.clone();
        let client = trusting(extra_ca_certs)?
            .https_only(true)
            .connect_timeout(Duration::from_secs(FETCH_CONNECT_TIMEOUT_S))
            .read_timeout(Duration::from_secs(FETCH_READ_TIMEOUT_S))
            .timeout(Duration::from_secs(FETCH_TOTAL_TIMEOUT_S))
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
            grants,
            grant_client,
            io,
            cache: Arc::default(),
        })
    }

    /// Whether `url` falls under one of the operator's grants (which hold even where package
    /// downloads are disabled).
    pub fn granted(&self, url: &str) -> bool {
        !self.grants.is_empty() && Url::parse(url).is_ok_and(|u| self.granted_url(&u))
    }

    fn granted_url(&self, url: &Url) -> bool {
        url.scheme() == "https" && self.grants.for_url(url).is_some()
    }

    /// Whether `url` may be fetched under the allowlist.
    pub fn check(&self, url: &str) -> Result<Url, FetchError> {
        let parsed = Url::parse(url).map_err(|_| FetchError::InvalidUrl(shown(url)))?;
        check_url(&self.allowed_hosts, &parsed)?;
        Ok(parsed)
    }

    /// One request of a sandbox's call, within its budget and before `deadline`; the returned future
    /// may be awaited anywhere.
    pub async fn fetch(
        &self,
        call: &CallFetches,
        mut request: SandboxRequest,
        deadline: Option<Instant>,
    ) -> Result<FetchResponse, FetchError> {
        let parsed =
            Url::parse(&request.url).map_err(|_| FetchError::InvalidUrl(shown(&request.url)))?;
        if self.granted_url(&parsed) {
            return self.fetch_granted(call, parsed, request, deadline).await;
        }
        check_url(&self.allowed_hosts, &parsed)?;
        let method = request.method.to_ascii_uppercase();
        check_request(&method, &mut request)?;
        let _in_flight = InFlight::enter(call).ok_or(FetchError::TooMany)?;
        let mut normalised = parsed.clone();
        normalised.set_fragment(None);
        let key = normalised.to_string();
        let cacheable = method == "GET"
            && request.headers.is_empty()
            && request.body.is_none()
            && is_artifact(&parsed);
        let hit = cacheable
            .then(|| {
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
            })
            .flatten();
        let response = match hit {
            Some(hit) => (*hit).clone(),
            None => {
                let response = self
                    .send(
                        parsed,
                        method,
                        request.headers,
                        request.body,
                        deadline,
                        Some(call.cancel.clone()),
                    )
                    .await?;
                if cacheable && response.status == 200 && cacheable_response(&response) {
                    self.cache
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(key, Arc::new(response.clone()));
                }
                response
            }
        };
        charged(call, response)
    }

    /// A request to a granted host (see `grant.rs`): redirects followed here one hop at a time, each
    /// re-checked against the grants and the allowlist and carrying only its own grant's headers.
    async fn fetch_granted(
        &self,
        call: &CallFetches,
        url: Url,
        mut request: SandboxRequest,
        deadline: Option<Instant>,
    ) -> Result<FetchResponse, FetchError> {
        let method = request.method.to_ascii_uppercase();
        check_request(&method, &mut request)?;
        let _in_flight = InFlight::enter(call).ok_or(FetchError::TooMany)?;
        let work = grant::request(
            self.grant_client.clone(),
            self.grants.clone(),
            self.allowed_hosts.clone(),
            url,
            method,
            request.headers,
            request.body,
        );
        let response = self
            .on_io(work, deadline, Some(call.cancel.clone()))
            .await?;
        charged(call, response)
    }

    /// A GET of `url` for the engine itself (a lock-file wheel), uncached, before `deadline`.
    pub async fn download(
        &self,
        url: &str,
        deadline: Option<Instant>,
    ) -> Result<FetchResponse, FetchError> {
        let parsed = self.check(url)?;
        self.send(parsed, "GET".into(), Vec::new(), None, deadline, None)
            .await
    }

    /// Performs one request on the I/O runtime, aborted at `deadline` or when `cancel` fires.
    async fn send(
        &self,
        url: Url,
        method: String,
        headers: Vec<(String, String)>,
        body: Option<Vec<u8>>,
        deadline: Option<Instant>,
        cancel: Option<CancellationToken>,
    ) -> Result<FetchResponse, FetchError> {
        let client = self.client.clone();
        let requested = url.to_string();
        let work = request(client, url, requested, method, headers, body);
        self.on_io(work, deadline, cancel).await
    }

    /// Runs `work` on the I/O runtime, aborted at `deadline` or when `cancel` fires.
    async fn on_io(
        &self,
        work: impl Future<Output = Result<FetchResponse, FetchError>> + Send + 'static,
        deadline: Option<Instant>,
        cancel: Option<CancellationToken>,
    ) -> Result<FetchResponse, FetchError> {
        let deadline = deadline.map(tokio::time::Instant::from_std);
        let task = self.io.spawn(async move {
            let cancelled = async {
                match &cancel {
                    Some(token) => token.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            let timed = async {
                match deadline {
                    Some(at) => tokio::time::timeout_at(at, work).await.unwrap_or_else(|_| {
                        Err(FetchError::TimedOut("the call's deadline passed".into()))
                    }),
                    None => work.await,
                }
            };
            tokio::select! {
                r = timed => r,
                _ = cancelled => Err(FetchError::Aborted),
            }
        });
        task.await
            .map_err(|e| FetchError::Failed(format!("request task failed: {e}")))?
    }
}

/// `response`, its bytes counted against the call's budget (refused once it is spent).
fn charged(call: &CallFetches, response: FetchResponse) -> Result<FetchResponse, FetchError> {
    let len = response.body.len() as u64;
    let received = call.received.fetch_add(len, Ordering::SeqCst) + len;
    if received > MAX_FETCH_BYTES_PER_CALL {
        return Err(FetchError::CallBudget);
    }
    Ok(response)
}

/// The method and headers of a sandbox's request, as any request's: a usual method, no header a
/// browser would not let a page set (the connection's own headers dropped).
fn check_request(method: &str, request: &mut SandboxRequest) -> Result<(), FetchError> {
    if !METHODS.contains(&method) {
        return Err(FetchError::Method(shown(&request.method)));
    }
    request
        .headers
        .retain(|(name, _)| !DROPPED_HEADERS.contains(&name.to_ascii_lowercase().as_str()));
    for (name, _) in &request.headers {
        let lower = name.to_ascii_lowercase();
        if FORBIDDEN_HEADERS.contains(&lower.as_str())
            || lower.starts_with("proxy-")
            || lower.starts_with("sec-")
        {
            return Err(FetchError::Header(shown(name)));
        }
    }
    Ok(())
}

/// What a sandbox asks for.
pub struct SandboxRequest {
    pub url: String,
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

async fn request(
    client: reqwest::Client,
    url: Url,
    requested: String,
    method: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
) -> Result<FetchResponse, FetchError> {
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| FetchError::Method(shown(&method)))?;
    let mut request = client.request(method, url);
    for (k, v) in headers {
        request = request.header(k, v);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = request.send().await.map_err(describe)?;
    read_response(response, requested, MAX_RESPONSE_BYTES).await
}

/// A response's status, headers and body (at most `max` bytes); `redirected` when its URL is not
/// `requested`.
async fn read_response(
    response: reqwest::Response,
    requested: String,
    max: usize,
) -> Result<FetchResponse, FetchError> {
    if let Some(len) = response.content_length()
        && len > max as u64
    {
        return Err(FetchError::TooLarge(short(response.url().as_str())));
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
    // (Sized once when the length is announced, up to 16 MiB whatever a server claims: growing a
    // large body by doubling copies it and touches fresh pages each time.)
    let announced = response
        .content_length()
        .unwrap_or(0)
        .min(max.min(16 << 20) as u64) as usize;
    let mut body = Vec::with_capacity(announced);
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(describe)?;
        if body.len() + chunk.len() > max {
            return Err(FetchError::TooLarge(short(&final_url)));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(FetchResponse {
        status: status.as_u16(),
        status_text: status.canonical_reason().unwrap_or("").to_string(),
        redirected: final_url != requested,
        url: final_url,
        headers,
        body,
    })
}

fn describe(e: reqwest::Error) -> FetchError {
    // The redirect policy's own refusals carry the allowlist message.
    let mut source: Option<&dyn std::error::Error> = Some(&e);
    while let Some(err) = source {
        if let Some(fetch) = err.downcast_ref::<FetchError>() {
            return match fetch {
                FetchError::HostNotAllowed(h) => FetchError::HostNotAllowed(h.clone()),
                FetchError::NotHttps(u) => FetchError::NotHttps(u.clone()),
                FetchError::PrivateAddress(a) => FetchError::PrivateAddress(a.clone()),
                other => FetchError::Failed(other.to_string()),
            };
        }
        source = err.source();
    }
    let timed_out = e.is_timeout();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(err) = source {
        text.push_str(": ");
        text.push_str(&err.to_string());
        source = err.source();
    }
    if timed_out {
        FetchError::TimedOut(text)
    } else {
        FetchError::Failed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::limits::MAX_FETCH_CACHE_BYTES;

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

    fn response(len: usize) -> Arc<FetchResponse> {
        Arc::new(FetchResponse {
            status: 200,
            status_text: "OK".into(),
            url: String::new(),
            redirected: false,
            headers: Vec::new(),
            body: vec![0; len],
        })
    }

    #[test]
    fn the_artifact_cache_evicts_the_least_recently_used_first() {
        let mut cache = ArtifactCache::default();
        let third = MAX_FETCH_CACHE_BYTES / 3;
        cache.insert("a".into(), response(third));
        cache.insert("b".into(), response(third));
        cache.insert("c".into(), response(third));
        assert!(cache.get("a").is_some(), "a is now the most recent");
        cache.insert("d".into(), response(third));
        assert!(cache.get("b").is_none(), "b was the least recently used");
        assert!(cache.get("a").is_some() && cache.get("c").is_some() && cache.get("d").is_some());
        assert!(cache.bytes <= MAX_FETCH_CACHE_BYTES);
        cache.insert("huge".into(), response(MAX_FETCH_CACHE_BYTES + 1));
        assert!(cache.get("huge").is_none());
    }

    #[test]
    fn personal_or_unstorable_responses_are_not_cached() {
        let mut r = (*response(1)).clone();
        assert!(cacheable_response(&r));
        r.headers = vec![("Cache-Control".into(), "private, max-age=60".into())];
        assert!(!cacheable_response(&r));
        r.headers = vec![("set-cookie".into(), "a=b".into())];
        assert!(!cacheable_response(&r));
    }
}
