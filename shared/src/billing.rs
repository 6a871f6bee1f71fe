//! The billing model (DESIGN §4) as plain functions: which registers an event writes, with
//! what value, and what it grants. SQL only persists these decisions (see `apply`).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use crate::config::SourceKind;

/// A catalog entry: what a provider's plan key or price id means here.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub plan: String,
    pub monthly_allowance: i64,
}

/// The plan catalog (`INBOX_PLANS`): provider key → plan.
#[derive(Debug, Clone, Default)]
pub struct Catalog(HashMap<String, Plan>);

impl Catalog {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let plans: HashMap<String, Plan> =
            serde_json::from_str(raw).map_err(|e| format!("not a valid plan catalog: {e}"))?;
        if let Some((key, _)) = plans.iter().find(|(_, p)| p.monthly_allowance < 0) {
            return Err(format!(
                "plan key '{key}': monthly_allowance must not be negative"
            ));
        }
        if let Some((key, _)) = plans.iter().find(|(_, p)| p.plan.trim().is_empty()) {
            return Err(format!("plan key '{key}': plan name is empty"));
        }
        Ok(Self(plans))
    }

    pub fn get(&self, key: &str) -> Option<&Plan> {
        self.0.get(key)
    }

    /// The allowance of a plan by its name (several keys may name one plan).
    pub fn allowance_of(&self, plan: &str) -> Option<i64> {
        self.0
            .values()
            .filter(|p| p.plan == plan)
            .map(|p| p.monthly_allowance)
            .max()
    }
}

/// A register's version: the provider's time, then the dedupe key, so the order is total.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub at: DateTime<Utc>,
    pub key: String,
}

/// The UTC month of a provider time, `YYYY-MM`: the period an allowance belongs to.
pub fn period_of(at: DateTime<Utc>) -> String {
    at.format("%Y-%m").to_string()
}

/// The ledger key that makes a grant happen once per account, period and plan.
pub fn allowance_entry_key(source: &str, customer: &str, period: &str, plan: &str) -> String {
    format!("allowance:{source}/{customer}:{period}:{plan}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentStatus {
    Paid,
    Failed,
    Refunded,
}

impl PaymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Paid => "paid",
            Self::Failed => "failed",
            Self::Refunded => "refunded",
        }
    }
}

/// A subscription status entitles its customer while `active` or `trialing`.
pub fn status_entitles(status: &str) -> bool {
    matches!(status, "active" | "trialing")
}

/// A plan key resolved against the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRef {
    pub key: String,
    pub plan: String,
    pub monthly_allowance: i64,
}

/// One write an event asks for. Each is applied by one conditional statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The customer's plan register; `None` is "no plan" (a cancelled agreement).
    CustomerPlan { plan: Option<PlanRef> },
    /// The customer's payment standing register (Kinde).
    Standing { past_due: bool },
    /// A subscription's register: the whole object's status and plan.
    Subscription {
        id: String,
        status: String,
        plan: Option<PlanRef>,
    },
    /// A payment's register; refunded is terminal.
    Payment {
        id: String,
        status: PaymentStatus,
        plan_key: Option<String>,
    },
    /// The plan's allowance for the period of the event's provider time.
    Grant { plan: PlanRef },
    /// The customer is deleted: a tombstone later events cannot lift.
    DeleteCustomer,
}

/// What an event means for the billing state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Apply(Vec<Effect>),
    /// Nothing to do, and why.
    Ignore(String),
    /// The payload cannot be read as this event type; retrying cannot help.
    Unprocessable(String),
}

/// Decides an event's effects from the event alone (never from what is stored).
pub fn decide(
    kind: SourceKind,
    event_type: &str,
    payload: &Value,
    dedupe_key: &str,
    catalog: &Catalog,
) -> Decision {
    let decided = match kind {
        SourceKind::Kinde => kinde(event_type, payload, dedupe_key, catalog),
        SourceKind::Stripe => stripe(event_type, payload, catalog),
        SourceKind::StandardWebhooks => standard(event_type, payload, catalog),
    };
    match decided {
        Ok(decision) => decision,
        Err(Problem::Unreadable(reason)) => Decision::Unprocessable(reason),
        Err(Problem::UnknownPlan(key)) => {
            Decision::Ignore(format!("plan key '{key}' is not in the plan catalog"))
        }
    }
}

