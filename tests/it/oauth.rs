//! `/mcp` as an OAuth resource server against an authorization server started here (axum, in
//! process: metadata and a key set that can be swapped, made to hang or to grow to 10 MB, with
//! every fetch counted) and tokens signed here with `ring` (RS256, ES256, EdDSA): the RFC 9728
//! metadata and challenges byte for byte, valid tokens of each algorithm, the token attacks (expired,
//! early, wrong audience or issuer, no subject, `alg: none`, HS256 keyed with the public key, an
//! algorithm that does not fit the key, `crit`, `jku`, a tampered payload, an oversized token), key
//! rotation, a flood of made-up key ids, a key set that hangs or is huge, principals that own their
//! sessions, and static tokens beside OAuth. The npm authorization server with the official MCP
//! client is tests/oauth/.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::rand::SystemRandom;
use ring::signature::{self as sig, KeyPair as _};
use serde_json::{Value, json};

use crate::containment::structured;
use crate::fixture::{
    Server, call_as, client, client_with_token, message, post_legacy, send_stateless,
    tool_call_body,
};

/// A signing key of the test authorization server.
enum SigningKey {
    Rsa(sig::RsaKeyPair),
    Ec(sig::EcdsaKeyPair),
    Ed(sig::Ed25519KeyPair),
}

struct Key {
    kid: String,
    key: SigningKey,
}

impl Key {
    fn rsa(kid: &str) -> Self {
        let der = include_bytes!("keys/rsa-2048-test-only.pk8");
        Self {
            kid: kid.into(),
            key: SigningKey::Rsa(sig::RsaKeyPair::from_pkcs8(der).unwrap()),
        }
    }

    fn ec(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let alg = &sig::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = sig::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        Self {
            kid: kid.into(),
            key: SigningKey::Ec(sig::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap()),
        }
    }

    fn ed(kid: &str) -> Self {
        let pkcs8 = sig::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Self {
            kid: kid.into(),
            key: SigningKey::Ed(sig::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()),
        }
    }

    fn alg(&self) -> &'static str {
        match self.key {
            SigningKey::Rsa(_) => "RS256",
            SigningKey::Ec(_) => "ES256",
            SigningKey::Ed(_) => "EdDSA",
        }
    }

    /// The public JWK.
    fn jwk(&self) -> Value {
        match &self.key {
            SigningKey::Rsa(k) => {
                let c = sig::RsaPublicKeyComponents::<Vec<u8>>::from(k.public());
                json!({"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256",
                       "n": B64.encode(c.n), "e": B64.encode(c.e)})
            }
            SigningKey::Ec(k) => {
                let point = k.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig",
                       "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..])})
            }
            SigningKey::Ed(k) => {
                json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid,
                       "x": B64.encode(k.public_key().as_ref())})
            }
        }
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match &self.key {
            SigningKey::Rsa(k) => {
                let mut out = vec![0; k.public().modulus_len()];
                k.sign(&sig::RSA_PKCS1_SHA256, &rng, message, &mut out)
                    .unwrap();
                out
            }
            SigningKey::Ec(k) => k.sign(&rng, message).unwrap().as_ref().to_vec(),
            SigningKey::Ed(k) => k.sign(message).as_ref().to_vec(),
        }
    }

    /// A token with this key's `alg` and `kid` (both overridable through `header`).
    fn token(&self, header: Value, claims: &Value) -> String {
        let mut h = json!({"typ": "at+jwt", "alg": self.alg(), "kid": self.kid});
        for (k, v) in header.as_object().unwrap() {
            if v.is_null() {
                h.as_object_mut().unwrap().remove(k);
            } else {
                h[k] = v.clone();
            }
        }
        let message = format!(
            "{}.{}",
            B64.encode(h.to_string()),
            B64.encode(claims.to_string())
        );
        let signature = self.sign(message.as_bytes());
        format!("{message}.{}", B64.encode(signature))
    }
}

/// How the test authorization server answers for its key set.
#[derive(Default)]
struct Behaviour {
    hang: AtomicBool,
    huge: AtomicBool,
    /// The introspection endpoint hangs.
    introspection_hangs: AtomicBool,
}

