//! `/mcp` as an OAuth 2.1 resource server (MCP authorization; `[auth.oauth]`): JWT access tokens
//! of one issuer ([`jwt`]) verified with its published keys ([`jwks`]) through a verify-only `ring`
//! provider ([`ring_provider`]), opaque ones through its introspection endpoint
//! ([`introspection`]), and the RFC 9728 protected-resource metadata that tells a client
//! where to get a token. A valid token's principal is its issuer and subject, hashed; the token
//! itself is never kept or logged.

use std::path::PathBuf;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use code_interpreter_mcp_config::{OAuthScopes, OAuthSettings};
use sha2::{Digest, Sha256};

use crate::sessions::Principal;
use crate::tools::access::{self, Access};

pub mod introspection;
pub mod jwks;
pub mod jwt;
mod ring_provider;

use jwt::Policy;
pub use jwt::{Identity, Refusal};

/// The metadata's path prefix (RFC 9728 §3).
pub const METADATA_PREFIX: &str = "/.well-known/oauth-protected-resource";

/// Why the resource server could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("auth.oauth: {0}")]
    Client(#[from] crate::fetch::ClientError),
    #[error("auth.oauth: cannot build the HTTP client: {0}")]
    Build(String),
    #[error("auth.oauth.resource {0:?} is not a URL")]
    Resource(String),
}

/// The issuer's keys, this server's resource identifier and its metadata document.
pub struct ResourceServer {
    policy: Policy,
    keys: Arc<jwks::Keys>,
    /// Introspection of opaque tokens, when configured.
    introspector: Option<introspection::Introspector>,
    /// The path the metadata is served at, e.g. `/.well-known/oauth-protected-resource/mcp`.
    metadata_path: String,
    /// Its absolute URL, named in every challenge.
    metadata_url: String,
    metadata: bytes::Bytes,
    scopes: Arc<OAuthScopes>,
}

impl std::fmt::Debug for ResourceServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceServer")
            .field("issuer", &self.policy.issuer)
            .field("resource", &self.policy.resource)
            .finish_non_exhaustive()
    }
}

impl ResourceServer {
    /// The resource server for `settings`; `resource` is `auth.oauth.resource` or, when that is
    /// empty, the URL the server was bound at.
    pub fn new(
        settings: &OAuthSettings,
        resource: &str,
        extra_ca_certs: &[PathBuf],
    ) -> Result<Self, SetupError> {
        ring_provider::install();
        let url =
            url::Url::parse(resource).map_err(|_| SetupError::Resource(resource.to_string()))?;
        let path = url.path().trim_end_matches('/');
        let metadata_path = format!("{METADATA_PREFIX}{path}");
        let metadata_url = format!("{}{metadata_path}", url.origin().ascii_serialization());
        let client = crate::fetch::trusting(extra_ca_certs)?
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(settings.jwks_timeout)
            .timeout(settings.jwks_timeout)
            .build()
            .map_err(|e| SetupError::Build(e.to_string()))?;
        let policy = Policy::new(
            &settings.issuer,
            resource,
            &settings.algorithms,
            settings.clock_skew,
        );
        let mut metadata = serde_json::json!({
            "resource": resource,
            "authorization_servers": [settings.issuer],
            "bearer_methods_supported": ["header"],
            "resource_signing_alg_values_supported": settings.algorithms,
            "resource_name": "code-interpreter-mcp",
        });
        let supported = access::supported(&settings.scopes);
        if !supported.is_empty() {
            metadata["scopes_supported"] = supported.into();
        }
        tracing::info!(
            issuer = %settings.issuer,
            resource,
            metadata = %metadata_url,
            "OAuth access tokens accepted on /mcp"
        );
        let keys = Arc::new(jwks::Keys::new(settings, policy.clone(), client));
        let introspector = settings.introspection.clone().map(|introspection| {
            introspection::Introspector::new(
                introspection,
                policy.clone(),
                Arc::clone(&keys),
                settings.jwks_timeout,
            )
        });
        Ok(Self {
            keys,
            introspector,
            policy,
            metadata_path,
            metadata_url,
            metadata: bytes::Bytes::from(metadata.to_string()),
            scopes: Arc::new(settings.scopes.clone()),
        })
    }

    /// Loads the issuer's keys now and keeps them current.
    pub fn start(&self) {
        self.keys.keep_current();
    }

    /// Whether this server checks `token`: a JWT (three dot-separated parts), or any other token
    /// when introspection is configured.
    pub fn takes(&self, token: &str) -> bool {
        is_jwt(token) || self.introspector.is_some()
    }

    /// Checks a bearer token this server [takes](Self::takes): who it speaks for and with which
    /// scopes.
    pub async fn authenticate(&self, token: &str) -> Result<Identity, Refusal> {
        match &self.introspector {
            Some(introspector) if !is_jwt(token) => introspector.introspect(token).await,
            _ => self.verify_jwt(token).await,
        }
    }

