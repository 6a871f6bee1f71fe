//! Lemon Squeezy deliveries for development: payloads shaped as Lemon Squeezy sends them
//! (`{"meta": {...}, "data": <JSON:API object>}`, testdata/providers/README.md), signed with
//! `X-Signature`, the hex HMAC-SHA256 of the body.

use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};

use super::verify::{dedupe_key, SIGNATURE_HEADER};
use crate::domain::SourceKind;
use crate::platform::config::SourceConfig;
use crate::providers::fixtures::{
    hmac_sha256, random_id, unknown_kind, Fixtures, KindeKey, Local, SignedDelivery, Spec,
};

pub struct LemonSqueezyFixtures;

/// The development source's signing secret (a dev-only value; Lemon Squeezy's are 6 to 40
/// characters, used as their bytes).
pub const DEV_SECRET: &str = "ls_dev_signing_secret_0123";

/// The variant a development delivery names unless told another, sent as a number as Lemon
/// Squeezy sends ids; the development catalog (`scripts/stack.sh`) keys it as `pro`, Lemon
/// Squeezy's catalogs being keyed by variant ids (§6.5). Not 1: the fixtures' product and
/// store are 1, and a product id is a plan key too.
pub const DEV_VARIANT: &str = "101";
/// The development catalog's `team` variant.
pub const DEV_TEAM_VARIANT: &str = "102";

const KINDS: &[&str] = &[
    "subscription",
    "expired",
    "order-created",
    "order-refunded",
    "payment-success",
    "payment-failed",
];

/// Lemon Squeezy's time format: RFC 3339 in UTC, to the microsecond.
fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// An id as Lemon Squeezy sends it, a number; a development id that is not one stays text.
fn number_or_text(id: &str) -> Value {
    id.parse::<u64>()
        .map(Value::from)
        .unwrap_or_else(|_| json!(id))
}

fn links(kind: &str, id: &str, related: &[&str]) -> Value {
    let relationships: serde_json::Map<String, Value> = related
        .iter()
        .map(|name| {
            (
                (*name).to_owned(),
                json!({"links": {
                    "related": format!("https://api.lemonsqueezy.com/v1/{kind}/{id}/{name}"),
                    "self": format!("https://api.lemonsqueezy.com/v1/{kind}/{id}/relationships/{name}")
                }}),
            )
        })
        .collect();
    Value::Object(relationships)
}

/// A Subscription object (lemonsqueezy.js `src/subscriptions/types.ts`).
fn subscription(spec: &Spec, expired: bool) -> (String, Value) {
    let at = spec.at;
    let id = spec
        .object_id
        .clone()
        .unwrap_or_else(|| format!("sub_{}", spec.customer));
    let cancelled = expired || spec.cancel_at_period_end;
    let status = match (expired, &spec.status) {
        (true, _) => "expired".to_owned(),
        (false, Some(status)) => status.clone(),
        (false, None) if cancelled => "cancelled".to_owned(),
        (false, None) => "active".to_owned(),
    };
    let renews = if expired { at } else { at + Duration::days(30) };
    let variant = spec.plan.clone().unwrap_or_else(|| DEV_VARIANT.into());
    let trialing = status == "on_trial";
    let attributes = json!({
        "store_id": 1, "customer_id": number_or_text(&spec.customer), "order_id": 1,
        "order_item_id": 1, "product_id": 1, "variant_id": number_or_text(&variant),
        "product_name": "Pro", "variant_name": "Default", "user_name": "Dev",
        "user_email": format!("{}@example.com", spec.customer), "status": status,
        "status_formatted": status.clone(), "card_brand": "visa", "card_last_four": "4242",
        "pause": null, "cancelled": cancelled,
        "trial_ends_at": trialing.then(|| time(renews)), "billing_anchor": 1,
        "first_subscription_item": null, "urls": {"update_payment_method": null,
            "customer_portal": null, "customer_portal_update_subscription": null},
        "renews_at": time(renews), "ends_at": cancelled.then(|| time(renews)),
        "created_at": time(at), "updated_at": time(at), "test_mode": true
    });
    let event = if expired {
        "subscription_expired"
    } else if cancelled {
        "subscription_cancelled"
    } else {
        "subscription_updated"
    };
    (
        event.to_owned(),
        json!({"type": "subscriptions", "id": id, "attributes": attributes,
               "relationships": links("subscriptions", &id, &["store", "customer", "order", "variant"]),
               "links": {"self": format!("https://api.lemonsqueezy.com/v1/subscriptions/{id}")}}),
    )
}

