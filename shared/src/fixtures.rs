//! Realistic deliveries for development: payloads shaped like each provider's, signed like
//! each provider signs them. Used by `inboxctl send` and `inboxctl scenario`.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::config::{SecretEncoding, SourceConfig, SourceKind};
use crate::providers::{sign, standard};

/// What to put in a delivery.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The event kind, in the provider's own words (see [`kinds`]).
    pub kind: String,
    pub customer: String,
    /// A plan key, price id or product id from the catalog.
    pub plan: Option<String>,
    /// The provider's time for the event.
    pub at: DateTime<Utc>,
    /// The object the event is about (subscription, order, invoice, payment); derived from
    /// the customer when absent.
    pub object_id: Option<String>,
    /// For subscription events: the object's status.
    pub status: Option<String>,
    /// The event's own id / message id; random when absent.
    pub event_id: Option<String>,
}

/// The kinds `send` knows for each provider.
pub fn kinds(kind: SourceKind) -> &'static [&'static str] {
    match kind {
        SourceKind::Kinde => &[
            "plan-assigned",
            "plan-changed",
            "agreement-cancelled",
            "payment-succeeded",
            "payment-failed",
            "invoice-overdue",
        ],
        SourceKind::Stripe => &[
            "subscription",
            "subscription-deleted",
            "invoice-paid",
            "payment-failed",
            "refund",
        ],
        SourceKind::StandardWebhooks => {
            &["subscription", "revoked", "order-paid", "order-refunded"]
        }
    }
}

fn random_id(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}{}", &id[..24])
}

