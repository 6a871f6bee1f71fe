//! What Lemon Squeezy's events mean for the registers (docs/design.md §6.5): the subscription
//! object is the state, in the billing model's words; a paid order or subscription invoice is
//! a payment (an invoice grants its subscription's plan, an order of a pack's variant buys the
//! pack); a full refund ends it.

use serde_json::Value;

use crate::billing::model::read::{flag, iso_time, required, resolve, text};
use crate::billing::model::{
    not_billing, packs_bought, paid, plan_candidates, subscription_effects,
};
use crate::billing::{
    Decided, Decision, Effect, PaymentStatus, Problem, Resolved, SubscriptionEnds,
};
use crate::domain::Catalog;

/// A Lemon Squeezy subscription's status in the billing model's words (Stripe's and Polar's):
/// `cancelled` is Lemon Squeezy's grace period — the subscription is valid until `ends_at`,
/// and may be resumed — so it is `active` with its end scheduled; `expired` has ended.
pub(super) fn status(ls: &str) -> &str {
    match ls {
        "on_trial" => "trialing",
        "cancelled" => "active",
        "expired" => "canceled",
        // The SDK's type also lists `pause`.
        "pause" => "paused",
        other => other,
    }
}

/// A subscription's ends (RFC 3339): `renews_at` ends the period; a cancelled one ends at its
/// `ends_at`; an expired one ended then; `trial_ends_at` ends its trial.
pub(super) fn ends(attributes: &Value) -> Result<SubscriptionEnds, Problem> {
    let ls_status = text(attributes, "/status").unwrap_or_default();
    let ends_at = iso_time(attributes, "/ends_at")?;
    let expired = ls_status == "expired";
    let cancelled = !expired && (flag(attributes, "/cancelled")? || ls_status == "cancelled");
    Ok(SubscriptionEnds {
        current_period_end: iso_time(attributes, "/renews_at")?,
        cancel_at_period_end: cancelled,
        cancel_at: if cancelled { ends_at } else { None },
        trial_end: iso_time(attributes, "/trial_ends_at")?,
        ended_at: if expired { ends_at } else { None },
    })
}

