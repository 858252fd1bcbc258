//! Optional bearer-token authentication for `/mcp`: the tokens of `auth.bearer_tokens_file` (one per
//! line; blank lines and `#` comments ignored), checked on every request in constant time, reloaded when
//! the file's contents change (polled every two seconds, which also follows a Kubernetes Secret's
//! symlink swap) or at once on SIGHUP. The probes and `/metrics` are outside it, and stdio has no HTTP
//! to authenticate. Only SHA-256 digests of the tokens are kept, and no token is ever logged. With
//! `[auth.oauth]` the same middleware also takes the issuer's JWT access tokens ([`super::oauth`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable as _, ConstantTimeEq as _};

use super::oauth::{self, ResourceServer};
use crate::config::QuotaPolicy;
use crate::sessions::{Principal, PrincipalKind, Profile};
use crate::telemetry::{self, AuthRefusal};
use crate::tools::access::Access;

/// How often the token file is re-read for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Why the token file could not be used at start-up.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("auth.bearer_tokens_file {path}: cannot read it: {source}")]
    Unreadable {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "auth.bearer_tokens_file {path} holds no token (one token per line; blank lines and # comments are ignored)"
    )]
    Empty { path: String },
    #[error(
        "auth.bearer_tokens_file {path}, line {line}: with auth.named_tokens each line is NAME:TOKEN, NAME of letters, digits, '.', '_' or '-' (at most 64), names unique"
    )]
    Malformed { path: String, line: usize },
}

/// What a request presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// No `Authorization: Bearer` header.
    Missing,
    /// A bearer token that is not in the file.
    Invalid,
}

/// The accepted tokens (as digests) and the file they come from.
pub struct BearerAuth {
    path: PathBuf,
    /// Lines are `NAME:TOKEN`.
    named: bool,
    state: RwLock<Loaded>,
}

struct Loaded {
    digests: Vec<[u8; 32]>,
    /// Each token's name (`auth.named_tokens`), beside its digest.
    names: Vec<Option<Arc<str>>>,
    /// Digest of the whole file, to notice changes.
    file: [u8; 32],
}

impl std::fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens (nor their digests).
        f.debug_struct("BearerAuth")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl BearerAuth {
    /// Reads the token file; an unreadable or empty file is a start-up error.
    pub fn load(path: &Path, named: bool) -> Result<Self, AuthError> {
        let loaded = read(path, named)?;
        if loaded.digests.is_empty() {
            return Err(AuthError::Empty {
                path: path.display().to_string(),
            });
        }
        tracing::info!(
            tokens = loaded.digests.len(),
            file = %path.display(),
            "bearer authentication on /mcp"
        );
        Ok(Self {
            path: path.to_path_buf(),
            named,
            state: RwLock::new(loaded),
        })
    }

    /// Re-reads the file; keeps the current tokens when it cannot be read. Returns whether they changed.
    pub fn reload(&self) -> bool {
        let loaded = match read(&self.path, self.named) {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::warn!(%error, "bearer token file not reloaded; keeping the current tokens");
                return false;
            }
        };
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        if state.file == loaded.file {
            return false;
        }
        if loaded.digests.is_empty() {
            tracing::warn!(
                "the bearer token file now holds no token: every /mcp request is refused"
            );
        }
        tracing::info!(tokens = loaded.digests.len(), "bearer tokens reloaded");
        *state = loaded;
        true
    }

    /// Checks an `Authorization` header value.
    pub fn verify(&self, authorization: Option<&HeaderValue>) -> Verdict {
        match authorization
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
        {
            None => Verdict::Missing,
            Some(token) if self.accepts(token) => Verdict::Accepted,
            Some(_) => Verdict::Invalid,
        }
    }

    /// Whether `token` is one of the file's.
    pub fn accepts(&self, token: &str) -> bool {
        self.find(token).is_some()
    }

    /// The principal of `token`, if it is one of the file's: a named token's stands for its name
    /// (the token can change, the principal stays), another's for the token itself (its digest).
    pub fn find(&self, token: &str) -> Option<(Principal, Option<Arc<str>>)> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        // Every digest is compared, so the time taken says nothing about which one (if any) matched.
        let (matched, index) = state.digests.iter().enumerate().fold(
            (subtle::Choice::from(0), 0u64),
            |(any, index), (i, d)| {
                let this = d.ct_eq(&presented);
                (
                    any | this,
                    u64::conditional_select(&index, &(i as u64), this),
                )
            },
        );
        if !bool::from(matched) {
            return None;
        }
        match state.names.get(index as usize).cloned().flatten() {
            Some(name) => Some((named_principal(&name), Some(name))),
            None => Some((Principal(presented), None)),
        }
    }

    /// Reloads on SIGHUP and whenever the file's contents change, until the process ends.
    pub fn watch(self: &Arc<Self>) {
        let auth = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RELOAD_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            #[cfg(unix)]
            let mut hangup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            loop {
                #[cfg(unix)]
                {
                    let sighup = async {
                        match hangup.as_mut() {
                            Some(signal) => signal.recv().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = sighup => tracing::info!("SIGHUP: reloading the bearer token file"),
                    }
                }
                #[cfg(not(unix))]
                tick.tick().await;
                auth.reload();
            }
        });
    }
}

