//! Kinde: the body is a JWT signed RS256 with a key from the account's JWKS (cached, one
//! rate-limited refetch for an unknown `kid`); `event_timestamp` is the provider time; plan,
//! agreement, payment and overdue-invoice events for the registers. Kinde has no change feed,
//! so Kinde sources are not reconciled.

mod decide;
#[cfg(any(test, feature = "dev"))]
pub mod fixtures;
pub mod jwks;
mod verify;

use std::time::Duration;

use serde_json::Value;

pub use verify::{content_hash, parse_claims, KindeVerifier, CUSTOMER_FIELDS, ID_HEADER};

use super::{Provider, Verify};
use crate::billing::{Catalog, Decided};
use crate::config::{ConfigError, SourceConfig};
use crate::domain::DedupeKey;

pub struct Kinde;

impl Provider for Kinde {
    fn verifier(
        &self,
        config: &SourceConfig,
        tolerance: Duration,
        http: &reqwest::Client,
    ) -> Result<Box<dyn Verify>, ConfigError> {
        let url = config
            .jwks_url
            .as_deref()
            .ok_or_else(|| ConfigError::source(&config.name, "a kinde source needs jwks_url"))?;
        let url = url::Url::parse(url)
            .map_err(|e| ConfigError::source(&config.name, format!("jwks_url: {e}")))?;
        Ok(Box::new(KindeVerifier::new(
            jwks::JwksCache::new(url, http.clone()),
            tolerance,
        )))
    }

    fn decide(
        &self,
        event_type: &str,
        payload: &Value,
        dedupe_key: &DedupeKey,
        catalog: &Catalog,
    ) -> Decided {
        decide::decide(event_type, payload, dedupe_key, catalog)
    }

    #[cfg(any(test, feature = "dev"))]
    fn fixtures(&self) -> &'static dyn super::fixtures::Fixtures {
        &fixtures::KindeFixtures
    }
}
