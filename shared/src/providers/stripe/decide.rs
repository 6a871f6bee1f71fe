//! What Stripe events mean for the billing registers: the subscription object is the state,
//! an invoice is a payment that grants the plan its lines name, a full refund ends a payment.

use serde_json::Value;

use crate::billing::model::read::{first_text, required, resolve};
use crate::billing::model::{not_billing, subscription_effects, with_grant};
use crate::billing::{Catalog, Decided, Decision, Effect, PaymentStatus, Problem};

/// Price and plan ids a Stripe object names, most specific first.
fn plan_keys(object: &Value) -> Vec<&str> {
    let mut keys = Vec::new();
    for list in ["/items/data", "/lines/data"] {
        for item in object
            .pointer(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            keys.extend(first_text(
                item,
                &["/price/id", "/pricing/price_details/price", "/plan/id"],
            ));
        }
    }
    keys.extend(first_text(object, &["/plan/id", "/price/id"]));
    keys.dedup();
    keys
}

/// What a Stripe event means for the billing registers.
pub fn decide(event_type: &str, p: &Value, catalog: &Catalog) -> Decided {
    let object = p
        .pointer("/data/object")
        .ok_or_else(|| Problem::Unreadable("no /data/object in the payload".into()))?;
    Ok(match event_type {
        "customer.subscription.created"
        | "customer.subscription.updated"
        | "customer.subscription.deleted"
        | "customer.subscription.paused"
        | "customer.subscription.resumed" => {
            let id = required(object, "/id")?.to_owned();
            let status = required(object, "/status")?.to_owned();
            let plan = resolve(catalog, &plan_keys(object))?;
            subscription_effects(id, status, plan)
        }
        "invoice.paid" | "invoice.payment_succeeded" => {
            let id = required(object, "/id")?.to_owned();
            let plan = resolve(catalog, &plan_keys(object))?;
            Decision::Apply(with_grant(
                vec![Effect::Payment {
                    id,
                    status: PaymentStatus::Paid,
                    plan_key: plan.as_ref().map(|p| p.key.clone()),
                }],
                &plan,
            ))
        }
        "invoice.payment_failed" => Decision::Apply(vec![Effect::Payment {
            id: required(object, "/id")?.to_owned(),
            status: PaymentStatus::Failed,
            plan_key: plan_keys(object).first().map(|k| (*k).to_owned()),
        }]),
        "charge.refunded" => {
            if object.get("refunded").and_then(Value::as_bool) != Some(true) {
                return Ok(Decision::Ignore(
                    "a partial refund changes no billing state".into(),
                ));
            }
            // The refund ends the payment it refunds: the invoice when the charge paid one.
            let id = first_text(object, &["/invoice", "/invoice/id", "/id"])
                .ok_or_else(|| Problem::Unreadable("no /data/object/id in the payload".into()))?;
            Decision::Apply(vec![Effect::Payment {
                id: id.to_owned(),
                status: PaymentStatus::Refunded,
                plan_key: None,
            }])
        }
        "customer.deleted" => Decision::Apply(vec![Effect::DeleteCustomer]),
        other => not_billing(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::catalog::tests::{catalog, key, pro};
    use crate::billing::PlanRef;
    use crate::domain::SourceKind;
    use crate::providers::decide;
    use serde_json::json;

    #[test]
    fn stripe_subscription_status_is_the_state_and_past_due_grants_nothing() {
        let p = |status: &str| {
            json!({"data": {"object": {"id": "sub_1", "status": status, "customer": "cus",
                "items": {"data": [{"price": {"id": "price_pro"}}]}}}})
        };
        let price_pro = PlanRef {
            key: "price_pro".into(),
            ..pro()
        };
        assert_eq!(
            decide(
                SourceKind::Stripe,
                "customer.subscription.updated",
                &p("past_due"),
                &key("e"),
                &catalog()
            ),
            Decision::Apply(vec![Effect::Subscription {
                id: "sub_1".into(),
                status: "past_due".into(),
                plan: Some(price_pro.clone())
            }])
        );
        let Decision::Apply(active) = decide(
            SourceKind::Stripe,
            "customer.subscription.created",
            &p("active"),
            &key("e"),
            &catalog(),
        ) else {
            panic!()
        };
        assert_eq!(active.last(), Some(&Effect::Grant { plan: price_pro }));
    }

    #[test]
    fn stripe_full_refund_ends_the_invoice_payment() {
        let p = json!({"data": {"object": {"id": "ch_1", "invoice": "in_1", "refunded": true}}});
        assert_eq!(
            decide(
                SourceKind::Stripe,
                "charge.refunded",
                &p,
                &key("e"),
                &catalog()
            ),
            Decision::Apply(vec![Effect::Payment {
                id: "in_1".into(),
                status: PaymentStatus::Refunded,
                plan_key: None
            }])
        );
        let partial = json!({"data": {"object": {"id": "ch_1", "refunded": false}}});
        assert!(matches!(
            decide(
                SourceKind::Stripe,
                "charge.refunded",
                &partial,
                &key("e"),
                &catalog()
            ),
            Decision::Ignore(_)
        ));
    }
}
