//! Effects: each change that took effect, told to the app once (docs/design.md §11). The
//! worker turns the registers' changes ([`Fact`]s) and the account's plan
//! before and after into outbox rows ([`effects_of`], pure); [`outbox`] is the one home of
//! an outbox row's life; the dispatcher delivers the rows to the sinks.
//!
//! An effect's id is a hash of its kind and its cause — the register and the event version
//! that moved it, or the ledger entry — so the same change always has the same id.

pub mod credits;
pub mod outbox;
pub mod sinks;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

pub use crate::billing::model::AccountState;
use crate::billing::{EventContext, PaymentStatus};
pub use crate::billing::{Fact, SubscriptionState};
use crate::domain::effect::{effect_id, Kind, NewEffect};
use crate::domain::FeaturesDiff;

/// The kind of a payment's effect.
fn kind_of_payment(status: PaymentStatus) -> Kind {
    match status {
        PaymentStatus::Paid => Kind::PaymentSucceeded,
        PaymentStatus::Failed => Kind::PaymentFailed,
        PaymentStatus::Refunded => Kind::PaymentRefunded,
    }
}

/// Whether an effect's `type` carries a state, as an app reads it: a kind it does not know is
/// a fact (kinds are added; a fact dropped is lost, a state applied once more is not).
pub fn type_carries_state(effect_type: &str) -> bool {
    Kind::parse(effect_type).is_some_and(Kind::carries_state)
}

/// The effects of one event's writes (`cause`: the event, its provider's id the version of
/// what it wrote): one per fact, `billing.plan_changed` when the
/// account's plan moved and `billing.features_changed` when its features did (`before` and
/// `after` compared, never a provider's account of what changed). Subscription, payment and
/// deletion effects come first, then the plan, its features, then grants, so an app reading
/// them in sequence order sees a cause before its consequence. No fact and no change of
/// plan or features: nothing.
pub fn effects_of(
    cause: &EventContext<'_>,
    facts: &[Fact],
    before: &AccountState,
    after: &AccountState,
) -> Vec<NewEffect> {
    let plan_before = before.plan.as_str();
    let (grants, others): (Vec<&Fact>, Vec<&Fact>) = facts
        .iter()
        .partition(|f| matches!(f, Fact::Granted { .. }));
    let mut effects: Vec<NewEffect> = others
        .into_iter()
        .map(|f| of_fact(cause, f, after))
        .collect();
    // The account's own states, each caused by the event that moved it.
    let of_account = |what: &str| {
        format!(
            "{what} of {}/{} at {}",
            cause.source,
            cause.customer,
            cause.dedupe_key.as_str()
        )
    };
    if plan_before != after.plan {
        let body = json!({"plan": after.plan, "previous_plan": plan_before});
        effects.push(effect(
            cause,
            Kind::PlanChanged,
            of_account("plan"),
            after,
            body,
        ));
    }
    let moved = FeaturesDiff::between(&before.features, &after.features);
    if !moved.is_empty() {
        let body = json!({"added": moved.added, "removed": moved.removed,
                          "changed": moved.changed, "features": after.features});
        let what = of_account("features");
        effects.push(effect(cause, Kind::FeaturesChanged, what, after, body));
    }
    effects.extend(grants.into_iter().map(|f| of_fact(cause, f, after)));
    effects
}

fn of_fact(cause: &EventContext<'_>, fact: &Fact, after: &AccountState) -> NewEffect {
    let (source, at) = (cause.source, cause.dedupe_key.as_str());
    match fact {
        Fact::Subscription { id, now, previous } => effect(
            cause,
            Kind::SubscriptionUpdated,
            format!("subscription {source}/{id} at {at}"),
            after,
            json!({
                "subscription": subscription_state(Some(id), now),
                "previous": previous.as_ref().map(|p| subscription_state(None, p)),
            }),
        ),
        Fact::Payment {
            id,
            status,
            previous,
        } => {
            // A refund is final: once per payment, whichever event reported it.
            let what = match status {
                PaymentStatus::Refunded => format!("payment {source}/{id} refunded"),
                _ => format!("payment {source}/{id} {} at {at}", status.as_str()),
            };
            effect(
                cause,
                kind_of_payment(*status),
                what,
                after,
                json!({
                    "payment": {"id": id, "status": status.as_str()},
                    "previous_status": previous,
                }),
            )
        }
        Fact::Granted {
            plan,
            period,
            amount,
            entry_key,
        } => effect(
            cause,
            Kind::AllowanceGranted,
            format!("ledger {entry_key}"),
            after,
            json!({"grant": {"plan": plan, "period": period.as_str(), "amount": amount}}),
        ),
        Fact::Deleted => effect(
            cause,
            Kind::CustomerDeleted,
            format!("customer {source}/{} deleted", cause.customer),
            after,
            json!({"deleted_at": timestamp(cause.version.at.as_datetime())}),
        ),
    }
}