/// The introspection endpoint's state: its answer per opaque token, the calls it got and those
/// with wrong client credentials.
#[derive(Default)]
struct Introspection {
    answers: Mutex<std::collections::HashMap<String, Value>>,
    calls: AtomicUsize,
    bad_credentials: AtomicUsize,
}

/// The client credentials the server introspects with.
const INTROSPECTION_AUTH: &str = "code-interpreter-mcp:intro-secret";

/// The authorization server: OpenID metadata naming `/jwks` and `/introspect`, the key set
/// (replaceable), the introspection endpoint (answers set by the test), and `/elsewhere` (a `jku`
/// target that must never be fetched).
struct Issuer {
    url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    introspection: Arc<Introspection>,
    fetches: Arc<AtomicUsize>,
    elsewhere: Arc<AtomicUsize>,
    behaviour: Arc<Behaviour>,
    _server: crate::fixture::Background,
}

impl Issuer {
    fn start(keys: &[&Key]) -> Self {
        let server = crate::fixture::Background::bind();
        let url = format!("http://127.0.0.1:{}", server.port);
        let jwks: Arc<Mutex<Vec<Value>>> =
            Arc::new(Mutex::new(keys.iter().map(|k| k.jwk()).collect()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let elsewhere = Arc::new(AtomicUsize::new(0));
        let behaviour = Arc::new(Behaviour::default());
        let metadata = json!({"issuer": url, "jwks_uri": format!("{url}/jwks"),
                              "introspection_endpoint": format!("{url}/introspect")});
        let (k, f, b) = (jwks.clone(), fetches.clone(), behaviour.clone());
        let e = elsewhere.clone();
        let introspection = Arc::new(Introspection::default());
        let (i, ib) = (introspection.clone(), behaviour.clone());
        let app = axum::Router::new()
            .route(
                "/introspect",
                axum::routing::post(
                    move |headers: axum::http::HeaderMap,
                          form: axum::Form<Vec<(String, String)>>| {
                        let (i, ib) = (i.clone(), ib.clone());
                        async move {
                            i.calls.fetch_add(1, Ordering::SeqCst);
                            if ib.introspection_hangs.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                            }
                            let expected = format!(
                                "Basic {}",
                                base64::engine::general_purpose::STANDARD
                                    .encode(INTROSPECTION_AUTH)
                            );
                            if headers.get("authorization").and_then(|v| v.to_str().ok())
                                != Some(&expected)
                            {
                                i.bad_credentials.fetch_add(1, Ordering::SeqCst);
                                return (axum::http::StatusCode::UNAUTHORIZED, "{}".to_string());
                            }
                            let token = form
                                .0
                                .iter()
                                .find(|(k, _)| k == "token")
                                .map(|(_, v)| v.clone())
                                .unwrap_or_default();
                            let answer = i
                                .answers
                                .lock()
                                .unwrap()
                                .get(&token)
                                .cloned()
                                .unwrap_or(json!({"active": false}));
                            (axum::http::StatusCode::OK, answer.to_string())
                        }
                    },
                ),
            )
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || async move { axum::Json(metadata) }),
            )
            .route(
                "/jwks",
                axum::routing::get(move || {
                    let (k, f, b) = (k.clone(), f.clone(), b.clone());
                    async move {
                        f.fetch_add(1, Ordering::SeqCst);
                        if b.hang.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                        }
                        if b.huge.load(Ordering::SeqCst) {
                            let pad = "x".repeat(10 << 20);
                            return format!(r#"{{"keys":[],"pad":"{pad}"}}"#);
                        }
                        json!({"keys": *k.lock().unwrap()}).to_string()
                    }
                }),
            )
            .route(
                "/elsewhere",
                axum::routing::get(move || {
                    e.fetch_add(1, Ordering::SeqCst);
                    async { "{}" }
                }),
            );
        let server = server.serve(app);
        Self {
            url,
            keys: jwks,
            introspection,
            fetches,
            elsewhere,
            behaviour,
            _server: server,
        }
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The claims of a valid token for `server` from `issuer`, for `sub`.
fn claims(issuer: &Issuer, server: &Server, sub: &str) -> Value {
    json!({"iss": issuer.url, "sub": sub, "aud": server.url, "exp": now() + 300,
           "iat": now(), "scope": "code:run sessions:read sessions:write", "client_id": sub})
}

/// POSTs a 2026-07-28 tools/call of run_python_code with `token` (none when empty); the raw
/// response.
fn call(server: &Server, token: &str, arguments: Value) -> reqwest::blocking::Response {
    call_as(server, (!token.is_empty()).then_some(token), arguments)
}

/// The structured result of a call that must be accepted.
fn run(server: &Server, token: &str, arguments: Value) -> Value {
    let response = call(server, token, arguments);
    assert_eq!(response.status(), 200);
    structured(&message(response)).clone()
}

/// The `WWW-Authenticate` of a call that must be refused with 401.
fn refused(server: &Server, token: &str) -> String {
    let response = call(server, token, json!({"code": "1"}));
    assert_eq!(response.status(), 401, "token {token:.40} was accepted");
    response.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string()
}

fn start_server(issuer: &Issuer, extra: &[(&str, &str)]) -> Server {
    let mut envs = vec![
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_ISSUER",
            issuer.url.as_str(),
        ),
        (
            "CODE_INTERPRETER_MCP_AUTH_OAUTH_ALGORITHMS",
            "RS256,ES256,EdDSA",
        ),
    ];
    envs.extend_from_slice(extra);
    Server::start(&envs)
}

