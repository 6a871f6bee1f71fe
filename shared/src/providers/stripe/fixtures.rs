//! Stripe deliveries for development: event payloads as Stripe sends them, signed with
//! `Stripe-Signature: t=…,v1=…`.

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde_json::{json, Value};

use crate::domain::SourceKind;
use crate::platform::config::SourceConfig;
use crate::providers::fixtures::{
    hmac_sha256, random_id, unknown_kind, Fixtures, KindeKey, Local, SignedDelivery, Spec,
};

pub struct StripeFixtures;

/// The development source's signing secret (a dev-only value).
pub const DEV_SECRET: &str = "whsec_devsecret_stripe_0123456789";

const KINDS: &[&str] = &[
    "subscription",
    "subscription-deleted",
    "invoice-paid",
    "payment-failed",
    "refund",
];

/// The summary of a customer's active entitlements: one register per customer.
const CUSTOMER_KINDS: &[&str] = &["entitlements"];

/// The lookup keys of the development kind `entitlements`: a customer's active features.
pub const DEV_LOOKUP_KEYS: &[&str] = &["sso", "priority-support"];

/// An active entitlement as Stripe lists it (`Entitlements.ActiveEntitlement` of stripe-node:
/// `id`, `object`, `feature` — an id, unexpanded in events and lists — `livemode`,
/// `lookup_key`), with ids of the shape of Stripe's (`ent_test_61…`, `feat_test_61…`) made
/// from `tag`.
pub fn active_entitlement(tag: &str, lookup_key: &str) -> Value {
    json!({"id": format!("ent_test_61{tag:0>30}"), "object": "entitlements.active_entitlement",
           "feature": format!("feat_test_61{tag:0>29}"), "livemode": false, "lookup_key": lookup_key})
}

/// A customer's active-entitlement summary (`Entitlements.ActiveEntitlementSummary`): the
/// entitlements as an embedded list that says `has_more` as asked.
pub fn entitlement_summary(customer: &str, entitlements: Vec<Value>, has_more: bool) -> Value {
    json!({"object": "entitlements.active_entitlement_summary", "customer": customer,
           "entitlements": {"object": "list", "data": entitlements, "has_more": has_more,
                            "url": format!("/v1/customer/{customer}/entitlements")},
           "livemode": false})
}

/// The event `entitlements.active_entitlement_summary.updated` of `summary`, created at
/// `created`, with Stripe's `previous_attributes` when given (never read).
pub fn summary_event(id: &str, created: i64, summary: Value, previous: Option<Value>) -> Value {
    let mut data = json!({"object": summary});
    if let Some(previous) = previous {
        data["previous_attributes"] = previous;
    }
    json!({"id": id, "object": "event", "api_version": "2025-03-31.basil", "created": created,
           "data": data, "livemode": false, "pending_webhooks": 1,
           "request": {"id": null, "idempotency_key": null},
           "type": "entitlements.active_entitlement_summary.updated"})
}

pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    hex::encode(hmac_sha256(key, message))
}

/// The `Stripe-Signature` header value for a body sent at `t`.
pub fn signature(secret: &[u8], t: i64, body: &[u8]) -> String {
    let signed = [format!("{t}.").as_bytes(), body].concat();
    format!("t={t},v1={}", hmac_sha256_hex(secret, &signed))
}

/// The thin twin of the snapshot `event` (docs/design.md §5, Stripe): `v1.<its type>`, no
/// `data`, its object named by `related_object` `{id, type, url}` for the worker to read from
/// the provider API, as a destination of thin events would receive it. `None` for an event
/// whose object is not a v1 resource with an id (an entitlement summary).
pub fn thin_twin(event: &Value) -> Option<Value> {
    let object = event.pointer("/data/object")?;
    let id = object["id"].as_str()?;
    let resource = object["object"].as_str().filter(|r| !r.contains('.'))?;
    let created = DateTime::<Utc>::from_timestamp(event["created"].as_i64()?, 0)?;
    Some(json!({
        "id": event["id"], "object": "v2.core.event",
        "type": format!("v1.{}", event["type"].as_str()?),
        "livemode": event["livemode"],
        "created": created.to_rfc3339_opts(SecondsFormat::Millis, true),
        "context": event.get("account").cloned().unwrap_or(Value::Null),
        "related_object": {"id": id, "type": resource, "url": format!("/v1/{resource}s/{id}")},
    }))
}

