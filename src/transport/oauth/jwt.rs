//! JWT access tokens (RFC 9068) checked against one issuer's signing keys: the header (type, no
//! critical extensions, an accepted algorithm that fits the key), the signature, and the claims
//! (`iss` exactly the issuer, `aud` holding this server's resource (RFC 8707), `exp` and `nbf` with
//! the configured leeway, `sub` present). Keys named by the token itself (`jku`, `jwk`, `x5u`) are
//! never followed. A refusal is one of [`Refusal`]'s fixed reasons: nothing from the token is
//! repeated back.

use std::collections::HashMap;
use std::time::Duration;

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde::Deserialize;

use crate::telemetry::AuthRefusal;

/// The most keys one key set may hold; the rest are ignored.
pub const MAX_KEYS: usize = 100;

/// What a token must satisfy besides its signature.
#[derive(Debug, Clone)]
pub struct Policy {
    pub issuer: String,
    pub resource: String,
    pub algorithms: Vec<Algorithm>,
    pub leeway: Duration,
}

impl Policy {
    /// A policy; algorithm names this module does not know are dropped (configuration allows only
    /// RS256, PS256, ES256 and EdDSA).
    pub fn new(issuer: &str, resource: &str, algorithms: &[String], leeway: Duration) -> Self {
        Self {
            issuer: issuer.to_string(),
            resource: resource.to_string(),
            algorithms: algorithms
                .iter()
                .filter_map(|a| match a.as_str() {
                    "RS256" => Some(Algorithm::RS256),
                    "PS256" => Some(Algorithm::PS256),
                    "ES256" => Some(Algorithm::ES256),
                    "EdDSA" => Some(Algorithm::EdDSA),
                    _ => None,
                })
                .collect(),
            leeway,
        }
    }
}

/// Why a token was refused: fixed texts, safe to log and to send back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a compact JWS, or a header or payload that does not parse.
    Malformed,
    /// A `typ` other than `at+jwt` / `application/at+jwt` / `JWT`.
    Type,
    /// A `crit` header: no extension is understood here.
    Critical,
    /// An algorithm outside `auth.oauth.algorithms`, or one that does not fit the key.
    Algorithm,
    /// No key of the issuer has this key id (after a refresh, where one was allowed).
    UnknownKey,
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// `exp`, `iss`, `aud` or `sub` is missing or not of its type.
    Claims,
    /// No key set has been loaded from the issuer yet.
    NoKeys,
    /// The introspection endpoint says the (opaque) token is not active.
    Inactive,
    /// The introspection endpoint could not be asked (down, slow, busy or answering nonsense).
    Introspection,
}

impl Refusal {
    /// The `error_description` of the 401.
    pub fn description(self) -> &'static str {
        match self {
            Self::Malformed => "the access token is not a well-formed JWT",
            Self::Type => "the access token's typ is not at+jwt",
            Self::Critical => "the access token uses a critical header extension",
            Self::Algorithm => "the access token's signature algorithm is not accepted",
            Self::UnknownKey => "the access token was signed with an unknown key",
            Self::Signature => "the access token's signature is invalid",
            Self::Expired => "the access token has expired",
            Self::NotYetValid => "the access token is not valid yet",
            Self::Issuer => "the access token is from another issuer",
            Self::Audience => "the access token is for another resource",
            Self::Claims => "the access token lacks a required claim",
            Self::NoKeys => "the authorization server's keys are not available",
            Self::Inactive => "the access token is not active",
            Self::Introspection => "the authorization server could not check the access token",
        }
    }

    /// The metric label (also logged).
    pub fn metric(self) -> AuthRefusal {
        match self {
            Self::Malformed => AuthRefusal::Malformed,
            Self::Type => AuthRefusal::Type,
            Self::Critical => AuthRefusal::Critical,
            Self::Algorithm => AuthRefusal::Algorithm,
            Self::UnknownKey => AuthRefusal::UnknownKey,
            Self::Signature => AuthRefusal::Signature,
            Self::Expired => AuthRefusal::Expired,
            Self::NotYetValid => AuthRefusal::NotYetValid,
            Self::Issuer => AuthRefusal::Issuer,
            Self::Audience => AuthRefusal::Audience,
            Self::Claims => AuthRefusal::Claims,
            Self::NoKeys => AuthRefusal::NoKeys,
            Self::Inactive => AuthRefusal::Inactive,
            Self::Introspection => AuthRefusal::IntrospectionFailed,
        }
    }
}

