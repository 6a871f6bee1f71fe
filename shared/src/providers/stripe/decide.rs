//! What Stripe events mean for the billing registers: the subscription object is the state,
//! an invoice is a payment that grants the plan its lines name, a full refund ends a payment,
//! an entitlement summary is the customer's whole set of active entitlements.

use serde_json::Value;

use crate::billing::model::read::{first_text, flag, required, resolve, unix_time};
use crate::billing::model::{
    not_billing, packs_bought, paid, plan_candidates, subscription_effects,
};
use crate::billing::{Decided, Decision, Effect, PaymentStatus, Problem, SubscriptionEnds};
use crate::domain::Catalog;

/// Price and plan ids a Stripe object names, most specific first.
pub(super) fn plan_keys(object: &Value) -> Vec<&str> {
    let mut keys = Vec::new();
    for list in ["/items/data", "/lines/data"] {
        for item in object
            .pointer(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            keys.extend(first_text(item, PRICE_PATHS));
        }
    }
    keys.extend(first_text(object, &["/plan/id", "/price/id"]));
    keys.dedup();
    keys
}

/// Each invoice line's price (as [`PRICE_PATHS`] find it) and quantity (1 when the line says
/// none): the credit packs the invoice buys.
fn line_quantities(invoice: &Value) -> Vec<(&str, u32)> {
    invoice
        .pointer("/lines/data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|line| {
            let price = first_text(line, PRICE_PATHS)?;
            let quantity = line.get("quantity").and_then(Value::as_u64).unwrap_or(1);
            Some((price, u32::try_from(quantity).unwrap_or(u32::MAX)))
        })
        .collect()
}

/// Where an item or an invoice line names its price, in every API version (docs/design.md
/// §6.2): the expanded `price` (items always; lines before basil), the `pricing` of a line from
/// basil on (an id, or the Price when expanded), the legacy `plan`.
const PRICE_PATHS: &[&str] = &[
    "/price/id",
    "/pricing/price_details/price",
    "/pricing/price_details/price/id",
    "/plan/id",
];

/// Where an invoice names the subscription it bills, in every API version (docs/design.md
/// §6.2): the invoice's own `subscription` before basil; `parent.subscription_details` from
/// basil on; on its lines, `parent.subscription_item_details` (basil on) and the line's
/// `subscription` (all versions). Each may be an id or the expanded object.
const INVOICE_SUBSCRIPTION_PATHS: &[&str] = &[
    "subscription",
    "parent.subscription_details.subscription",
    "lines.data[].parent.subscription_item_details.subscription",
    "lines.data[].subscription",
];

/// The subscriptions an invoice names, from every place the API versions put one, in the
/// order of [`INVOICE_SUBSCRIPTION_PATHS`], without repeats.
pub(super) fn invoice_subscriptions(invoice: &Value) -> Vec<&str> {
    fn id<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
        let expanded = format!("{pointer}/id");
        first_text(value, &[pointer, expanded.as_str()])
    }
    let mut ids = Vec::new();
    ids.extend(id(invoice, "/subscription"));
    ids.extend(id(invoice, "/parent/subscription_details/subscription"));
    let lines = invoice.pointer("/lines/data").and_then(Value::as_array);
    for line in lines.into_iter().flatten() {
        ids.extend(id(line, "/parent/subscription_item_details/subscription"));
        ids.extend(id(line, "/subscription"));
    }
    let mut seen = std::collections::HashSet::new();
    ids.retain(|s| seen.insert(*s));
    ids
}

/// A Stripe subscription's ends (unix seconds). The period end is the subscription's before
/// 2025-03-31 (basil); from basil on each item has its own (`items.data[].current_period_end`)
/// and the subscription runs until the latest of them. The rest are the subscription's in
/// both generations.
pub(super) fn ends(object: &Value) -> Result<SubscriptionEnds, Problem> {
    let mut current_period_end = unix_time(object, "/current_period_end")?;
    if current_period_end.is_none() {
        for item in object
            .pointer("/items/data")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            current_period_end = current_period_end.max(unix_time(item, "/current_period_end")?);
        }
    }
    Ok(SubscriptionEnds {
        current_period_end,
        cancel_at_period_end: flag(object, "/cancel_at_period_end")?,
        cancel_at: unix_time(object, "/cancel_at")?,
        trial_end: unix_time(object, "/trial_end")?,
        ended_at: unix_time(object, "/ended_at")?,
    })
}

