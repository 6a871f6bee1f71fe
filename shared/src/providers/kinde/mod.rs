//! Kinde: the body is a JWT signed RS256 with a key from the account's JWKS (cached, one
//! rate-limited refetch for an unknown `kid`); `event_timestamp` is the provider time; plan,
//! agreement, payment and overdue-invoice events for the registers. Kinde has no change feed:
//! a source with M2M credentials is reconciled customer by customer against the Management
//! API's billing entitlements (`api`).

pub mod api;
mod decide;
#[cfg(any(test, feature = "dev"))]
pub mod fixtures;
pub mod jwks;
mod verify;

use std::time::Duration;

use serde_json::Value;

pub use verify::{content_hash, parse_claims, KindeVerifier, CUSTOMER_FIELDS, ID_HEADER};

use super::{Api, Provider, Reconciliation, Verify};
use crate::billing::Decided;
use crate::domain::{Catalog, DedupeKey};
use crate::platform::config::{ConfigError, SourceConfig};

pub struct Kinde;

impl Provider for Kinde {
    fn verifier(
        &self,
        config: &SourceConfig,
        tolerance: Duration,
        http: &crate::platform::http_client::LazyClient,
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
        _dedupe_key: &DedupeKey,
        catalog: &Catalog,
    ) -> Decided {
        // Nothing here depends on the dedupe key, which may be the unsigned `webhook-id`.
        decide::decide(event_type, payload, catalog)
    }

    /// A client id is required with an `api_key` (`config::parse_sources` says so); without
    /// one the source is not reconciled.
    fn reconciliation(&self, api: Api) -> Option<Reconciliation> {
        let client_id = api.client_id.clone()?;
        Some(Reconciliation::Customers(Box::new(
            api::KindeEntitlements::new(api, client_id),
        )))
    }

    /// The business's Kinde domain, where its JWKS is served: `https://<sub>.kinde.com`.
    fn api_base(&self, config: &SourceConfig) -> Option<String> {
        let url = url::Url::parse(config.jwks_url.as_deref()?).ok()?;
        Some(url.origin().ascii_serialization())
    }

    #[cfg(any(test, feature = "dev"))]
    fn fixtures(&self) -> &'static dyn super::fixtures::Fixtures {
        &fixtures::KindeFixtures
    }
}