    async fn verify_jwt(&self, token: &str) -> Result<Identity, Refusal> {
        let header = jwt::header(token, &self.policy)?;
        let mut keys = self.keys.current();
        if !keys.has(&header) {
            keys = self.keys.refresh().await;
            if keys.is_empty() {
                return Err(Refusal::NoKeys);
            }
        }
        keys.verify(token, &header)
    }

    /// What a valid token's principal may do.
    pub fn access(&self, identity: Identity) -> Access {
        Access::new(identity.scopes, Arc::clone(&self.scopes))
    }

    /// The URL of the protected-resource metadata.
    pub fn metadata_url(&self) -> &str {
        &self.metadata_url
    }

    /// The `WWW-Authenticate` value of a 401: without `refusal` a bare challenge (no token was
    /// sent) naming the scopes the request needs, as far as its headers say (a 2026-07-28 request
    /// names its method, tool and session in them), else the least scope that does anything
    /// (running code); with one, `invalid_token` with the refusal's fixed description.
    pub fn challenge(&self, description: Option<&str>, headers: &HeaderMap) -> String {
        match description {
            None => {
                let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
                let asked = access::Asked {
                    method: text("mcp-method").unwrap_or(""),
                    tool: text("mcp-name"),
                    session: headers.contains_key("mcp-param-session-id"),
                    uri: text("mcp-name"),
                };
                let mut needed = access::needed(&self.scopes, &asked);
                if needed.is_empty() && !self.scopes.run.is_empty() {
                    needed.push(&self.scopes.run);
                }
                if needed.is_empty() {
                    format!(r#"Bearer resource_metadata="{}""#, self.metadata_url)
                } else {
                    format!(
                        r#"Bearer resource_metadata="{}", scope="{}""#,
                        self.metadata_url,
                        needed.join(" ")
                    )
                }
            }
            Some(description) => format!(
                r#"Bearer error="invalid_token", error_description="{description}", resource_metadata="{}""#,
                self.metadata_url
            ),
        }
    }

    /// The metadata routes: the path-inserted form of RFC 9728 §3.1 and, when the resource has a
    /// path, the bare form too (clients that look there first find the same document).
    pub fn routes(self: &Arc<Self>) -> axum::Router {
        let body = self.metadata.clone();
        let serve = move || {
            let body = body.clone();
            async move { metadata_response(body) }
        };
        let mut router = axum::Router::new().route(
            &self.metadata_path,
            axum::routing::get(serve.clone()).options(preflight),
        );
        if self.metadata_path != METADATA_PREFIX {
            router = router.route(
                METADATA_PREFIX,
                axum::routing::get(serve).options(preflight),
            );
        }
        router
    }
}

fn is_jwt(token: &str) -> bool {
    token.bytes().filter(|&b| b == b'.').count() == 2
}

/// The `WWW-Authenticate` value of a 403 for a request that needs `needed` (every scope it needs,
/// RFC 6750 §3.1).
pub fn insufficient_scope(metadata_url: &str, needed: &[String], what: &str) -> String {
    let needed = needed.join(" ");
    format!(
        r#"Bearer error="insufficient_scope", scope="{needed}", resource_metadata="{metadata_url}", error_description="{what} needs the scopes {needed}""#
    )
}

fn metadata_response(body: bytes::Bytes) -> Response {
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("max-age=300"),
            ),
            (
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            ),
        ],
        body,
    )
        .into_response()
}

async fn preflight() -> Response {
    (
        StatusCode::NO_CONTENT,
        [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            (header::ACCESS_CONTROL_ALLOW_METHODS, "GET, OPTIONS"),
            (header::ACCESS_CONTROL_MAX_AGE, "300"),
        ],
    )
        .into_response()
}

/// The principal of a token's issuer and subject: SHA-256 over a domain tag and both values,
/// length-prefixed, so no subject can pose as another issuer's and no static token (visible ASCII,
/// never a NUL) hashes to the same.
pub fn principal(identity: &Identity) -> Principal {
    let mut hash = Sha256::new();
    hash.update(b"\0oauth");
    for part in [&identity.issuer, &identity.subject] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    Principal(hash.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(issuer: &str, subject: &str) -> Identity {
        Identity {
            issuer: issuer.into(),
            subject: subject.into(),
            scopes: Vec::new(),
            claims: Vec::new(),
        }
    }

    #[test]
    fn principals_separate_issuers_and_subjects_and_static_tokens() {
        let a = principal(&identity("https://a", "bc"));
        assert_eq!(a, principal(&identity("https://a", "bc")));
        assert_ne!(a, principal(&identity("https://ab", "c")));
        assert_ne!(a, principal(&identity("https://b", "bc")));
        assert_ne!(a.0, <[u8; 32]>::from(Sha256::digest(b"https://abc")));
        assert!(a.label().starts_with("p-") && a.label().len() == 14);
    }
}