/// An id Lemon Squeezy sends as a number (or as text), as text.
fn id_text(value: &Value, pointer: &str) -> Option<String> {
    match value.pointer(pointer)? {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// The plan keys a subscription or order names, most specific first: the variant, then the
/// product (the catalog is keyed by variant ids, docs/design.md §6.5).
pub(super) fn plan_keys(attributes: &Value) -> Vec<String> {
    [
        "/variant_id",
        "/first_order_item/variant_id",
        "/product_id",
        "/first_order_item/product_id",
    ]
    .iter()
    .filter_map(|p| id_text(attributes, p))
    .collect()
}

fn resolved(catalog: &Catalog, keys: &[String]) -> Resolved {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    resolve(catalog, &keys)
}

/// A payment's id: Lemon Squeezy's orders and subscription invoices number apart (order 1 and
/// invoice 1 are two payments), so the id is the object's API path, `orders/1`,
/// `subscription-invoices/1` (docs/design.md §6.5).
fn payment_id(object_type: &str, id: &str) -> String {
    format!("{object_type}/{id}")
}

/// The object of an event, checked to be of the type its event carries.
fn object<'a>(p: &'a Value, object_type: &str) -> Result<(&'a str, &'a Value), Problem> {
    let data = p
        .get("data")
        .ok_or_else(|| Problem("no /data in the payload".into()))?;
    let found = required(data, "/type")?;
    if found != object_type {
        return Err(Problem(format!(
            "/data/type is {found}: this event carries {object_type}"
        )));
    }
    let attributes = data
        .get("attributes")
        .ok_or_else(|| Problem("no /data/attributes in the payload".into()))?;
    Ok((required(data, "/id")?, attributes))
}

/// What a Lemon Squeezy event means for the billing registers.
pub fn decide(event_type: &str, p: &Value, catalog: &Catalog) -> Decided {
    Ok(match event_type {
        "subscription_created"
        | "subscription_updated"
        | "subscription_cancelled"
        | "subscription_resumed"
        | "subscription_expired"
        | "subscription_paused"
        | "subscription_unpaused"
        | "subscription_plan_changed" => {
            let (id, attributes) = object(p, "subscriptions")?;
            let ls_status = required(attributes, "/status")?;
            subscription_effects(
                id.to_owned(),
                status(ls_status).to_owned(),
                ends(attributes)?,
                resolved(catalog, &plan_keys(attributes)),
            )
        }
        // A subscription invoice names its subscription, not its variant: it grants the plan
        // the subscription's register holds (as Stripe's invoices whose lines name no known
        // price do, docs/design.md §6.2).
        "subscription_payment_success" | "subscription_payment_recovered" => {
            let (id, attributes) = object(p, "subscription-invoices")?;
            let id = &payment_id("subscription-invoices", id);
            if text(attributes, "/status") != Some("paid") {
                return Ok(Decision::Ignore(format!(
                    "the subscription invoice is {}, not paid",
                    text(attributes, "/status").unwrap_or("without a status")
                )));
            }
            let subscription = id_text(attributes, "/subscription_id")
                .ok_or_else(|| Problem("no /subscription_id in the payload".into()))?;
            match paid(
                id.to_owned(),
                Resolved {
                    plan: None,
                    note: None,
                },
            ) {
                Decision::Apply { mut effects, notes } => {
                    effects.push(Effect::GrantOfSubscription {
                        payment: id.to_owned(),
                        subscriptions: vec![subscription],
                        read: "the subscription at data.attributes.subscription_id".into(),
                    });
                    Decision::Apply { effects, notes }
                }
                other => other,
            }
        }
        "subscription_payment_failed" => {
            let (id, _) = object(p, "subscription-invoices")?;
            Decision::apply(vec![Effect::Payment {
                id: payment_id("subscription-invoices", id),
                status: PaymentStatus::Failed,
                plan_key: None,
            }])
        }
        "subscription_payment_refunded" => {
            let (id, attributes) = object(p, "subscription-invoices")?;
            refund(&payment_id("subscription-invoices", id), attributes)?
        }
        "order_created" => {
            let (id, attributes) = object(p, "orders")?;
            match text(attributes, "/status") {
                Some("paid") => order_paid(payment_id("orders", id), attributes, catalog),
                other => Decision::Ignore(format!(
                    "the order is {}, not paid",
                    other.unwrap_or("without a status")
                )),
            }
        }
        "order_refunded" => {
            let (id, attributes) = object(p, "orders")?;
            refund(&payment_id("orders", id), attributes)?
        }
        other => not_billing(other),
    })
}

/// A paid order: the most specific key of its item the catalog knows (its variant, else its
/// product) names the plan it grants for the event's period and the credit pack it buys
/// (docs/design.md §4.14), keyed by the order, so its `order_refunded` voids what remains.
/// An order carries its first item only (`first_order_item`, an Order Item: "A positive
/// integer representing the quantity of this order item", docs.lemonsqueezy.com/api/order-items;
/// a checkout sells one variant), so `quantity` packs of it are one grant.
fn order_paid(id: String, attributes: &Value, catalog: &Catalog) -> Decision {
    let keys = plan_keys(attributes);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let Some(known) = keys
        .iter()
        .copied()
        .find(|k| catalog.get(k).is_some() || catalog.pack(k).is_some())
    else {
        // No key known: no plan, and the note names the variant.
        return paid(id, resolve(catalog, &keys));
    };
    let quantity = attributes
        .pointer("/first_order_item/quantity")
        .and_then(Value::as_u64)
        .map_or(1, |q| u32::try_from(q).unwrap_or(u32::MAX));
    let packs = packs_bought(&id, &[(known, quantity)], catalog);
    // A key the catalog knows only as a pack names no plan.
    match paid(id, resolve(catalog, &plan_candidates(&[known], catalog))) {
        Decision::Apply { mut effects, notes } => {
            effects.extend(packs);
            Decision::Apply { effects, notes }
        }
        other => other,
    }
}

/// A refund of an order or a subscription invoice: a full one (`status: refunded`) ends the
/// payment; a partial one (the refunded amount below the total) changes nothing.
fn refund(id: &str, attributes: &Value) -> Decided {
    if text(attributes, "/status") != Some("refunded") {
        return Ok(Decision::Ignore(
            "a partial refund changes no billing state".into(),
        ));
    }
    Ok(Decision::apply(vec![Effect::Payment {
        id: id.to_owned(),
        status: PaymentStatus::Refunded,
        plan_key: None,
    }]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SourceKind;
    use crate::providers::decide;
    use serde_json::json;

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"{"1":{"plan":"pro","monthly_allowance":500},"2":{"plan":"pro","monthly_allowance":500}}"#,
        )
        .unwrap()
    }

    /// A file of the corpus (`testdata/providers/lemonsqueezy/`), as Lemon Squeezy sends it.
    fn corpus(name: &str) -> Value {
        let path = format!(
            "{}/../testdata/providers/lemonsqueezy/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn ls(p: &Value) -> Decision {
        let event_type = p["meta"]["event_name"].as_str().unwrap();
        decide(SourceKind::LemonSqueezy, event_type, p, &catalog())
    }

    fn subscription(p: &Value) -> (String, Option<String>, SubscriptionEnds, bool) {
        let Decision::Apply { effects, .. } = ls(p) else {
            panic!("applied: {:?}", ls(p))
        };
        let Some(Effect::Subscription {
            status, plan, ends, ..
        }) = effects.first()
        else {
            panic!("{effects:?}")
        };
        let granted = effects.iter().any(|e| matches!(e, Effect::Grant { .. }));
        (
            status.clone(),
            plan.as_ref().map(|p| p.key.clone()),
            ends.clone(),
            granted,
        )
    }

    #[test]
    fn each_subscription_status_is_read_in_the_models_words() {
        let (status, plan, ends, granted) = subscription(&corpus("subscription_created"));
        assert_eq!(
            (status.as_str(), plan.as_deref(), granted),
            ("active", Some("1"), true)
        );
        assert!(ends.current_period_end.is_some() && !ends.cancel_at_period_end);
        // Cancelled: valid until ends_at, which is when it ends.
        let (status, _, ends, granted) = subscription(&corpus("subscription_cancelled"));
        assert_eq!(status, "active");
        assert!(granted, "the grace period is paid for");
        assert!(ends.cancel_at_period_end);
        assert_eq!(
            ends.cancel_at.unwrap().to_rfc3339(),
            "2026-01-01T10:00:00+00:00"
        );
        let (status, _, ends, _) = subscription(&corpus("subscription_resumed"));
        assert_eq!(status, "active");
        assert!(!ends.cancel_at_period_end && ends.cancel_at.is_none());
        let (status, _, ends, granted) = subscription(&corpus("subscription_expired"));
        assert_eq!(status, "canceled");
        assert!(!granted && !ends.cancel_at_period_end);
        assert!(ends.ended_at.is_some());
        let (status, _, _, granted) = subscription(&corpus("subscription_paused"));
        assert_eq!((status.as_str(), granted), ("paused", false));
        let (status, _, _, _) = subscription(&corpus("subscription_updated"));
        assert_eq!(status, "past_due");
        let (_, plan, _, _) = subscription(&corpus("subscription_plan_changed"));
        assert_eq!(plan.as_deref(), Some("2"), "the variant is the plan key");
        let mut trial = corpus("subscription_created");
        trial["data"]["attributes"]["status"] = json!("on_trial");
        trial["data"]["attributes"]["trial_ends_at"] = json!("2025-11-15T10:00:00.000000Z");
        let (status, _, ends, granted) = subscription(&trial);
        assert_eq!((status.as_str(), granted), ("trialing", true));
        assert!(ends.trial_end.is_some());
    }

    #[test]
    fn an_unknown_variant_falls_back_to_the_product_then_to_no_plan() {
        let mut p = corpus("subscription_created");
        p["data"]["attributes"]["variant_id"] = json!(99);
        p["data"]["attributes"]["product_id"] = json!(2);
        assert_eq!(subscription(&p).1.as_deref(), Some("2"));
        p["data"]["attributes"]["product_id"] = json!(98);
        let Decision::Apply { notes, .. } = ls(&p) else {
            panic!()
        };
        assert_eq!(notes, ["no plan: '99' is not in the plan catalog"]);
    }

    #[test]
    fn payments_and_refunds() {
        let Decision::Apply { effects, .. } = ls(&corpus("order_created")) else {
            panic!()
        };
        assert!(
            matches!(&effects[0], Effect::Payment { id, status: PaymentStatus::Paid, plan_key }
            if id == "orders/1" && plan_key.as_deref() == Some("1"))
        );
        assert!(effects.iter().any(|e| matches!(e, Effect::Grant { .. })));
        let Decision::Apply { effects, .. } = ls(&corpus("subscription_payment_success")) else {
            panic!()
        };
        assert!(
            effects.iter().any(|e| matches!(e,
            Effect::GrantOfSubscription { payment, subscriptions, .. }
                if payment == "subscription-invoices/1" && subscriptions == &vec!["1".to_owned()]))
        );
        let Decision::Apply { effects, .. } = ls(&corpus("subscription_payment_failed")) else {
            panic!()
        };
        assert!(matches!(
            &effects[0],
            Effect::Payment {
                status: PaymentStatus::Failed,
                ..
            }
        ));
        let Decision::Apply { effects, .. } = ls(&corpus("order_refunded")) else {
            panic!()
        };
        assert!(
            matches!(&effects[0], Effect::Payment { id, status: PaymentStatus::Refunded, .. } if id == "orders/1")
        );
        let mut partial = corpus("order_refunded");
        partial["data"]["attributes"]["status"] = json!("paid");
        partial["data"]["attributes"]["refunded_amount"] = json!(900);
        assert_eq!(
            ls(&partial),
            Decision::Ignore("a partial refund changes no billing state".into())
        );
    }

    #[test]
    fn an_order_of_a_pack_variant_buys_its_quantity_keyed_by_the_order() {
        let packs = Catalog::parse(
            r#"{"1": {"plan": "pro", "monthly_allowance": 500},
                "201": {"credits": {"amount": 500}}}"#,
        )
        .unwrap();
        let mut p = corpus("order_created");
        p["data"]["attributes"]["first_order_item"]["variant_id"] = json!(201);
        p["data"]["attributes"]["first_order_item"]["quantity"] = json!(3);
        let decided = decide(SourceKind::LemonSqueezy, "order_created", &p, &packs);
        let Decision::Apply { effects, notes } = decided else {
            panic!("a paid order applies: {decided:?}")
        };
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(
            effects,
            vec![
                Effect::Payment {
                    id: "orders/1".into(),
                    status: PaymentStatus::Paid,
                    plan_key: None
                },
                Effect::PackBought {
                    payment: "orders/1".into(),
                    price: "201".into(),
                    pack: packs.pack("201").unwrap().clone(),
                    quantity: 3,
                }
            ],
            "the variant decides: its product, a plan key, is not read"
        );
        // A pending order buys nothing yet.
        p["data"]["attributes"]["status"] = json!("pending");
        assert!(matches!(
            decide(SourceKind::LemonSqueezy, "order_created", &p, &packs),
            Decision::Ignore(_)
        ));
    }

    #[test]
    fn an_object_of_another_type_than_its_event_carries_is_unprocessable() {
        let mut p = corpus("order_created");
        p["meta"]["event_name"] = json!("subscription_updated");
        assert_eq!(
            ls(&p),
            Decision::Unprocessable(
                "/data/type is orders: this event carries subscriptions".into()
            )
        );
        let mut bad = corpus("subscription_cancelled");
        bad["data"]["attributes"]["ends_at"] = json!(12);
        assert_eq!(
            ls(&bad),
            Decision::Unprocessable("/ends_at is not an RFC 3339 time".into())
        );
        assert!(matches!(
            ls(&json!({"meta": {"event_name": "license_key_created"}, "data": {}})),
            Decision::Ignore(_)
        ));
    }
}
