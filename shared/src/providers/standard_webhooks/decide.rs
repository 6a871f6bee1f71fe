//! What Polar's (Standard Webhooks) events mean for the registers: the subscription object
//! is the state, a paid order is a payment that grants its product, a full refund ends it.

use serde_json::Value;

use crate::billing::model::read::{first_text, flag, iso_time, required, resolve, text};
use crate::billing::model::{not_billing, paid, subscription_effects};
use crate::billing::{Decided, Decision, Effect, PaymentStatus, Problem, SubscriptionEnds};
use crate::domain::Catalog;

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

/// A Polar subscription's ends (RFC 3339). Polar's `ends_at` is "the timestamp when the
/// subscription will end": a scheduled cancellation's time, which is `cancel_at` here.
pub(super) fn ends(data: &Value) -> Result<SubscriptionEnds, Problem> {
    Ok(SubscriptionEnds {
        current_period_end: iso_time(data, "/current_period_end")?,
        cancel_at_period_end: flag(data, "/cancel_at_period_end")?,
        cancel_at: iso_time(data, "/ends_at")?,
        trial_end: iso_time(data, "/trial_end")?,
        ended_at: iso_time(data, "/ended_at")?,
    })
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
            subscription_effects(id, status, ends(data)?, resolve(catalog, &plan_keys()))
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
    use crate::domain::catalog::tests::catalog;
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
            &catalog(),
        ) else {
            panic!()
        };
        assert!(matches!(&effects[0], Effect::Subscription { status, .. } if status == "canceled"));
        assert_eq!(effects.len(), 1, "a canceled subscription grants nothing");
    }

    #[test]
    fn polar_ends_are_read_and_ends_at_is_when_a_cancellation_ends_it() {
        let corpus = |name: &str| -> Value {
            let path = format!(
                "{}/../testdata/providers/polar/{name}.json",
                env!("CARGO_MANIFEST_DIR")
            );
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        let canceled = corpus("subscription.canceled");
        let read = ends(&canceled["data"]).unwrap();
        assert!(read.cancel_at_period_end);
        assert_eq!(
            read.cancel_at, read.current_period_end,
            "it ends with its period"
        );
        assert!(read.cancel_at.is_some());
        let uncanceled = ends(&corpus("subscription.uncanceled")["data"]).unwrap();
        assert!(!uncanceled.cancel_at_period_end);
        assert_eq!(uncanceled.cancel_at, None);
        assert!(ends(&corpus("subscription.revoked")["data"])
            .unwrap()
            .ended_at
            .is_some());
        let bad = json!({"data": {"id": "s", "status": "active", "ends_at": 12}});
        assert_eq!(
            decide(
                SourceKind::StandardWebhooks,
                "subscription.updated",
                &bad,
                &catalog()
            ),
            Decision::Unprocessable("/ends_at is not an RFC 3339 time".into())
        );
    }

    #[test]
    fn missing_object_id_is_unprocessable() {
        let p = json!({"data": {"status": "active"}});
        assert!(matches!(
            decide(
                SourceKind::StandardWebhooks,
                "subscription.updated",
                &p,
                &catalog()
            ),
            Decision::Unprocessable(_)
        ));
    }
}
