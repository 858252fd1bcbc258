//! What a sandbox's request may be: HTTPS to an allowlisted host (or a subdomain of one), one of the
//! usual methods, none of the headers a browser would not let a page set; and which responses the
//! artifact cache may keep.

use url::Url;

use super::{FetchError, FetchResponse};
use crate::protocol::limits::shown;

/// Methods a sandbox may use.
pub(super) const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

/// Request headers a sandbox may not set: the Fetch standard's forbidden request headers (the
/// transport's to manage, or a browser's alone to send), and `Range`, which partial downloads would
/// need and nothing in the sandbox does.
pub(super) const FORBIDDEN_HEADERS: [&str; 18] = [
    "accept-charset",
    "access-control-request-headers",
    "access-control-request-method",
    "cookie",
    "cookie2",
    "date",
    "dnt",
    "expect",
    "host",
    "origin",
    "referer",
    "set-cookie",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "via",
    "range",
];

/// Request headers of the connection itself, which HTTP client libraries send by default (requests'
/// `Accept-Encoding`, `Connection: keep-alive` and `Content-Length`): dropped silently, as a
/// browser's fetch drops them, since the transport in Rust sets its own (the length from the body
/// it sends).
pub(super) const DROPPED_HEADERS: [&str; 4] = [
    "accept-encoding",
    "connection",
    "keep-alive",
    "content-length",
];

/// Package artifacts (immutable by convention) are cached; index pages and API answers are not.
pub(super) fn is_artifact(url: &Url) -> bool {
    let path = url.path().to_ascii_lowercase();
    [".whl", ".tar.gz", ".zip", ".tar.bz2"]
        .iter()
        .any(|ext| path.ends_with(ext))
}

/// A response that says it must not be stored, or that is personal, is not cached.
pub(super) fn cacheable_response(response: &FetchResponse) -> bool {
    !response.headers.iter().any(|(name, value)| {
        let value = value.to_ascii_lowercase();
        name.eq_ignore_ascii_case("set-cookie")
            || (name.eq_ignore_ascii_case("cache-control")
                && (value.contains("no-store") || value.contains("private")))
    })
}

pub(super) fn check_url(allowed: &[String], url: &Url) -> Result<(), FetchError> {
    if url.scheme() != "https" {
        return Err(FetchError::NotHttps(short(url.as_str())));
    }
    let host = url
        .host_str()
        .ok_or_else(|| FetchError::InvalidUrl(shown(url.as_str())))?
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if host_allowed(allowed, &host) {
        Ok(())
    } else {
        Err(FetchError::HostNotAllowed(short(&host)))
    }
}

/// At most 200 characters of `text` (a URL or host in a message).
pub(super) fn short(text: &str) -> String {
    let mut out: String = text.chars().take(200).collect();
    if text.chars().nth(200).is_some() {
        out.push('…');
    }
    out
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
