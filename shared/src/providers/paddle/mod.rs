//! Paddle Billing: `Paddle-Signature: ts=…;h1=…` over `"{ts}:{body}"` (any `h1` against any
//! secret of the notification destination), the event's `event_id` as the dedupe key and its
//! per-destination `notification_id` as the delivery id, `occurred_at` as the provider time;
//! subscription, transaction and adjustment events for the registers (docs/design.md §6.4).
//! Sandbox and live are separate Paddle environments, each with its own destinations,
//! secrets and API: the payload carries no mode, so a source's `livemode` (required) says
//! which environment it is, and with it which API it reads.

mod api;
mod decide;
pub mod fixtures;
mod verify;

use std::time::Duration;

use serde_json::Value;

pub use api::{PaddleEvents, PaddleReads};
pub use verify::{content_hash, parse_event, PaddleVerifier, SIGNATURE_HEADER};

use super::{refused, Api, Fetched, Provider, ReadFor, Reads, Reconciliation, Setting, Verify};
use crate::billing::Decided;
use crate::domain::Catalog;
use crate::platform::config::{ConfigError, SourceConfig};

pub struct Paddle;

/// Paddle's API of each environment.
pub const LIVE_API: &str = "https://api.paddle.com";
pub const SANDBOX_API: &str = "https://sandbox-api.paddle.com";

impl Provider for Paddle {
    fn verifier(
        &self,
        config: &SourceConfig,
        tolerance: Duration,
        _http: &crate::platform::http_client::LazyClient,
    ) -> Result<Box<dyn Verify>, ConfigError> {
        let secrets = config.required_secrets()?;
        Ok(Box::new(PaddleVerifier::new(
            secrets.iter().map(|s| s.as_bytes().to_vec()).collect(),
            tolerance,
        )))
    }

    fn decide(&self, event_type: &str, payload: &Value, catalog: &Catalog) -> Decided {
        decide::decide(event_type, payload, catalog)
    }

    /// Paddle's events list, walked like Stripe's, what it failed to deliver first.
    fn reconciliation(&self, api: Api) -> Option<Reconciliation> {
        Some(Reconciliation::Feed(Box::new(PaddleEvents::new(api))))
    }

    /// A subscription read, to settle a same-second tie, or for a transaction whose items
    /// name no known price before any event of its subscription.
    fn reads(&self, api: Api) -> Option<Box<dyn Reads>> {
        Some(Box::new(PaddleReads::new(api)))
    }

    fn read_as_event(&self, read: &ReadFor<'_>, object: &Value) -> Option<Fetched> {
        api::read_as_event(read, object)
    }

    /// The environment's API: sandbox for a source that is not live.
    fn api_base(&self, config: &SourceConfig) -> Option<String> {
        Some(
            if config.livemode == Some(true) {
                LIVE_API
            } else {
                SANDBOX_API
            }
            .to_owned(),
        )
    }

    /// "Most operations are limited to 240 requests per minute" per IP address, in sandbox and
    /// live alike; a 429 carries `Retry-After` (developer.paddle.com/api-reference/about/
    /// rate-limiting). A bucket of 3 a second and 20 at once lets at most 200 out in any minute.
    fn api_limit(&self, _config: &SourceConfig) -> crate::platform::budget::Limit {
        crate::platform::budget::Limit {
            per_second: 3.0,
            burst: 20,
            reserved: 2,
            window: crate::platform::budget::PER_MINUTE,
        }
    }