enum Problem {
    Unreadable(String),
    UnknownPlan(String),
}

fn text<'a>(payload: &'a Value, pointer: &str) -> Option<&'a str> {
    payload
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
}

fn required<'a>(payload: &'a Value, pointer: &str) -> Result<&'a str, Problem> {
    text(payload, pointer)
        .ok_or_else(|| Problem::Unreadable(format!("no {pointer} in the payload")))
}

fn first_text<'a>(payload: &'a Value, pointers: &[&str]) -> Option<&'a str> {
    pointers.iter().find_map(|p| text(payload, p))
}

/// Resolves the first candidate key the catalog knows; a named but unknown key is a problem,
/// no key at all is no plan.
fn resolve(catalog: &Catalog, candidates: &[&str]) -> Result<Option<PlanRef>, Problem> {
    for key in candidates {
        if let Some(plan) = catalog.get(key) {
            return Ok(Some(PlanRef {
                key: (*key).to_owned(),
                plan: plan.plan.clone(),
                monthly_allowance: plan.monthly_allowance,
            }));
        }
    }
    match candidates.first() {
        Some(key) => Err(Problem::UnknownPlan((*key).to_owned())),
        None => Ok(None),
    }
}

fn with_grant(mut effects: Vec<Effect>, plan: &Option<PlanRef>) -> Vec<Effect> {
    if let Some(plan) = plan {
        effects.push(Effect::Grant { plan: plan.clone() });
    }
    effects
}

fn no_meaning(event_type: &str) -> Decision {
    Decision::Ignore(format!("{event_type} carries no billing state"))
}

fn kinde(
    event_type: &str,
    p: &Value,
    dedupe_key: &str,
    catalog: &Catalog,
) -> Result<Decision, Problem> {
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
        .unwrap_or(dedupe_key)
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
        other => Decision::Ignore(format!("event type {other} is not a billing event")),
    })
}

/// Price and plan ids a Stripe object names, most specific first.
fn stripe_plan_keys(object: &Value) -> Vec<&str> {
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

fn stripe(event_type: &str, p: &Value, catalog: &Catalog) -> Result<Decision, Problem> {
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
            let plan = resolve(catalog, &stripe_plan_keys(object))?;
            subscription_effects(id, status, plan)
        }
        "invoice.paid" | "invoice.payment_succeeded" => {
            let id = required(object, "/id")?.to_owned();
            let plan = resolve(catalog, &stripe_plan_keys(object))?;
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
            plan_key: stripe_plan_keys(object).first().map(|k| (*k).to_owned()),
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
        other => Decision::Ignore(format!("event type {other} is not a billing event")),
    })
}

/// A subscription event records the object's state; an entitling state also grants its plan
/// for the event's period.
fn subscription_effects(id: String, status: String, plan: Option<PlanRef>) -> Decision {
    let grant = if status_entitles(&status) {
        plan.clone()
    } else {
        None
    };
    Decision::Apply(with_grant(
        vec![Effect::Subscription { id, status, plan }],
        &grant,
    ))
}

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

fn standard(event_type: &str, p: &Value, catalog: &Catalog) -> Result<Decision, Problem> {
    let data = p
        .get("data")
        .ok_or_else(|| Problem::Unreadable("no /data in the payload".into()))?;
    let plan_keys = || -> Vec<&str> {
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
    };
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
                .ok_or_else(|| Problem::Unreadable("no /data/status in the payload".into()))?
                .to_owned();
            let plan = resolve(catalog, &plan_keys())?;
            subscription_effects(id, status, plan)
        }
        "order.paid" => {
            let plan = resolve(catalog, &plan_keys())?;
            Decision::Apply(with_grant(
                vec![Effect::Payment {
                    id: required(data, "/id")?.to_owned(),
                    status: PaymentStatus::Paid,
                    plan_key: plan.as_ref().map(|p| p.key.clone()),
                }],
                &plan,
            ))
        }
        "order.refunded" => {
            if text(data, "/status") == Some("partially_refunded") {
                return Ok(Decision::Ignore(
                    "a partial refund changes no billing state".into(),
                ));
            }
            Decision::Apply(vec![Effect::Payment {
                id: required(data, "/id")?.to_owned(),
                status: PaymentStatus::Refunded,
                plan_key: None,
            }])
        }
        "customer.deleted" => Decision::Apply(vec![Effect::DeleteCustomer]),
        other => Decision::Ignore(format!("event type {other} is not a billing event")),
    })
}

