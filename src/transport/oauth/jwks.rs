//! The issuer's signing keys, kept current: discovered from its metadata (RFC 8414
//! `/.well-known/oauth-authorization-server`, then OpenID `/.well-known/openid-configuration`, whose
//! `issuer` must match exactly) unless `auth.oauth.jwks_uri` names them, fetched at start, every
//! `jwks_refresh_s`, and when a token names a key id not in the set. Fetches are single-flight (one
//! at a time; callers that waited take its result) and rate-bounded (none within
//! `jwks_min_refresh_interval_s` of the last, so a flood of made-up key ids costs one fetch per
//! interval). Each fetch has a deadline and a size limit and follows no redirect; a failed one keeps
//! the keys already held. Readers never wait on a fetch to read the current set.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use code_interpreter_mcp_config::OAuthSettings;

use super::jwt::{KeySet, Policy};
use crate::telemetry::{self, KeysFetch};

/// Why a fetch of the metadata or keys failed (logged; never shown to clients).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: {reason}")]
    Http { url: String, reason: String },
    #[error("{url}: answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: larger than auth.oauth.jwks_max_kb")]
    TooLarge { url: String },
    #[error("{url}: {reason}")]
    Document { url: String, reason: &'static str },
    #[error("no answer within auth.oauth.jwks_timeout_ms")]
    Timeout,
}

/// The current keys and how to refresh them.
pub struct Keys {
    policy: Policy,
    issuer: String,
    configured_uri: Option<String>,
    client: reqwest::Client,
    timeout: Duration,
    max_bytes: usize,
    min_interval: Duration,
    every: Duration,
    current: RwLock<Arc<KeySet>>,
    /// Held by the one fetch in progress.
    fetch: tokio::sync::Mutex<FetchState>,
    /// Counts finished fetch attempts, so a caller that waited knows one happened meanwhile.
    attempts: AtomicU64,
}

#[derive(Default)]
struct FetchState {
    last: Option<Instant>,
    /// The key set's URL once discovered.
    uri: Option<String>,
}

impl Keys {
    pub fn new(settings: &OAuthSettings, policy: Policy, client: reqwest::Client) -> Self {
        Self {
            policy,
            issuer: settings.issuer.clone(),
            configured_uri: settings.jwks_uri.clone(),
            client,
            timeout: settings.jwks_timeout,
            max_bytes: settings.jwks_max_bytes,
            min_interval: settings.jwks_min_refresh_interval,
            every: settings.jwks_refresh,
            current: RwLock::new(Arc::new(KeySet::default())),
            fetch: tokio::sync::Mutex::new(FetchState::default()),
            attempts: AtomicU64::new(0),
        }
    }

    /// The keys held now.
    pub fn current(&self) -> Arc<KeySet> {
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Fetches the keys unless a fetch is in progress (then waits for it, at most the fetch
    /// timeout) or the last one was less than `jwks_min_refresh_interval_s` ago; returns the keys
    /// held afterwards.
    pub async fn refresh(&self) -> Arc<KeySet> {
        let seen = self.attempts.load(Ordering::Acquire);
        let Ok(mut state) = tokio::time::timeout(self.timeout, self.fetch.lock()).await else {
            return self.current();
        };
        if self.attempts.load(Ordering::Acquire) != seen
            || state
                .last
                .is_some_and(|last| last.elapsed() < self.min_interval)
        {
            return self.current();
        }
        state.last = Some(Instant::now());
        let fetched = tokio::time::timeout(self.timeout, self.fetch_keys(&mut state))
            .await
            .unwrap_or(Err(FetchError::Timeout));
        match fetched {
            Ok(set) => {
                telemetry::keys_fetched(KeysFetch::Loaded);
                tracing::info!(keys = set.len(), "authorization server keys loaded");
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
            }
            Err(error) => {
                telemetry::keys_fetched(KeysFetch::Failed);
                tracing::warn!(%error, "authorization server keys not refreshed; keeping the current ones");
            }
        }
        self.attempts.fetch_add(1, Ordering::Release);
        self.current()
    }

    /// Loads the keys now and every `jwks_refresh_s`, until the process ends.
    pub fn keep_current(self: &Arc<Self>) {
        let keys = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(keys.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                keys.refresh().await;
            }
        });
    }

    async fn fetch_keys(&self, state: &mut FetchState) -> Result<KeySet, FetchError> {
        let uri = match (&self.configured_uri, &state.uri) {
            (Some(uri), _) | (None, Some(uri)) => uri.clone(),
            (None, None) => {
                let uri = self.discover().await?;
                state.uri = Some(uri.clone());
                uri
            }
        };
        let body = self.get(&uri).await?;
        KeySet::parse(&body, &self.policy).ok_or(FetchError::Document {
            url: uri,
            reason: "not a JSON Web Key Set",
        })
    }