/// The event types `decide` gives a meaning (Stripe's `types[]` filter takes up to 20).
pub const HANDLED_TYPES: [&str; 15] = [
    "customer.subscription.created",
    "customer.subscription.updated",
    "customer.subscription.deleted",
    "customer.subscription.paused",
    "customer.subscription.resumed",
    "invoice.paid",
    "invoice.payment_succeeded",
    "invoice.payment_failed",
    "invoice_payment.paid",
    "charge.refunded",
    "customer.deleted",
    super::entitlements::SUMMARY_TYPE,
    // Stripe Billing Credits (docs/design.md §4.14): their thin twins read the object too.
    super::credits::GRANT_TYPES[0],
    super::credits::GRANT_TYPES[1],
    super::credits::TRANSACTION_TYPE,
];

/// The payment intent an object names, as an id or an expanded object.
fn payment_intent(object: &Value) -> Option<&str> {
    first_text(object, &["/payment_intent", "/payment_intent/id"])
}

/// The payment intents an invoice names: its own field before 2025-03-31 (basil), its
/// `payments` list (when the payload includes it) from basil on.
fn invoice_payment_intents(invoice: &Value) -> Vec<&str> {
    let mut intents: Vec<&str> = payment_intent(invoice).into_iter().collect();
    for payment in invoice
        .pointer("/payments/data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        intents.extend(first_text(
            payment,
            &["/payment/payment_intent", "/payment/payment_intent/id"],
        ));
    }
    intents
}

/// The links an invoice's payload carries from its payment intents to itself.
fn links(invoice_id: &str, invoice: &Value) -> Vec<Effect> {
    invoice_payment_intents(invoice)
        .into_iter()
        .map(|pi| Effect::PaymentIntent {
            payment_intent: pi.to_owned(),
            invoice: invoice_id.to_owned(),
        })
        .collect()
}