/// The account's plan, derived from its registers: the best entitlement it holds, `free`
/// when none. A tombstoned customer holds nothing.
pub fn derive_plan<'a>(
    deleted: bool,
    customer_plan: Option<&'a str>,
    past_due: bool,
    entitling_subscription_plans: impl IntoIterator<Item = &'a str>,
    catalog: &Catalog,
) -> String {
    if deleted {
        return FREE.to_owned();
    }
    let kinde = customer_plan.filter(|_| !past_due);
    kinde
        .into_iter()
        .chain(entitling_subscription_plans)
        .max_by_key(|plan| (catalog.allowance_of(plan).unwrap_or(0), plan.to_string()))
        .map(str::to_owned)
        .unwrap_or_else(|| FREE.to_owned())
}

pub const FREE: &str = "free";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"{"free":{"plan":"free","monthly_allowance":10},
                "pro":{"plan":"pro","monthly_allowance":500},
                "price_pro":{"plan":"pro","monthly_allowance":500},
                "prod_team":{"plan":"team","monthly_allowance":2000}}"#,
        )
        .unwrap()
    }

    fn pro() -> PlanRef {
        PlanRef {
            key: "pro".into(),
            plan: "pro".into(),
            monthly_allowance: 500,
        }
    }

    #[test]
    fn catalog_rejects_negative_allowance() {
        assert!(Catalog::parse(r#"{"x":{"plan":"x","monthly_allowance":-1}}"#).is_err());
        assert!(Catalog::parse(r#"{"x":{"plan":"x"}}"#).is_err());
    }

    #[test]
    fn kinde_plan_change_sets_the_register_and_grants_its_plan() {
        let p = json!({"data": {"customer_id": "c", "plan": {"key": "pro"}}});
        assert_eq!(
            decide(
                SourceKind::Kinde,
                "customer.plan_changed",
                &p,
                "k",
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
                "k",
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
                "k",
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
            "evt_9",
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
                "e",
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
            "e",
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
            decide(SourceKind::Stripe, "charge.refunded", &p, "e", &catalog()),
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
                "e",
                &catalog()
            ),
            Decision::Ignore(_)
        ));
    }

    #[test]
    fn polar_revoked_without_status_is_canceled() {
        let p = json!({"data": {"id": "sub_1", "customer_id": "c", "product_id": "prod_team"}});
        let Decision::Apply(effects) = decide(
            SourceKind::StandardWebhooks,
            "subscription.revoked",
            &p,
            "e",
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
                "e",
                &catalog()
            ),
            Decision::Unprocessable(_)
        ));
    }

    #[test]
    fn non_billing_types_are_ignored_with_a_reason() {
        assert_eq!(
            decide(
                SourceKind::Kinde,
                "user.created",
                &json!({}),
                "e",
                &catalog()
            ),
            Decision::Ignore("event type user.created is not a billing event".into())
        );
        assert_eq!(
            decide(
                SourceKind::Kinde,
                "customer.meter_usage_updated",
                &json!({}),
                "e",
                &catalog()
            ),
            Decision::Ignore("customer.meter_usage_updated carries no billing state".into())
        );
    }

    #[test]
    fn derived_plan_is_the_best_entitlement() {
        let c = catalog();
        assert_eq!(derive_plan(false, None, false, [], &c), "free");
        assert_eq!(derive_plan(false, Some("pro"), false, ["team"], &c), "team");
        assert_eq!(derive_plan(false, Some("pro"), true, [], &c), "free");
        assert_eq!(derive_plan(true, Some("pro"), false, ["team"], &c), "free");
    }

    #[test]
    fn period_is_the_utc_month() {
        let t = DateTime::parse_from_rfc3339("2026-03-31T23:30:00-02:00")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(period_of(t), "2026-04");
    }
}
