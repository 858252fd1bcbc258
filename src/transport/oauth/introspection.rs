//! Opaque access tokens, checked at the issuer's introspection endpoint (RFC 7662) with this
//! server's client credentials (HTTP Basic). A token is accepted only when the answer says
//! `active: true`, names this server's resource in `aud`, the configured issuer in `iss` (when
//! given) and an `exp` still ahead. Answers are kept under the token's SHA-256 (never the token):
//! active ones until `exp` or `introspection_cache_s`, whichever comes first, inactive ones for
//! [`NEGATIVE_FOR`]; at most `introspection_cache_entries` and [`MAX_NEGATIVE`] of them, the
//! soonest to expire evicted first. At most [`MAX_IN_FLIGHT`] introspections run at once; one that
//! fails or times out refuses the token without caching anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use code_interpreter_mcp_config::IntrospectionSettings;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::jwks::{FetchError, Keys};
use super::jwt::{Identity, Policy, Refusal};

/// How long an inactive or refused token's answer is kept.
pub const NEGATIVE_FOR: Duration = Duration::from_secs(5);
/// The most inactive answers kept.
pub const MAX_NEGATIVE: usize = 1000;
/// The most introspection requests in flight.
pub const MAX_IN_FLIGHT: usize = 16;

/// The introspection client and its cache.
pub struct Introspector {
    settings: IntrospectionSettings,
    policy: Policy,
    keys: Arc<Keys>,
    /// The endpoint once known (configured, or discovered from the metadata).
    endpoint: tokio::sync::Mutex<Option<String>>,
    cache: Mutex<Cache>,
    in_flight: Semaphore,
    timeout: Duration,
}

#[derive(Default)]
struct Cache {
    active: HashMap<[u8; 32], (Identity, Instant)>,
    inactive: HashMap<[u8; 32], (Refusal, Instant)>,
}

/// The fields of an introspection answer looked at.
#[derive(serde::Deserialize)]
struct Answer {
    active: bool,
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    aud: Option<Audience>,
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    scope: Option<String>,
    /// The rest (the issuer's own claims among them).
    #[serde(flatten)]
    extra: HashMap<String, serde_json::Value>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Introspector {
    pub fn new(
        settings: IntrospectionSettings,
        policy: Policy,
        keys: Arc<Keys>,
        timeout: Duration,
    ) -> Self {
        Self {
            endpoint: tokio::sync::Mutex::new(settings.endpoint.clone()),
            settings,
            policy,
            keys,
            cache: Mutex::new(Cache::default()),
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            timeout,
        }
    }

    /// Who an opaque token speaks for, from the cache or the issuer.
    pub async fn introspect(&self, token: &str) -> Result<Identity, Refusal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(known) = self.cached(&digest) {
            return known;
        }
        let Ok(Ok(_permit)) = tokio::time::timeout(self.timeout, self.in_flight.acquire()).await
        else {
            return Err(Refusal::Introspection);
        };
        let answer = match tokio::time::timeout(self.timeout, self.ask(token)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                tracing::warn!(%error, "token introspection failed");
                return Err(Refusal::Introspection);
            }
            Err(_) => {
                tracing::warn!("token introspection timed out");
                return Err(Refusal::Introspection);
            }
        };
        let checked = self.check(answer);
        self.remember(digest, &checked);
        checked.map(|(identity, _)| identity)
    }

    fn cached(&self, digest: &[u8; 32]) -> Option<Result<Identity, Refusal>> {
        let now = Instant::now();
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((identity, until)) = cache.active.get(digest)
            && *until > now
        {
            return Some(Ok(identity.clone()));
        }
        match cache.inactive.get(digest) {
            Some((refusal, until)) if *until > now => Some(Err(*refusal)),
            _ => None,
        }
    }

    /// Keeps an answer: an active token until its `exp` or the cache time, a refusal briefly.
    fn remember(&self, digest: [u8; 32], checked: &Result<(Identity, Duration), Refusal>) {
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match checked {
            Ok((identity, left)) => {
                let keep = (*left).min(self.settings.cache_for);
                if keep.is_zero() {
                    return;
                }
                bound(&mut cache.active, self.settings.cache_entries, now);
                cache.active.insert(digest, (identity.clone(), now + keep));
            }
            Err(refusal) => {
                bound(&mut cache.inactive, MAX_NEGATIVE, now);
                cache
                    .inactive
                    .insert(digest, (*refusal, now + NEGATIVE_FOR));
            }
        }
    }

    /// The identity of an answer, and how long the token has left.
    fn check(&self, answer: Answer) -> Result<(Identity, Duration), Refusal> {
        if !answer.active {
            return Err(Refusal::Inactive);
        }
        if answer
            .iss
            .as_ref()
            .is_some_and(|iss| *iss != self.policy.issuer)
        {
            return Err(Refusal::Issuer);
        }
        let for_us = match &answer.aud {
            Some(Audience::One(aud)) => *aud == self.policy.resource,
            Some(Audience::Many(auds)) => auds.contains(&self.policy.resource),
            None => false,
        };
        if !for_us {
            return Err(Refusal::Audience);
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let exp = answer.exp.ok_or(Refusal::Claims)?;
        if exp <= now {
            return Err(Refusal::Expired);
        }
        let subject = answer
            .sub
            .or(answer.client_id)
            .filter(|s| !s.is_empty())
            .ok_or(Refusal::Claims)?;
        Ok((
            Identity {
                issuer: self.policy.issuer.clone(),
                subject,
                scopes: answer
                    .scope
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_string)
                    .collect(),
                claims: super::jwt::string_claims(answer.extra),
            },
            Duration::from_secs(exp - now),
        ))
    }

    /// POSTs the token to the endpoint.
    async fn ask(&self, token: &str) -> Result<Answer, FetchError> {
        let endpoint = {
            let mut endpoint = self.endpoint.lock().await;
            if endpoint.is_none() {
                *endpoint = Some(self.keys.endpoint("introspection_endpoint").await?);
            }
            endpoint.clone().unwrap_or_default()
        };
        let request = self
            .keys
            .client()
            .post(&endpoint)
            .basic_auth(
                &self.settings.client_id,
                Some(self.settings.client_secret.expose()),
            )
            .form(&[("token", token), ("token_type_hint", "access_token")]);
        let body = self.keys.read(request, &endpoint).await?;
        serde_json::from_slice(&body).map_err(|_| FetchError::Document {
            url: endpoint,
            reason: "not an introspection answer",
        })
    }
}

/// Makes room for one more entry: drops expired ones, then the soonest to expire.
fn bound<V>(map: &mut HashMap<[u8; 32], (V, Instant)>, most: usize, now: Instant) {
    if map.len() < most {
        return;
    }
    map.retain(|_, (_, until)| *until > now);
    while map.len() >= most {
        let Some(soonest) = map
            .iter()
            .min_by_key(|(_, (_, until))| *until)
            .map(|(k, _)| *k)
        else {
            return;
        };
        map.remove(&soonest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_evicts_the_soonest_to_expire() {
        let now = Instant::now();
        let mut map: HashMap<[u8; 32], ((), Instant)> = HashMap::new();
        for i in 0..3u8 {
            map.insert([i; 32], ((), now + Duration::from_secs(10 + u64::from(i))));
        }
        map.insert([9; 32], ((), now - Duration::from_secs(1)));
        bound(&mut map, 3, now);
        assert_eq!(map.len(), 2, "the expired one, then the soonest");
        assert!(!map.contains_key(&[0; 32]) && !map.contains_key(&[9; 32]));
        bound(&mut map, 3, now);
        assert_eq!(map.len(), 2, "room already");
    }
}
