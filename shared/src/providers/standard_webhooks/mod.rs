//! Standard Webhooks senders (Polar, Svix-based senders), the provider: what their deliveries
//! and events mean — the message id as the dedupe key, `data.modified_at` (else the envelope's
//! `timestamp`) as the provider time; subscription and order events for the registers;
//! Polar's `GET /v1/subscriptions/` for reconciliation. The format itself (secrets, headers,
//! signature) is [`crate::signing::standard_webhooks`].

mod api;
pub mod credits;
mod decide;
pub mod fixtures;
pub mod meter;
mod verify;

use std::time::Duration;

use serde_json::Value;

pub use api::{PolarReads, PolarSubscriptions};
pub use verify::{parse_event, StandardVerifier};

use super::{Api, Provider, Reads, Reconciliation, Verify};
use crate::billing::Decided;
use crate::domain::Catalog;
use crate::platform::config::{ConfigError, SourceConfig};
use crate::signing::standard_webhooks::{decode_secret, SecretEncoding};

pub struct StandardWebhooks;

impl Provider for StandardWebhooks {
    fn verifier(
        &self,
        config: &SourceConfig,
        tolerance: Duration,
        _http: &crate::platform::http_client::LazyClient,
    ) -> Result<Box<dyn Verify>, ConfigError> {
        let encoding = config.secret_encoding.unwrap_or(SecretEncoding::Base64);
        let keys = config
            .required_secrets()?
            .iter()
            .enumerate()
            .map(|(i, s)| {
                decode_secret(s, encoding).map_err(|e| {
                    ConfigError::at(
                        crate::platform::config::SOURCES_VAR,
                        format!("source '{}': secrets[{i}]", config.name),
                        e,
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(StandardVerifier::new(keys, tolerance)))
    }

    fn decide(&self, event_type: &str, payload: &Value, catalog: &Catalog) -> Decided {
        decide::decide(event_type, payload, catalog)
    }

    fn reconciliation(&self, api: Api) -> Option<Reconciliation> {
        Some(Reconciliation::Sweep(Box::new(PolarSubscriptions::new(
            api,
        ))))
    }

    /// Polar's limits are per organization, per minute: 500 in production, 100 in the sandbox
    /// (`sandbox-api.polar.sh`), a 429 with `Retry-After` past them (polar.sh/docs/
    /// api-reference/introduction, Rate limits). Buckets of 6 a second and 30 at once (at most
    /// 390 in any minute) and of 1.25 and 10 (at most 85).
    fn api_limit(&self, config: &SourceConfig) -> crate::platform::budget::Limit {
        use crate::platform::budget::Limit;
        let base = config.api_base_url.as_deref().unwrap_or_default();
        match base.contains("sandbox") {
            true => Limit {
                per_second: 1.25,
                burst: 10,
                reserved: 2,
                window: crate::platform::budget::PER_MINUTE,
            },
            false => Limit {
                per_second: 6.0,
                burst: 30,
                reserved: 3,
                window: crate::platform::budget::PER_MINUTE,
            },
        }
    }

    fn api_base(&self, _config: &SourceConfig) -> Option<String> {
        Some("https://api.polar.sh".to_owned())
    }

    fn reads(&self, api: Api) -> Option<Box<dyn Reads>> {
        Some(Box::new(PolarReads::new(api)))
    }

    fn meter_field(&self) -> Option<(&'static str, usize)> {
        Some(("event_name", meter::MAX_EVENT_NAME))
    }

    fn meter(&self, api: Api, event_name: &str) -> Option<Box<dyn super::meter::Meter>> {
        Some(Box::new(meter::PolarMeter::new(api, event_name)))
    }

    fn fixtures(&self) -> &'static dyn super::fixtures::Fixtures {
        &fixtures::StandardFixtures
    }
}