#[test]
fn issuer_tokens_are_accepted_and_every_forgery_is_refused() {
    let (rsa, ec, ed) = (Key::rsa("rsa-1"), Key::ec("ec-1"), Key::ed("ed-1"));
    let issuer = Issuer::start(&[&rsa, &ec, &ed]);
    let dir = crate::common::temp_dir("oauth-static");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "static-token\n").unwrap();
    let server = start_server(
        &issuer,
        &[(
            "CODE_INTERPRETER_MCP_AUTH_BEARER_TOKENS_FILE",
            tokens.to_str().unwrap(),
        )],
    );
    let base = server.url.trim_end_matches("/mcp").to_string();
    let metadata_url = format!("{base}/.well-known/oauth-protected-resource/mcp");

    // RFC 9728 metadata, at the path-inserted URL and the bare one, public.
    for url in [
        &metadata_url,
        &format!("{base}/.well-known/oauth-protected-resource"),
    ] {
        let response = client().get(url).send().unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["cache-control"], "max-age=300");
        assert_eq!(response.headers()["access-control-allow-origin"], "*");
        let document: Value = response.json().unwrap();
        assert_eq!(
            document,
            json!({"resource": server.url, "authorization_servers": [issuer.url],
                   "bearer_methods_supported": ["header"],
                   "resource_signing_alg_values_supported": ["RS256", "ES256", "EdDSA"],
                   "resource_name": "code-interpreter-mcp",
                   "scopes_supported": ["code:run", "sessions:read", "sessions:write"]})
        );
    }
    // No token: the challenge names the metadata (RFC 9728 §5.1) and the least useful scope.
    assert_eq!(
        refused(&server, ""),
        format!(r#"Bearer resource_metadata="{metadata_url}", scope="code:run""#)
    );

    // A valid token of each algorithm; the static token beside them.
    for key in [&rsa, &ec, &ed] {
        let token = key.token(json!({}), &claims(&issuer, &server, "alice"));
        assert_eq!(
            run(&server, &token, json!({"code": "6 * 7"}))["result"],
            "42"
        );
    }
    assert_eq!(
        run(&server, "static-token", json!({"code": "1 + 1"}))["result"],
        "2"
    );
    // RFC 9068 typ, and the plain JWT typ many issuers send.
    let plain = ec.token(json!({"typ": "JWT"}), &claims(&issuer, &server, "alice"));
    assert_eq!(run(&server, &plain, json!({"code": "3"}))["result"], "3");

    // The attacks, each with the fixed reason it gets.
    let c = |f: &dyn Fn(&mut Value)| {
        let mut c = claims(&issuer, &server, "alice");
        f(&mut c);
        c
    };
    let valid = c(&|_| {});
    let hs256 = {
        // HS256 keyed with the RSA public key as a shared secret (the classic confusion).
        let n = rsa.jwk()["n"].as_str().unwrap().to_string();
        let message = format!(
            "{}.{}",
            B64.encode(json!({"typ": "at+jwt", "alg": "HS256", "kid": "rsa-1"}).to_string()),
            B64.encode(valid.to_string())
        );
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, n.as_bytes());
        let tag = ring::hmac::sign(&key, message.as_bytes());
        format!("{message}.{}", B64.encode(tag.as_ref()))
    };
    let none = format!(
        "{}.{}.",
        B64.encode(json!({"typ": "at+jwt", "alg": "none"}).to_string()),
        B64.encode(valid.to_string())
    );
    let tampered = {
        let token = ec.token(json!({}), &valid);
        let parts: Vec<&str> = token.split('.').collect();
        let forged = c(&|c| c["sub"] = json!("mallory"));
        format!(
            "{}.{}.{}",
            parts[0],
            B64.encode(forged.to_string()),
            parts[2]
        )
    };
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "expired",
            ec.token(json!({}), &c(&|c| c["exp"] = json!(now() - 120))),
            "the access token has expired",
        ),
        (
            "early",
            ec.token(json!({}), &c(&|c| c["nbf"] = json!(now() + 600))),
            "the access token is not valid yet",
        ),
        (
            "audience",
            ec.token(
                json!({}),
                &c(&|c| c["aud"] = json!("https://other.example.com/mcp")),
            ),
            "the access token is for another resource",
        ),
        (
            "issuer",
            ec.token(
                json!({}),
                &c(&|c| c["iss"] = json!("https://evil.example.com")),
            ),
            "the access token is from another issuer",
        ),
        (
            "no sub",
            ec.token(
                json!({}),
                &c(&|c| {
                    c.as_object_mut().unwrap().remove("sub");
                }),
            ),
            "the access token lacks a required claim",
        ),
        (
            "no exp",
            ec.token(
                json!({}),
                &c(&|c| {
                    c.as_object_mut().unwrap().remove("exp");
                }),
            ),
            "the access token lacks a required claim",
        ),
        (
            "alg none",
            none,
            "the access token is not a well-formed JWT",
        ),
        (
            "hs256",
            hs256,
            "the access token's signature algorithm is not accepted",
        ),
        (
            "es256 on the rsa key",
            ec.token(json!({"kid": "rsa-1"}), &valid),
            "the access token's signature algorithm is not accepted",
        ),
        (
            "rs256 on the ec key",
            rsa.token(json!({"kid": "ec-1"}), &valid),
            "the access token's signature algorithm is not accepted",
        ),
        (
            "crit",
            ec.token(json!({"crit": ["exp"], "exp": 1}), &valid),
            "the access token uses a critical header extension",
        ),
        (
            "typ",
            ec.token(json!({"typ": "JOSE+JSON"}), &valid),
            "the access token's typ is not at+jwt",
        ),
        (
            "no typ",
            ec.token(json!({"typ": null}), &valid),
            "the access token's typ is not at+jwt",
        ),
        (
            "tampered",
            tampered,
            "the access token's signature is invalid",
        ),
        (
            "foreign key",
            Key::ec("ec-1").token(json!({}), &valid),
            "the access token's signature is invalid",
        ),
        (
            "unknown kid",
            Key::ec("kid-MARKER").token(json!({}), &valid),
            "the access token was signed with an unknown key",
        ),
    ];
    for (name, token, reason) in cases {
        let challenge = refused(&server, &token);
        assert_eq!(
            challenge,
            format!(
                r#"Bearer error="invalid_token", error_description="{reason}", resource_metadata="{metadata_url}""#
            ),
            "{name}"
        );
    }
    // A key the token points at is never fetched.
    let jku = ec.token(
        json!({"jku": format!("{}/elsewhere", issuer.url), "kid": "elsewhere-1"}),
        &valid,
    );
    refused(&server, &jku);
    assert_eq!(issuer.elsewhere.load(Ordering::SeqCst), 0);
    // Too long, and not a JWT: refused unread.
    let long = format!("{}.x.y", "a".repeat(9000));
    assert!(refused(&server, &long).contains("the bearer token is too long"));
    assert!(refused(&server, "not-a-jwt").contains("the bearer token is not accepted"));

    // Principals: a session answers only to the subject that created it.
    let alice = ed.token(json!({}), &claims(&issuer, &server, "alice"));
    let bob = ed.token(json!({}), &claims(&issuer, &server, "bob"));
    let r = run(
        &server,
        &alice,
        json!({"code": "secret = 42", "session_id": "new"}),
    );
    let id = r["session_id"].as_str().unwrap().to_string();
    let r = run(&server, &bob, json!({"code": "secret", "session_id": id}));
    assert_eq!(r["error"]["type"], "SessionNotFound", "{r}");
    let r = run(
        &server,
        "static-token",
        json!({"code": "secret", "session_id": id}),
    );
    assert_eq!(r["error"]["type"], "SessionNotFound", "{r}");
    // Alice again, with a token from another of the issuer's keys: the same principal.
    let alice_again = rsa.token(json!({}), &claims(&issuer, &server, "alice"));
    let r = run(
        &server,
        &alice_again,
        json!({"code": "secret", "session_id": id}),
    );
    assert_eq!(r["result"], "42", "{r}");
}

