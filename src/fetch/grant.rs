//! Egress the operator grants (`[[network.hosts]]`): which grant a URL falls under, whether its
//! method and path are allowed, the headers injected into its requests (credentials, resolved at
//! start-up, never handed to the sandbox), the request itself with its redirects followed one hop at
//! a time, and the resolver that refuses a granted name whose
//! addresses are private, loopback, link-local or otherwise not public (checked on the addresses
//! the connection then uses: no second lookup, nothing to rebind).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use reqwest::header::{HeaderName, HeaderValue};
use url::Url;

use super::policy::{check_url, short};
use super::{
    FetchError, FetchResponse, MAX_REDIRECTS, MAX_RESPONSE_BYTES, describe, read_response,
};
use crate::config::{HostGrant, secret};
use crate::protocol::limits::shown;

/// One granted host, its credentials resolved.
pub(super) struct Grant {
    /// Lowercase; `wildcard`: the subdomains of `host` (not `host` itself).
    host: String,
    wildcard: bool,
    methods: Vec<String>,
    paths: Vec<String>,
    /// Injected into every request to the host (values marked sensitive).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// What of those values a response must not hold (see `Secret::needles`).
    needles: Vec<Vec<u8>>,
    pub max_response_bytes: usize,
    allow_private: bool,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("host", &self.host)
            .field(
                "headers",
                &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The grants of a fetcher.
#[derive(Debug, Default)]
pub(super) struct Grants(Vec<Grant>);

impl Grants {
    /// The grants of `config`, their header templates resolved (an error names the key and the
    /// variable or file, never a value).
    pub fn new(config: &[HostGrant]) -> Result<Self, String> {
        let mut grants = Vec::new();
        for (i, g) in config.iter().enumerate() {
            let mut headers = Vec::new();
            let mut needles = Vec::new();
            for (name, secret) in secret::resolve_all(
                &format!("network.hosts[{i}].inject_headers"),
                &g.inject_headers,
            )? {
                let name = HeaderName::try_from(name.as_str()).map_err(|_| {
                    format!("network.hosts[{i}].inject_headers: {name} is not a header name")
                })?;
                let mut value = HeaderValue::try_from(secret.expose()).map_err(|_| {
                    format!("network.hosts[{i}].inject_headers.{name}: the value is not a valid header value")
                })?;
                value.set_sensitive(true);
                headers.push((name, value));
                // (An injected header is a credential even when written literally.)
                needles.extend(
                    secret
                        .needles(true)
                        .into_iter()
                        .map(|n| n.as_bytes().to_vec()),
                );
            }
            let (host, wildcard) = match g.host.strip_prefix("*.") {
                Some(domain) => (domain.to_string(), true),
                None => (g.host.clone(), false),
            };
            grants.push(Grant {
                host,
                wildcard,
                methods: g.methods.clone(),
                paths: g.paths.clone(),
                headers,
                needles,
                max_response_bytes: g.max_response_bytes,
                allow_private: g.allow_private_addresses,
            });
        }
        Ok(Self(grants))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The grant `host` falls under (the first that names it).
    pub fn for_host(&self, host: &str) -> Option<&Grant> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        self.0.iter().find(|g| {
            if g.wildcard {
                host.len() > g.host.len()
                    && host.ends_with(g.host.as_str())
                    && host.as_bytes()[host.len() - g.host.len() - 1] == b'.'
            } else {
                host == g.host
            }
        })
    }

    /// The grant of `url`'s host, if any.
    pub fn for_url(&self, url: &Url) -> Option<&Grant> {
        url.host_str().and_then(|h| self.for_host(h))
    }

    /// Every injected credential (the secret parts of each injected value), to refuse responses
    /// that hold one.
    pub fn injected_values(&self) -> impl Iterator<Item = &[u8]> {
        self.0
            .iter()
            .flat_map(|g| g.needles.iter().map(Vec::as_slice))
    }
}

impl Grant {
    /// Whether `method` to `url` is within the grant: the method allowed, the path under an allowed
    /// prefix (without encoded dots or slashes where prefixes narrow it), an address the grant
    /// permits when the host is an IP literal.
    pub fn check(&self, url: &Url, method: &str) -> Result<(), FetchError> {
        if !self.methods.iter().any(|m| m == method) {
            return Err(FetchError::GrantMethod(
                short(method),
                short(url.host_str().unwrap_or("")),
            ));
        }
        let path = url.path();
        let narrowed = !self.paths.iter().any(|p| p == "/");
        if narrowed {
            let lower = path.to_ascii_lowercase();
            if ["%2e", "%2f", "%5c"].iter().any(|e| lower.contains(e)) || path.contains('\\') {
                return Err(FetchError::GrantPath(short(path)));
            }
        }
        if !self.paths.iter().any(|p| path.starts_with(p.as_str())) {
            return Err(FetchError::GrantPath(short(path)));
        }
        if let Some(url::Host::Ipv4(ip)) = url.host()
            && !self.allow_private
            && !public(IpAddr::V4(ip))
        {
            return Err(FetchError::PrivateAddress(short(&ip.to_string())));
        }
        if let Some(url::Host::Ipv6(ip)) = url.host()
            && !self.allow_private
            && !public(IpAddr::V6(ip))
        {
            return Err(FetchError::PrivateAddress(short(&ip.to_string())));
        }
        Ok(())
    }

    /// Whether a request header the sandbox set is one this grant injects.
    pub fn injects(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n.as_str().eq_ignore_ascii_case(name))
    }
}

/// One granted request and its redirects (at most [`MAX_REDIRECTS`]): each hop re-checked against
/// the grants and the allowlist and carrying only its own grant's headers; a response holding an
/// injected value refused.
pub(super) async fn request(
    client: reqwest::Client,
    grants: Arc<Grants>,
    allowed: Arc<Vec<String>>,
    mut url: Url,
    mut method: String,
    headers: Vec<(String, String)>,
    mut body: Option<Vec<u8>>,
) -> Result<FetchResponse, FetchError> {
    for hop in 0..=MAX_REDIRECTS {
        let grant = grants.for_url(&url);
        match grant {
            Some(g) => {
                if url.scheme() != "https" {
                    return Err(FetchError::NotHttps(short(url.as_str())));
                }
                g.check(&url, &method)?;
                if let Some((name, _)) = headers.iter().find(|(n, _)| g.injects(n)) {
                    return Err(FetchError::InjectedHeader(shown(name)));
                }
            }
            None => check_url(&allowed, &url)?,
        }
        let m = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| FetchError::Method(shown(&method)))?;
        let mut request = client.request(m, url.clone());
        for (k, v) in &headers {
            request = request.header(k, v);
        }
        if let Some(g) = grant {
            for (name, value) in &g.headers {
                request = request.header(name.clone(), value.clone());
            }
        }
        if let Some(body) = &body {
            request = request.body(body.clone());
        }
        let response = request.send().await.map_err(describe)?;
        let status = response.status();
        if status.is_redirection()
            && let Some(location) = response.headers().get(reqwest::header::LOCATION)
        {
            if hop == MAX_REDIRECTS {
                return Err(FetchError::Failed("too many redirects".into()));
            }
            let location = location
                .to_str()
                .map_err(|_| FetchError::Failed("a redirect to an unreadable location".into()))?;
            let next = url
                .join(location)
                .map_err(|_| FetchError::InvalidUrl(shown(location)))?;
            let code = status.as_u16();
            if code == 303 || ((code == 301 || code == 302) && method == "POST") {
                method = "GET".into();
                body = None;
            }
            url = next;
            continue;
        }
        let max = grant.map_or(MAX_RESPONSE_BYTES, |g| g.max_response_bytes);
        let requested = if hop == 0 {
            url.to_string()
        } else {
            String::new()
        };
        let response = read_response(response, requested, max).await?;
        let host = url.host_str().unwrap_or("").to_string();
        for value in grants.injected_values() {
            let in_headers = response
                .headers
                .iter()
                .any(|(_, v)| memchr::memmem::find(v.as_bytes(), value).is_some());
            if in_headers || memchr::memmem::find(&response.body, value).is_some() {
                return Err(FetchError::Reflected(short(&host)));
            }
        }
        return Ok(response);
    }
    Err(FetchError::Failed("too many redirects".into()))
}

