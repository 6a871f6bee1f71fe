//! A provider's JSON Web Key Set, fetched once and cached across invocations.
//!
//! Keys are kept for `ttl`. A token naming a `kid` the cache does not hold triggers one
//! refetch (the provider may have rotated), at most once per `refetch_interval`, so that a
//! stream of forged `kid`s cannot turn the intake into a load generator for the JWKS host.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::Jwk;
use serde_json::Value;
use tokio::sync::Mutex;
use url::Url;

use crate::providers::AuthError;

pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
pub const DEFAULT_REFETCH_INTERVAL: Duration = Duration::from_secs(30);
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

pub struct JwksCache {
    url: Url,
    http: reqwest::Client,
    ttl: Duration,
    refetch_interval: Duration,
    state: Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    keys: Vec<Jwk>,
    fetched_at: Option<Instant>,
    last_unknown_kid_fetch: Option<Instant>,
}

impl CacheState {
    fn find(&self, kid: &str) -> Option<&Jwk> {
        self.keys
            .iter()
            .find(|k| k.common.key_id.as_deref() == Some(kid))
    }
}

impl JwksCache {
    pub fn new(url: Url, http: reqwest::Client) -> Self {
        Self::with_timing(url, http, DEFAULT_TTL, DEFAULT_REFETCH_INTERVAL)
    }

    pub fn with_timing(
        url: Url,
        http: reqwest::Client,
        ttl: Duration,
        refetch_interval: Duration,
    ) -> Self {
        Self {
            url,
            http,
            ttl,
            refetch_interval,
            state: Mutex::new(CacheState::default()),
        }
    }

    /// The key named `kid`, as of `now`.
    pub async fn key(&self, kid: &str, now: Instant) -> Result<Jwk, AuthError> {
        // One lock across the fetch: concurrent cold requests wait for one fetch, not many.
        let mut state = self.state.lock().await;
        let expired = state
            .fetched_at
            .is_none_or(|at| now.saturating_duration_since(at) >= self.ttl);
        if expired {
            match self.fetch().await {
                Ok(keys) => {
                    state.keys = keys;
                    state.fetched_at = Some(now);
                }
                // Stale keys beat no keys while the JWKS host is down.
                Err(e) if !state.keys.is_empty() => {
                    tracing::warn!(url = %self.url, error = %e, "JWKS refresh failed; using cached keys");
                }
                Err(e) => {
                    tracing::error!(url = %self.url, error = %e, "JWKS fetch failed");
                    return Err(AuthError::KeysUnavailable);
                }
            }
        }
        if let Some(key) = state.find(kid) {
            return Ok(key.clone());
        }
        let may_refetch = state
            .last_unknown_kid_fetch
            .is_none_or(|at| now.saturating_duration_since(at) >= self.refetch_interval);
        if !expired && may_refetch {
            state.last_unknown_kid_fetch = Some(now);
            match self.fetch().await {
                Ok(keys) => {
                    state.keys = keys;
                    state.fetched_at = Some(now);
                }
                Err(e) => {
                    tracing::warn!(url = %self.url, error = %e, "JWKS refetch for an unknown kid failed");
                }
            }
            if let Some(key) = state.find(kid) {
                return Ok(key.clone());
            }
        }
        Err(AuthError::UnknownKey(kid.to_owned()))
    }

    #[tracing::instrument(skip_all, fields(url = %self.url))]
    async fn fetch(&self) -> anyhow::Result<Vec<Jwk>> {
        use anyhow::Context;
        let set: Value = self
            .http
            .get(self.url.clone())
            .timeout(FETCH_TIMEOUT)
            .send()
            .await
            .context("requesting the JWKS")?
            .error_for_status()
            .context("JWKS answer")?
            .json()
            .await
            .context("reading the JWKS as JSON")?;
        let entries = set
            .get("keys")
            .and_then(Value::as_array)
            .context("the JWKS has no keys array")?;
        // A key of a type this library does not know is skipped, not fatal to the others.
        let keys: Vec<Jwk> = entries
            .iter()
            .filter_map(|k| serde_json::from_value(k.clone()).ok())
            .collect();
        tracing::info!(keys = keys.len(), "JWKS fetched");
        Ok(keys)
    }
}