/// The token of an `Authorization: Bearer <token>` value (scheme case-insensitive, RFC 6750 §2.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn read(path: &Path, named: bool) -> Result<Loaded, AuthError> {
    let bytes = std::fs::read(path).map_err(|source| AuthError::Unreadable {
        path: path.display().to_string(),
        source,
    })?;
    let mut loaded = Loaded {
        digests: Vec::new(),
        names: Vec::new(),
        file: Sha256::digest(&bytes).into(),
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut seen = std::collections::HashSet::new();
    let lines = text
        .lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'));
    for (number, line) in lines {
        let (name, token) = if named {
            let malformed = || AuthError::Malformed {
                path: path.display().to_string(),
                line: number,
            };
            let (name, token) = line.split_once(':').ok_or_else(malformed)?;
            let (name, token) = (name.trim(), token.trim());
            if !token_name_ok(name) || token.is_empty() || !seen.insert(name) {
                return Err(malformed());
            }
            (Some(Arc::from(name)), token)
        } else {
            (None, line)
        };
        loaded.digests.push(Sha256::digest(token.as_bytes()).into());
        loaded.names.push(name);
    }
    Ok(loaded)
}

/// Whether `name` may name a token: 1 to 64 letters, digits, '.', '_' or '-'.
fn token_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The principal of the token named `name`: SHA-256 over a domain tag and the length-prefixed
/// name, so it equals no token's digest (a token never starts with NUL) and no OAuth principal.
fn named_principal(name: &str) -> Principal {
    let mut hash = Sha256::new();
    hash.update(b"\0static");
    hash.update((name.len() as u64).to_be_bytes());
    hash.update(name.as_bytes());
    Principal(hash.finalize().into())
}

/// The longest bearer token looked at; a longer one is refused unread.
pub const MAX_TOKEN_BYTES: usize = 8192;

/// Who may use /mcp: the static tokens, an OAuth issuer's access tokens, or both.
#[derive(Debug, Default, Clone)]
pub struct Authenticator {
    pub tokens: Option<Arc<BearerAuth>>,
    pub oauth: Option<Arc<ResourceServer>>,
    /// The quotas each principal's profile gets.
    pub quotas: QuotaPolicy,
}

/// What an accepted token stands for.
struct Accepted {
    principal: Principal,
    access: Option<Access>,
    profile: Arc<Profile>,
}

impl Authenticator {
    /// Whether /mcp needs a token at all.
    pub fn required(&self) -> bool {
        self.tokens.is_some() || self.oauth.is_some()
    }

    /// The principal of a presented token (and for an OAuth token, what its scopes allow), or the
    /// description of why it is refused and the reason counted.
    async fn check(&self, token: &str) -> Result<Accepted, (&'static str, AuthRefusal)> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(("the bearer token is too long", AuthRefusal::TooLong));
        }
        if let Some(tokens) = &self.tokens
            && let Some((principal, name)) = tokens.find(token)
        {
            let limits = self.quotas.limits_for(name.as_deref(), |_| Vec::new());
            let profile = Profile {
                name,
                kind: PrincipalKind::Token,
                limits,
            };
            return Ok(Accepted {
                principal,
                access: None,
                profile: Arc::new(profile),
            });
        }
        match &self.oauth {
            Some(oauth) if oauth.takes(token) => match oauth.authenticate(token).await {
                Ok(identity) => {
                    let principal = oauth::principal(&identity);
                    tracing::debug!(principal = %principal.label(), "OAuth access token accepted");
                    let limits = self.quotas.limits_for(None, |claim| identity.claim(claim));
                    let profile = Profile {
                        name: None,
                        kind: PrincipalKind::OAuth,
                        limits,
                    };
                    Ok(Accepted {
                        principal,
                        profile: Arc::new(profile),
                        access: Some(oauth.access(identity)),
                    })
                }
                Err(refusal) => Err((refusal.description(), refusal.metric())),
            },
            _ => Err((
                "the bearer token is not accepted",
                AuthRefusal::UnknownToken,
            )),
        }
    }

    /// The `WWW-Authenticate` value of a 401 (RFC 6750 §3; with OAuth, RFC 9728 §5.1).
    fn challenge(&self, description: Option<&str>, headers: &HeaderMap) -> String {
        if let Some(oauth) = &self.oauth {
            return oauth.challenge(description, headers);
        }
        match description {
            None => r#"Bearer realm="code-interpreter-mcp""#.to_string(),
            Some(description) => format!(
                r#"Bearer realm="code-interpreter-mcp", error="invalid_token", error_description="{description}""#
            ),
        }
    }
}

