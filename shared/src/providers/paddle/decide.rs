//! What Paddle Billing's events mean for the registers (docs/design.md §6.4): the
//! subscription object is the state; a paid or completed transaction is a payment that grants
//! the plan its items name; an approved full refund ends its transaction's payment.

use serde_json::Value;

use crate::billing::model::read::{iso_time, required, resolve, text};
use crate::billing::model::{
    not_billing, packs_bought, paid, plan_candidates, subscription_effects,
};
use crate::billing::{Decided, Decision, Effect, PaymentStatus, Problem, SubscriptionEnds};
use crate::domain::Catalog;

/// The subscription events `decide` reads: each carries the whole subscription.
pub(super) const SUBSCRIPTION_TYPES: &[&str] = &[
    "subscription.created",
    "subscription.updated",
    "subscription.activated",
    "subscription.trialing",
    "subscription.past_due",
    "subscription.paused",
    "subscription.resumed",
    "subscription.canceled",
    // A subscription brought over from another billing system: its state as imported.
    "subscription.imported",
];

/// Every event type `decide` gives a meaning: the reconciliation walk asks Paddle for these
/// alone.
pub(super) const HANDLED_TYPES: &[&str] = &[
    "subscription.created",
    "subscription.updated",
    "subscription.activated",
    "subscription.trialing",
    "subscription.past_due",
    "subscription.paused",
    "subscription.resumed",
    "subscription.canceled",
    "subscription.imported",
    "transaction.completed",
    "transaction.paid",
    "transaction.payment_failed",
    "adjustment.created",
    "adjustment.updated",
];

