//! Stripe: `Stripe-Signature: t=…,v1=…` over `"{t}.{body}"` (any `v1` against any secret,
//! `v0` never), the event `id` as the dedupe key, `created` as the provider time; subscription,
//! invoice and refund events and entitlement summaries for the registers; `GET /v1/events` for
//! reconciliation.

mod api;
pub mod credits;
mod decide;
pub mod entitlements;
pub mod event_destination;
mod fetch;
pub mod fixtures;
pub mod meter;
pub mod thin;
mod verify;

use std::time::Duration;

use serde_json::Value;

pub use api::{StripeEvents, StripeReads};
pub use verify::{content_hash, parse_event, StripeVerifier, SIGNATURE_HEADER};

use super::{
    Api, Carrier, Fetched, Notice, Provider, ReadFor, Reads, Reconciliation, Setting, Verify,
};
use crate::billing::registers::StoredSubscription;
use crate::billing::Decided;
use crate::domain::Catalog;
use crate::platform::config::{ConfigError, SourceConfig};

pub struct Stripe;

impl Provider for Stripe {
    fn verifier(
        &self,
        config: &SourceConfig,
        tolerance: Duration,
        _http: &crate::platform::http_client::LazyClient,
    ) -> Result<Box<dyn Verify>, ConfigError> {
        let secrets = config.required_secrets()?;
        Ok(Box::new(StripeVerifier::new(
            secrets.iter().map(|s| s.as_bytes().to_vec()).collect(),
            tolerance,
        )))
    }

    fn decide(&self, event_type: &str, payload: &Value, catalog: &Catalog) -> Decided {
        decide::decide(event_type, payload, catalog)
    }

    fn reconciliation(&self, api: Api) -> Option<Reconciliation> {
        Some(Reconciliation::Feed(Box::new(StripeEvents::new(api))))
    }

    fn api_base(&self, _config: &SourceConfig) -> Option<String> {
        Some("https://api.stripe.com".to_owned())
    }

    /// "The basic rate limiter restricts the number of API requests per second as follows: Live
    /// mode: 100 read operations and 100 write operations; Test mode: 25 read operations and 25
    /// write operations" (docs.stripe.com/rate-limits). A bucket of 80 a second and 10 at once
    /// lets at most 90 out in any second; 20 and 2 at most 22: a tenth under the limit, since
    /// Stripe counts a request when it arrives and requests that waited on the way arrive
    /// bunched (a bucket at the limit drew a 429 under load, `inboxctl bench --budget`). The
    /// mode is the API key's
    /// (`sk_live_…`, `rk_live_…`: its calls count against live mode's limit), else the
    /// source's `livemode`; a source whose key is read later and that takes both modes is held
    /// to test mode's. Each endpoint has a budget of its own too ([`Self::api_endpoints`]).
    fn api_limit(&self, config: &SourceConfig) -> crate::platform::budget::Limit {
        use crate::platform::budget::Limit;
        let live = config
            .api_key
            .as_deref()
            .and_then(key_is_live)
            .or(config.livemode);
        match live {
            Some(true) => Limit {
                per_second: 80.0,
                burst: 10,
                reserved: 5,
                window: crate::platform::budget::PER_SECOND,
            },
            _ => Limit {
                per_second: 20.0,
                burst: 2,
                reserved: 1,
                window: crate::platform::budget::PER_SECOND,
            },
        }
    }

    /// "Individual API endpoints: 25 requests per second" unless noted, and "Stripe considers
    /// each named API operation as a separate endpoint (for example, `POST /v1/payment_intents`
    /// and `GET /v1/payment_intents/{id}` are separate endpoints)" (docs.stripe.com/rate-limits).
    /// Live mode's global limit (100) is above it, so a burst of one kind of read (every thin
    /// event's subscription) meets the endpoint's first (`inboxctl bench --budget 200 --live`
    /// drew 9 429s before endpoints had budgets). Each endpoint's bucket is test mode's
    /// source bucket, 20 a second and 2 at once: at most 22 in any second, a tenth under, for
    /// the same reason. Live meter events are noted apart ("1000 calls per second",
    /// ibid.), far above the source's budget they take from: no endpoint bucket for them.
    fn api_endpoints(&self, config: &SourceConfig) -> Option<crate::platform::budget::Endpoints> {
        let live = config
            .api_key
            .as_deref()
            .and_then(key_is_live)
            .or(config.livemode);
        Some(crate::platform::budget::Endpoints {
            of: match live {
                Some(true) => endpoint_live,
                _ => endpoint,
            },
            limit: crate::platform::budget::Limit {
                per_second: 20.0,
                burst: 2,
                reserved: 0,
                window: crate::platform::budget::PER_SECOND,
            },
        })
    }