impl Fixtures for StripeFixtures {
    fn kinds(&self) -> &'static [&'static str] {
        KINDS
    }

    fn customer_kinds(&self) -> &'static [&'static str] {
        CUSTOMER_KINDS
    }

    fn sample_plan(&self) -> &'static str {
        "price_pro"
    }

    fn dev_source(&self, _local: &Local) -> Value {
        json!({"name": "stripe", "kind": SourceKind::Stripe.as_str(), "secrets": [DEV_SECRET]})
    }

    fn payload(&self, spec: &Spec) -> Result<(String, Value), String> {
        let customer = spec.customer.as_str();
        let event_id = spec.event_id.clone().unwrap_or_else(|| random_id("evt_"));
        let price = spec.plan.clone().unwrap_or_else(|| "price_pro".into());
        let (event_type, object) = match spec.kind.as_str() {
            "subscription" | "subscription-deleted" => {
                let deleted = spec.kind == "subscription-deleted";
                let status = spec
                    .status
                    .clone()
                    .unwrap_or_else(|| (if deleted { "canceled" } else { "active" }).into());
                // API version 2024-06-20: the period is the subscription's (from basil on it is
                // each item's). A cancellation at period end sets `cancel_at` to the period end
                // and `canceled_at` to the request's time; a deleted subscription has ended.
                let (start, end) = (
                    spec.at.timestamp(),
                    (spec.at + Duration::days(30)).timestamp(),
                );
                let at = spec.at.timestamp();
                let cancel = spec.cancel_at_period_end && !deleted;
                let trialing = status == "trialing";
                (
                    if deleted {
                        "customer.subscription.deleted"
                    } else {
                        "customer.subscription.updated"
                    },
                    json!({"id": spec.object_id.clone().unwrap_or_else(|| format!("sub_{customer}")),
                           "object": "subscription", "customer": customer, "status": status,
                           "current_period_start": start, "current_period_end": end,
                           "cancel_at_period_end": cancel, "cancel_at": cancel.then_some(end),
                           "canceled_at": (cancel || deleted).then_some(at),
                           "ended_at": deleted.then_some(at),
                           "trial_start": trialing.then_some(start), "trial_end": trialing.then_some(end),
                           "items": {"object": "list", "data": [{"price": {"id": price}}]}}),
                )
            }
            "invoice-paid" | "payment-failed" => (
                if spec.kind == "invoice-paid" {
                    "invoice.paid"
                } else {
                    "invoice.payment_failed"
                },
                json!({"id": spec.object_id.clone().unwrap_or_else(|| random_id("in_")), "object": "invoice",
                       "customer": customer, "lines": {"object": "list", "data": [{"price": {"id": price}}]}}),
            ),
            "refund" => (
                "charge.refunded",
                json!({"id": random_id("ch_"), "object": "charge", "customer": customer, "refunded": true,
                       "invoice": spec.object_id.clone().unwrap_or_else(|| random_id("in_"))}),
            ),
            "entitlements" => {
                // The whole payload is the summary event: it names no object id.
                let entitlements = DEV_LOOKUP_KEYS
                    .iter()
                    .enumerate()
                    .map(|(n, key)| active_entitlement(&format!("{customer}{n}"), key))
                    .collect();
                let summary = entitlement_summary(customer, entitlements, false);
                return Ok((
                    event_id.clone(),
                    summary_event(&event_id, spec.at.timestamp(), summary, None),
                ));
            }
            other => return Err(unknown_kind(other, &[KINDS, CUSTOMER_KINDS].concat())),
        };
        Ok((
            event_id.clone(),
            json!({"id": event_id, "object": "event", "api_version": "2024-06-20", "created": spec.at.timestamp(),
                   "livemode": false, "pending_webhooks": 1, "request": {"id": null, "idempotency_key": null},
                   "type": event_type, "data": {"object": object}}),
        ))
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
        let now = Utc::now().timestamp();
        Ok(SignedDelivery {
            headers: vec![
                ("content-type".into(), "application/json".into()),
                (
                    super::SIGNATURE_HEADER.into(),
                    signature(secret.as_bytes(), now, &body),
                ),
            ],
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::Notice;

    /// `inboxctl send --thin` delivers this: the worker reads it as a thin event whose read is
    /// stored as the snapshot's type, from the object's own API path.
    #[test]
    fn a_thin_twin_names_the_snapshots_object_for_the_worker_to_read() {
        let spec = Spec {
            kind: "subscription".into(),
            customer: "cus_1".into(),
            object_id: Some("sub_1".into()),
            at: Utc::now(),
            ..Default::default()
        };
        let (_, snapshot) = StripeFixtures.payload(&spec).unwrap();
        let thin = thin_twin(&snapshot).unwrap();
        let Some(Notice::Carrier(carrier)) = super::super::thin::notice(&thin) else {
            panic!("not read as a thin event: {thin}");
        };
        assert_eq!(carrier.read_type, Some("customer.subscription.updated"));
        assert_eq!(carrier.path.as_deref(), Ok("/v1/subscriptions/sub_1"));
        assert_eq!(carrier.id, snapshot["id"].as_str().unwrap());
    }
}
