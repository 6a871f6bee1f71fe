//! What Polar's (Standard Webhooks) events mean for the registers: the subscription object
//! is the state, a paid order is a payment that grants its product, a full refund ends it, a
//! benefit grant gives the feature its benefit names while it is granted.

use serde_json::Value;

use crate::billing::model::read::{first_text, flag, iso_time, required, resolve, text};
use crate::billing::model::{not_billing, paid_with_packs, subscription_effects};
use crate::billing::{Decided, Decision, Effect, PaymentStatus, Problem, SubscriptionEnds};
use crate::domain::{Catalog, FeatureValue, Features};

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

/// A boolean the payload must carry (Polar's schema requires it): absent is no guess.
fn boolean(data: &Value, pointer: &str) -> Result<bool, Problem> {
    data.pointer(pointer)
        .and_then(Value::as_bool)
        .ok_or_else(|| Problem(format!("no boolean {pointer} in the payload")))
}

/// A Polar benefit grant (`benefit_grant.created` / `updated` / `cycled` / `revoked`): one
/// entitlement register per grant id (docs/design.md §6.3), active while Polar says the
/// benefit is granted and not revoked; a revocation is never active, and what a grant that is
/// not active would give is not read (a revocation always applies). A `meter_credit`
/// benefit's creditings are besides credit grants of the credits fold
/// ([`super::credits::meter_credit_grants`]); a revocation whose credits cannot be read still
/// ends the entitlement, the reason noted.
fn benefit_grant(event_type: &str, data: &Value) -> Decided {
    let grant = required(data, "/id")?.to_owned();
    let revoked = event_type == "benefit_grant.revoked";
    let active = !revoked && boolean(data, "/is_granted")? && !boolean(data, "/is_revoked")?;
    let features = if active {
        benefit_features(data)?
    } else {
        Features::new()
    };
    let key = super::credits::event_key(event_type, data);
    let (credits, note) = match super::credits::meter_credit_grants(event_type, data, &key) {
        Ok(grants) => (grants, None),
        Err(problem) if revoked => (
            Vec::new(),
            Some(format!("meter credits not read: {}", problem.0)),
        ),
        Err(problem) => return Err(problem),
    };
    let mut effects = vec![Effect::Entitlement {
        grant,
        active,
        features,
        rank: crate::billing::Rank(0),
    }];
    effects.extend(credits.into_iter().map(Effect::CreditGrant));
    Ok(Decision::apply(effects).noted(note))
}

