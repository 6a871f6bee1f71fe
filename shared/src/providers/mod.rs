//! Provider verification and parsing: turns one signed HTTP delivery into a verified event.
//!
//! Each provider module owns its signature scheme and its envelope; this module owns what they
//! have in common: the verified event, the authentication errors and the source registry.

pub mod jwks;
pub mod kinde;
pub mod sign;
pub mod standard;
pub mod stripe;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use http::HeaderMap;
use serde_json::Value;

use crate::config::{SecretEncoding, SourceConfig, SourceKind};
use crate::domain::{ContentHash, CustomerId, DedupeKey, ProviderTime};

/// Why a delivery was not accepted as coming from the provider. Every variant but
/// `KeysUnavailable` is the sender's fault (401); that one is ours (503, the provider retries).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("signature does not match")]
    BadSignature,
    #[error("timestamp is older than the {0} s tolerance")]
    Stale(u64),
    #[error("timestamp is further than {0} s in the future")]
    Future(u64),
    #[error("signing key id '{0}' is not in the provider's key set")]
    UnknownKey(String),
    #[error("signing algorithm '{0}' is not allowed")]
    AlgorithmNotAllowed(String),
    #[error("signing key '{0}' is not an RSA key")]
    WrongKeyType(String),
    #[error("the provider's signing keys could not be fetched")]
    KeysUnavailable,
}

/// What a parser learned from a verified envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMeta {
    pub event_type: String,
    pub customer: Option<CustomerId>,
    pub occurred_at: ProviderTime,
}

/// A delivery whose signature checked out. It is stored whether or not it parses:
/// an unparseable one is kept as evidence and marked unprocessable.
#[derive(Debug, Clone)]
pub struct VerifiedEvent {
    pub dedupe_key: DedupeKey,
    pub content_hash: ContentHash,
    /// The signed content as JSON (for Kinde, the token's claims), when it is JSON.
    pub payload: Option<Value>,
    /// The signed send time of this attempt.
    pub sent_at: Option<DateTime<Utc>>,
    /// The provider's id for this delivery or message, when it sends one.
    pub delivery_id: Option<String>,
    pub meta: Result<EventMeta, String>,
}

/// One configured source: its name in the route and how its deliveries are verified.
pub struct Source {
    pub name: String,
    verifier: Verifier,
}

enum Verifier {
    Kinde(kinde::KindeVerifier),
    Stripe(stripe::StripeVerifier),
    Standard(standard::StandardVerifier),
}

