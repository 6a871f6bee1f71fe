//! Paddle Billing deliveries for development: notifications shaped as Paddle's SDKs' own
//! (testdata/providers/paddle/), signed with `Paddle-Signature: ts=…;h1=…`.

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde_json::{json, Value};

use crate::domain::SourceKind;
use crate::platform::config::SourceConfig;
use crate::providers::fixtures::{
    hmac_sha256, random_id, unknown_kind, Fixtures, KindeKey, Local, SignedDelivery, Spec,
};

pub struct PaddleFixtures;

/// The development source's notification destination secret (a dev-only value).
pub const DEV_SECRET: &str = "pdl_ntfset_01devsecretpaddle00000000_devonly0123456789";

/// The price a development delivery names unless told another: the paddle-node-sdk mocks'
/// "Monthly (per seat)" price of the product its items carry, which the development catalog
/// (`scripts/stack.sh`) keys as `pro`; Paddle's catalogs are keyed by price ids (§6.4).
pub const DEV_PRICE: &str = "pri_01gsz8x8sawmvhz1pv30nge1ke";
/// The development catalog's `team` price (the mocks' "Annual plan" price).
pub const DEV_TEAM_PRICE: &str = "pri_01h84cdy3xatsp16afda2gekzy";

const KINDS: &[&str] = &[
    "subscription",
    "subscription-canceled",
    "transaction-completed",
    "payment-failed",
    "refund",
];

/// The `Paddle-Signature` header value for a body sent at `ts`: HMAC-SHA256 of `"{ts}:{body}"`.
pub fn signature(secret: &[u8], ts: i64, body: &[u8]) -> String {
    let signed = [format!("{ts}:").as_bytes(), body].concat();
    format!("ts={ts};h1={}", hex::encode(hmac_sha256(secret, &signed)))
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A price as Paddle's subscriptions and transactions carry it in their items.
fn price(id: &str) -> Value {
    json!({"id": id, "product_id": "pro_01gsz4t5hdjse780zja8vvr7jg", "description": "Monthly",
           "tax_mode": "account_setting", "billing_cycle": {"interval": "month", "frequency": 1},
           "trial_period": null, "unit_price": {"amount": "3240", "currency_code": "USD"}})
}

impl Fixtures for PaddleFixtures {
    fn kinds(&self) -> &'static [&'static str] {
        KINDS
    }

    /// A Paddle notification names its event at `event_type`.
    fn event_type<'a>(&self, payload: &'a Value) -> Option<&'a str> {
        payload["event_type"].as_str()
    }

    fn sample_plan(&self) -> &'static str {
        DEV_PRICE
    }

    fn dev_source(&self, _local: &Local) -> Value {
        json!({"name": "paddle", "kind": SourceKind::Paddle.as_str(), "secrets": [DEV_SECRET],
               "livemode": false})
    }

    fn payload(&self, spec: &Spec) -> Result<(String, Value), String> {
        let customer = spec.customer.as_str();
        let event_id = spec.event_id.clone().unwrap_or_else(|| random_id("evt_"));
        let price_id = spec.plan.clone().unwrap_or_else(|| DEV_PRICE.into());
        let (start, end) = (time(spec.at), time(spec.at + Duration::days(30)));
        let (event_type, data) = match spec.kind.as_str() {
            "subscription" | "subscription-canceled" => {
                let canceled = spec.kind == "subscription-canceled";
                let status = spec
                    .status
                    .clone()
                    .unwrap_or_else(|| (if canceled { "canceled" } else { "active" }).into());
                let trialing = status == "trialing";
                let cancel = spec.cancel_at_period_end && !canceled;
                // A canceled subscription has no billing period left (the SDK's
                // subscription.canceled); a cancellation scheduled ends it with its period.
                (
                    if canceled {
                        "subscription.canceled"
                    } else {
                        "subscription.updated"
                    },
                    json!({"id": spec.object_id.clone().unwrap_or_else(|| format!("sub_{customer}")),
                           "status": status, "customer_id": customer,
                           "address_id": "add_01h7hswbfjqez51ezfhk7s6400", "business_id": null,
                           "currency_code": "USD", "collection_mode": "automatic",
                           "created_at": start, "updated_at": start, "started_at": start,
                           "first_billed_at": start, "next_billed_at": (!canceled).then(|| end.clone()),
                           "paused_at": null, "canceled_at": canceled.then(|| start.clone()),
                           "billing_cycle": {"interval": "month", "frequency": 1},
                           "current_billing_period": (!canceled).then(|| json!({"starts_at": start, "ends_at": end})),
                           "scheduled_change": cancel.then(|| json!({"action": "cancel", "effective_at": end, "resume_at": null})),
                           "billing_details": null, "discount": null, "custom_data": null,
                           "items": [{"status": "active", "quantity": 1, "recurring": true,
                                      "created_at": start, "updated_at": start,
                                      "previously_billed_at": start, "next_billed_at": (!canceled).then(|| end.clone()),
                                      "trial_dates": trialing.then(|| json!({"starts_at": start, "ends_at": end})),
                                      "price": price(&price_id)}]}),
                )
            }
            "transaction-completed" | "payment-failed" => {
                let completed = spec.kind == "transaction-completed";
                (
                    if completed {
                        "transaction.completed"
                    } else {
                        "transaction.payment_failed"
                    },
                    json!({"id": spec.object_id.clone().unwrap_or_else(|| random_id("txn_")),
                           "status": if completed { "completed" } else { "ready" },
                           "customer_id": customer, "subscription_id": format!("sub_{customer}"),
                           "origin": "subscription_recurring", "invoice_id": null, "invoice_number": null,
                           "currency_code": "USD", "collection_mode": "automatic", "discount_id": null,
                           "address_id": "add_01h7hswbfjqez51ezfhk7s6400", "business_id": null,
                           "billed_at": start, "created_at": start, "updated_at": start,
                           "billing_period": {"starts_at": start, "ends_at": end}, "custom_data": null,
                           "items": [{"price": price(&price_id), "quantity": 1, "proration": null}]}),
                )
            }
            "refund" => (
                "adjustment.updated",
                json!({"id": random_id("adj_"), "action": "refund", "type": "full", "reason": "error",
                       "status": "approved", "customer_id": customer,
                       "transaction_id": spec.object_id.clone().unwrap_or_else(|| random_id("txn_")),
                       "subscription_id": format!("sub_{customer}"), "currency_code": "USD",
                       "credit_applied_to_balance": null, "created_at": start, "updated_at": start,
                       "items": [{"id": random_id("adjitm_"), "type": "full", "amount": "3240",
                                  "item_id": random_id("txnitm_"), "proration": null}]}),
            ),
            other => return Err(unknown_kind(other, KINDS)),
        };
        Ok((
            event_id.clone(),
            json!({"event_id": event_id, "event_type": event_type, "occurred_at": time(spec.at),
                   "notification_id": random_id("ntf_"), "data": data}),
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
        Ok(SignedDelivery {
            headers: vec![
                ("content-type".into(), "application/json".into()),
                (
                    super::SIGNATURE_HEADER.into(),
                    signature(secret.as_bytes(), Utc::now().timestamp(), &body),
                ),
            ],
            body,
        })
    }
}