    fn own_settings(&self) -> &'static [(Setting, &'static str)] {
        &[(
            Setting::Livemode,
            "is a Stripe setting (Stripe events say which mode they are from)",
        )]
    }

    fn reads(&self, api: Api) -> Option<Box<dyn Reads>> {
        Some(Box::new(StripeReads::new(api)))
    }

    fn bus_fed_var(&self) -> Option<&'static str> {
        Some(event_destination::EVENT_SOURCE_FOR_VAR)
    }

    fn meter_field(&self) -> Option<(&'static str, usize)> {
        Some(("event_name", meter::MAX_EVENT_NAME))
    }

    fn meter(&self, api: Api, event_name: &str) -> Option<Box<dyn super::meter::Meter>> {
        Some(Box::new(meter::StripeMeter::new(api, event_name)))
    }

    /// Every Stripe event says whether it is live; a source that declares its mode takes only
    /// that mode's events (docs/design.md §4.6).
    fn out_of_scope(&self, payload: &Value, livemode: Option<bool>) -> Option<String> {
        let expected = livemode?;
        match payload.get("livemode").and_then(Value::as_bool) {
            Some(live) if live != expected => Some(format!(
                "a {} event on a {} source",
                mode(live),
                mode(expected)
            )),
            _ => None,
        }
    }

    /// Thin events, event generation failures and entitlement summaries whose list is
    /// incomplete (docs/design.md §6.2).
    fn notice(&self, payload: &Value) -> Option<Notice> {
        thin::notice(payload).or_else(|| entitlements::notice(payload))
    }

    fn read_as_event(&self, read: &ReadFor<'_>, object: &Value) -> Option<Fetched> {
        thin::read_as_event(read, object)
    }

    fn tie_read(&self, payload: &Value, effect: &crate::billing::Effect) -> Option<Carrier> {
        entitlements::tie_read(payload, effect)
    }

    fn missing_read(&self, carrier: &Carrier, path: &str) -> Option<String> {
        entitlements::missing(carrier, path)
    }

    fn subscription_differs(
        &self,
        subscription: &Value,
        local: Option<&StoredSubscription>,
    ) -> bool {
        thin::differs(subscription, local)
    }

    fn fixtures(&self) -> &'static dyn super::fixtures::Fixtures {
        &fixtures::StripeFixtures
    }
}

fn mode(live: bool) -> &'static str {
    if live {
        "live-mode"
    } else {
        "test-mode"
    }
}

/// The mode of a Stripe API key, by its prefix (secret `sk_`, restricted `rk_`); `None` for a
/// key that names none.
/// The words of Stripe's paths the project calls; any other segment is an object's id.
/// A word missing here is read as an id, which puts two endpoints in one bucket: fewer calls,
/// never more.
const PATH_WORDS: &[&str] = &[
    "",
    "v1",
    "v2",
    "core",
    "accounts",
    "events",
    "billing",
    "meters",
    "meter_events",
    "meter_event_adjustments",
    "event_summaries",
    "subscriptions",
    "invoices",
    "invoice_payments",
    "customers",
    "payment_intents",
    "charges",
    "refunds",
    "entitlements",
    "active_entitlements",
    "credit_grants",
    "credit_balance_summary",
    "credit_balance_transactions",
    "search",
];

/// The endpoint a request counts against: its method and path with the ids taken out
/// (`GET /v1/subscriptions/{id}`), as Stripe counts "each named API operation".
fn endpoint(method: &http::Method, path: &str) -> Option<String> {
    let path: Vec<&str> = path
        .split('/')
        .map(|s| if PATH_WORDS.contains(&s) { s } else { "{id}" })
        .collect();
    Some(format!("{method} {}", path.join("/")))
}