/// The event's payload, and its id (the dedupe key the provider would use).
pub fn payload(kind: SourceKind, spec: &Spec) -> Result<(String, Value), String> {
    let at = spec.at;
    let customer = spec.customer.as_str();
    match kind {
        SourceKind::Kinde => {
            let event_id = spec.event_id.clone().unwrap_or_else(|| random_id("event_"));
            let event_type = match spec.kind.as_str() {
                "plan-assigned" => "customer.plan_assigned",
                "plan-changed" => "customer.plan_changed",
                "agreement-cancelled" => "customer.agreement_cancelled",
                "payment-succeeded" => "customer.payment_succeeded",
                "payment-failed" => "customer.payment_failed",
                "invoice-overdue" => "customer.invoice_overdue",
                other => return Err(unknown(other, kind)),
            };
            let mut data = json!({"customer_id": customer});
            if let Some(plan) = &spec.plan {
                data["plan"] = json!({"key": plan, "name": plan});
            }
            if event_type.contains("payment") {
                data["payment_id"] =
                    json!(spec.object_id.clone().unwrap_or_else(|| random_id("pay_")));
            }
            Ok((
                event_id.clone(),
                json!({"type": event_type, "event_id": event_id, "event_timestamp": at.to_rfc3339(),
                       "timestamp": Utc::now().to_rfc3339(), "source": "api", "data": data}),
            ))
        }
        SourceKind::Stripe => {
            let event_id = spec.event_id.clone().unwrap_or_else(|| random_id("evt_"));
            let price = spec.plan.clone().unwrap_or_else(|| "price_pro".into());
            let (event_type, object) = match spec.kind.as_str() {
                "subscription" | "subscription-deleted" => {
                    let deleted = spec.kind == "subscription-deleted";
                    let status = spec
                        .status
                        .clone()
                        .unwrap_or_else(|| (if deleted { "canceled" } else { "active" }).into());
                    (
                        if deleted {
                            "customer.subscription.deleted"
                        } else {
                            "customer.subscription.updated"
                        },
                        json!({"id": spec.object_id.clone().unwrap_or_else(|| format!("sub_{customer}")),
                               "object": "subscription", "customer": customer, "status": status,
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
                other => return Err(unknown(other, kind)),
            };
            Ok((
                event_id.clone(),
                json!({"id": event_id, "object": "event", "api_version": "2024-06-20", "created": at.timestamp(),
                       "livemode": false, "pending_webhooks": 1, "request": {"id": null, "idempotency_key": null},
                       "type": event_type, "data": {"object": object}}),
            ))
        }
        SourceKind::StandardWebhooks => {
            let message_id = spec.event_id.clone().unwrap_or_else(|| random_id("msg_"));
            let product = spec.plan.clone().unwrap_or_else(|| "prod_pro".into());
            let (event_type, data) = match spec.kind.as_str() {
                "subscription" | "revoked" => {
                    let revoked = spec.kind == "revoked";
                    let status = spec
                        .status
                        .clone()
                        .unwrap_or_else(|| (if revoked { "canceled" } else { "active" }).into());
                    (
                        if revoked {
                            "subscription.revoked"
                        } else {
                            "subscription.updated"
                        },
                        json!({"id": spec.object_id.clone().unwrap_or_else(|| format!("sub_{customer}")),
                               "customer_id": customer, "status": status, "product_id": product,
                               "modified_at": at.to_rfc3339(), "created_at": at.to_rfc3339()}),
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
                other => return Err(unknown(other, kind)),
            };
            Ok((
                message_id,
                json!({"type": event_type, "timestamp": at.to_rfc3339(), "data": data}),
            ))
        }
    }
}

fn unknown(kind: &str, source: SourceKind) -> String {
    format!(
        "unknown event kind '{kind}'; this source knows: {}",
        kinds(source).join(", ")
    )
}

/// A signed HTTP delivery: headers and body.
#[derive(Debug, Clone)]
pub struct SignedDelivery {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The local signing key for a Kinde source: a PEM private key and the `kid` its JWKS names.
pub struct KindeKey {
    pub pem: Vec<u8>,
    pub kid: String,
}

/// Signs a payload as the source's provider would, with the source's first secret.
pub fn sign_delivery(
    source: &SourceConfig,
    id: &str,
    payload: &Value,
    kinde_key: Option<&KindeKey>,
) -> Result<SignedDelivery, String> {
    let now = Utc::now().timestamp();
    let json_type = ("content-type".to_owned(), "application/json".to_owned());
    match source.kind {
        SourceKind::Stripe => {
            let secret = source.secrets.first().ok_or("the source has no secret")?;
            let body = serde_json::to_vec(payload).map_err(|e| e.to_string())?;
            Ok(SignedDelivery {
                headers: vec![
                    json_type,
                    (
                        "stripe-signature".into(),
                        sign::stripe_signature(secret.as_bytes(), now, &body),
                    ),
                ],
                body,
            })
        }
        SourceKind::StandardWebhooks => {
            let secret = source.secrets.first().ok_or("the source has no secret")?;
            let key = standard::decode_secret(
                secret,
                source.secret_encoding.unwrap_or(SecretEncoding::Base64),
            )?;
            let body = serde_json::to_vec(payload).map_err(|e| e.to_string())?;
            Ok(SignedDelivery {
                headers: vec![
                    json_type,
                    ("webhook-id".into(), id.to_owned()),
                    ("webhook-timestamp".into(), now.to_string()),
                    (
                        "webhook-signature".into(),
                        sign::standard_signature(&key, id, now, &body),
                    ),
                ],
                body,
            })
        }
        SourceKind::Kinde => {
            let key = kinde_key
                .ok_or("a Kinde delivery needs the local signing key (INBOX_DEV_KINDE_KEY)")?;
            let token = sign::kinde_token(&key.pem, &key.kid, payload)
                .map_err(|e| format!("signing the token: {e}"))?;
            Ok(SignedDelivery {
                headers: vec![
                    ("content-type".into(), "application/jwt".into()),
                    ("webhook-id".into(), id.to_owned()),
                ],
                body: token.into_bytes(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::{decide, Catalog, Decision};

    #[test]
    fn every_kind_builds_a_payload_the_billing_model_applies() {
        let catalog = Catalog::parse(
            r#"{"pro":{"plan":"pro","monthly_allowance":500},"price_pro":{"plan":"pro","monthly_allowance":500},
                "prod_pro":{"plan":"pro","monthly_allowance":500}}"#,
        )
        .unwrap();
        for source in [
            SourceKind::Kinde,
            SourceKind::Stripe,
            SourceKind::StandardWebhooks,
        ] {
            for kind in kinds(source) {
                let spec = Spec {
                    kind: (*kind).to_owned(),
                    customer: "cus_1".into(),
                    plan: Some(
                        if source == SourceKind::Kinde {
                            "pro"
                        } else if source == SourceKind::Stripe {
                            "price_pro"
                        } else {
                            "prod_pro"
                        }
                        .into(),
                    ),
                    at: Utc::now(),
                    object_id: None,
                    status: None,
                    event_id: None,
                };
                let (id, payload) = payload(source, &spec).unwrap();
                let event_type = payload["type"].as_str().unwrap();
                let decision = decide(source, event_type, &payload, &id, &catalog);
                assert!(
                    matches!(decision, Decision::Apply(_)),
                    "{source:?} {kind}: {decision:?}"
                );
            }
        }
    }

    #[test]
    fn random_ids_differ() {
        assert_ne!(random_id("x"), random_id("x"));
    }
}