#[test]
fn key_ids_floods_cost_one_fetch_per_interval_and_a_hanging_or_huge_key_set_stalls_nobody() {
    let ec = Key::ec("ec-1");
    let issuer = Issuer::start(&[&ec]);
    let port = crate::metrics::free_port();
    let port_text = port.to_string();
    let server = start_server(
        &issuer,
        &[
            (
                "CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_MIN_REFRESH_INTERVAL_S",
                "2",
            ),
            ("CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_TIMEOUT_MS", "500"),
            (
                "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_ENABLED",
                "true",
            ),
            (
                "CODE_INTERPRETER_MCP_INTEGRATIONS_PROMETHEUS_PORT",
                &port_text,
            ),
        ],
    );
    let metric = |series: &str| -> u64 {
        let (_, samples) = crate::metrics::scrape(port);
        crate::metrics::value(&samples, &format!("code_interpreter_mcp_{series}")) as u64
    };
    let valid = ec.token(json!({}), &claims(&issuer, &server, "alice"));
    assert_eq!(run(&server, &valid, json!({"code": "1"}))["result"], "1");
    let fetches = issuer.fetches();
    assert_eq!(fetches, 1, "the keys are loaded once at start");

    // 300 made-up key ids within about a second: at most one more fetch.
    let started = Instant::now();
    for i in 0..300 {
        let token = ec.token(
            json!({"kid": format!("made-up-{i}")}),
            &valid_claims(&issuer, &server),
        );
        refused(&server, &token);
    }
    let flood = started.elapsed();
    let extra = issuer.fetches() - fetches;
    let allowed = 1 + (flood.as_secs_f64() / 2.0).floor() as usize;
    assert!(
        extra <= allowed,
        "{extra} fetches for 300 unknown key ids in {flood:?} (allowed {allowed})"
    );
    println!("300 unknown key ids in {flood:?}: {extra} key set fetches");
    // Counted by reason, and every fetch by outcome.
    assert_eq!(metric(r#"auth_refusals_total{reason="unknown_key"}"#), 300);
    assert_eq!(
        metric(r#"authorization_keys_fetches_total{outcome="loaded"}"#),
        issuer.fetches() as u64
    );

    // Rotation: a new key is published; its first token fetches the set once the interval passed.
    let ed = Key::ed("ed-2");
    issuer.keys.lock().unwrap().push(ed.jwk());
    std::thread::sleep(Duration::from_millis(2100));
    let rotated = ed.token(json!({}), &claims(&issuer, &server, "alice"));
    assert_eq!(run(&server, &rotated, json!({"code": "2"}))["result"], "2");

    // The key set hangs: known keys answer as before; an unknown key id waits at most the fetch
    // timeout once, and the hang never holds a valid call.
    issuer.behaviour.hang.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(2100));
    let unknown = Key::ec("ec-9").token(json!({}), &claims(&issuer, &server, "alice"));
    let started = Instant::now();
    let challenge = refused(&server, &unknown);
    let waited = started.elapsed();
    assert!(challenge.contains("unknown key"), "{challenge}");
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    let started = Instant::now();
    assert_eq!(run(&server, &valid, json!({"code": "3"}))["result"], "3");
    assert!(started.elapsed() < Duration::from_secs(5));
    issuer.behaviour.hang.store(false, Ordering::SeqCst);

    // A 10 MB key set is refused and the keys held are kept.
    issuer.behaviour.huge.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(2100));
    let before = issuer.fetches();
    refused(&server, &unknown);
    assert_eq!(issuer.fetches(), before + 1, "the huge set was fetched");
    assert_eq!(run(&server, &valid, json!({"code": "4"}))["result"], "4");
    assert_eq!(run(&server, &rotated, json!({"code": "5"}))["result"], "5");
    assert_eq!(
        metric(r#"authorization_keys_fetches_total{outcome="failed"}"#),
        2,
        "the hanging and the huge fetch"
    );
}

fn valid_claims(issuer: &Issuer, server: &Server) -> Value {
    claims(issuer, server, "alice")
}

/// A raw 2026-07-28 request with `token`.
fn send(
    server: &Server,
    token: &str,
    method: &str,
    name: Option<&str>,
    body: &Value,
) -> reqwest::blocking::Response {
    send_stateless(&client_with_token(token), &server.url, method, name, body).unwrap()
}

#[test]
fn an_mcp_session_answers_only_to_the_principal_that_opened_it() {
    let ed = Key::ed("ed-1");
    let issuer = Issuer::start(&[&ed]);
    let server = start_server(&issuer, &[]);
    let (alice, bob) = (
        client_with_token(&ed.token(json!({}), &claims(&issuer, &server, "alice"))),
        client_with_token(&ed.token(json!({}), &claims(&issuer, &server, "bob"))),
    );
    let version = "2025-11-25";
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "it", "version": "1"}}});
    let opened = post_legacy(&alice, &server.url, None, version, init);
    assert_eq!(opened.status(), 200);
    let id = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    // Bob learns nothing from Alice's id: every method answers as for an unknown session.
    let unknown = post_legacy(
        &bob,
        &server.url,
        Some("no-such-session"),
        version,
        list.clone(),
    );
    assert_eq!(unknown.status(), 404);
    let unknown_body = unknown.text().unwrap();
    let response = post_legacy(&bob, &server.url, Some(&id), version, list.clone());
    assert_eq!(response.status(), 404);
    assert_eq!(response.text().unwrap(), unknown_body);
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let response = bob
            .request(method.clone(), &server.url)
            .header("Mcp-Session-Id", &id)
            .header("MCP-Protocol-Version", version)
            .header("Accept", "text/event-stream")
            .send()
            .unwrap();
        assert_eq!(response.status(), 404, "{method}");
    }
    // Alice's session is intact.
    let response = post_legacy(&alice, &server.url, Some(&id), version, list);
    assert_eq!(response.status(), 200);
    let closed = alice
        .delete(&server.url)
        .header("Mcp-Session-Id", &id)
        .header("MCP-Protocol-Version", version)
        .send()
        .unwrap();
    assert!(closed.status().is_success());
}

