//! What Polar's (Standard Webhooks) events mean for the registers: the subscription object
//! is the state, a paid order is a payment that grants its product, a full refund ends it.

use serde_json::Value;

use crate::billing::model::read::{first_text, required, resolve, text};
use crate::billing::model::{not_billing, paid, subscription_effects};
use crate::billing::{Catalog, Decided, Decision, Effect, PaymentStatus, Problem};

/// Polar's and other Standard Webhooks senders' subscription state: the object's `status`,
/// or what the event type implies when the object carries none.
fn standard_status<'a>(event_type: &str, data: &'a Value) -> Option<&'a str> {
    text(data, "/status").or(match event_type {
        "subscription.active" | "subscription.uncanceled" => Some("active"),
        "subscription.revoked" => Some("canceled"),
        "subscription.past_due" => Some("past_due"),
        _ => None,
    })
}

/// The price and product ids a Polar subscription or order names, most specific first.
pub(super) fn plan_keys(data: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = Vec::new();
    keys.extend(first_text(data, &["/price_id", "/price/id"]));
    for price in data
        .pointer("/prices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        keys.extend(text(price, "/id"));
    }
    keys.extend(first_text(data, &["/product_id", "/product/id"]));
    keys
}

/// What a Standard Webhooks (Polar) event means for the billing registers.
pub fn decide(event_type: &str, p: &Value, catalog: &Catalog) -> Decided {
    let data = p
        .get("data")
        .ok_or_else(|| Problem("no /data in the payload".into()))?;
    let plan_keys = || plan_keys(data);
    Ok(match event_type {
        "subscription.created"
        | "subscription.updated"
        | "subscription.active"
        | "subscription.canceled"
        | "subscription.uncanceled"
        | "subscription.revoked"
        | "subscription.past_due" => {
            let id = required(data, "/id")?.to_owned();
            let status = standard_status(event_type, data)
                .ok_or_else(|| Problem("no /data/status in the payload".into()))?
                .to_owned();
            subscription_effects(id, status, resolve(catalog, &plan_keys()))
        }
        "order.paid" => paid(
            required(data, "/id")?.to_owned(),
            resolve(catalog, &plan_keys()),
        ),
        "order.refunded" => {
            if text(data, "/status") == Some("partially_refunded") {
                return Ok(Decision::Ignore(
                    "a partial refund changes no billing state".into(),
                ));
            }
            Decision::apply(vec![Effect::Payment {
                id: required(data, "/id")?.to_owned(),
                status: PaymentStatus::Refunded,
                plan_key: None,
            }])
        }
        // The customer is the object itself (`data.id`); the verifier reads it there.
        "customer.deleted" => Decision::apply(vec![Effect::DeleteCustomer]),
        other => not_billing(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::catalog::tests::{catalog, key};
    use crate::domain::SourceKind;
    use crate::providers::decide;
    use serde_json::json;

    #[test]
    fn polar_revoked_without_status_is_canceled() {
        let p = json!({"data": {"id": "sub_1", "customer_id": "c", "product_id": "prod_team"}});
        let Decision::Apply { effects, .. } = decide(
            SourceKind::StandardWebhooks,
            "subscription.revoked",
            &p,
            &key("e"),
            &catalog(),
        ) else {
            panic!()
        };
        assert!(matches!(&effects[0], Effect::Subscription { status, .. } if status == "canceled"));
        assert_eq!(effects.len(), 1, "a canceled subscription grants nothing");
    }

    #[test]
    fn missing_object_id_is_unprocessable() {
        let p = json!({"data": {"status": "active"}});
        assert!(matches!(
            decide(
                SourceKind::StandardWebhooks,
                "subscription.updated",
                &p,
                &key("e"),
                &catalog()
            ),
            Decision::Unprocessable(_)
        ));
    }
}
