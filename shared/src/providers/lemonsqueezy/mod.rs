//! Lemon Squeezy, the provider (docs/design.md §6.5): `X-Signature`, the hex HMAC-SHA256 of
//! the raw body with the webhook's signing secret; a dedupe key made of what the notification
//! signs (its payloads carry no event id), `data.attributes.updated_at` as the provider time,
//! `data.attributes.customer_id` as the customer, `meta.test_mode` as the mode; subscription,
//! subscription invoice and order events for the registers; `GET /v1/subscriptions` for
//! reconciliation.

mod api;
mod decide;
pub mod fixtures;
mod verify;

use std::time::Duration;

use serde_json::Value;

pub use api::{LemonSqueezyReads, LemonSqueezySubscriptions};
pub use verify::{content_hash, dedupe_key, parse_event, LemonSqueezyVerifier, SIGNATURE_HEADER};

use super::{Api, Fetched, Provider, ReadFor, Reads, Reconciliation, Setting, Verify};
use crate::billing::Decided;
use crate::domain::Catalog;
use crate::platform::config::{ConfigError, SourceConfig};

pub struct LemonSqueezy;

impl Provider for LemonSqueezy {
    /// Every configured secret verifies (a webhook's secret is changed by editing it; the
    /// old and the new are both configured while deliveries signed with the old still come).
    fn verifier(
        &self,
        config: &SourceConfig,
        _tolerance: Duration,
        _http: &crate::platform::http_client::LazyClient,
    ) -> Result<Box<dyn Verify>, ConfigError> {
        let secrets = config.required_secrets()?;
        Ok(Box::new(LemonSqueezyVerifier::new(
            secrets.iter().map(|s| s.as_bytes().to_vec()).collect(),
        )))
    }

    fn decide(&self, event_type: &str, payload: &Value, catalog: &Catalog) -> Decided {
        decide::decide(event_type, payload, catalog)
    }

    fn reconciliation(&self, api: Api) -> Option<Reconciliation> {
        Some(Reconciliation::Sweep(Box::new(
            LemonSqueezySubscriptions::new(api),
        )))
    }

    /// A subscription read, for a payment before any event of its subscription or to settle
    /// a tie.
    fn reads(&self, api: Api) -> Option<Box<dyn Reads>> {
        Some(Box::new(LemonSqueezyReads::new(api)))
    }

    fn read_as_event(&self, read: &ReadFor<'_>, object: &Value) -> Option<Fetched> {
        api::read_as_event(read, object)
    }

    fn api_base(&self, _config: &SourceConfig) -> Option<String> {
        Some("https://api.lemonsqueezy.com".to_owned())
    }

    /// "The API has a rate limit of 300 calls per minute", test mode and live alike
    /// (docs.lemonsqueezy.com/api, Rate limiting). A bucket of 4 a second and 20 at once lets
    /// at most 260 out in any minute.
    fn api_limit(&self, _config: &SourceConfig) -> crate::platform::budget::Limit {
        crate::platform::budget::Limit {
            per_second: 4.0,
            burst: 20,
            reserved: 2,
            window: crate::platform::budget::PER_MINUTE,
        }
    }

    fn own_settings(&self) -> &'static [(Setting, &'static str)] {
        &[(
            Setting::Livemode,
            "is a Stripe and Lemon Squeezy setting (their events say which mode they are from)",
        )]
    }

    /// A source says which mode it takes: a store's test and live modes can deliver to one URL
    /// signed with one secret, and a source that took both would let a test-mode order grant
    /// a real plan.
    fn check(&self, config: &SourceConfig) -> Result<(), ConfigError> {
        match config.livemode {
            Some(_) => Ok(()),
            None => Err(super::refused(
                config,
                "livemode",
                "is required for a Lemon Squeezy source (true or false): test and live mode can \
                 share a URL and a signing secret, and a test-mode order would grant a real plan",
            )),
        }
    }

    /// Every Lemon Squeezy event says whether it is a test-mode one (`meta.test_mode`); a
    /// source takes only the mode it declares ([`Provider::check`] requires it; docs/design.md
    /// §4.6).
    fn out_of_scope(&self, payload: &Value, livemode: Option<bool>) -> Option<String> {
        let expected = livemode?;
        let live = !payload
            .pointer("/meta/test_mode")
            .and_then(Value::as_bool)?;
        (live != expected).then(|| format!("a {} event on a {} source", mode(live), mode(expected)))
    }

    fn fixtures(&self) -> &'static dyn super::fixtures::Fixtures {
        &fixtures::LemonSqueezyFixtures
    }
}

fn mode(live: bool) -> &'static str {
    if live {
        "live-mode"
    } else {
        "test-mode"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_source_takes_only_the_mode_it_declares() {
        let test = json!({"meta": {"test_mode": true, "event_name": "order_created"}});
        let live = json!({"meta": {"test_mode": false, "event_name": "order_created"}});
        assert_eq!(LemonSqueezy.out_of_scope(&test, Some(false)), None);
        assert_eq!(
            LemonSqueezy.out_of_scope(&live, Some(false)),
            Some("a live-mode event on a test-mode source".into())
        );
        assert_eq!(
            LemonSqueezy.out_of_scope(&test, Some(true)),
            Some("a test-mode event on a live-mode source".into())
        );
        assert_eq!(LemonSqueezy.out_of_scope(&live, None), None);
        assert_eq!(LemonSqueezy.out_of_scope(&json!({}), Some(true)), None);
    }

    /// Test and live mode can share a URL and a signing secret: a source that does not say
    /// which mode it takes would let a test-mode order grant a real plan.
    #[test]
    fn a_source_must_say_which_mode_it_takes() {
        use crate::platform::config::parse_sources;
        use crate::providers::check_sources;
        let checked =
            |raw: &str| check_sources(&parse_sources(raw).unwrap()).map_err(|e| e.to_string());
        assert_eq!(
            checked(r#"[{"name":"shop","kind":"lemonsqueezy","secrets":["x"]}]"#).unwrap_err(),
            "INBOX_SOURCES: source 'shop': livemode: is required for a Lemon Squeezy source \
             (true or false): test and live mode can share a URL and a signing secret, and a \
             test-mode order would grant a real plan"
        );
        checked(r#"[{"name":"shop","kind":"lemonsqueezy","secrets":["x"],"livemode":true}]"#)
            .unwrap();
    }
}