/// Who a valid token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub issuer: String,
    pub subject: String,
    /// `scope` (RFC 9068, space-separated) or `scp` (a list), as given.
    pub scopes: Vec<String>,
    /// The token's other claims whose values are strings or arrays of strings (for quota
    /// overrides by claim); the strings of each, at most [`MAX_CLAIM_VALUES`].
    pub claims: Vec<(String, Vec<String>)>,
}

/// Strings kept of one claim at most.
pub const MAX_CLAIM_VALUES: usize = 32;

/// The claims of `extra` that are strings or arrays of strings (see [`Identity::claims`]).
pub fn string_claims(extra: HashMap<String, serde_json::Value>) -> Vec<(String, Vec<String>)> {
    use serde_json::Value;
    extra
        .into_iter()
        .filter_map(|(name, value)| {
            let values = match value {
                Value::String(s) => vec![s],
                Value::Array(items) => items
                    .into_iter()
                    .filter_map(|v| match v {
                        Value::String(s) => Some(s),
                        _ => None,
                    })
                    .take(MAX_CLAIM_VALUES)
                    .collect(),
                _ => return None,
            };
            Some((name, values))
        })
        .collect()
}

impl Identity {
    /// The string values of claim `name` (none when absent or not strings).
    pub fn claim(&self, name: &str) -> Vec<&str> {
        self.claims
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, values)| values.iter().map(String::as_str))
            .collect()
    }
}

/// The header fields looked at before a key is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub algorithm: Algorithm,
    pub kid: Option<String>,
}

/// Reads a token's header: the algorithm (accepted ones only) and key id.
pub fn header(token: &str, policy: &Policy) -> Result<Header, Refusal> {
    if token.split('.').count() != 3 {
        return Err(Refusal::Malformed);
    }
    let header = jsonwebtoken::decode_header(token).map_err(|_| Refusal::Malformed)?;
    match header
        .typ
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("at+jwt" | "application/at+jwt" | "jwt") => {}
        _ => return Err(Refusal::Type),
    }
    if header.crit.is_some() || header.extras.inner().contains_key("b64") {
        return Err(Refusal::Critical);
    }
    if !policy.algorithms.contains(&header.alg) {
        return Err(Refusal::Algorithm);
    }
    Ok(Header {
        algorithm: header.alg,
        kid: header.kid,
    })
}

/// One signing key, with the checks prepared for it.
struct Key {
    kid: Option<String>,
    family: AlgorithmFamily,
    decoding: DecodingKey,
    validation: Validation,
}