#[test]
fn scopes_decide_what_a_token_may_call_and_see() {
    let ec = Key::ec("ec-1");
    let issuer = Issuer::start(&[&ec]);
    let server = start_server(&issuer, &[]);
    let metadata_url = server
        .url
        .replace("/mcp", "/.well-known/oauth-protected-resource/mcp");
    let token = |scope: &str| {
        let mut c = claims(&issuer, &server, "alice");
        c["scope"] = json!(scope);
        ec.token(json!({}), &c)
    };
    let (runner, full) = (token("code:run"), token("code:run sessions:write"));
    let tools = |token: &str| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                          "params": {"_meta": crate::fixture::stateless_meta()}});
        let reply = message(send(&server, token, "tools/list", None, &body));
        let mut names: Vec<String> = reply["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    // tools/list shows each principal only what it may call.
    let run_tools = ["get_code_snippet", "list_code_snippets", "run_python_code"];
    assert_eq!(tools(&runner), run_tools);
    assert_eq!(
        tools(&full),
        [
            "clear_session",
            "fork_session",
            "get_code_snippet",
            "list_code_snippets",
            "list_session_files",
            "run_python_code"
        ]
    );
    assert_eq!(tools(&token("sessions:read")), ["list_session_files"]);

    // A call that needs more: 403 naming every scope it needs (one challenge, RFC 6750 §3.1).
    assert_eq!(run(&server, &runner, json!({"code": "1"}))["result"], "1");
    let response = call(&server, &runner, json!({"code": "1", "session_id": "new"}));
    assert_eq!(response.status(), 403);
    assert_eq!(
        response.headers()["www-authenticate"],
        format!(
            r#"Bearer error="insufficient_scope", scope="code:run sessions:write", resource_metadata="{metadata_url}", error_description="run_python_code needs the scopes code:run sessions:write""#
        )
        .as_str()
    );
    let r = run(
        &server,
        &full,
        json!({"code": "x = 1", "session_id": "new"}),
    );
    let id = r["session_id"].as_str().unwrap().to_string();
    let files = tool_call_body("list_session_files", json!({"session_id": id}), None);
    let response = send(
        &server,
        &runner,
        "tools/call",
        Some("list_session_files"),
        &files,
    );
    assert_eq!(response.status(), 403);
    let response = send(
        &server,
        &full,
        "tools/call",
        Some("list_session_files"),
        &files,
    );
    assert_eq!(
        response.status(),
        200,
        "sessions:write implies sessions:read"
    );
    // session:// resources need sessions:read.
    let read = json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read",
                      "params": {"uri": format!("session://{id}/files/x"), "_meta": crate::fixture::stateless_meta()}});
    assert_eq!(
        send(&server, &runner, "resources/read", None, &read).status(),
        403
    );

    // A body this check cannot read needs every scope (fails closed): a batch, duplicate keys.
    let batch = json!([tool_call_body(
        "run_python_code",
        json!({"code": "1"}),
        None
    )]);
    let response = send(
        &server,
        &runner,
        "tools/call",
        Some("run_python_code"),
        &batch,
    );
    assert_eq!(response.status(), 403);
    let duplicate = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_python_code","name":"clear_session","arguments":{"code":"1"}}}"#;
    let response = client_with_token(&runner)
        .post(&server.url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "run_python_code")
        .body(duplicate)
        .send()
        .unwrap();
    assert_eq!(response.status(), 403);
}