/// The feature a granted Polar benefit gives (docs/design.md §6.3), from the benefit as the
/// grant carries it. The benefit's `metadata` is Polar's place for the app's data:
/// - the key is `metadata.feature`; without one a `feature_flag` benefit is keyed by its id
///   (its description is for people and can change), and any other benefit (a Discord role,
///   a download, a license key) gives no feature;
/// - the value is `metadata.value` (a boolean, a whole number or a string); without one a
///   `meter_credit` benefit gives its `properties.units` (the credits of a cycle), and any
///   other benefit `true`.
pub(super) fn benefit_features(data: &Value) -> Result<Features, Problem> {
    let benefit = data
        .get("benefit")
        .ok_or_else(|| Problem("no /benefit in the payload".into()))?;
    let kind = text(benefit, "/type");
    let meta = |name: &str| {
        benefit
            .pointer(&format!("/metadata/{name}"))
            .filter(|v| !v.is_null())
    };
    let key = match meta("feature") {
        None if kind == Some("feature_flag") => required(data, "/benefit/id")?.to_owned(),
        None => return Ok(Features::new()),
        Some(Value::String(key)) if !key.trim().is_empty() => key.clone(),
        Some(other) => {
            return Err(Problem(format!(
                "the benefit's metadata.feature is {other}: a feature key is a non-blank string"
            )))
        }
    };
    let value = match meta("value") {
        Some(value) => FeatureValue::of_json(value).ok_or_else(|| {
            Problem(format!(
                "the benefit's metadata.value is {value}: a boolean, a whole number or a string"
            ))
        })?,
        None if kind == Some("meter_credit") => benefit
            .pointer("/properties/units")
            .and_then(Value::as_i64)
            .map(FeatureValue::Number)
            .ok_or_else(|| {
                Problem("no whole number /benefit/properties/units in the payload".into())
            })?,
        None => FeatureValue::Flag(true),
    };
    Ok(Features::from([(key, value)]))
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
        // A product the catalog gives a credit pack buys it (docs/design.md §4.14).
        "order.paid" => paid_with_packs(required(data, "/id")?.to_owned(), &plan_keys(), catalog),
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
        "benefit_grant.created"
        | "benefit_grant.updated"
        | "benefit_grant.cycled"
        | "benefit_grant.revoked" => benefit_grant(event_type, data)?,
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

    /// A file of the Polar corpus (`testdata/providers/polar/`), as Polar sends it.
    fn corpus(name: &str) -> Value {
        let path = format!(
            "{}/../testdata/providers/polar/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn polar(p: &Value) -> Decision {
        let event_type = p["type"].as_str().unwrap();
        decide(SourceKind::StandardWebhooks, event_type, p, &catalog())
    }

    /// The one entitlement a benefit grant event writes: (grant, active, features).
    fn entitlement(p: &Value) -> (String, bool, Features) {
        match polar(p) {
            Decision::Apply { effects, .. } => {
                let entitlements: Vec<_> = effects
                    .iter()
                    .filter_map(|e| match e {
                        Effect::Entitlement {
                            grant,
                            active,
                            features,
                            ..
                        } => Some((grant.clone(), *active, features.clone())),
                        _ => None,
                    })
                    .collect();
                let [one] = entitlements.try_into().expect("one entitlement");
                one
            }
            other => panic!("applied: {other:?}"),
        }
    }

    fn features(value: Value) -> Features {
        crate::domain::features::of_json_object(value.as_object().unwrap()).unwrap()
    }

    /// The corpus's granted SSO grant, its benefit's `metadata` replaced.
    fn granted_with_metadata(metadata: Value) -> Value {
        let mut p = corpus("benefit_grant.created");
        p["data"]["benefit"]["metadata"] = metadata;
        p
    }

    /// Polar's `BenefitMeterCredit` as a grant carries it: 1,000 units of a meter a cycle.
    fn meter_credit(metadata: Value) -> Value {
        let mut p = corpus("benefit_grant.created");
        p["data"]["benefit"] = json!({
            "id": "e2c4f9a1-7b35-4d08-a6e2-91f3b8c0d547",
            "created_at": "2025-09-01T08:05:12.046611Z", "modified_at": null,
            "type": "meter_credit", "description": "1,000 API calls a month",
            "selectable": true, "deletable": true, "is_deleted": false,
            "organization_id": "ba0685ff-8e13-446c-97b7-47b5a75ca925",
            "metadata": metadata, "visibility": "public",
            "properties": {"units": 1000, "rollover": false,
                           "meter_id": "7d3a9e62-c1f4-4b8d-95a0-3e6b2f8c1d94"},
            "visibility_configurable": true
        });
        p["data"]["benefit_id"] = p["data"]["benefit"]["id"].clone();
        p["data"]["properties"] = json!({
            "last_credited_meter_id": "7d3a9e62-c1f4-4b8d-95a0-3e6b2f8c1d94",
            "last_credited_units": 1000,
            "last_credited_at": "2025-12-01T10:00:04.320114+00:00"
        });
        p
    }

    #[test]
    fn a_benefit_grant_gives_the_feature_its_benefit_names_while_it_is_granted() {
        let (grant, active, given) = entitlement(&corpus("benefit_grant.created"));
        assert_eq!(
            grant, "0f6d8a2e-3b71-4c59-9e04-b2a7c5d1e863",
            "one register a grant"
        );
        assert!(active);
        assert_eq!(given, features(json!({"sso": true})));
        let (grant, active, given) = entitlement(&corpus("benefit_grant.revoked"));
        assert_eq!(grant, "0f6d8a2e-3b71-4c59-9e04-b2a7c5d1e863");
        assert!(!active, "a revoked grant gives nothing");
        assert_eq!(given, Features::new());
        // Polar re-grants a revoked grant in place: the same id, granted again.
        let mut again = corpus("benefit_grant.revoked");
        again["type"] = json!("benefit_grant.created");
        again["data"]["is_granted"] = json!(true);
        again["data"]["is_revoked"] = json!(false);
        assert!(entitlement(&again).1, "granted again");
        // An update or a cycle says the grant as it is now.
        let mut cycled = corpus("benefit_grant.created");
        cycled["type"] = json!("benefit_grant.cycled");
        assert_eq!(entitlement(&cycled).2, features(json!({"sso": true})));
    }

    #[test]
    fn a_grant_that_failed_or_says_revoked_gives_nothing_whatever_its_event() {
        let mut failed = corpus("benefit_grant.created");
        failed["type"] = json!("benefit_grant.updated");
        failed["data"]["is_granted"] = json!(false);
        failed["data"]["granted_at"] = Value::Null;
        failed["data"]["error"] = json!({"message": "The customer must connect an account",
            "type": "BenefitActionRequiredError", "timestamp": "2025-12-01T10:00:04.3+00:00"});
        assert!(!entitlement(&failed).1);
        let mut contradicts = corpus("benefit_grant.created");
        contradicts["data"]["is_revoked"] = json!(true);
        assert!(!entitlement(&contradicts).1, "revoked wins over granted");
        let mut unsaid = corpus("benefit_grant.created");
        unsaid["data"].as_object_mut().unwrap().remove("is_granted");
        assert_eq!(
            polar(&unsaid),
            Decision::Unprocessable("no boolean /is_granted in the payload".into())
        );
    }

    #[test]
    fn the_benefits_metadata_names_the_feature_and_its_value() {
        let given = |p: &Value| entitlement(p).2;
        // A feature flag with no metadata is keyed by the benefit's id.
        assert_eq!(
            given(&granted_with_metadata(json!({}))),
            features(json!({"5b1e3c7a-9d24-4f86-b0c1-7e3a2d9f4c18": true}))
        );
        assert_eq!(
            given(&granted_with_metadata(
                json!({"feature": "seats", "value": 20})
            )),
            features(json!({"seats": 20}))
        );
        assert_eq!(
            given(&granted_with_metadata(
                json!({"feature": "export", "value": "csv", "note": "x"})
            )),
            features(json!({"export": "csv"}))
        );
        assert_eq!(
            given(&granted_with_metadata(
                json!({"feature": "beta", "value": false})
            )),
            features(json!({"beta": false}))
        );
        // Another kind of benefit gives a feature only when its metadata names one.
        let mut discord = granted_with_metadata(json!({"role": "editor"}));
        discord["data"]["benefit"]["type"] = json!("discord");
        assert_eq!(given(&discord), Features::new());
        assert!(entitlement(&discord).1, "the grant is still kept, active");
        // Meter credits: the credits of a cycle, unless the metadata says a value.
        assert_eq!(
            given(&meter_credit(json!({"feature": "api_calls"}))),
            features(json!({"api_calls": 1000}))
        );
        assert_eq!(
            given(&meter_credit(json!({"feature": "api", "value": true}))),
            features(json!({"api": true}))
        );
        assert_eq!(given(&meter_credit(json!({}))), Features::new());
    }

    #[test]
    fn metadata_that_names_no_readable_feature_is_unprocessable_but_a_revocation_applies() {
        assert_eq!(
            polar(&granted_with_metadata(
                json!({"feature": "seats", "value": 2.5})
            )),
            Decision::Unprocessable(
                "the benefit's metadata.value is 2.5: a boolean, a whole number or a string".into()
            )
        );
        assert_eq!(
            polar(&granted_with_metadata(json!({"feature": 7}))),
            Decision::Unprocessable(
                "the benefit's metadata.feature is 7: a feature key is a non-blank string".into()
            )
        );
        assert!(matches!(
            polar(&granted_with_metadata(json!({"feature": " "}))),
            Decision::Unprocessable(_)
        ));
        let mut revoked = corpus("benefit_grant.revoked");
        revoked["data"]["benefit"]["metadata"] = json!({"feature": "seats", "value": 2.5});
        assert!(!entitlement(&revoked).1, "what it would give is not read");
    }

    #[test]
    fn a_meter_credit_grant_gives_its_feature_and_its_crediting_as_a_credit_grant() {
        let granted = meter_credit(json!({"feature": "api_calls"}));
        let Decision::Apply { effects, .. } = polar(&granted) else {
            panic!("applied")
        };
        let [Effect::Entitlement { active: true, .. }, Effect::CreditGrant(g)] = effects.as_slice()
        else {
            panic!("the entitlement, then the crediting: {effects:?}")
        };
        assert_eq!(
            g.grant_id,
            "meter_credit:0f6d8a2e-3b71-4c59-9e04-b2a7c5d1e863:2025-12-01T10:00:04.320114Z"
        );
        assert_eq!(g.origin, crate::billing::credits::Origin::PolarMeterCredit);
        // A revocation whose credits cannot be read still ends the entitlement, said why.
        let mut revoked = granted.clone();
        revoked["type"] = json!("benefit_grant.revoked");
        revoked["data"]["properties"]["last_credited_units"] = json!("-1000");
        let Decision::Apply { effects, notes } = polar(&revoked) else {
            panic!("applied")
        };
        assert!(matches!(
            effects.as_slice(),
            [Effect::Entitlement { active: false, .. }]
        ));
        assert_eq!(
            notes,
            ["meter credits not read: /properties/last_credited_units is \"-1000\": a whole number"]
        );
        // A granting event's must be read: no silent guess.
        let mut cycled = revoked;
        cycled["type"] = json!("benefit_grant.cycled");
        assert!(matches!(polar(&cycled), Decision::Unprocessable(_)));
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