/// Whether `ip` is a public unicast address (IPv4-mapped, NAT64 and 6to4 addresses by their IPv4
/// part).
pub(super) fn public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return public_v4(v4);
            }
            let s = v6.segments();
            // NAT64 64:ff9b::/96
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                return public_v4(Ipv4Addr::new(
                    (s[6] >> 8) as u8,
                    s[6] as u8,
                    (s[7] >> 8) as u8,
                    s[7] as u8,
                ));
            }
            // 6to4 2002::/16
            if s[0] == 0x2002 {
                return public_v4(Ipv4Addr::new(
                    (s[1] >> 8) as u8,
                    s[1] as u8,
                    (s[2] >> 8) as u8,
                    s[2] as u8,
                ));
            }
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7 (fd00:ec2::254 among them)
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || v6.to_ipv4().is_some_and(|v4| !public_v4(v4)) && s[0..6] == [0; 6])
        }
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16: the metadata address among them
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0
        || (o[0] == 100 && (64..128).contains(&o[1])) // shared address space 100.64/10
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (18..20).contains(&o[1])) // benchmarking 198.18/15
        || o[0] >= 240)
}

/// The resolver of the client that carries granted requests: a granted name that does not allow
/// private addresses must resolve only to public ones, and the connection uses exactly the
/// addresses checked here. Names no grant covers resolve as usual.
pub(super) struct GuardedResolver {
    pub grants: Arc<Grants>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guarded = self
            .grants
            .for_host(name.as_str())
            .is_some_and(|g| !g.allow_private);
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if guarded && let Some(bad) = addrs.iter().find(|a| !public(a.ip())) {
                return Err(Box::new(FetchError::PrivateAddress(format!(
                    "{} resolves to {}",
                    short(&host),
                    bad.ip()
                )))
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:169.254.169.254",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "ff02::1",
        ] {
            assert!(!public(private.parse().unwrap()), "{private}");
        }
        for open in [
            "93.184.215.14",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(public(open.parse().unwrap()), "{open}");
        }
    }