/// Axum middleware: passes authenticated requests on with their [`Principal`] (sessions and tasks
/// answer only to the principal that created them: a static token's digest, or an OAuth token's
/// issuer and subject); answers others with 401 and a `WWW-Authenticate: Bearer` challenge.
pub async fn require_bearer(
    State(auth): State<Arc<Authenticator>>,
    mut request: Request,
    next: Next,
) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .map(str::to_owned);
    let (description, reason) = match token {
        None => (None, AuthRefusal::NoToken),
        Some(token) => match auth.check(&token).await {
            Ok(accepted) => {
                request.extensions_mut().insert(accepted.principal);
                request.extensions_mut().insert(accepted.profile);
                if let Some(access) = accepted.access {
                    request.extensions_mut().insert(access);
                }
                return next.run(request).await;
            }
            Err((description, reason)) => (Some(description), reason),
        },
    };
    telemetry::auth_refused(reason);
    tracing::warn!(
        reason = reason.label(),
        method = %request.method(),
        "refused an unauthenticated /mcp request"
    );
    // A token that could not be checked (the issuer's keys or introspection unavailable) is the
    // server's trouble, not the client's: 503, to retry, rather than a 401 that sends the client
    // back to the authorization server.
    if matches!(
        reason,
        AuthRefusal::NoKeys | AuthRefusal::IntrospectionFailed
    ) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::RETRY_AFTER, HeaderValue::from_static("5")),
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                ),
            ],
            format!("{}; retry shortly\n", description.unwrap_or_default()),
        )
            .into_response();
    }
    let challenge = HeaderValue::from_str(&auth.challenge(description, request.headers()))
        .unwrap_or_else(|_| HeaderValue::from_static("Bearer"));
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, challenge),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
        ],
        "unauthorized: send Authorization: Bearer <token>\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth_with(text: &str) -> (BearerAuth, tempfile::NamedTempFile) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        (BearerAuth::load(file.path(), false).unwrap(), file)
    }

    fn header(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn tokens_are_matched_exactly_and_the_scheme_case_insensitively() {
        let (auth, _file) = auth_with("# team\n\n  alpha-token \nbeta\n");
        assert_eq!(
            auth.verify(Some(&header("Bearer alpha-token"))),
            Verdict::Accepted
        );
        assert_eq!(auth.verify(Some(&header("bearer beta"))), Verdict::Accepted);
        assert_eq!(auth.verify(Some(&header("Bearer alpha"))), Verdict::Invalid);
        assert_eq!(
            auth.verify(Some(&header("Bearer # team"))),
            Verdict::Invalid
        );
        assert_eq!(
            auth.verify(Some(&header("Basic YWxwaGE="))),
            Verdict::Missing
        );
        assert_eq!(auth.verify(Some(&header("Bearer "))), Verdict::Missing);
        assert_eq!(auth.verify(None), Verdict::Missing);
    }

    #[test]
    fn reload_follows_the_file_and_keeps_tokens_when_it_is_unreadable() {
        let (auth, file) = auth_with("old\n");
        assert!(!auth.reload(), "unchanged");
        std::fs::write(file.path(), "new\n").unwrap();
        assert!(auth.reload());
        assert_eq!(auth.verify(Some(&header("Bearer old"))), Verdict::Invalid);
        assert_eq!(auth.verify(Some(&header("Bearer new"))), Verdict::Accepted);
        let path = file.path().to_path_buf();
        drop(file);
        assert!(!auth.reload());
        assert!(!path.exists());
        assert_eq!(auth.verify(Some(&header("Bearer new"))), Verdict::Accepted);
    }

    #[test]
    fn a_named_tokens_principal_is_its_name_and_bad_lines_stop_start_up() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "# ci\nci: tok-1\nalice:tok-2\n").unwrap();
        let auth = BearerAuth::load(file.path(), true).unwrap();
        let (ci, name) = auth.find("tok-1").unwrap();
        assert_eq!(name.as_deref(), Some("ci"));
        assert!(auth.find("ci:tok-1").is_none() && auth.find("ci").is_none());
        // A new token for the same name: the same principal; not a token's digest.
        std::fs::write(file.path(), "ci:tok-3\nalice:tok-2\n").unwrap();
        assert!(auth.reload());
        assert_eq!(auth.find("tok-3").unwrap().0, ci);
        assert!(auth.find("tok-1").is_none());
        assert_ne!(ci, Principal(Sha256::digest(b"tok-3").into()));
        assert_ne!(ci, auth.find("tok-2").unwrap().0);
        for (text, line) in [
            ("ci:a\nno-colon\n", 2),
            ("ci:a\nci:b\n", 2),
            ("bad name:a\n", 1),
            ("ci:\n", 1),
        ] {
            std::fs::write(file.path(), text).unwrap();
            match BearerAuth::load(file.path(), true) {
                Err(AuthError::Malformed { line: at, .. }) => assert_eq!(at, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_empty_or_missing_file_stops_start_up() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "# nothing yet\n\n").unwrap();
        assert!(matches!(
            BearerAuth::load(file.path(), false),
            Err(AuthError::Empty { .. })
        ));
        assert!(matches!(
            BearerAuth::load(Path::new("/nonexistent/tokens"), false),
            Err(AuthError::Unreadable { .. })
        ));
    }
}