#[test]
fn opaque_tokens_are_introspected_cached_and_refused_when_inactive() {
    let ec = Key::ec("ec-1");
    let issuer = Issuer::start(&[&ec]);
    let server = start_server(
        &issuer,
        &[
            (
                "CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CLIENT_ID",
                "code-interpreter-mcp",
            ),
            (
                "CODE_INTERPRETER_MCP_AUTH_OAUTH_INTROSPECTION_CLIENT_SECRET",
                "${CIM_IT_INTROSPECTION_SECRET}",
            ),
            ("CIM_IT_INTROSPECTION_SECRET", "intro-secret"),
            ("CODE_INTERPRETER_MCP_AUTH_OAUTH_JWKS_TIMEOUT_MS", "500"),
        ],
    );
    let answer = |sub: &str, f: &dyn Fn(&mut Value)| {
        let mut a = json!({"active": true, "iss": issuer.url, "aud": [server.url], "sub": sub,
                           "exp": now() + 300, "scope": "code:run sessions:write",
                           "client_id": sub, "token_type": "Bearer"});
        f(&mut a);
        a
    };
    {
        let mut answers = issuer.introspection.answers.lock().unwrap();
        answers.insert("opaque-alice".into(), answer("alice", &|_| {}));
        answers.insert("opaque-bob".into(), answer("bob", &|_| {}));
        answers.insert("opaque-inactive".into(), json!({"active": false}));
        answers.insert(
            "opaque-aud".into(),
            answer("alice", &|a| a["aud"] = json!("https://other/mcp")),
        );
        answers.insert(
            "opaque-iss".into(),
            answer("alice", &|a| a["iss"] = json!("https://evil")),
        );
        answers.insert(
            "opaque-expired".into(),
            answer("alice", &|a| a["exp"] = json!(now() - 5)),
        );
        answers.insert(
            "opaque-nobody".into(),
            answer("", &|a| {
                a.as_object_mut().unwrap().remove("client_id");
            }),
        );
    }
    let calls = || issuer.introspection.calls.load(Ordering::SeqCst);

    // Accepted, then served from the cache.
    let r = run(
        &server,
        "opaque-alice",
        json!({"code": "secret = 42", "session_id": "new"}),
    );
    let id = r["session_id"].as_str().unwrap().to_string();
    assert_eq!(calls(), 1);
    let r = run(
        &server,
        "opaque-alice",
        json!({"code": "secret", "session_id": id}),
    );
    assert_eq!(r["result"], "42");
    assert_eq!(calls(), 1, "the answer was cached");
    assert_eq!(
        issuer.introspection.bad_credentials.load(Ordering::SeqCst),
        0
    );
    // The principal is the issuer and subject, whichever kind of token carries them.
    let jwt = ec.token(json!({}), &claims(&issuer, &server, "alice"));
    assert_eq!(
        run(&server, &jwt, json!({"code": "secret", "session_id": id}))["result"],
        "42"
    );
    let r = run(
        &server,
        "opaque-bob",
        json!({"code": "secret", "session_id": id}),
    );
    assert_eq!(r["error"]["type"], "SessionNotFound", "{r}");

    for (token, reason) in [
        ("opaque-inactive", "the access token is not active"),
        ("opaque-unknown", "the access token is not active"),
        ("opaque-aud", "the access token is for another resource"),
        ("opaque-iss", "the access token is from another issuer"),
        ("opaque-expired", "the access token has expired"),
        ("opaque-nobody", "the access token lacks a required claim"),
    ] {
        let challenge = refused(&server, token);
        assert!(
            challenge.contains(&format!(r#"error_description="{reason}""#)),
            "{token}: {challenge}"
        );
    }
    // Refusals are cached briefly too: asking again costs no call.
    let before = calls();
    refused(&server, "opaque-inactive");
    assert_eq!(calls(), before);

    // An endpoint that hangs: 503 within the deadline, and JWTs keep working.
    issuer
        .behaviour
        .introspection_hangs
        .store(true, Ordering::SeqCst);
    let started = Instant::now();
    let response = call(&server, "opaque-slow", json!({"code": "1"}));
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "5");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(run(&server, &jwt, json!({"code": "7"}))["result"], "7");
}

/// `[[quotas.overrides]]` by claim: a token whose `tier` claim (a string, or an array holding it)
/// is `gold` gets the override's quotas, another principal the server's.
#[test]
fn a_claim_picks_the_quotas_of_an_override() {
    let ec = Key::ec("ec-1");
    let issuer = Issuer::start(&[&ec]);
    let dir = crate::common::temp_dir("oauth-overrides");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[quotas]\nmax_concurrent_calls = 1\n\n[[quotas.overrides]]\nclaim = \"tier\"\nvalue = \"gold\"\nmax_concurrent_calls = 2\n",
    )
    .unwrap();
    let server = Server::start_with_args(
        &["--config", config.to_str().unwrap()],
        &[
            ("CODE_INTERPRETER_MCP_WORKERS_MAX_WORKERS", "2"),
            (
                "CODE_INTERPRETER_MCP_AUTH_OAUTH_ISSUER",
                issuer.url.as_str(),
            ),
            ("CODE_INTERPRETER_MCP_AUTH_OAUTH_ALGORITHMS", "ES256"),
        ],
    );
    let token = |sub: &str, tier: Value| {
        let mut c = claims(&issuer, &server, sub);
        c["tier"] = tier;
        ec.token(json!({}), &c)
    };
    let gold = token("carol", json!(["beta", "gold"]));
    let plain = token("dave", json!("silver"));
    // Two calls at once: the gold principal may, the other is held to one.
    for (token, second_runs) in [(&gold, true), (&plain, false)] {
        std::thread::scope(|scope| {
            let long = scope.spawn(|| {
                run(
                    &server,
                    token,
                    json!({"code": "import time; time.sleep(1.5); 'slept'"}),
                )
            });
            std::thread::sleep(std::time::Duration::from_millis(600));
            let second = run(&server, token, json!({"code": "2"}));
            if second_runs {
                assert_eq!(second["result"], "2", "{second}");
            } else {
                assert_eq!(second["error"]["quota"], "max_concurrent_calls", "{second}");
            }
            assert_eq!(long.join().unwrap()["result"], "slept");
        });
    }
}