/// The issuer's signing keys that can verify an accepted algorithm.
#[derive(Default)]
pub struct KeySet {
    keys: Vec<Key>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// What a key set document must look like.
#[derive(Deserialize)]
struct Document {
    keys: Vec<serde_json::Value>,
}

impl KeySet {
    /// The usable keys of a JWKS document (RFC 7517): signature keys (`use` absent or `sig`) of
    /// RSA, EC P-256 or OKP Ed25519 whose `alg`, if given, is accepted; symmetric and unknown keys
    /// are dropped, as is everything past [`MAX_KEYS`]. `None`: not a key set at all.
    pub fn parse(document: &[u8], policy: &Policy) -> Option<Self> {
        // The signatures of every key set are checked by the ring provider.
        super::ring_provider::install();
        let document: Document = serde_json::from_slice(document).ok()?;
        let keys = document
            .keys
            .into_iter()
            .take(MAX_KEYS)
            .filter_map(|value| key(value, policy))
            .collect();
        Some(Self { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether a key for this header is here: by key id, or without one the only key of the
    /// algorithm's family.
    pub fn has(&self, header: &Header) -> bool {
        self.find(header).is_some()
    }

    fn find(&self, header: &Header) -> Option<&Key> {
        let family = header.algorithm.family();
        match &header.kid {
            Some(kid) => self
                .keys
                .iter()
                .find(|k| k.kid.as_deref() == Some(kid.as_str())),
            None => {
                let mut of_family = self.keys.iter().filter(|k| k.family == family);
                let first = of_family.next();
                if of_family.next().is_some() {
                    None
                } else {
                    first
                }
            }
        }
    }

    /// Verifies `token` (whose header is `header`) with the key it names.
    pub fn verify(&self, token: &str, header: &Header) -> Result<Identity, Refusal> {
        let key = self.find(header).ok_or(Refusal::UnknownKey)?;
        if key.family != header.algorithm.family() {
            return Err(Refusal::Algorithm);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &key.decoding, &key.validation)
            .map_err(|e| refusal(e.kind()))?;
        let claims = data.claims;
        let scopes = match (claims.scope, claims.scp) {
            (Some(scope), _) => scope.split_whitespace().map(str::to_string).collect(),
            (None, Some(Scp::List(list))) => list,
            (None, Some(Scp::Text(text))) => text.split_whitespace().map(str::to_string).collect(),
            (None, None) => Vec::new(),
        };
        if claims.sub.is_empty() {
            return Err(Refusal::Claims);
        }
        Ok(Identity {
            issuer: claims.iss,
            subject: claims.sub,
            scopes,
            claims: string_claims(claims.extra),
        })
    }
}

/// The claims read after validation (the library has checked `exp`, `nbf`, `iss` and `aud`).
#[derive(Deserialize)]
struct Claims {
    #[serde(default)]
    iss: String,
    #[serde(default)]
    sub: String,
    scope: Option<String>,
    scp: Option<Scp>,
    /// The rest (`exp`, `aud`, ... and the issuer's own claims).
    #[serde(flatten)]
    extra: HashMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Scp {
    List(Vec<String>),
    Text(String),
}

fn refusal(kind: &jsonwebtoken::errors::ErrorKind) -> Refusal {
    use jsonwebtoken::errors::ErrorKind as E;
    match kind {
        E::InvalidSignature => Refusal::Signature,
        E::ExpiredSignature => Refusal::Expired,
        E::ImmatureSignature => Refusal::NotYetValid,
        E::InvalidIssuer => Refusal::Issuer,
        E::InvalidAudience => Refusal::Audience,
        E::MissingRequiredClaim(_) | E::InvalidClaimFormat(_) | E::InvalidSubject => {
            Refusal::Claims
        }
        E::InvalidAlgorithm
        | E::MissingAlgorithm
        | E::UnsupportedAlgorithm
        | E::InvalidAlgorithmName
        | E::InvalidKeyFormat => Refusal::Algorithm,
        _ => Refusal::Malformed,
    }
}

/// One JWK as a [`Key`], if it can verify an accepted algorithm.
fn key(value: serde_json::Value, policy: &Policy) -> Option<Key> {
    let text = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_string);
    if text("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let (kty, crv) = (text("kty")?, text("crv"));
    let family = match (kty.as_str(), crv.as_deref()) {
        ("RSA", _) => AlgorithmFamily::Rsa,
        ("EC", Some("P-256")) => AlgorithmFamily::Ec,
        ("OKP", Some("Ed25519")) => AlgorithmFamily::Ed,
        _ => return None,
    };
    let mut algorithms: Vec<Algorithm> = policy
        .algorithms
        .iter()
        .copied()
        .filter(|a| a.family() == family)
        .collect();
    if let Some(alg) = text("alg") {
        algorithms.retain(|a| format!("{a:?}") == alg);
    }
    if algorithms.is_empty() {
        return None;
    }
    let kid = text("kid");
    let jwk: Jwk = serde_json::from_value(value).ok()?;
    let decoding = DecodingKey::from_jwk(&jwk).ok()?;
    if decoding.family() != family {
        return None;
    }
    let mut validation = Validation::new_for_family(family);
    validation.algorithms = algorithms;
    validation.leeway = policy.leeway.as_secs();
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.validate_aud = true;
    validation.set_issuer(&[&policy.issuer]);
    validation.set_audience(&[&policy.resource]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    validation.sub = None;
    Some(Key {
        kid,
        family,
        decoding,
        validation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_claims_keep_strings_and_string_arrays_only() {
        let extra: HashMap<String, serde_json::Value> = serde_json::from_value(serde_json::json!({
            "tier": "gold", "groups": ["a", 1, "b"], "exp": 5, "nested": {"x": "y"}
        }))
        .unwrap();
        let identity = Identity {
            issuer: String::new(),
            subject: String::new(),
            scopes: Vec::new(),
            claims: string_claims(extra),
        };
        assert_eq!(identity.claim("tier"), ["gold"]);
        assert_eq!(identity.claim("groups"), ["a", "b"]);
        assert!(identity.claim("exp").is_empty() && identity.claim("nested").is_empty());
    }

    fn policy(algorithms: &[&str]) -> Policy {
        let algorithms: Vec<String> = algorithms.iter().map(|a| a.to_string()).collect();
        Policy::new("https://idp", "https://rs/mcp", &algorithms, Duration::ZERO)
    }

    /// A P-256 point that parses (the checks here never verify with it).
    fn ec(kid: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut key = serde_json::json!({"kty": "EC", "crv": "P-256", "kid": kid,
            "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
            "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"});
        for (k, v) in extra.as_object().unwrap() {
            key[k] = v.clone();
        }
        key
    }

    #[test]
    fn only_signature_keys_of_accepted_algorithms_are_kept() {
        let document = serde_json::json!({"keys": [
            ec("ok", serde_json::json!({})),
            ec("enc", serde_json::json!({"use": "enc"})),
            ec("wrong-alg", serde_json::json!({"alg": "ES384"})),
            ec("p384", serde_json::json!({"crv": "P-384"})),
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "bad-rsa", "n": "!!", "e": "AQAB"},
            "not a key",
        ]});
        let keys = KeySet::parse(document.to_string().as_bytes(), &policy(&["ES256"])).unwrap();
        assert_eq!(keys.len(), 1);
        let header = |kid: &str| Header {
            algorithm: Algorithm::ES256,
            kid: Some(kid.into()),
        };
        assert!(keys.has(&header("ok")));
        assert!(!keys.has(&header("hmac")));
        // Without a kid: the only key of the family.
        assert!(keys.has(&Header {
            algorithm: Algorithm::ES256,
            kid: None
        }));
        // An algorithm not accepted drops keys of its family.
        let none = KeySet::parse(document.to_string().as_bytes(), &policy(&["RS256"])).unwrap();
        assert!(none.is_empty());
        assert!(KeySet::parse(b"{\"keys\": 3}", &policy(&["ES256"])).is_none());
        assert!(KeySet::parse(b"[]", &policy(&["ES256"])).is_none());
    }

    #[test]
    fn a_key_set_holds_at_most_max_keys() {
        let keys: Vec<_> = (0..MAX_KEYS + 50)
            .map(|i| ec(&format!("k{i}"), serde_json::json!({})))
            .collect();
        let document = serde_json::json!({ "keys": keys });
        let set = KeySet::parse(document.to_string().as_bytes(), &policy(&["ES256"])).unwrap();
        assert_eq!(set.len(), MAX_KEYS);
        // Two keys of one family: a token without kid names none of them.
        assert!(!set.has(&Header {
            algorithm: Algorithm::ES256,
            kid: None
        }));
    }

    #[test]
    fn headers_are_refused_before_any_key_is_looked_at() {
        use base64::Engine as _;
        let b64 = |v: serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let token = |h: serde_json::Value| format!("{}.{}.sig", b64(h), b64(serde_json::json!({})));
        let p = policy(&["ES256"]);
        let ok = header(
            &token(serde_json::json!({"typ": "at+jwt", "alg": "ES256", "kid": "a"})),
            &p,
        );
        assert_eq!(ok.unwrap().kid.as_deref(), Some("a"));
        let refused = |h| header(&token(h), &p).unwrap_err();
        assert_eq!(
            refused(serde_json::json!({"typ": "at+jwt", "alg": "none"})),
            Refusal::Malformed
        );
        assert_eq!(
            refused(serde_json::json!({"typ": "at+jwt", "alg": "HS256"})),
            Refusal::Algorithm
        );
        assert_eq!(
            refused(serde_json::json!({"typ": "at+jwt", "alg": "RS256"})),
            Refusal::Algorithm
        );
        assert_eq!(refused(serde_json::json!({"alg": "ES256"})), Refusal::Type);
        assert_eq!(
            refused(
                serde_json::json!({"typ": "at+jwt", "alg": "ES256", "crit": ["b64"], "b64": false})
            ),
            Refusal::Critical
        );
        assert_eq!(header("a.b", &p).unwrap_err(), Refusal::Malformed);
        assert_eq!(header("a.b.c.d", &p).unwrap_err(), Refusal::Malformed);
    }
}