/// An Order object (lemonsqueezy.js `src/orders/types.ts`).
fn order(spec: &Spec, refunded: bool) -> Value {
    let at = time(spec.at);
    let id = spec.object_id.clone().unwrap_or_else(|| random_id(""));
    let variant = spec.plan.clone().unwrap_or_else(|| DEV_VARIANT.into());
    let attributes = json!({
        "store_id": 1, "customer_id": number_or_text(&spec.customer),
        "identifier": uuid::Uuid::new_v4().to_string(), "order_number": 1,
        "user_name": "Dev", "user_email": format!("{}@example.com", spec.customer),
        "currency": "USD", "currency_rate": "1.00000000", "subtotal": 2900, "discount_total": 0,
        "tax": 0, "total": 2900, "refunded_amount": if refunded { 2900 } else { 0 },
        "status": if refunded { "refunded" } else { "paid" },
        "status_formatted": if refunded { "Refunded" } else { "Paid" },
        "refunded": refunded, "refunded_at": refunded.then(|| at.clone()),
        "first_order_item": {"order_id": 1, "product_id": 1,
            "variant_id": number_or_text(&variant), "product_name": "Pro",
            "variant_name": "Default", "price": 2900, "created_at": at.clone(),
            "updated_at": at.clone(), "test_mode": true},
        "urls": {"receipt": null}, "created_at": at.clone(), "updated_at": at, "test_mode": true
    });
    json!({"type": "orders", "id": id, "attributes": attributes,
           "relationships": links("orders", &id, &["store", "customer", "order-items"]),
           "links": {"self": format!("https://api.lemonsqueezy.com/v1/orders/{id}")}})
}

/// A Subscription invoice object (lemonsqueezy.js `src/subscriptionInvoices/types.ts`).
fn invoice(spec: &Spec, paid: bool) -> Value {
    let at = time(spec.at);
    let id = spec.object_id.clone().unwrap_or_else(|| random_id(""));
    let status = if paid { "paid" } else { "pending" };
    let attributes = json!({
        "store_id": 1, "subscription_id": format!("sub_{}", spec.customer),
        "customer_id": number_or_text(&spec.customer), "user_name": "Dev",
        "user_email": format!("{}@example.com", spec.customer),
        "billing_reason": "renewal", "card_brand": "visa", "card_last_four": "4242",
        "currency": "USD", "currency_rate": "1.00000000", "status": status,
        "status_formatted": status, "refunded": false, "refunded_at": null,
        "subtotal": 2900, "discount_total": 0, "tax": 0, "tax_inclusive": false, "total": 2900,
        "refunded_amount": 0, "urls": {"invoice_url": null},
        "created_at": at.clone(), "updated_at": at, "test_mode": true
    });
    json!({"type": "subscription-invoices", "id": id, "attributes": attributes,
           "relationships": links("subscription-invoices", &id, &["store", "subscription", "customer"]),
           "links": {"self": format!("https://api.lemonsqueezy.com/v1/subscription-invoices/{id}")}})
}

impl Fixtures for LemonSqueezyFixtures {
    fn kinds(&self) -> &'static [&'static str] {
        KINDS
    }

    /// A Lemon Squeezy webhook names its event at `meta.event_name`.
    fn event_type<'a>(&self, payload: &'a Value) -> Option<&'a str> {
        payload["meta"]["event_name"].as_str()
    }

    fn sample_plan(&self) -> &'static str {
        DEV_VARIANT
    }

    fn dev_source(&self, _local: &Local) -> Value {
        json!({"name": "lemonsqueezy", "kind": SourceKind::LemonSqueezy.as_str(),
               "secrets": [DEV_SECRET], "livemode": false})
    }

    fn payload(&self, spec: &Spec) -> Result<(String, Value), String> {
        let (event_name, data) = match spec.kind.as_str() {
            "subscription" => subscription(spec, false),
            "expired" => subscription(spec, true),
            "order-created" => ("order_created".to_owned(), order(spec, false)),
            "order-refunded" => ("order_refunded".to_owned(), order(spec, true)),
            "payment-success" => (
                "subscription_payment_success".to_owned(),
                invoice(spec, true),
            ),
            "payment-failed" => (
                "subscription_payment_failed".to_owned(),
                invoice(spec, false),
            ),
            other => return Err(unknown_kind(other, KINDS)),
        };
        let payload = json!({
            "meta": {"test_mode": true, "event_name": event_name,
                     "webhook_id": "00000000-0000-4000-8000-000000000001"},
            "data": data
        });
        let key = dedupe_key(&payload)?;
        Ok((key.as_str().to_owned(), payload))
    }

    fn sign(
        &self,
        source: &SourceConfig,
        _id: &str,
        payload: &Value,
        _kinde_key: Option<&KindeKey>,
    ) -> Result<SignedDelivery, String> {
        let secret = source.secrets.first().ok_or("the source has no secret")?;
        let body = serde_json::to_vec(payload).map_err(|e| e.to_string())?;
        let event_name = payload
            .pointer("/meta/event_name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Ok(SignedDelivery {
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("x-event-name".into(), event_name.to_owned()),
                (
                    SIGNATURE_HEADER.into(),
                    hex::encode(hmac_sha256(secret.as_bytes(), &body)),
                ),
            ],
            body,
        })
    }
}