    /// The `jwks_uri` of the issuer's metadata.
    async fn discover(&self) -> Result<String, FetchError> {
        self.endpoint("jwks_uri").await
    }

    /// The endpoint `field` (`jwks_uri`, `introspection_endpoint`) of the issuer's metadata.
    pub async fn endpoint(&self, field: &str) -> Result<String, FetchError> {
        let mut last_error = None;
        for url in metadata_urls(&self.issuer) {
            match self.get(&url).await {
                Ok(body) => return endpoint_of(&body, &self.issuer, &url, field),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or(FetchError::Timeout))
    }

    /// The client that fetches from the issuer (no redirects, its deadline).
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// GETs `url` as JSON, reading at most `jwks_max_kb`.
    async fn get(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        self.read(self.client.get(url), url).await
    }

    /// Sends `request` (to `url`, named in errors) asking for JSON; a successful answer's body, of
    /// at most `jwks_max_kb`.
    pub async fn read(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<Vec<u8>, FetchError> {
        let response = request
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| FetchError::Http {
                url: url.to_string(),
                reason: e.without_url().to_string(),
            })?;
        if !response.status().is_success() {
            return Err(FetchError::Status {
                url: url.to_string(),
                status: response.status().as_u16(),
            });
        }
        read_limited(response, self.max_bytes, url).await
    }
}

/// A response's body, refused past `max_bytes` (checked as it arrives).
async fn read_limited(
    mut response: reqwest::Response,
    max_bytes: usize,
    url: &str,
) -> Result<Vec<u8>, FetchError> {
    let too_large = || FetchError::TooLarge {
        url: url.to_string(),
    };
    if response
        .content_length()
        .is_some_and(|n| n > max_bytes as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| FetchError::Http {
        url: url.to_string(),
        reason: e.without_url().to_string(),
    })? {
        if body.len() + chunk.len() > max_bytes {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Where an issuer's metadata may be: RFC 8414's path-inserted form, then OpenID Connect's.
fn metadata_urls(issuer: &str) -> Vec<String> {
    let Ok(url) = url::Url::parse(issuer) else {
        return Vec::new();
    };
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/');
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{origin}{path}/.well-known/openid-configuration"),
    ]
}

/// The endpoint `field` of a metadata document that names `issuer` as its own.
fn endpoint_of(body: &[u8], issuer: &str, url: &str, field: &str) -> Result<String, FetchError> {
    let bad = |reason| FetchError::Document {
        url: url.to_string(),
        reason,
    };
    let document: serde_json::Value = serde_json::from_slice(body).map_err(|_| bad("not JSON"))?;
    if document.get("issuer").and_then(|v| v.as_str()) != Some(issuer) {
        return Err(bad("its issuer is not auth.oauth.issuer"));
    }
    let uri = document
        .get(field)
        .and_then(|v| v.as_str())
        .ok_or_else(|| bad("does not name the endpoint"))?;
    if !secure_or_loopback(uri) {
        return Err(bad(
            "names an endpoint neither https nor on a loopback address",
        ));
    }
    Ok(uri.to_string())
}

/// https, or http to a loopback address.
fn secure_or_loopback(uri: &str) -> bool {
    let Ok(url) = url::Url::parse(uri) else {
        return false;
    };
    match url.scheme() {
        "https" => url.host().is_some(),
        "http" => match url.host() {
            Some(url::Host::Domain(name)) => name == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_where_rfc_8414_then_openid_put_it() {
        assert_eq!(
            metadata_urls("https://idp.example.com/realms/mcp/"),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server/realms/mcp",
                "https://idp.example.com/realms/mcp/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("http://127.0.0.1:9000"),
            [
                "http://127.0.0.1:9000/.well-known/oauth-authorization-server",
                "http://127.0.0.1:9000/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn metadata_of_another_issuer_or_with_a_plain_http_key_url_is_refused() {
        let issuer = "https://idp.example.com";
        let doc = |iss: &str, jwks: &str| format!(r#"{{"issuer":"{iss}","jwks_uri":"{jwks}"}}"#);
        assert_eq!(
            endpoint_of(
                doc(issuer, "https://idp.example.com/jwks").as_bytes(),
                issuer,
                "u",
                "jwks_uri"
            )
            .unwrap(),
            "https://idp.example.com/jwks"
        );
        for (iss, jwks) in [
            ("https://evil.example.com", "https://idp.example.com/jwks"),
            ("https://idp.example.com/", "https://idp.example.com/jwks"),
            (issuer, "http://idp.example.com/jwks"),
            (issuer, "file:///etc/passwd"),
        ] {
            assert!(endpoint_of(doc(iss, jwks).as_bytes(), issuer, "u", "jwks_uri").is_err());
        }
        assert!(secure_or_loopback("http://127.0.0.1:1/jwks"));
        assert!(secure_or_loopback("http://[::1]:1/jwks"));
        assert!(!secure_or_loopback("http://10.0.0.1/jwks"));
    }
}