impl Source {
    pub fn from_config(
        config: &SourceConfig,
        default_tolerance: Duration,
        http: reqwest::Client,
    ) -> Result<Self, String> {
        let tolerance = config
            .tolerance_secs
            .map(Duration::from_secs)
            .unwrap_or(default_tolerance);
        let verifier = match config.kind {
            SourceKind::Kinde => {
                let url = config
                    .jwks_url
                    .as_deref()
                    .ok_or("a kinde source needs jwks_url")?;
                let url = url::Url::parse(url).map_err(|e| format!("jwks_url: {e}"))?;
                Verifier::Kinde(kinde::KindeVerifier::new(
                    jwks::JwksCache::new(url, http),
                    tolerance,
                ))
            }
            SourceKind::Stripe => {
                let secrets = non_empty_secrets(config)?;
                Verifier::Stripe(stripe::StripeVerifier::new(
                    secrets.iter().map(|s| s.as_bytes().to_vec()).collect(),
                    tolerance,
                ))
            }
            SourceKind::StandardWebhooks => {
                let secrets = non_empty_secrets(config)?;
                let encoding = config.secret_encoding.unwrap_or(SecretEncoding::Base64);
                let keys = secrets
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        standard::decode_secret(s, encoding)
                            .map_err(|e| format!("secrets[{i}]: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Verifier::Standard(standard::StandardVerifier::new(keys, tolerance))
            }
        };
        Ok(Self {
            name: config.name.clone(),
            verifier,
        })
    }

    /// Checks the delivery's signature and time, then parses what it can of the envelope.
    pub async fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedEvent, AuthError> {
        match &self.verifier {
            Verifier::Kinde(v) => v.verify(headers, body, now).await,
            Verifier::Stripe(v) => v.verify(headers, body, now),
            Verifier::Standard(v) => v.verify(headers, body, now),
        }
    }
}

fn non_empty_secrets(config: &SourceConfig) -> Result<&[String], String> {
    if config.secrets.is_empty() || config.secrets.iter().any(|s| s.trim().is_empty()) {
        return Err("secrets must be a non-empty list of non-empty strings".into());
    }
    Ok(&config.secrets)
}

/// The configured sources by route name.
#[derive(Default)]
pub struct Sources(HashMap<String, Source>);

impl Sources {
    pub fn build(
        configs: &[SourceConfig],
        default_tolerance: Duration,
        http: reqwest::Client,
    ) -> Result<Self, String> {
        let mut sources = HashMap::new();
        for config in configs {
            let source = Source::from_config(config, default_tolerance, http.clone())
                .map_err(|e| format!("source '{}': {e}", config.name))?;
            if sources.insert(config.name.clone(), source).is_some() {
                return Err(format!("source '{}' is configured twice", config.name));
            }
        }
        Ok(Self(sources))
    }

    pub fn get(&self, name: &str) -> Option<&Source> {
        self.0.get(name)
    }
}

/// Checks a signed send time against the tolerance, both ways.
fn check_tolerance(
    sent_at: DateTime<Utc>,
    now: DateTime<Utc>,
    tolerance: Duration,
) -> Result<(), AuthError> {
    let tolerance_secs = tolerance.as_secs();
    let age = now.signed_duration_since(sent_at).num_seconds();
    let limit = i64::try_from(tolerance_secs).unwrap_or(i64::MAX);
    if age > limit {
        Err(AuthError::Stale(tolerance_secs))
    } else if -age > limit {
        Err(AuthError::Future(tolerance_secs))
    } else {
        Ok(())
    }
}

/// Whether any candidate signature is the HMAC-SHA256 of the message (given in parts) under
/// any key. `verify_slice` compares in constant time and rejects a wrong length, so a
/// truncated or empty signature never passes.
fn any_hmac_matches(keys: &[Vec<u8>], candidates: &[Vec<u8>], message: &[&[u8]]) -> bool {
    use hmac::{Hmac, Mac};
    keys.iter().any(|key| {
        candidates.iter().any(|candidate| {
            let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(key) else {
                return false;
            };
            for part in message {
                mac.update(part);
            }
            mac.verify_slice(candidate).is_ok()
        })
    })
}

/// A header's value as text, if present and printable.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// A string at a JSON pointer, if it is one.
fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// Customer at a pointer that holds either an id or an expanded object with an id.
fn customer_at(value: &Value, pointer: &str) -> Option<CustomerId> {
    let found = value.pointer(pointer)?;
    let raw = found
        .as_str()
        .or_else(|| found.get("id").and_then(Value::as_str))?;
    CustomerId::parse(raw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn tolerance_rejects_both_directions() {
        let now = Utc.timestamp_opt(1_000_000, 0).unwrap();
        let tol = Duration::from_secs(300);
        let at = |s| Utc.timestamp_opt(s, 0).unwrap();
        assert_eq!(check_tolerance(at(1_000_000 - 300), now, tol), Ok(()));
        assert_eq!(check_tolerance(at(1_000_000 + 300), now, tol), Ok(()));
        assert_eq!(
            check_tolerance(at(1_000_000 - 301), now, tol),
            Err(AuthError::Stale(300))
        );
        assert_eq!(
            check_tolerance(at(1_000_000 + 301), now, tol),
            Err(AuthError::Future(300))
        );
    }
}
