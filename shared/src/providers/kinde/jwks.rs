//! A provider's JSON Web Key Set, fetched once and cached across invocations.
//!
//! Keys are kept for `ttl`. A token naming a `kid` the cache does not hold triggers one
//! refetch (the provider may have rotated), at most once per `refetch_interval`, so that a
//! stream of forged `kid`s cannot turn the intake into a load generator for the JWKS host.
//!
//! One fetch at a time, and no lock is held across it: the request that starts a fetch marks
//! it in flight; others use the cached keys, or (with none) wait for that fetch to finish. A
//! failed fetch is remembered for `backoff`: meanwhile requests are answered from the stale
//! keys, or at once with "keys unavailable" (503) — never by another fetch.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::Jwk;
use serde_json::Value;
use tokio::sync::Notify;
use url::Url;

use crate::platform::http_client::LazyClient;
use crate::signing::AuthError;

pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
pub const DEFAULT_REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// How long a failed fetch is remembered before another is tried.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(30);
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// All one key lookup may take, every fetch and wait in it included: a refresh that finds
/// the kid missing fetches once more (a rotation), and a request may wait on another's fetch
/// before it makes its own. After that the cached keys answer, if they hold the kid, and
/// otherwise "keys unavailable" (503: the provider retries), so that the intake's worst path
/// stays inside its function's timeout (template.yaml).
pub const LOOKUP_BUDGET: Duration = FETCH_TIMEOUT;

pub struct JwksCache {
    url: Url,
    http: LazyClient,
    ttl: Duration,
    refetch_interval: Duration,
    backoff: Duration,
    /// Held only to read or write the state, never across an await.
    state: Mutex<CacheState>,
    /// Wakes the requests waiting on a fetch in flight.
    fetched: Notify,
}

#[derive(Default)]
struct CacheState {
    keys: Vec<Jwk>,
    fetched_at: Option<Instant>,
    failed_at: Option<Instant>,
    last_unknown_kid_fetch: Option<Instant>,
    in_flight: bool,
}

impl CacheState {
    fn find(&self, kid: &str) -> Option<&Jwk> {
        self.keys
            .iter()
            .find(|k| k.common.key_id.as_deref() == Some(kid))
    }
}

/// What a request does next, decided under the state lock.
enum Next {
    Answer(Result<Box<Jwk>, AuthError>),
    Fetch,
    Wait,
}

/// Clears the in-flight mark, and wakes the waiters, when the fetching request ends, even
/// if it is dropped mid-fetch.
struct InFlight<'a>(&'a JwksCache);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.lock().in_flight = false;
        self.0.fetched.notify_waiters();
    }
}

impl JwksCache {
    pub fn new(url: Url, http: impl Into<LazyClient>) -> Self {
        Self::with_timing(url, http, DEFAULT_TTL, DEFAULT_REFETCH_INTERVAL)
    }

    pub fn with_timing(
        url: Url,
        http: impl Into<LazyClient>,
        ttl: Duration,
        refetch_interval: Duration,
    ) -> Self {
        Self {
            url,
            http: http.into(),
            ttl,
            refetch_interval,
            backoff: DEFAULT_BACKOFF,
            state: Mutex::new(CacheState::default()),
            fetched: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key named `kid`, as of `now`, within [`LOOKUP_BUDGET`].
    pub async fn key(&self, kid: &str, now: Instant) -> Result<Jwk, AuthError> {
        match tokio::time::timeout(LOOKUP_BUDGET, self.lookup(kid, now)).await {
            Ok(answer) => answer,
            Err(_) => {
                tracing::warn!(url = %self.url, kid, "JWKS lookup given up after {LOOKUP_BUDGET:?}");
                // Stale keys beat no answer; a fetch cut short here is tried again later.
                self.lock()
                    .find(kid)
                    .cloned()
                    .ok_or(AuthError::KeysUnavailable)
            }
        }
    }

    async fn lookup(&self, kid: &str, now: Instant) -> Result<Jwk, AuthError> {
        loop {
            let waiting = self.fetched.notified();
            tokio::pin!(waiting);
            // Registered before the state is read, so a fetch that ends in between still
            // wakes this request.
            waiting.as_mut().enable();
            match self.next(kid, now) {
                Next::Answer(answer) => return answer.map(|key| *key),
                Next::Wait => {
                    // A fetch is bounded by its timeout; the wait too, in case of a bug.
                    let _ = tokio::time::timeout(FETCH_TIMEOUT * 2, waiting).await;
                }
                Next::Fetch => {
                    let in_flight = InFlight(self);
                    let fetched = self.fetch().await;
                    let mut state = self.lock();
                    state.in_flight = false;
                    match fetched {
                        Ok(keys) => {
                            state.keys = keys;
                            state.fetched_at = Some(now);
                            state.failed_at = None;
                        }
                        Err(e) => {
                            if state.keys.is_empty() {
                                tracing::error!(url = %self.url, error = %e, "JWKS fetch failed");
                            } else {
                                // Stale keys beat no keys while the JWKS host is down.
                                tracing::warn!(url = %self.url, error = %e, "JWKS refresh failed; using cached keys");
                            }
                            state.failed_at = Some(now);
                        }
                    }
                    drop(state);
                    drop(in_flight);
                }
            }
        }
    }

    /// Decides, under the lock and without waiting, what a request for `kid` does next.
    fn next(&self, kid: &str, now: Instant) -> Next {
        let mut state = self.lock();
        let within = |at: Option<Instant>, span: Duration| {
            at.is_some_and(|at| now.saturating_duration_since(at) < span)
        };
        let fresh = within(state.fetched_at, self.ttl);
        let backing_off = within(state.failed_at, self.backoff);
        if let Some(key) = state.find(kid) {
            if fresh || backing_off || state.in_flight {
                return Next::Answer(Ok(Box::new(key.clone())));
            }
        }
        if state.in_flight {
            return if state.keys.is_empty() {
                Next::Wait
            } else {
                Next::Answer(Err(AuthError::UnknownKey(kid.to_owned())))
            };
        }
        if backing_off {
            return Next::Answer(Err(if state.keys.is_empty() {
                AuthError::KeysUnavailable
            } else {
                AuthError::UnknownKey(kid.to_owned())
            }));
        }
        if !fresh {
            state.in_flight = true;
            return Next::Fetch;
        }
        // Fresh keys without this kid: one refetch per interval, in case of a rotation.
        if within(state.last_unknown_kid_fetch, self.refetch_interval)
            || state.last_unknown_kid_fetch == Some(now)
        {
            return Next::Answer(Err(AuthError::UnknownKey(kid.to_owned())));
        }
        state.last_unknown_kid_fetch = Some(now);
        state.in_flight = true;
        Next::Fetch
    }

    #[tracing::instrument(skip_all, fields(url = %self.url))]
    async fn fetch(&self) -> anyhow::Result<Vec<Jwk>> {
        use anyhow::Context;
        let set: Value = self
            .http
            .get()
            .context("building the HTTP client")?
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