/// What a Stripe event means for the billing registers. Both API generations are read: an
/// invoice's price at `lines.data[].price` (before 2025-03-31) or
/// `lines.data[].pricing.price_details.price` (basil and later); a refunded charge names its
/// invoice (before basil) or only its payment intent (basil), docs/design.md §6.
pub fn decide(event_type: &str, p: &Value, catalog: &Catalog) -> Decided {
    let object = p
        .pointer("/data/object")
        .ok_or_else(|| Problem("no /data/object in the payload".into()))?;
    Ok(match event_type {
        "customer.subscription.created"
        | "customer.subscription.updated"
        | "customer.subscription.deleted"
        | "customer.subscription.paused"
        | "customer.subscription.resumed" => {
            let id = required(object, "/id")?.to_owned();
            let status = required(object, "/status")?.to_owned();
            let ends = ends(object)?;
            subscription_effects(id, status, ends, resolve(catalog, &plan_keys(object)))
        }
        "invoice.paid" | "invoice.payment_succeeded" => {
            let id = required(object, "/id")?;
            let keys = plan_keys(object);
            let candidates = plan_candidates(&keys, catalog);
            let resolved = resolve(catalog, &candidates);
            let named = resolved.plan.is_some();
            // The credit packs its lines buy (docs/design.md §4.14): an invoice of packs alone
            // names no plan and asks for none.
            let packs = packs_bought(id, &line_quantities(object), catalog);
            let packs_only = candidates.is_empty() && !packs.is_empty();
            match paid(id.to_owned(), resolved) {
                Decision::Apply { mut effects, notes } => {
                    effects.extend(packs);
                    // Lines that name no known price: the plan is the subscription's, as its
                    // register holds it (docs/design.md §6.2).
                    if !named && !packs_only {
                        effects.push(Effect::GrantOfSubscription {
                            payment: id.to_owned(),
                            subscriptions: invoice_subscriptions(object)
                                .into_iter()
                                .map(str::to_owned)
                                .collect(),
                            read: format!(
                                "the price at lines.data[].{{price.id, pricing.price_details.price, plan.id}} and the subscription at {}",
                                INVOICE_SUBSCRIPTION_PATHS.join(", ")
                            ),
                        });
                    }
                    effects.extend(links(id, object));
                    Decision::Apply { effects, notes }
                }
                other => other,
            }
        }
        "invoice.payment_failed" => {
            let id = required(object, "/id")?;
            let mut effects = vec![Effect::Payment {
                id: id.to_owned(),
                status: PaymentStatus::Failed,
                plan_key: plan_keys(object).first().map(|k| (*k).to_owned()),
            }];
            effects.extend(links(id, object));
            Decision::apply(effects)
        }
        "invoice_payment.paid" => {
            // Basil's record of which payment paid which invoice: the link a later refund of
            // the payment intent follows.
            let invoice = first_text(object, &["/invoice", "/invoice/id"])
                .ok_or_else(|| Problem("no /data/object/invoice in the payload".into()))?;
            match first_text(
                object,
                &["/payment/payment_intent", "/payment/payment_intent/id"],
            ) {
                Some(pi) => Decision::apply(vec![Effect::PaymentIntent {
                    payment_intent: pi.to_owned(),
                    invoice: invoice.to_owned(),
                }]),
                None => Decision::Ignore(
                    "the invoice payment names no payment intent (paid out of band)".into(),
                ),
            }
        }
        "charge.refunded" => {
            if object.get("refunded").and_then(Value::as_bool) != Some(true) {
                return Ok(Decision::Ignore(
                    "a partial refund changes no billing state".into(),
                ));
            }
            let charge = required(object, "/id")?;
            let refunded = |id: &str| Effect::Payment {
                id: id.to_owned(),
                status: PaymentStatus::Refunded,
                plan_key: None,
            };
            match (
                first_text(object, &["/invoice", "/invoice/id"]),
                payment_intent(object),
            ) {
                // Before basil the charge names the invoice it paid.
                (Some(invoice), pi) => {
                    let mut effects = vec![refunded(invoice)];
                    effects.extend(pi.map(|pi| Effect::PaymentIntent {
                        payment_intent: pi.to_owned(),
                        invoice: invoice.to_owned(),
                    }));
                    Decision::apply(effects)
                }
                // From basil on, only through its payment intent.
                (None, Some(pi)) => Decision::apply(vec![Effect::RefundIntent {
                    charge: charge.to_owned(),
                    payment_intent: pi.to_owned(),
                }]),
                (None, None) => Decision::apply(vec![refunded(charge)]).noted(Some(
                    "the charge names no invoice and no payment intent: the refund is recorded on the charge".into(),
                )),
            }
        }
        "customer.deleted" => Decision::apply(vec![Effect::DeleteCustomer]),
        // The whole set of the customer's active entitlements; `previous_attributes` is not
        // read (docs/design.md §4.12).
        super::entitlements::SUMMARY_TYPE => super::entitlements::decide_summary(p, object)?,
        // Stripe Billing Credits (docs/design.md §4.14): a grant's snapshot is its register's
        // write, a transaction its grant's ledger entry; one the credits fold cannot read is
        // unprocessable with its field named. No plan, subscription or payment register moves.
        t if super::credits::is_credit_type(t) => {
            let key = p.get("id").and_then(Value::as_str).unwrap_or_default();
            Decision::apply(vec![match super::credits::read(t, object, key)? {
                super::credits::CreditEvent::Grant { snapshot, .. } => {
                    Effect::CreditGrant(snapshot)
                }
                super::credits::CreditEvent::Transaction(t) => Effect::CreditTransaction(t),
            }])
        }
        other => not_billing(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::catalog::tests::{catalog, pro};
    use crate::domain::PlanRef;
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
                &catalog()
            ),
            Decision::apply(vec![Effect::Subscription {
                id: "sub_1".into(),
                status: "past_due".into(),
                plan: Some(price_pro.clone()),
                ends: SubscriptionEnds::default(),
                rank: crate::billing::Rank::of_status("past_due"),
            }])
        );
        let Decision::Apply {
            effects: active, ..
        } = decide(
            SourceKind::Stripe,
            "customer.subscription.created",
            &p("active"),
            &catalog(),
        )
        else {
            panic!()
        };
        assert_eq!(active.last(), Some(&Effect::Grant { plan: price_pro }));
    }

    #[test]
    fn stripe_ends_are_read_from_the_subscription_before_basil_and_its_items_from_basil_on() {
        let corpus = |generation: &str| -> Value {
            let path = format!(
                "{}/../testdata/providers/stripe/{generation}/customer.subscription.updated.json",
                env!("CARGO_MANIFEST_DIR")
            );
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        let period_end = chrono::DateTime::from_timestamp(1_767_225_600, 0);
        for generation in ["pre-basil", "basil"] {
            let mut event = corpus(generation);
            let object = &mut event["data"]["object"];
            object["cancel_at_period_end"] = json!(true);
            object["cancel_at"] = json!(1_767_225_600);
            let read = ends(&event["data"]["object"]).unwrap();
            assert_eq!(
                read,
                SubscriptionEnds {
                    current_period_end: period_end,
                    cancel_at_period_end: true,
                    cancel_at: period_end,
                    trial_end: None,
                    ended_at: None,
                },
                "{generation}"
            );
        }
        let bad = json!({"id": "sub_1", "status": "active", "cancel_at": "tomorrow"});
        assert_eq!(
            decide(
                SourceKind::Stripe,
                "customer.subscription.updated",
                &json!({"data": {"object": bad}}),
                &catalog()
            ),
            Decision::Unprocessable("/cancel_at is not a time in unix seconds".into())
        );
    }

    #[test]
    fn stripe_full_refund_ends_the_invoice_payment() {
        let p = json!({"data": {"object": {"id": "ch_1", "invoice": "in_1", "refunded": true}}});
        assert_eq!(
            decide(SourceKind::Stripe, "charge.refunded", &p, &catalog()),
            Decision::apply(vec![Effect::Payment {
                id: "in_1".into(),
                status: PaymentStatus::Refunded,
                plan_key: None
            }])
        );
        let basil =
            json!({"data": {"object": {"id": "ch_1", "payment_intent": "pi_1", "refunded": true}}});
        assert_eq!(
            decide(SourceKind::Stripe, "charge.refunded", &basil, &catalog()),
            Decision::apply(vec![Effect::RefundIntent {
                charge: "ch_1".into(),
                payment_intent: "pi_1".into(),
            }])
        );
        let partial = json!({"data": {"object": {"id": "ch_1", "refunded": false}}});
        assert!(matches!(
            decide(SourceKind::Stripe, "charge.refunded", &partial, &catalog()),
            Decision::Ignore(_)
        ));
    }

    /// Every API generation's corpus file for `event_type`, parsed (where the generation has
    /// that type).
    fn every_generation(event_type: &str) -> Vec<(&'static str, Value)> {
        GENERATIONS
            .iter()
            .filter_map(|generation| {
                let path = format!(
                    "{}/../testdata/providers/stripe/{generation}/{event_type}.json",
                    env!("CARGO_MANIFEST_DIR")
                );
                let body = std::fs::read_to_string(path).ok()?;
                Some((*generation, serde_json::from_str(&body).unwrap()))
            })
            .collect()
    }

    const GENERATIONS: [&str; 5] = ["pre-basil", "basil", "clover", "dahlia", "endive"];

    /// The corpus ids of a generation (testdata/providers/README.md, "Fixed ids").
    fn ids(generation: &str) -> (&'static str, String, String, String) {
        match generation {
            "pre-basil" => (
                "PreBasil",
                "cus_PreBasilCust01".into(),
                "sub_1PreBasilSub0001".into(),
                "price_1ProMonthlyPre01".into(),
            ),
            "basil" => (
                "Basil",
                "cus_BasilCust0001".into(),
                "sub_1BasilSub000001".into(),
                "price_1ProMonthlyBas01".into(),
            ),
            other => {
                let name = match other {
                    "clover" => "Clover",
                    "dahlia" => "Dahlia",
                    _ => "Endive",
                };
                (
                    name,
                    format!("cus_{name}Cust001"),
                    format!("sub_1{name}Sub00001"),
                    format!("price_1ProMonthly{}01", &name[..3]),
                )
            }
        }
    }

    /// docs/design.md §6.2, per version: the customer, the account and the mode of every
    /// event; the subscription's id, status, price and period end; the invoice's price,
    /// subscription and payment intents; the invoice payment's invoice and intent; the
    /// refund's invoice or intent. Each is read from where that version puts it.
    #[test]
    fn every_decision_field_is_read_in_every_api_version() {
        for (generation, event) in every_generation("customer.subscription.updated") {
            let (_, customer, subscription, price) = ids(generation);
            let verified = crate::providers::stripe::parse_event(
                event.to_string().as_bytes(),
                chrono::Utc::now(),
            );
            let meta = verified.meta.unwrap();
            assert_eq!(meta.customer.unwrap().as_str(), customer, "{generation}");
            assert_eq!(event["livemode"], json!(false), "{generation}");
            let object = &event["data"]["object"];
            assert_eq!(required(object, "/id").unwrap(), subscription);
            assert_eq!(required(object, "/status").unwrap(), "active");
            assert_eq!(
                plan_keys(object).first(),
                Some(&price.as_str()),
                "{generation}"
            );
            assert_eq!(
                ends(object).unwrap().current_period_end,
                chrono::DateTime::from_timestamp(1_767_225_600, 0),
                "{generation}"
            );
            // A connected account's event names its account: part of the customer's id.
            let mut connected = event.clone();
            connected["account"] = json!("acct_1Connected0001");
            let meta = crate::providers::stripe::parse_event(
                connected.to_string().as_bytes(),
                chrono::Utc::now(),
            )
            .meta
            .unwrap();
            assert_eq!(
                meta.customer.unwrap().as_str(),
                format!("acct_1Connected0001/{customer}")
            );
        }
        for (generation, event) in every_generation("invoice.paid") {
            let (name, _, subscription, price) = ids(generation);
            let invoice = &event["data"]["object"];
            assert_eq!(plan_keys(invoice), vec![price.as_str()], "{generation}");
            assert_eq!(
                invoice_subscriptions(invoice),
                vec![subscription.as_str()],
                "{generation}"
            );
            let intents = invoice_payment_intents(invoice);
            match generation {
                // Before basil the invoice names its payment intent; from basil on only its
                // `payments` (when included) and the invoice payment do.
                "pre-basil" => assert_eq!(intents, vec!["pi_3PreBasilPi00001"]),
                _ => assert!(intents.is_empty(), "{generation}: {intents:?}"),
            }
            if generation != "pre-basil" {
                let mut with_payments = invoice.clone();
                with_payments["payments"] = json!({"object": "list", "data": [
                    {"payment": {"type": "payment_intent", "payment_intent": format!("pi_3{name}Pi")}}
                ]});
                assert_eq!(
                    invoice_payment_intents(&with_payments),
                    vec![format!("pi_3{name}Pi")]
                );
            }
        }
        for (generation, event) in every_generation("charge.refunded") {
            let charge = &event["data"]["object"];
            assert_eq!(charge["refunded"], json!(true), "{generation}");
            let decided = super::decide("charge.refunded", &event, &catalog()).unwrap();
            let Decision::Apply { effects, .. } = decided else {
                panic!("{generation}: {decided:?}")
            };
            match generation {
                "pre-basil" => assert!(matches!(
                    &effects[0],
                    Effect::Payment { id, status: PaymentStatus::Refunded, .. } if id == "in_1PreBasilInv0001"
                )),
                _ => assert!(
                    matches!(&effects[0], Effect::RefundIntent { payment_intent, .. } if payment_intent.starts_with("pi_3")),
                    "{generation}: {effects:?}"
                ),
            }
        }
        let paid_by = every_generation("invoice_payment.paid");
        assert_eq!(paid_by.len(), 4, "every generation from basil on");
        for (generation, event) in paid_by {
            let decided = super::decide("invoice_payment.paid", &event, &catalog());
            let Ok(Decision::Apply { effects, .. }) = decided else {
                panic!("{generation}: {decided:?}")
            };
            assert!(
                matches!(&effects[..], [Effect::PaymentIntent { invoice, .. }] if invoice.ends_with("Inv000001") || invoice.ends_with("Inv00001")),
                "{generation}: {effects:?}"
            );
        }
    }

    /// The places a field may also take in any version: an expanded object for an id, the
    /// line's own `subscription`, an expanded Price in a line's `pricing`.
    #[test]
    fn expanded_and_line_level_places_are_read() {
        let invoice = json!({
            "id": "in_1",
            "subscription": {"id": "sub_top", "object": "subscription"},
            "parent": {"subscription_details": {"subscription": {"id": "sub_parent"}}},
            "lines": {"data": [
                {"parent": {"subscription_item_details": {"subscription": "sub_item"}},
                 "subscription": "sub_line",
                 "pricing": {"type": "price_details", "price_details": {"price": {"id": "price_x"}}}},
                {"subscription": "sub_line"}
            ]}
        });
        assert_eq!(
            invoice_subscriptions(&invoice),
            vec!["sub_top", "sub_parent", "sub_item", "sub_line"]
        );
        assert_eq!(plan_keys(&invoice), vec!["price_x"]);
    }

    /// An invoice whose lines name no known price asks for its subscription's plan; one whose
    /// lines name a known price grants it and asks for nothing more.
    #[test]
    fn an_invoice_without_a_known_price_asks_for_its_subscriptions_plan() {
        for (generation, mut event) in every_generation("invoice.paid") {
            let (_, _, subscription, _) = ids(generation);
            let Ok(Decision::Apply { effects, .. }) =
                super::decide("invoice.paid", &event, &catalog())
            else {
                panic!("{generation}")
            };
            // The corpus prices are not in the unit catalog: nothing tells the plan yet.
            let Some(Effect::GrantOfSubscription {
                subscriptions,
                read,
                ..
            }) = effects
                .iter()
                .find(|e| matches!(e, Effect::GrantOfSubscription { .. }))
            else {
                panic!("{generation}: {effects:?}")
            };
            assert_eq!(subscriptions, &vec![subscription.clone()], "{generation}");
            assert!(read.contains("parent.subscription_details.subscription"));
            for line in event["data"]["object"]["lines"]["data"]
                .as_array_mut()
                .unwrap()
            {
                line["price"] = json!({"id": "price_pro"});
            }
            let Ok(Decision::Apply { effects, .. }) =
                super::decide("invoice.paid", &event, &catalog())
            else {
                panic!("{generation}")
            };
            assert!(
                !effects
                    .iter()
                    .any(|e| matches!(e, Effect::GrantOfSubscription { .. })),
                "{generation}: {effects:?}"
            );
            assert!(effects.iter().any(|e| matches!(e, Effect::Grant { .. })));
        }
    }

    /// A summary event shaped as Stripe sends it (`providers::stripe::fixtures`).
    fn summary(keys: &[&str], has_more: bool, previous: Option<Value>) -> Value {
        use crate::providers::stripe::fixtures::{
            active_entitlement, entitlement_summary, summary_event,
        };
        let listed = keys
            .iter()
            .enumerate()
            .map(|(n, key)| active_entitlement(&n.to_string(), key))
            .collect();
        let summary = entitlement_summary("cus_Ent1", listed, has_more);
        summary_event("evt_1Ent", 1_767_225_600, summary, previous)
    }

    fn flags(keys: &[&str]) -> crate::domain::features::Features {
        keys.iter()
            .map(|k| {
                (
                    (*k).to_owned(),
                    crate::domain::features::FeatureValue::Flag(true),
                )
            })
            .collect()
    }

    const SUMMARY: &str = "entitlements.active_entitlement_summary.updated";

    #[test]
    fn a_complete_summary_is_the_customers_whole_set_of_lookup_keys() {
        let decided = decide(
            SourceKind::Stripe,
            SUMMARY,
            &summary(&["sso", "seats-20", "export"], false, None),
            &catalog(),
        );
        assert_eq!(
            decided,
            Decision::apply(vec![Effect::Entitlement {
                grant: "active_entitlement_summary".into(),
                active: true,
                features: flags(&["export", "seats-20", "sso"]),
                rank: crate::billing::Rank(0),
            }])
        );
        assert!(HANDLED_TYPES.contains(&SUMMARY), "the walk asks for it");
    }

    /// A summary read from Stripe's list (it says when) is Stripe's word at that moment: a
    /// confirmed rank at the read's time, above a summary of the same second; it settles no tie
    /// of its own, and only a summary's list that Stripe does not find is unprocessable.
    #[test]
    fn a_summary_read_writes_at_the_confirmed_rank_of_its_read_and_reads_no_tie() {
        use crate::providers::stripe::entitlements::{missing, tie_read, READ_AT};
        let rank_of =
            |payload: &Value| match decide(SourceKind::Stripe, SUMMARY, payload, &catalog()) {
                Decision::Apply { effects, .. } => match effects.as_slice() {
                    [Effect::Entitlement { rank, .. }] => *rank,
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            };
        let event = summary(&["sso"], false, None);
        assert_eq!(rank_of(&event), crate::billing::Rank(0));
        let mut read = event.clone();
        read["id"] = json!("read:evt_1Ent");
        read["summary_event"] = json!("evt_1Ent");
        read[READ_AT] = json!("2026-01-01T00:00:07.250000+00:00");
        let at = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:07.25Z").unwrap();
        assert_eq!(rank_of(&read), crate::billing::Rank::confirmed(at.into()));
        let Decision::Apply { effects, .. } =
            decide(SourceKind::Stripe, SUMMARY, &event, &catalog())
        else {
            panic!("applied")
        };
        let carrier = tie_read(&event, &effects[0]).expect("an event's tie is read");
        assert_eq!(
            carrier.path.as_deref(),
            Ok("/v1/entitlements/active_entitlements?customer=cus_Ent1")
        );
        assert_eq!(
            tie_read(&read, &effects[0]),
            None,
            "a read is Stripe's word"
        );
        assert!(missing(
            &carrier,
            "/v1/entitlements/active_entitlements?customer=cus_Ent1"
        )
        .is_some_and(|why| why.contains("answered 404")));
        assert!(missing(&carrier, "/v1/events/evt_1Ent")
            .is_some_and(|why| why.contains("snapshot event") && why.contains("answered 404")));
        let mut other = carrier.clone();
        other.read_type = Some("customer.subscription.updated");
        assert_eq!(missing(&other, "/v1/subscriptions/sub_1"), None);
        read[READ_AT] = json!("yesterday");
        assert!(matches!(
            decide(SourceKind::Stripe, SUMMARY, &read, &catalog()),
            Decision::Unprocessable(_)
        ));
    }

    #[test]
    fn an_empty_summary_gives_no_features_and_still_replaces_the_set() {
        assert_eq!(
            decide(
                SourceKind::Stripe,
                SUMMARY,
                &summary(&[], false, None),
                &catalog()
            ),
            Decision::apply(vec![Effect::Entitlement {
                grant: "active_entitlement_summary".into(),
                active: true,
                features: flags(&[]),
                rank: crate::billing::Rank(0),
            }])
        );
    }

    /// Stripe embeds a page of the list in the event: one that says `has_more`, or holds fewer
    /// than its `total_count`, or does not say, is never applied (its complete list is read).
    #[test]
    fn an_incomplete_summary_is_never_applied() {
        let keys: Vec<String> = (0..10).map(|n| format!("feature-{n}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let more = summary(&keys, true, None);
        let mut counted = summary(&keys, false, None);
        counted["data"]["object"]["entitlements"]["total_count"] = json!(12);
        let mut unsaid = summary(&keys, false, None);
        unsaid["data"]["object"]["entitlements"]
            .as_object_mut()
            .unwrap()
            .remove("has_more");
        let mut no_list = summary(&keys, false, None);
        no_list["data"]["object"]
            .as_object_mut()
            .unwrap()
            .remove("entitlements");
        for (what, payload) in [
            ("has_more", more),
            ("total_count", counted),
            ("no has_more", unsaid),
            ("no list", no_list),
        ] {
            let decided = decide(SourceKind::Stripe, SUMMARY, &payload, &catalog());
            assert!(
                matches!(&decided, Decision::Unprocessable(reason) if reason.contains("never applied")),
                "{what}: {decided:?}"
            );
            assert!(
                crate::providers::stripe::entitlements::notice(&payload).is_some(),
                "{what}: the worker reads its complete list"
            );
        }
        let complete = summary(&keys, false, None);
        assert_eq!(
            crate::providers::stripe::entitlements::notice(&complete),
            None
        );
    }

    /// What changed is the account's features before and after, never Stripe's
    /// `previous_attributes`, which may be absent (issue 39).
    #[test]
    fn previous_attributes_absent_or_present_change_nothing() {
        let without = summary(&["sso"], false, None);
        let with = summary(
            &["sso"],
            false,
            Some(json!({"entitlements": {"data": [], "has_more": false}})),
        );
        let lying = summary(
            &["sso"],
            false,
            Some(json!({"entitlements": {"data": [{"lookup_key": "sso"}]}})),
        );
        let decided = decide(SourceKind::Stripe, SUMMARY, &without, &catalog());
        assert!(matches!(decided, Decision::Apply { .. }), "{decided:?}");
        for payload in [with, lying] {
            assert_eq!(
                decide(SourceKind::Stripe, SUMMARY, &payload, &catalog()),
                decided
            );
        }
    }

    #[test]
    fn an_entitlement_without_a_lookup_key_is_unprocessable_not_dropped() {
        let mut payload = summary(&["sso", "export"], false, None);
        payload["data"]["object"]["entitlements"]["data"][1]
            .as_object_mut()
            .unwrap()
            .remove("lookup_key");
        assert_eq!(
            decide(SourceKind::Stripe, SUMMARY, &payload, &catalog()),
            Decision::Unprocessable("entitlements.data[1] has no lookup_key".into())
        );
    }

    /// stripe-node types the summary with `customer` alone: a customer that is an Account is
    /// the id the summary names, its list read by that id (the list takes `customer` alone),
    /// as the connected account the event names, if any.
    #[test]
    fn a_summary_of_a_customer_that_is_an_account_is_read_and_keyed_by_its_id() {
        use crate::providers::stripe::fixtures::{entitlement_summary, summary_event};
        let summary = entitlement_summary("acct_1EntCust", vec![], true);
        let mut payload = summary_event("evt_1EntAcct", 1_767_225_600, summary, None);
        for (account, key) in [
            (None, "acct_1EntCust"),
            (
                Some("acct_1EntConnect01"),
                "acct_1EntConnect01/acct_1EntCust",
            ),
        ] {
            if let Some(account) = account {
                payload["account"] = json!(account);
            }
            let verified = crate::providers::stripe::parse_event(
                payload.to_string().as_bytes(),
                chrono::Utc::now(),
            );
            assert_eq!(verified.meta.unwrap().customer.unwrap().as_str(), key);
            let Some(crate::providers::Notice::Carrier(carrier)) =
                crate::providers::stripe::entitlements::notice(&payload)
            else {
                panic!("a notice")
            };
            assert_eq!(
                carrier.path.as_deref(),
                Ok("/v1/entitlements/active_entitlements?customer=acct_1EntCust")
            );
            assert_eq!(carrier.context.as_deref(), account);
        }
    }

    /// The accounts-v2 corpus (a customer that is an Account: `customer` null,
    /// `customer_account` set): every event is that Account's, and every decision field is
    /// read as in the version's own corpus.
    #[test]
    fn every_accounts_v2_event_is_the_accounts_and_reads_as_its_versions() {
        let dir = format!(
            "{}/../testdata/providers/stripe/accounts-v2",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut read = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let event: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let object = &event["data"]["object"];
            let meta = crate::providers::stripe::parse_event(
                event.to_string().as_bytes(),
                chrono::Utc::now(),
            )
            .meta
            .unwrap();
            let name = path.display();
            match object["object"].as_str() {
                // A charge has no customer_account (stripe-node): its customer is its intent's.
                Some("charge") | Some("invoice_payment") => {
                    assert_eq!(meta.customer, None, "{name}")
                }
                _ => {
                    assert_eq!(object["customer"], Value::Null, "{name}");
                    assert_eq!(
                        meta.customer.unwrap().as_str(),
                        "acct_1AcctV2Cust0001",
                        "{name}"
                    );
                }
            }
            let decided = decide(
                SourceKind::Stripe,
                meta.event_type.as_str(),
                &event,
                &catalog(),
            );
            assert!(
                matches!(decided, Decision::Apply { .. }),
                "{name}: {decided:?}"
            );
            read += 1;
        }
        assert!(read >= 5, "the accounts-v2 corpus has its files");
    }

    /// A Connect endpoint's summary names the connected account: the customer is that
    /// account's, and its list is read as that account.
    #[test]
    fn a_connected_accounts_incomplete_summary_is_read_as_that_account() {
        let mut payload = summary(&["sso"], true, None);
        payload["account"] = json!("acct_1EntConnect01");
        let verified = crate::providers::stripe::parse_event(
            payload.to_string().as_bytes(),
            chrono::Utc::now(),
        );
        assert_eq!(
            verified.meta.unwrap().customer.unwrap().as_str(),
            "acct_1EntConnect01/cus_Ent1"
        );
        let Some(crate::providers::Notice::Carrier(carrier)) =
            crate::providers::stripe::entitlements::notice(&payload)
        else {
            panic!("a notice")
        };
        assert_eq!(carrier.id, "evt_1Ent");
        assert_eq!(carrier.read_type, Some(SUMMARY));
        assert_eq!(
            carrier.path.as_deref(),
            Ok("/v1/entitlements/active_entitlements?customer=cus_Ent1")
        );
        assert_eq!(carrier.context.as_deref(), Some("acct_1EntConnect01"));
        assert_eq!(carrier.read_key().unwrap().as_str(), "read:evt_1Ent");
    }
}
