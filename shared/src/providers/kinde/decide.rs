//! What Kinde billing events mean for the registers: plan events set the customer's plan
//! register and grant their plan; payments and overdue invoices move the payment standing.

use serde_json::Value;

use crate::billing::model::read::{first_text, resolve, text};
use crate::billing::model::{no_meaning, not_billing, with_grant};
use crate::billing::{Catalog, Decided, Decision, Effect, PaymentStatus, Problem};
use crate::domain::DedupeKey;

/// What a Kinde event means for the billing registers.
pub fn decide(event_type: &str, p: &Value, dedupe_key: &DedupeKey, catalog: &Catalog) -> Decided {
    let plan_keys: Vec<&str> = text(p, "/data/plan/key").into_iter().collect();
    // A payment names itself when it can; otherwise each payment event is its own payment.
    let payment_id = || {
        first_text(
            p,
            &[
                "/data/payment_id",
                "/data/payment/id",
                "/data/invoice_id",
                "/data/invoice/id",
            ],
        )
        .unwrap_or(dedupe_key.as_str())
        .to_owned()
    };
    Ok(match event_type {
        "customer.plan_assigned" | "customer.plan_changed" | "customer.agreement_created" => {
            if plan_keys.is_empty() {
                return Err(Problem::Unreadable(
                    "no /data/plan/key in the payload".into(),
                ));
            }
            let plan = resolve(catalog, &plan_keys)?;
            // A plan event grants its own plan for its period even when it is too old to
            // move the register: the customer did hold that plan then.
            Decision::Apply(with_grant(
                vec![Effect::CustomerPlan { plan: plan.clone() }],
                &plan,
            ))
        }
        "customer.agreement_cancelled" => {
            Decision::Apply(vec![Effect::CustomerPlan { plan: None }])
        }
        "customer.payment_succeeded" => {
            let plan = resolve(catalog, &plan_keys)?;
            Decision::Apply(with_grant(
                vec![
                    Effect::Payment {
                        id: payment_id(),
                        status: PaymentStatus::Paid,
                        plan_key: plan.as_ref().map(|p| p.key.clone()),
                    },
                    Effect::Standing { past_due: false },
                ],
                &plan,
            ))
        }
        "customer.payment_failed" => Decision::Apply(vec![
            Effect::Payment {
                id: payment_id(),
                status: PaymentStatus::Failed,
                plan_key: plan_keys.first().map(|k| (*k).to_owned()),
            },
            Effect::Standing { past_due: true },
        ]),
        "customer.invoice_overdue" => Decision::Apply(vec![Effect::Standing { past_due: true }]),
        "customer.meter_usage_updated" => no_meaning(event_type),
        other => not_billing(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::catalog::tests::{catalog, key, pro};
    use crate::domain::SourceKind;
    use crate::providers::decide;
    use serde_json::json;

    #[test]
    fn kinde_plan_change_sets_the_register_and_grants_its_plan() {
        let p = json!({"data": {"customer_id": "c", "plan": {"key": "pro"}}});
        assert_eq!(
            decide(
                SourceKind::Kinde,
                "customer.plan_changed",
                &p,
                &key("k"),
                &catalog()
            ),
            Decision::Apply(vec![
                Effect::CustomerPlan { plan: Some(pro()) },
                Effect::Grant { plan: pro() }
            ])
        );
    }

    #[test]
    fn kinde_cancellation_clears_the_plan_register() {
        let p = json!({"data": {"customer_id": "c"}});
        assert_eq!(
            decide(
                SourceKind::Kinde,
                "customer.agreement_cancelled",
                &p,
                &key("k"),
                &catalog()
            ),
            Decision::Apply(vec![Effect::CustomerPlan { plan: None }])
        );
    }

    #[test]
    fn unknown_plan_key_is_ignored_with_its_name() {
        let p = json!({"data": {"customer_id": "c", "plan": {"key": "gold"}}});
        assert_eq!(
            decide(
                SourceKind::Kinde,
                "customer.plan_assigned",
                &p,
                &key("k"),
                &catalog()
            ),
            Decision::Ignore("plan key 'gold' is not in the plan catalog".into())
        );
    }

    #[test]
    fn kinde_payment_without_plan_grants_nothing() {
        let p = json!({"data": {"customer_id": "c"}});
        let Decision::Apply(effects) = decide(
            SourceKind::Kinde,
            "customer.payment_succeeded",
            &p,
            &key("evt_9"),
            &catalog(),
        ) else {
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
    fn non_billing_types_are_ignored_with_a_reason() {
        assert_eq!(
            decide(
                SourceKind::Kinde,
                "user.created",
                &json!({}),
                &key("e"),
                &catalog()
            ),
            Decision::Ignore("event type user.created is not a billing event".into())
        );
        assert_eq!(
            decide(
                SourceKind::Kinde,
                "customer.meter_usage_updated",
                &json!({}),
                &key("e"),
                &catalog()
            ),
            Decision::Ignore("customer.meter_usage_updated carries no billing state".into())
        );
    }
}