/// The price ids, then the product ids, a subscription's or transaction's items name
/// (`items[].price.id`, `items[].price.product_id`), most specific first.
pub(super) fn plan_keys(data: &Value) -> Vec<&str> {
    let items: Vec<&Value> = data
        .pointer("/items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let mut keys: Vec<&str> = items
        .iter()
        .filter_map(|item| text(item, "/price/id"))
        .collect();
    for item in &items {
        if let Some(product) = text(item, "/price/product_id").or(text(item, "/product/id")) {
            if !keys.contains(&product) {
                keys.push(product);
            }
        }
    }
    keys
}

/// A Paddle subscription's ends: the current billing period's `ends_at`; a scheduled
/// change's `effective_at` when its action is `cancel` (Paddle schedules a cancellation for
/// the end of the billing period, so it ends with its period); the first item's trial end;
/// `canceled_at` once it is canceled.
pub(super) fn ends(data: &Value) -> Result<SubscriptionEnds, Problem> {
    let current_period_end = iso_time(data, "/current_billing_period/ends_at")?;
    let cancel_at = match text(data, "/scheduled_change/action") {
        Some("cancel") => iso_time(data, "/scheduled_change/effective_at")?,
        _ => None,
    };
    let trial_end = match data.pointer("/items").and_then(Value::as_array) {
        Some(items) => items
            .iter()
            .map(|item| iso_time(item, "/trial_dates/ends_at"))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .next(),
        None => None,
    };
    let ended_at = if text(data, "/status") == Some("canceled") {
        iso_time(data, "/canceled_at")?
    } else {
        None
    };
    Ok(SubscriptionEnds {
        current_period_end,
        cancel_at_period_end: cancel_at.is_some() && cancel_at == current_period_end,
        cancel_at,
        trial_end,
        ended_at,
    })
}

/// What a Paddle adjustment means: an approved full refund ends its transaction's payment;
/// anything else (a partial refund, a credit, a chargeback, one pending approval or rejected)
/// changes no billing state, and says why.
fn adjustment(data: &Value) -> Decided {
    let action = required(data, "/action")?;
    let status = required(data, "/status")?;
    if action != "refund" {
        return Ok(Decision::Ignore(format!(
            "a {action} adjustment changes no billing state"
        )));
    }
    if status != "approved" {
        return Ok(Decision::Ignore(format!(
            "a refund {} changes no billing state yet",
            status.replace('_', " ")
        )));
    }
    // The adjustment's `type`; an adjustment that carries none is full when each of its
    // items is (`items[].type`, as every adjustment carries).
    let full = match text(data, "/type") {
        Some(kind) => kind == "full",
        None => data
            .pointer("/items")
            .and_then(Value::as_array)
            .is_some_and(|items| {
                !items.is_empty() && items.iter().all(|item| text(item, "/type") == Some("full"))
            }),
    };
    if !full {
        return Ok(Decision::Ignore(
            "a partial refund changes no billing state".into(),
        ));
    }
    Ok(Decision::apply(vec![Effect::Payment {
        id: required(data, "/transaction_id")?.to_owned(),
        status: PaymentStatus::Refunded,
        plan_key: None,
    }]))
}

/// What a Paddle Billing event means for the billing registers. The customer is
/// `data.customer_id` (the verifier reads it); `custom_data` is never read.
pub fn decide(event_type: &str, p: &Value, catalog: &Catalog) -> Decided {
    let data = p
        .get("data")
        .ok_or_else(|| Problem("no /data in the payload".into()))?;
    Ok(match event_type {
        t if SUBSCRIPTION_TYPES.contains(&t) => {
            let id = required(data, "/id")?.to_owned();
            let status = required(data, "/status")?.to_owned();
            subscription_effects(id, status, ends(data)?, resolve(catalog, &plan_keys(data)))
        }
        "transaction.completed" | "transaction.paid" => {
            let id = required(data, "/id")?;
            let keys = plan_keys(data);
            let candidates = plan_candidates(&keys, catalog);
            let resolved = resolve(catalog, &candidates);
            let named = resolved.plan.is_some();
            // The credit packs its items buy (docs/design.md §4.14).
            let one_each: Vec<(&str, u32)> = keys.iter().map(|k| (*k, 1)).collect();
            let packs = packs_bought(id, &one_each, catalog);
            let packs_only = candidates.is_empty() && !packs.is_empty();
            match paid(id.to_owned(), resolved) {
                Decision::Apply { mut effects, notes } => {
                    effects.extend(packs);
                    // Items that name no known price: the plan is the subscription's, as its
                    // register holds it (docs/design.md §6.2, as for Stripe's invoices).
                    if !named && !packs_only {
                        effects.push(Effect::GrantOfSubscription {
                            payment: id.to_owned(),
                            subscriptions: text(data, "/subscription_id")
                                .into_iter()
                                .map(str::to_owned)
                                .collect(),
                            read: "the price at items[].price.id and the subscription at subscription_id".into(),
                        });
                    }
                    Decision::Apply { effects, notes }
                }
                other => other,
            }
        }
        "transaction.payment_failed" => Decision::apply(vec![Effect::Payment {
            id: required(data, "/id")?.to_owned(),
            status: PaymentStatus::Failed,
            plan_key: plan_keys(data).first().map(|k| (*k).to_owned()),
        }]),
        "adjustment.created" | "adjustment.updated" => adjustment(data)?,
        other => not_billing(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SourceKind;
    use crate::providers::decide;
    use serde_json::json;

    fn corpus(name: &str) -> Value {
        let path = format!(
            "{}/../testdata/providers/paddle/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"{"pri_01gsz8x8sawmvhz1pv30nge1ke":{"plan":"pro","monthly_allowance":500},
                "pro_01h84cd36f900f3wmpdfamgv8w":{"plan":"team","monthly_allowance":2000}}"#,
        )
        .unwrap()
    }

    fn paddle(p: &Value) -> Decision {
        decide(
            SourceKind::Paddle,
            p["event_type"].as_str().unwrap(),
            p,
            &catalog(),
        )
    }

    fn subscription(p: &Value) -> (String, Option<String>, SubscriptionEnds, usize) {
        let Decision::Apply { effects, .. } = paddle(p) else {
            panic!("applied");
        };
        let Some(Effect::Subscription {
            status, plan, ends, ..
        }) = effects.first()
        else {
            panic!("a subscription effect: {effects:?}");
        };
        (
            status.clone(),
            plan.as_ref().map(|p| p.plan.clone()),
            ends.clone(),
            effects.len(),
        )
    }

    #[test]
    fn every_subscription_event_of_the_sdk_is_its_status_and_plan() {
        for (name, status, grants) in [
            ("subscription.created", "active", true),
            ("subscription.updated", "active", true),
            ("subscription.activated", "active", true),
            ("subscription.past_due", "past_due", false),
            ("subscription.paused", "paused", false),
            ("subscription.resumed", "active", true),
            ("subscription.canceled", "canceled", false),
            ("subscription.imported", "active", true),
        ] {
            let (read, plan, _, effects) = subscription(&corpus(name));
            assert_eq!(read, status, "{name}");
            assert_eq!(
                plan.as_deref(),
                Some("pro"),
                "{name}: the price id names it"
            );
            assert_eq!(effects, if grants { 2 } else { 1 }, "{name}");
        }
        // The trial's price is unknown; its product is in the catalog.
        let (status, plan, ends, _) = subscription(&corpus("subscription.trialing"));
        assert_eq!(
            (status.as_str(), plan.as_deref()),
            ("trialing", Some("team"))
        );
        assert_eq!(ends.trial_end, ends.current_period_end);
        assert!(ends.trial_end.is_some());
    }

    #[test]
    fn ends_are_the_billing_period_the_scheduled_cancellation_and_the_cancellation() {
        let updated = ends(&corpus("subscription.updated")["data"]).unwrap();
        assert_eq!(
            updated.current_period_end.unwrap().to_rfc3339(),
            "2023-10-11T08:07:35.449123+00:00"
        );
        assert!(!updated.cancel_at_period_end && updated.cancel_at.is_none());
        let canceled = ends(&corpus("subscription.canceled")["data"]).unwrap();
        assert!(canceled.ended_at.is_some());
        assert_eq!(canceled.current_period_end, None);
        let mut scheduled = corpus("subscription.updated");
        scheduled["data"]["scheduled_change"] = json!({"action": "cancel",
            "effective_at": "2023-10-11T08:07:35.449123Z", "resume_at": null});
        let read = ends(&scheduled["data"]).unwrap();
        assert!(read.cancel_at_period_end);
        assert_eq!(read.cancel_at, read.current_period_end);
        scheduled["data"]["scheduled_change"]["action"] = json!("pause");
        let paused = ends(&scheduled["data"]).unwrap();
        assert!(!paused.cancel_at_period_end && paused.cancel_at.is_none());
        scheduled["data"]["current_billing_period"]["ends_at"] = json!(12);
        assert_eq!(
            paddle(&scheduled),
            Decision::Unprocessable(
                "/current_billing_period/ends_at is not an RFC 3339 time".into()
            )
        );
    }

    #[test]
    fn transactions_are_payments_of_their_items_plan() {
        let Decision::Apply { effects, .. } = paddle(&corpus("transaction.completed")) else {
            panic!()
        };
        assert!(
            matches!(&effects[0], Effect::Payment { id, status: PaymentStatus::Paid, plan_key }
            if id == "txn_01h8dzxgkvdwemdhbpcapj2tbj" && plan_key.as_deref() == Some("pri_01gsz8x8sawmvhz1pv30nge1ke"))
        );
        assert!(matches!(&effects[1], Effect::Grant { plan } if plan.plan == "pro"));
        let Decision::Apply { effects, .. } = paddle(&corpus("transaction.payment_failed")) else {
            panic!()
        };
        assert!(matches!(
            &effects[..],
            [Effect::Payment {
                status: PaymentStatus::Failed,
                ..
            }]
        ));
        // A renewal whose price the catalog does not know: its subscription's plan.
        let mut renewal = corpus("transaction.completed");
        renewal["data"]["items"] =
            json!([{"price": {"id": "pri_unknown", "product_id": "pro_unknown"}}]);
        renewal["data"]["subscription_id"] = json!("sub_1");
        let Decision::Apply { effects, notes } = paddle(&renewal) else {
            panic!()
        };
        assert!(
            matches!(&effects[1], Effect::GrantOfSubscription { subscriptions, .. }
            if subscriptions == &["sub_1".to_owned()])
        );
        assert_eq!(
            notes,
            ["no plan: 'pri_unknown' is not in the plan catalog".to_owned()]
        );
    }

    #[test]
    fn an_approved_full_refund_ends_its_transaction_and_nothing_else_does() {
        // The SDK's adjustments: a partial refund, pending then approved.
        for name in ["adjustment.created", "adjustment.updated"] {
            assert!(
                matches!(paddle(&corpus(name)), Decision::Ignore(_)),
                "{name}"
            );
        }
        let mut full = corpus("adjustment.updated");
        full["data"]["type"] = json!("full");
        assert_eq!(
            paddle(&full),
            Decision::apply(vec![Effect::Payment {
                id: "txn_01h8bxpvx398a7zbawb77y0kp5".into(),
                status: PaymentStatus::Refunded,
                plan_key: None,
            }])
        );
        // Without a `type`, its items tell.
        let mut untyped = full.clone();
        untyped["data"].as_object_mut().unwrap().remove("type");
        assert!(
            matches!(paddle(&untyped), Decision::Ignore(_)),
            "a partial item"
        );
        untyped["data"]["items"][0]["type"] = json!("full");
        assert_eq!(paddle(&untyped), paddle(&full));
        full["data"]["status"] = json!("pending_approval");
        assert_eq!(
            paddle(&full),
            Decision::Ignore("a refund pending approval changes no billing state yet".into())
        );
        full["data"]["status"] = json!("approved");
        full["data"]["action"] = json!("credit");
        assert_eq!(
            paddle(&full),
            Decision::Ignore("a credit adjustment changes no billing state".into())
        );
    }

    #[test]
    fn other_events_are_not_billing() {
        let p = json!({"event_type": "customer.updated", "data": {"id": "ctm_1"}});
        assert!(matches!(paddle(&p), Decision::Ignore(_)));
    }
}
