//! What Kinde billing events mean for the registers: plan events set the customer's plan
//! register and grant their plan; payments and overdue invoices move the payment standing (a
//! payment of a key the catalog gives a credit pack buys the pack);
//! the entitlements reconciliation read (`customer.entitlements_read`) sets the customer's
//! Kinde entitlements.

use serde_json::Value;

use super::{content_hash, CUSTOMER_FIELDS};
use crate::billing::model::read::{first_text, resolve, text};
use crate::billing::model::{no_meaning, not_billing, packs_bought, plan_candidates, with_grant};
use crate::billing::{Decided, Decision, Effect, PaymentStatus, Problem};
use crate::domain::{features, Catalog, FeatureValue, Features};

/// The event type of Kinde's entitlements as reconciliation read them: the project's own (Kinde
/// sends no such webhook), stored as the read's corrective event (docs/design.md §6.1).
pub const ENTITLEMENTS_READ: &str = "customer.entitlements_read";

/// The one entitlement register that holds a customer's Kinde entitlements as read.
pub const ENTITLEMENTS_GRANT: &str = "kinde_entitlements";

/// The features a list of Kinde billing entitlements gives (`GET /api/v1/billing/entitlements`,
/// `entitlements[]`): `feature_code` → `entitlement_limit_max`, or `true` when it has no
/// maximum; an entitlement without a `feature_code` names no feature. Two of one feature
/// (two plans' prices) give the larger value.
pub fn entitlement_features(entitlements: &[Value]) -> Result<Features, Problem> {
    let mut out = Features::new();
    for entitlement in entitlements {
        let Some(code) = text(entitlement, "/feature_code") else {
            continue;
        };
        let value = match entitlement.get("entitlement_limit_max") {
            None | Some(Value::Null) => FeatureValue::Flag(true),
            Some(max) => max.as_i64().map(FeatureValue::Number).ok_or_else(|| {
                Problem(format!(
                    "entitlement {code}'s entitlement_limit_max is {max}: not a whole number"
                ))
            })?,
        };
        features::join(&mut out, &Features::from([(code.to_owned(), value)]));
    }
    Ok(out)
}

/// Where Kinde billing events name their plan (Kinde does not publish the layout; both are
/// read in the wild, docs/design.md §6).
const PLAN_FIELDS: [&str; 2] = ["/data/plan/key", "/data/plan/code"];

/// The first of `pointers` that holds text, and its value.
fn field<'a>(p: &'a Value, pointers: &[&'static str]) -> Option<(&'static str, &'a str)> {
    pointers
        .iter()
        .find_map(|pointer| text(p, pointer).map(|value| (*pointer, value)))
}

/// Which payload fields named the customer and the plan, for the log line, when they are not
/// the usual layout (`data.customer_id`, `data.plan.key`): a layout Kinde does not publish is
/// never read silently, and the usual one is not said on every line.
fn fields_used(customer: &str, plan: Option<&str>) -> Option<String> {
    if customer == CUSTOMER_FIELDS[0] && plan.is_none_or(|plan| plan == PLAN_FIELDS[0]) {
        return None;
    }
    let dotted = |pointer: &str| pointer.trim_start_matches('/').replace('/', ".");
    Some(match plan {
        Some(plan) => format!("customer at {}, plan at {}", dotted(customer), dotted(plan)),
        None => format!("customer at {}", dotted(customer)),
    })
}

/// The id of a payment whose token names neither the payment nor the event: a hash of the
/// token's signed content without its send time (`content_hash`), so every copy of the token,
/// and every re-signed retry, names the same payment whatever `webhook-id` it came under
/// (docs/design.md §6).
fn signed_payment_id(claims: &Value) -> String {
    format!(
        "signed_{}",
        hex::encode(&content_hash(claims).as_bytes()[..16])
    )
}