    fn own_settings(&self) -> &'static [(Setting, &'static str)] {
        &[(
            Setting::Livemode,
            "is a Stripe, Lemon Squeezy or Paddle setting (the mode of their events)",
        )]
    }

    /// A Paddle source says its environment: its events do not.
    fn check(&self, config: &SourceConfig) -> Result<(), ConfigError> {
        // A live API key says so (`pdl_live_apikey_…`, the SDKs' `api_key.*` notification
        // mocks): on a sandbox source it would read another environment's events.
        if config.livemode == Some(false)
            && config
                .api_key
                .as_deref()
                .is_some_and(|key| key.starts_with("pdl_live_"))
        {
            return Err(refused(
                config,
                "api_key",
                "is a live Paddle API key (pdl_live_…) on a sandbox source (livemode: false)",
            ));
        }
        if config.livemode.is_none() {
            return Err(refused(
                config,
                "livemode",
                "is required for a Paddle source: its events do not say whether they are from \
                 the sandbox (false) or live (true), and the API it reads is that environment's",
            ));
        }
        Ok(())
    }

    fn fixtures(&self) -> &'static dyn super::fixtures::Fixtures {
        &fixtures::PaddleFixtures
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::PaddleFixtures;
    use super::*;
    use crate::billing::{Decision, Effect};
    use crate::domain::SourceKind;
    use crate::platform::config::parse_sources;
    use crate::providers::fixtures::Fixtures as _;
    use crate::providers::fixtures::{payload, sign_delivery, Spec};
    use crate::providers::{check_sources, Api, Sources};

    fn checked(raw: &str) -> Result<(), String> {
        let sources = parse_sources(raw).map_err(|e| e.to_string())?;
        check_sources(&sources).map_err(|e| e.to_string())
    }

    #[test]
    fn a_paddle_source_says_its_environment_and_reads_that_api() {
        checked(r#"[{"name":"p","kind":"paddle","secrets":["pdl_ntfset_x"],"livemode":false}]"#)
            .unwrap();
        checked(r#"[{"name":"s","kind":"stripe","secrets":["x"],"livemode":true}]"#).unwrap();
        assert_eq!(
            checked(r#"[{"name":"p","kind":"paddle","secrets":["pdl_ntfset_x"]}]"#).unwrap_err(),
            "INBOX_SOURCES: source 'p': livemode: is required for a Paddle source: its events do \
             not say whether they are from the sandbox (false) or live (true), and the API it \
             reads is that environment's"
        );
        assert_eq!(
            checked(r#"[{"name":"p","kind":"paddle","secrets":["s"],"api_key":"pdl_live_apikey_01x","livemode":false}]"#)
                .unwrap_err(),
            "INBOX_SOURCES: source 'p': api_key: is a live Paddle API key (pdl_live_…) on a sandbox \
             source (livemode: false)"
        );
        checked(r#"[{"name":"p","kind":"paddle","secrets":["s"],"api_key":"pdl_live_apikey_01x","livemode":true}]"#)
            .unwrap();
        let http = reqwest::Client::new();
        for (live, base) in [("false", SANDBOX_API), ("true", LIVE_API)] {
            let raw = format!(
                r#"[{{"name":"p","kind":"paddle","secrets":["s"],"api_key":"k","livemode":{live}}}]"#
            );
            let config = &parse_sources(&raw).unwrap()[0];
            assert_eq!(Api::for_source(config, &http).unwrap().base_url, base);
        }
    }

    #[tokio::test]
    async fn a_dev_delivery_verifies_and_a_scheduled_cancellation_ends_with_its_period() {
        let raw = serde_json::Value::Array(vec![
            PaddleFixtures.dev_source(&crate::providers::fixtures::Local { jwks_url: "" })
        ])
        .to_string();
        let configs = parse_sources(&raw).unwrap();
        let sources =
            Sources::build(&configs, Duration::from_secs(300), reqwest::Client::new()).unwrap();
        let spec = Spec {
            kind: "subscription".into(),
            customer: "ctm_01h7hswb86rtps5ggbq7ybydcw".into(),
            plan: Some("pri_pro".into()),
            at: chrono::Utc::now(),
            cancel_at_period_end: true,
            ..Default::default()
        };
        let (id, body) = payload(SourceKind::Paddle, &spec).unwrap();
        let delivery = sign_delivery(&configs[0], &id, &body, None).unwrap();
        let mut headers = http::HeaderMap::new();
        for (name, value) in &delivery.headers {
            headers.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let event = sources
            .get("paddle")
            .unwrap()
            .verify(&headers, &delivery.body, chrono::Utc::now())
            .await
            .unwrap();
        assert_eq!(event.dedupe_key.as_str(), id);
        let meta = event.meta.unwrap();
        let catalog =
            Catalog::parse(r#"{"pri_pro":{"plan":"pro","monthly_allowance":500}}"#).unwrap();
        let Decision::Apply { effects, .. } =
            crate::providers::decide(SourceKind::Paddle, &meta.event_type, &body, &catalog)
        else {
            panic!("applied");
        };
        let Some(Effect::Subscription { ends, plan, .. }) = effects.first() else {
            panic!("a subscription effect");
        };
        assert_eq!(plan.as_ref().unwrap().plan, "pro");
        assert!(ends.cancel_at_period_end);
        assert!(ends.current_period_end.is_some());
        assert_eq!(ends.cancel_at, ends.current_period_end);
    }
}
