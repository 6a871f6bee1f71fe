//! Standard Webhooks (Polar) deliveries for development: payloads shaped like Polar's, signed
//! with `webhook-id`, `webhook-timestamp` and `webhook-signature: v1,<base64>`.

use chrono::{Duration, Utc};
use serde_json::{json, Value};

use crate::domain::SourceKind;
use crate::platform::config::SourceConfig;
use crate::providers::fixtures::{
    random_id, unknown_kind, Fixtures, KindeKey, Local, SignedDelivery, Spec,
};
use crate::signing::standard_webhooks::{
    decode_secret, signature, SecretEncoding, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};

pub struct StandardFixtures;

/// The development source's signing secret (a dev-only value), used as its raw bytes as
/// Polar's secrets are (`secret_encoding: raw`, docs/design.md §6.3).
pub const DEV_SECRET: &str = "polar_whs_devsecret_0123456789";

const KINDS: &[&str] = &["subscription", "revoked", "order-paid", "order-refunded"];

impl Fixtures for StandardFixtures {
    fn kinds(&self) -> &'static [&'static str] {
        KINDS
    }

    fn sample_plan(&self) -> &'static str {
        "prod_pro"
    }

    /// Named `polar`: the development source stands for Polar.
    fn dev_source(&self, _local: &Local) -> Value {
        json!({"name": "polar", "kind": SourceKind::StandardWebhooks.as_str(),
               "secrets": [DEV_SECRET], "secret_encoding": "raw"})
    }

    fn payload(&self, spec: &Spec) -> Result<(String, Value), String> {
        let at = spec.at;
        let customer = spec.customer.as_str();
        let message_id = spec.event_id.clone().unwrap_or_else(|| random_id("msg_"));
        let product = spec.plan.clone().unwrap_or_else(|| "prod_pro".into());
        let (event_type, data) = match spec.kind.as_str() {
            "subscription" | "revoked" => {
                let revoked = spec.kind == "revoked";
                let status = spec
                    .status
                    .clone()
                    .unwrap_or_else(|| (if revoked { "canceled" } else { "active" }).into());
                // Polar's ends: a cancellation at period end sets `ends_at` to the period end
                // and `canceled_at` to now; a revoked subscription ended now.
                let end = (at + Duration::days(30)).to_rfc3339();
                let cancel = spec.cancel_at_period_end && !revoked;
                let now = at.to_rfc3339();
                let trialing = status == "trialing";
                (
                    if revoked {
                        "subscription.revoked"
                    } else if cancel {
                        "subscription.canceled"
                    } else {
                        "subscription.updated"
                    },
                    json!({"id": spec.object_id.clone().unwrap_or_else(|| format!("sub_{customer}")),
                           "customer_id": customer, "status": status, "product_id": product,
                           "modified_at": now, "created_at": now,
                           "current_period_start": now, "current_period_end": end,
                           "trial_start": trialing.then_some(&now), "trial_end": trialing.then_some(&end),
                           "cancel_at_period_end": cancel,
                           "canceled_at": (cancel || revoked).then_some(&now),
                           "ends_at": if cancel { Some(&end) } else if revoked { Some(&now) } else { None },
                           "ended_at": revoked.then_some(&now)}),
                )
            }
            "order-paid" | "order-refunded" => {
                let refunded = spec.kind == "order-refunded";
                (
                    if refunded {
                        "order.refunded"
                    } else {
                        "order.paid"
                    },
                    json!({"id": spec.object_id.clone().unwrap_or_else(|| random_id("ord_")),
                           "customer_id": customer, "product_id": product,
                           "status": if refunded { "refunded" } else { "paid" },
                           "modified_at": at.to_rfc3339(), "created_at": at.to_rfc3339()}),
                )
            }
            other => return Err(unknown_kind(other, KINDS)),
        };
        Ok((
            message_id,
            json!({"type": event_type, "timestamp": at.to_rfc3339(), "data": data}),
        ))
    }

    fn sign(
        &self,
        source: &SourceConfig,
        id: &str,
        payload: &Value,
        _kinde_key: Option<&KindeKey>,
    ) -> Result<SignedDelivery, String> {
        let secret = source.secrets.first().ok_or("the source has no secret")?;
        let key = decode_secret(
            secret,
            source.secret_encoding.unwrap_or(SecretEncoding::Base64),
        )?;
        let body = serde_json::to_vec(payload).map_err(|e| e.to_string())?;
        let now = Utc::now().timestamp();
        Ok(SignedDelivery {
            headers: vec![
                ("content-type".into(), "application/json".into()),
                (ID_HEADER.into(), id.to_owned()),
                (TIMESTAMP_HEADER.into(), now.to_string()),
                (SIGNATURE_HEADER.into(), signature(&key, id, now, &body)),
            ],
            body,
        })
    }
}