/// What a Kinde event means for the billing registers.
pub fn decide(event_type: &str, p: &Value, catalog: &Catalog) -> Decided {
    if !event_type.starts_with("customer.") {
        return Ok(not_billing(event_type));
    }
    if event_type == "customer.meter_usage_updated" {
        return Ok(no_meaning(event_type));
    }
    let (customer_field, _) = field(p, &CUSTOMER_FIELDS)
        .ok_or_else(|| Problem("no customer at data.customer_id or data.customer.id".to_owned()))?;
    let plan_field = field(p, &PLAN_FIELDS);
    let plan_keys: Vec<&str> = plan_field.map(|(_, key)| key).into_iter().collect();
    let resolved = resolve(catalog, &plan_keys);
    let used = fields_used(customer_field, plan_field.map(|(f, _)| f));
    // A payment names itself when it can; otherwise the signed event names it. Never the
    // dedupe key: for a token without an `event_id` that is the unsigned `webhook-id`
    // header, and a captured token replayed under new ids would be new payments.
    let payment_id = || {
        first_text(
            p,
            &[
                "/data/payment_id",
                "/data/payment/id",
                "/data/invoice_id",
                "/data/invoice/id",
                "/event_id",
            ],
        )
        .map(str::to_owned)
        .unwrap_or_else(|| signed_payment_id(p))
    };
    Ok(match event_type {
        "customer.plan_assigned" | "customer.plan_changed" | "customer.agreement_created" => {
            if plan_field.is_none() {
                return Err(Problem(
                    "no plan at data.plan.key or data.plan.code".to_owned(),
                ));
            }
            // A plan event grants its own plan for its period even when it is too old to
            // move the register: the customer did hold that plan then. An unknown plan
            // still moves the register (to a plan that entitles nothing).
            Decision::apply(with_grant(
                vec![Effect::CustomerPlan {
                    plan: resolved.plan.clone(),
                    key: plan_keys.first().map(|k| (*k).to_owned()),
                }],
                &resolved.plan,
            ))
            .noted(resolved.note)
        }
        "customer.agreement_cancelled" => Decision::apply(vec![Effect::CustomerPlan {
            plan: None,
            key: None,
        }]),
        "customer.payment_succeeded" => {
            let id = payment_id();
            // A key the catalog gives a credit pack buys it, keyed by the payment (docs/design.md
            // §4.14), and names no plan. Kinde sends no refund event, so nothing voids it.
            let one_each: Vec<(&str, u32)> = plan_keys.iter().map(|k| (*k, 1)).collect();
            let packs = packs_bought(&id, &one_each, catalog);
            let resolved = resolve(catalog, &plan_candidates(&plan_keys, catalog));
            let mut effects = with_grant(
                vec![
                    Effect::Payment {
                        id,
                        status: PaymentStatus::Paid,
                        plan_key: resolved.plan.as_ref().map(|p| p.key.clone()),
                    },
                    Effect::Standing { past_due: false },
                ],
                &resolved.plan,
            );
            effects.extend(packs);
            Decision::apply(effects).noted(resolved.note)
        }
        "customer.payment_failed" => Decision::apply(vec![
            Effect::Payment {
                id: payment_id(),
                status: PaymentStatus::Failed,
                plan_key: plan_keys.first().map(|k| (*k).to_owned()),
            },
            Effect::Standing { past_due: true },
        ]),
        "customer.invoice_overdue" => Decision::apply(vec![Effect::Standing { past_due: true }]),
        ENTITLEMENTS_READ => {
            let read = p
                .pointer("/data/entitlements")
                .and_then(Value::as_array)
                .ok_or_else(|| Problem("no list at data.entitlements".to_owned()))?;
            Decision::apply(vec![Effect::Entitlement {
                grant: ENTITLEMENTS_GRANT.to_owned(),
                active: true,
                features: entitlement_features(read)?,
                rank: crate::billing::Rank(0),
            }])
        }
        other => return Ok(not_billing(other)),
    }
    .noted(used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::catalog::tests::{catalog, pro};
    use crate::domain::SourceKind;
    use crate::providers::decide;
    use serde_json::json;

    fn kinde(event_type: &str, p: &Value) -> Decision {
        decide(SourceKind::Kinde, event_type, p, &catalog())
    }

    #[test]
    fn kinde_plan_change_sets_the_register_and_grants_its_plan() {
        let p = json!({"data": {"customer_id": "c", "plan": {"key": "pro"}}});
        assert_eq!(
            kinde("customer.plan_changed", &p),
            Decision::Apply {
                effects: vec![
                    Effect::CustomerPlan {
                        plan: Some(pro()),
                        key: Some("pro".into())
                    },
                    Effect::Grant { plan: pro() }
                ],
                notes: vec![]
            }
        );
    }

    #[test]
    fn the_other_layout_is_read_and_said() {
        let p = json!({"data": {"customer": {"id": "c"}, "plan": {"code": "pro"}}});
        let Decision::Apply { effects, notes } = kinde("customer.plan_assigned", &p) else {
            panic!("the plan event applies")
        };
        assert_eq!(effects[1], Effect::Grant { plan: pro() });
        assert_eq!(
            notes,
            vec!["customer at data.customer.id, plan at data.plan.code".to_owned()]
        );
    }

    #[test]
    fn a_billing_event_with_no_known_customer_or_plan_field_is_unprocessable() {
        let no_customer = json!({"data": {"user_id": "c", "plan": {"key": "pro"}}});
        assert_eq!(
            kinde("customer.plan_assigned", &no_customer),
            Decision::Unprocessable("no customer at data.customer_id or data.customer.id".into())
        );
        let no_plan = json!({"data": {"customer_id": "c", "plan": {"name": "Pro"}}});
        assert_eq!(
            kinde("customer.plan_assigned", &no_plan),
            Decision::Unprocessable("no plan at data.plan.key or data.plan.code".into())
        );
    }

    #[test]
    fn kinde_cancellation_clears_the_plan_register() {
        let p = json!({"data": {"customer_id": "c"}});
        assert_eq!(
            kinde("customer.agreement_cancelled", &p),
            Decision::Apply {
                effects: vec![Effect::CustomerPlan {
                    plan: None,
                    key: None
                }],
                notes: vec![]
            }
        );
    }

    #[test]
    fn unknown_plan_key_moves_the_register_to_no_plan_and_says_why() {
        let p = json!({"data": {"customer_id": "c", "plan": {"key": "gold"}}});
        assert_eq!(
            kinde("customer.plan_assigned", &p),
            Decision::Apply {
                effects: vec![Effect::CustomerPlan {
                    plan: None,
                    key: Some("gold".into())
                }],
                notes: vec!["no plan: 'gold' is not in the plan catalog".into()]
            }
        );
    }

    #[test]
    fn kinde_payment_without_plan_grants_nothing() {
        let p = json!({"event_id": "evt_9", "data": {"customer_id": "c"}});
        let Decision::Apply { effects, .. } = kinde("customer.payment_succeeded", &p) else {
            panic!("a payment applies");
        };
        assert!(!effects.iter().any(|e| matches!(e, Effect::Grant { .. })));
        assert!(effects.contains(&Effect::Payment {
            id: "evt_9".into(),
            status: PaymentStatus::Paid,
            plan_key: None
        }));
    }

    #[test]
    fn a_payment_of_a_pack_key_buys_the_pack_by_its_payment_and_names_no_plan() {
        let packs = Catalog::parse(
            r#"{"pro": {"plan": "pro", "monthly_allowance": 500},
                "credits_1000": {"credits": {"amount": 1000}}}"#,
        )
        .unwrap();
        let p = json!({"event_id": "evt_9",
                       "data": {"customer_id": "c", "payment_id": "pay_1",
                                "plan": {"key": "credits_1000"}}});
        let decided = decide(SourceKind::Kinde, "customer.payment_succeeded", &p, &packs);
        let Decision::Apply { effects, notes } = decided else {
            panic!("a payment applies: {decided:?}");
        };
        assert!(notes.is_empty(), "a pack is no unknown plan: {notes:?}");
        assert!(!effects.iter().any(|e| matches!(e, Effect::Grant { .. })));
        assert!(effects.contains(&Effect::Payment {
            id: "pay_1".into(),
            status: PaymentStatus::Paid,
            plan_key: None
        }));
        assert!(effects.contains(&Effect::PackBought {
            payment: "pay_1".into(),
            price: "credits_1000".into(),
            pack: packs.pack("credits_1000").unwrap().clone(),
            quantity: 1,
        }));
    }

    fn payment_id(decision: Decision) -> String {
        let Decision::Apply { effects, .. } = decision else {
            panic!("a payment applies");
        };
        effects
            .into_iter()
            .find_map(|e| match e {
                Effect::Payment { id, .. } => Some(id),
                _ => None,
            })
            .expect("a payment effect")
    }

    #[test]
    fn a_payment_that_names_no_id_is_named_by_its_signed_content_never_by_the_dedupe_key() {
        let sent = json!({"type": "customer.payment_succeeded", "timestamp": "2026-01-01T00:00:00Z",
                          "event_timestamp": "2025-12-31T23:59:58Z", "data": {"customer_id": "c"}});
        let first = payment_id(decide(
            SourceKind::Kinde,
            "customer.payment_succeeded",
            &sent,
            &catalog(),
        ));
        let mut re_signed = sent.clone();
        re_signed["timestamp"] = json!("2026-01-01T00:01:00Z");
        let replayed = payment_id(decide(
            SourceKind::Kinde,
            "customer.payment_succeeded",
            &re_signed,
            &catalog(),
        ));
        assert_eq!(first, replayed, "signed again, the same payment");
        assert!(first.starts_with("signed_"), "{first}");
        let mut other = sent.clone();
        other["event_timestamp"] = json!("2026-01-31T23:59:58Z");
        let next_month = payment_id(kinde("customer.payment_succeeded", &other));
        assert_ne!(
            first, next_month,
            "another signed payment is another payment"
        );
    }

    /// An entitlement as Kinde's `GET /api/v1/billing/entitlements` lists it.
    fn entitlement(code: &str, max: Value) -> Value {
        json!({"id": format!("entitlement_{code}"), "fixed_charge": null,
               "price_name": code, "unit_amount": null, "feature_code": code,
               "feature_name": code, "entitlement_limit_max": max,
               "entitlement_limit_min": null})
    }

    #[test]
    fn kindes_entitlements_as_read_are_one_register_of_feature_codes_and_limits() {
        let read = json!({"type": ENTITLEMENTS_READ, "data": {"customer_id": "c", "entitlements": [
            entitlement("seats", json!(10)),
            entitlement("sso", Value::Null),
            entitlement("seats", json!(25)),
            {"id": "entitlement_base", "fixed_charge": 2900, "price_name": "Base"},
        ]}});
        let want: Features = crate::domain::features::of_json_object(
            json!({"seats": 25, "sso": true}).as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(
            kinde(ENTITLEMENTS_READ, &read),
            Decision::apply(vec![Effect::Entitlement {
                grant: ENTITLEMENTS_GRANT.into(),
                active: true,
                features: want,
                rank: crate::billing::Rank(0),
            }])
        );
        let none = json!({"data": {"customer_id": "c", "entitlements": []}});
        assert!(matches!(
            kinde(ENTITLEMENTS_READ, &none),
            Decision::Apply { effects, .. }
                if effects == [Effect::Entitlement { grant: ENTITLEMENTS_GRANT.into(),
                                                     active: true, features: Features::new(),
                                                     rank: crate::billing::Rank(0) }]
        ));
        let odd = json!({"data": {"customer_id": "c",
                                  "entitlements": [entitlement("seats", json!(2.5))]}});
        assert_eq!(
            kinde(ENTITLEMENTS_READ, &odd),
            Decision::Unprocessable(
                "entitlement seats's entitlement_limit_max is 2.5: not a whole number".into()
            )
        );
        assert_eq!(
            kinde(ENTITLEMENTS_READ, &json!({"data": {"customer_id": "c"}})),
            Decision::Unprocessable("no list at data.entitlements".into())
        );
    }

    #[test]
    fn non_billing_types_are_ignored_with_a_reason() {
        assert_eq!(
            kinde("user.created", &json!({})),
            Decision::Ignore("event type user.created is not a billing event".into())
        );
        assert_eq!(
            kinde("customer.meter_usage_updated", &json!({})),
            Decision::Ignore("customer.meter_usage_updated carries no billing state".into())
        );
    }
}