/// [`endpoint`] in live mode, where meter events have a limit of their own far above the
/// source's budget.
fn endpoint_live(method: &http::Method, path: &str) -> Option<String> {
    endpoint(method, path).filter(|e| e != "POST /v1/billing/meter_events")
}

fn key_is_live(key: &str) -> Option<bool> {
    match key.get(..8) {
        Some("sk_live_" | "rk_live_") => Some(true),
        Some("sk_test_" | "rk_test_") => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::config::parse_sources;

    fn limit_of(entry: serde_json::Value) -> f64 {
        let config = parse_sources(&serde_json::json!([entry]).to_string())
            .unwrap()
            .remove(0);
        Stripe.api_limit(&config).per_second
    }

    #[test]
    fn a_sources_budget_is_under_the_limit_of_its_keys_mode() {
        let source = |extra: serde_json::Value| {
            let mut entry = serde_json::json!({"name": "stripe", "kind": "stripe",
                "secrets": ["whsec_test"]});
            entry
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            entry
        };
        assert_eq!(
            limit_of(source(serde_json::json!({"api_key": "rk_live_x"}))),
            80.0
        );
        assert_eq!(
            limit_of(source(serde_json::json!({"api_key": "sk_test_x"}))),
            20.0
        );
        assert_eq!(
            limit_of(source(
                serde_json::json!({"api_key": "sk_test_x", "livemode": true})
            )),
            20.0,
            "a test key's calls count against test mode's limit"
        );
        assert_eq!(
            limit_of(source(serde_json::json!({"livemode": true}))),
            80.0
        );
        assert_eq!(
            limit_of(source(serde_json::json!({}))),
            20.0,
            "both modes: the lower"
        );
        assert_eq!(key_is_live("whatever"), None);
    }

    #[test]
    fn an_endpoint_is_its_method_and_path_with_the_ids_taken_out() {
        let get = http::Method::GET;
        assert_eq!(
            endpoint(&get, "/v1/subscriptions/sub_1Thin").as_deref(),
            Some("GET /v1/subscriptions/{id}")
        );
        assert_eq!(
            endpoint(&get, "/v1/subscriptions/sub_other"),
            endpoint(&get, "/v1/subscriptions/sub_1Thin"),
            "reads of different objects count against one endpoint"
        );
        assert_ne!(
            endpoint(&http::Method::POST, "/v1/subscriptions/sub_1Thin"),
            endpoint(&get, "/v1/subscriptions/sub_1Thin")
        );
        assert_eq!(
            endpoint(&get, "/v1/billing/meters/mtr_1/event_summaries").as_deref(),
            Some("GET /v1/billing/meters/{id}/event_summaries")
        );
        let meter_events = "/v1/billing/meter_events";
        assert!(endpoint(&http::Method::POST, meter_events).is_some());
        assert_eq!(
            endpoint_live(&http::Method::POST, meter_events),
            None,
            "live meter events have their own limit"
        );
    }

    /// Stripe counts a request in the second it arrives (docs.stripe.com/rate-limits: "API
    /// requests per second"), the budget when its token is taken: requests that wait between
    /// the two, on a busy machine or the network, arrive bunched into one of Stripe's seconds.
    /// A budget that lets exactly the limit out in a second goes over it then (measured:
    /// `inboxctl bench --budget`, docs/benchmarks.md), so each mode's default keeps a tenth of
    /// the limit as the margin for that spread.
    #[test]
    fn each_modes_default_budget_keeps_a_tenth_of_stripes_limit_for_requests_that_arrive_bunched() {
        for (key, documented) in [("sk_test_x", 25.0), ("sk_live_x", 100.0)] {
            let config = parse_sources(
                &serde_json::json!([{"name": "stripe", "kind": "stripe",
                    "secrets": ["whsec_test"], "api_key": key}])
                .to_string(),
            )
            .unwrap()
            .remove(0);
            let limit = Stripe.api_limit(&config);
            assert!(
                limit.most_in(1.0) <= 0.9 * documented,
                "{key}: {} calls in a second against Stripe's {documented}",
                limit.most_in(1.0)
            );
            assert!(limit.reserved >= 1 && limit.reserved < limit.burst);
        }
    }
}
