//! Kinde: the body is a JWT signed RS256 with a key from the account's JWKS (cached, one
//! rate-limited refetch for an unknown `kid`); `event_timestamp` is the provider time; plan,
//! agreement, payment and overdue-invoice events for the registers. Kinde has no change feed:
//! a source with M2M credentials is reconciled customer by customer against the Management
//! API's billing entitlements (`api`).

pub mod api;
mod decide;
pub mod fixtures;
pub mod jwks;
pub mod meter;
mod verify;

use std::time::Duration;

use serde_json::Value;

pub use verify::{content_hash, parse_claims, KindeVerifier, CUSTOMER_FIELDS, ID_HEADER};

use super::{refused, Api, Provider, Reconciliation, Setting, Verify};
use crate::billing::Decided;
use crate::domain::Catalog;
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

    fn decide(&self, event_type: &str, payload: &Value, catalog: &Catalog) -> Decided {
        decide::decide(event_type, payload, catalog)
    }

    /// Kinde limits its Management API "per minute" and by concurrency, and publishes no number;
    /// a 429 says when the limit resets in `RateLimit-Reset` (docs.kinde.com/developer-tools/
    /// kinde-api/api-rate-limits). The budget of a provider without a published limit, until
    /// a source's `api_budget` says what Kinde agreed to.
    fn api_limit(&self, _config: &SourceConfig) -> crate::platform::budget::Limit {
        super::UNPUBLISHED_LIMIT
    }

    fn own_settings(&self) -> &'static [(Setting, &'static str)] {
        &[(
            Setting::ApiClientId,
            "is a Kinde setting (the other providers' API keys are bearer tokens)",
        )]
    }

    /// The Management API takes client credentials: a client id beside the key, whose secret
    /// is the key alone (a Kinde source signs nothing: it verifies with `jwks_url`).
    fn check(&self, config: &SourceConfig) -> Result<(), ConfigError> {
        if config.api_key_secret_id.is_some() && config.secret_id.is_some() {
            return Err(refused(
                config,
                "secret_id",
                "a Kinde source has no signing secret (it verifies with jwks_url): \
                 its M2M client secret's secret is api_key_secret_id alone",
            ));
        }
        let has_key = config.api_key.is_some() || config.api_key_secret_id.is_some();
        if has_key && config.api_client_id.is_none() {
            return Err(refused(
                config,
                "api_client_id",
                "is required with api_key or api_key_secret_id: Kinde's Management API \
                 takes an M2M application's client id and secret (the secret is the API key)",
            ));
        }
        Ok(())
    }

    /// A client id is required with an `api_key` (its `check` says so); without one the
    /// source is not reconciled.
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

    fn meter_field(&self) -> Option<(&'static str, usize)> {
        Some(("feature_code", meter::MAX_FEATURE_CODE))
    }

    /// Kinde's Management API takes the M2M client's id beside its secret.
    fn meter(&self, api: Api, feature_code: &str) -> Option<Box<dyn super::meter::Meter>> {
        let client_id = api.client_id.clone()?;
        Some(Box::new(meter::KindeMeter::new(
            api,
            client_id,
            feature_code,
        )))
    }

    fn fixtures(&self) -> &'static dyn super::fixtures::Fixtures {
        &fixtures::KindeFixtures
    }
}