    fn grant(host: &str, paths: &[&str]) -> Grants {
        Grants::new(&[HostGrant {
            host: host.into(),
            methods: vec!["GET".into()],
            paths: paths.iter().map(|p| p.to_string()).collect(),
            inject_headers: Default::default(),
            max_response_bytes: 1 << 20,
            allow_private_addresses: false,
        }])
        .unwrap()
    }

    #[test]
    fn grants_match_hosts_methods_and_paths() {
        let exact = grant("api.example.com", &["/v1/"]);
        let url = |s: &str| Url::parse(s).unwrap();
        let g = exact
            .for_url(&url("https://API.example.com./v1/x"))
            .unwrap();
        assert!(g.check(&url("https://api.example.com/v1/x"), "GET").is_ok());
        assert!(
            g.check(&url("https://api.example.com/v1/x"), "POST")
                .is_err()
        );
        assert!(
            g.check(&url("https://api.example.com/v2/x"), "GET")
                .is_err()
        );
        assert!(
            g.check(&url("https://api.example.com/v1/%2e%2e/admin"), "GET")
                .is_err()
        );
        assert!(
            g.check(&url("https://api.example.com/v1/..%2fadmin"), "GET")
                .is_err()
        );
        // (The URL parser removes plain dot segments before the check sees the path.)
        assert_eq!(url("https://api.example.com/v1/../admin").path(), "/admin");
        assert!(exact.for_host("evil-api.example.com").is_none());
        assert!(exact.for_host("api.example.com.evil.com").is_none());
        let wild = grant("*.example.com", &["/"]);
        assert!(wild.for_host("a.example.com").is_some());
        assert!(wild.for_host("example.com").is_none());
        assert!(wild.for_host("badexample.com").is_none());
        let ip = grant("169.254.169.254", &["/"]);
        let g = ip.for_host("169.254.169.254").unwrap();
        assert!(matches!(
            g.check(&url("https://169.254.169.254/latest"), "GET"),
            Err(FetchError::PrivateAddress(_))
        ));
    }
}
