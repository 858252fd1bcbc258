//! Optional bearer-token authentication for `/mcp`: the tokens of `auth.bearer_tokens_file` (one per
//! line; blank lines and `#` comments ignored), checked on every request in constant time, reloaded when
//! the file's contents change (polled every two seconds, which also follows a Kubernetes Secret's
//! symlink swap) or at once on SIGHUP. The probes and `/metrics` are outside it, and stdio has no HTTP
//! to authenticate. Only SHA-256 digests of the tokens are kept, and no token is ever logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use crate::sessions::Principal;

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
    state: RwLock<Loaded>,
}

struct Loaded {
    digests: Vec<[u8; 32]>,
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
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let loaded = read(path)?;
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
            state: RwLock::new(loaded),
        })
    }

    /// Re-reads the file; keeps the current tokens when it cannot be read. Returns whether they changed.
    pub fn reload(&self) -> bool {
        let loaded = match read(&self.path) {
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
        let Some(token) = authorization
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
        else {
            return Verdict::Missing;
        };
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        // Every digest is compared, so the time taken says nothing about which one (if any) matched.
        let matched = state
            .digests
            .iter()
            .fold(subtle::Choice::from(0), |acc, d| acc | d.ct_eq(&presented));
        if bool::from(matched) {
            Verdict::Accepted
        } else {
            Verdict::Invalid
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

fn read(path: &Path) -> Result<Loaded, AuthError> {
    let bytes = std::fs::read(path).map_err(|source| AuthError::Unreadable {
        path: path.display().to_string(),
        source,
    })?;
    let digests = String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|token| Sha256::digest(token.as_bytes()).into())
        .collect();
    Ok(Loaded {
        digests,
        file: Sha256::digest(&bytes).into(),
    })
}

/// Axum middleware: passes authenticated requests on, with the token's digest as their
/// [`Principal`] (sessions answer only to the token that created them); answers others with 401 and
/// a `WWW-Authenticate: Bearer` challenge (RFC 6750 §3).
pub async fn require_bearer(
    State(auth): State<Arc<BearerAuth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let verdict = auth.verify(request.headers().get(header::AUTHORIZATION));
    let challenge = match verdict {
        Verdict::Accepted => {
            if let Some(token) = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(bearer_token)
            {
                let principal = Principal(Sha256::digest(token.as_bytes()).into());
                request.extensions_mut().insert(principal);
            }
            return next.run(request).await;
        }
        Verdict::Missing => r#"Bearer realm="code-interpreter-mcp""#,
        Verdict::Invalid => {
            r#"Bearer realm="code-interpreter-mcp", error="invalid_token", error_description="the bearer token is not accepted""#
        }
    };
    tracing::warn!(?verdict, method = %request.method(), "refused an unauthenticated /mcp request");
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, challenge),
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
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
        (BearerAuth::load(file.path()).unwrap(), file)
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
    fn an_empty_or_missing_file_stops_start_up() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), "# nothing yet\n\n").unwrap();
        assert!(matches!(
            BearerAuth::load(file.path()),
            Err(AuthError::Empty { .. })
        ));
        assert!(matches!(
            BearerAuth::load(Path::new("/nonexistent/tokens")),
            Err(AuthError::Unreadable { .. })
        ));
    }
}