/// An effect's body: the common part (who, which event, the account now) and the kind's own.
fn effect(
    cause: &EventContext<'_>,
    kind: Kind,
    what: String,
    after: &AccountState,
    own: Value,
) -> NewEffect {
    let id = effect_id(kind, &what);
    let mut data = json!({
        "source": cause.source,
        "customer_id": cause.customer.as_str(),
        "event_id": cause.event_id,
        "provider_event_id": cause.dedupe_key.as_str(),
        "account": {"plan": after.plan, "features": after.features, "balance": after.balance,
                    "used": after.used, "remaining": after.remaining,
                    "period": after.period.as_str()},
    });
    if let (Some(data), Value::Object(own)) = (data.as_object_mut(), own) {
        data.extend(own);
    }
    NewEffect {
        body: json!({
            "id": id,
            "type": kind.as_str(),
            "occurred_at": timestamp(cause.version.at.as_datetime()),
            "data": data,
        }),
        id,
        kind,
        cause: what,
    }
}

/// A subscription's state as an effect tells it: status, plan and the five ends.
fn subscription_state(id: Option<&str>, state: &SubscriptionState) -> Value {
    let ends = &state.ends;
    let at = |t: Option<DateTime<Utc>>| t.map(timestamp);
    let mut body = json!({
        "status": state.status,
        "plan": state.plan,
        "current_period_end": at(ends.current_period_end),
        "cancel_at_period_end": ends.cancel_at_period_end,
        "cancel_at": at(ends.cancel_at),
        "trial_end": at(ends.trial_end),
        "ended_at": at(ends.ended_at),
    });
    if let (Some(id), Some(body)) = (id, body.as_object_mut()) {
        body.insert("id".to_owned(), json!(id));
    }
    body
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::Version;
    use crate::domain::{CustomerId, DedupeKey, Period};

    fn key(key: &str) -> &'static DedupeKey {
        Box::leak(Box::new(DedupeKey::parse(key).unwrap()))
    }

    fn cause() -> EventContext<'static> {
        let at: DateTime<Utc> = "2026-11-30T10:00:00Z".parse().unwrap();
        EventContext {
            event_id: 7,
            source: "stripe",
            customer: Box::leak(Box::new(CustomerId::parse("cus_1").unwrap())),
            event_type: "customer.subscription.updated",
            dedupe_key: key("evt_1"),
            version: Version {
                at: at.into(),
                key: key("evt_1").clone(),
            },
        }
    }

    fn account(plan: &str) -> AccountState {
        AccountState {
            plan: plan.into(),
            features: Default::default(),
            balance: 500,
            used: 0,
            remaining: 500,
            period: Period::parse("2026-11").unwrap(),
        }
    }

    fn upgrade() -> Vec<Fact> {
        vec![
            Fact::Subscription {
                id: "sub_1".into(),
                now: SubscriptionState {
                    status: "active".into(),
                    plan: Some("pro".into()),
                    ends: crate::billing::SubscriptionEnds {
                        current_period_end: "2026-12-30T10:00:00Z".parse().ok(),
                        ..Default::default()
                    },
                },
                previous: None,
            },
            Fact::Granted {
                plan: "pro".into(),
                period: Period::parse("2026-11").unwrap(),
                amount: 490,
                entry_key: "allowance:stripe/cus_1:2026-11:pro".into(),
            },
        ]
    }

    #[test]
    fn an_upgrade_tells_the_subscription_then_the_plan_then_the_grant() {
        let effects = effects_of(&cause(), &upgrade(), &account("free"), &account("pro"));
        let kinds: Vec<&str> = effects.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "billing.subscription_updated",
                "billing.plan_changed",
                "billing.allowance_granted"
            ]
        );
        let plan = &effects[1].body;
        assert_eq!(plan["type"], "billing.plan_changed");
        assert_eq!(plan["id"], effects[1].id.as_str());
        assert_eq!(plan["occurred_at"], "2026-11-30T10:00:00.000Z");
        assert_eq!(plan["data"]["plan"], "pro");
        assert_eq!(plan["data"]["previous_plan"], "free");
        assert_eq!(plan["data"]["customer_id"], "cus_1");
        assert_eq!(plan["data"]["event_id"], 7);
        assert_eq!(plan["data"]["account"]["balance"], 500);
        assert_eq!(effects[2].body["data"]["grant"]["amount"], 490);
        let subscription = &effects[0].body["data"]["subscription"];
        assert_eq!(subscription["status"], "active");
        assert_eq!(
            subscription["current_period_end"],
            "2026-12-30T10:00:00.000Z"
        );
        assert_eq!(subscription["cancel_at_period_end"], false);
        assert!(subscription["cancel_at"].is_null());
        assert!(effects[0].body["data"]["previous"].is_null());
    }

    #[test]
    fn the_same_change_has_the_same_id_and_another_change_another() {
        let once = effects_of(&cause(), &upgrade(), &account("free"), &account("pro"));
        let again = effects_of(&cause(), &upgrade(), &account("free"), &account("pro"));
        assert_eq!(once, again);
        let other = EventContext {
            dedupe_key: key("evt_2"),
            ..cause()
        };
        let later = effects_of(&other, &upgrade(), &account("free"), &account("pro"));
        assert_ne!(
            once[0].id, later[0].id,
            "another version of the subscription"
        );
        assert_eq!(once[2].id, later[2].id, "the same ledger entry");
        assert!(once[0].id.starts_with("eff_") && once[0].id.len() == 36);
    }

    #[test]
    fn a_refund_is_one_effect_whichever_event_reports_it() {
        let refund = [Fact::Payment {
            id: "in_1".into(),
            status: PaymentStatus::Refunded,
            previous: Some("paid".into()),
        }];
        let one = effects_of(&cause(), &refund, &account("pro"), &account("pro"));
        let other = EventContext {
            dedupe_key: key("evt_9"),
            ..cause()
        };
        let two = effects_of(&other, &refund, &account("pro"), &account("pro"));
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].kind, Kind::PaymentRefunded);
        assert_eq!(one[0].id, two[0].id);
        assert_eq!(one[0].body["data"]["previous_status"], "paid");
    }

    #[test]
    fn nothing_changed_writes_nothing() {
        assert!(effects_of(&cause(), &[], &account("pro"), &account("pro")).is_empty());
        let only_plan = effects_of(&cause(), &[], &account("free"), &account("pro"));
        assert_eq!(only_plan.len(), 1);
        assert_eq!(only_plan[0].kind, Kind::PlanChanged);
    }

    #[test]
    fn only_plan_and_subscription_effects_carry_a_state() {
        let state = [Kind::PlanChanged, Kind::SubscriptionUpdated];
        let facts = [
            Kind::AllowanceGranted,
            Kind::PaymentSucceeded,
            Kind::PaymentFailed,
            Kind::PaymentRefunded,
            Kind::CustomerDeleted,
            Kind::AllowanceExhausted,
            Kind::UsageReversed,
        ];
        assert!(state.iter().all(|k| k.carries_state()));
        assert!(facts.iter().all(|k| !k.carries_state()));
        assert_eq!(
            Kind::AllowanceExhausted.as_str(),
            "billing.allowance_exhausted"
        );
    }

    #[test]
    fn the_account_block_tells_used_and_remaining_beside_balance() {
        let after = AccountState {
            used: 120,
            remaining: 380,
            ..account("pro")
        };
        let effects = effects_of(&cause(), &upgrade(), &account("free"), &after);
        assert_eq!(
            effects[1].body["data"]["account"],
            json!({"plan": "pro", "features": {}, "balance": 500, "used": 120, "remaining": 380,
                   "period": "2026-11"})
        );
    }

    #[test]
    fn features_changed_compares_the_features_before_and_after_and_same_features_tell_nothing() {
        let with = |features: Value| AccountState {
            features: crate::domain::features::of_json_object(features.as_object().unwrap())
                .unwrap(),
            ..account("pro")
        };
        let before = with(json!({"sso": true, "seats": 5, "old": true}));
        let after = with(json!({"sso": true, "seats": 20, "api": "v2"}));
        let effects = effects_of(&cause(), &[], &before, &after);
        assert_eq!(effects.len(), 1);
        assert_eq!(effects[0].kind, Kind::FeaturesChanged);
        assert!(Kind::FeaturesChanged.carries_state());
        assert_eq!(
            effects[0].body["data"],
            json!({"source": "stripe", "customer_id": "cus_1", "event_id": 7,
                   "provider_event_id": "evt_1",
                   "account": {"plan": "pro", "features": {"sso": true, "seats": 20, "api": "v2"},
                               "balance": 500, "used": 0, "remaining": 500, "period": "2026-11"},
                   "added": ["api"], "removed": ["old"],
                   "changed": [{"key": "seats", "from": 5, "to": 20}],
                   "features": {"sso": true, "seats": 20, "api": "v2"}})
        );
        assert!(effects_of(&cause(), &[], &after, &after.clone()).is_empty());
    }
}
