//! Standard Webhooks (Polar) deliveries for development: payloads shaped like Polar's, signed
//! with `webhook-id`, `webhook-timestamp` and `webhook-signature: v1,<base64>`.

use chrono::{Duration, Utc};
use serde_json::{json, Value};

use crate::domain::SourceKind;
use crate::platform::config::SourceConfig;
use crate::providers::fixtures::{
    random_id, unknown_kind, Fixtures, KindeKey, Local, SignedDelivery, Spec,
};
use crate::signing::standard_webhooks::{
    decode_secret, signature, SecretEncoding, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};

pub struct StandardFixtures;

/// A feature as `--feature` names it: `sso`, `seats=20`, `export=csv`, `beta=false`; as the
/// benefit's metadata says it (`{"feature": "seats", "value": 20}`, docs/design.md §6.3).
fn feature_metadata(feature: &str) -> Result<Value, String> {
    let (key, value) = match feature.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (feature, None),
    };
    if key.trim().is_empty() {
        return Err(format!("--feature '{feature}' names no feature"));
    }
    let mut metadata = json!({"feature": key});
    if let Some(value) = value {
        metadata["value"] = match value {
            "true" | "false" => json!(value == "true"),
            number if number.parse::<i64>().is_ok() => json!(number.parse::<i64>().ok()),
            text => json!(text),
        };
    }
    Ok(metadata)
}

/// A `BenefitGrantWebhook` as Polar sends it: a `feature_flag` benefit whose metadata names
/// the spec's feature (`sso` by default), granted for the customer's subscription; revoked
/// by `benefit_grant.revoked`. A new grant has no `modified_at` yet.
fn benefit_grant(spec: &Spec, event_type: &str) -> Result<Value, String> {
    let at = spec.at.to_rfc3339();
    let customer = spec.customer.as_str();
    let feature = spec.feature.as_deref().unwrap_or("sso");
    let metadata = feature_metadata(feature)?;
    let key = metadata["feature"].as_str().unwrap_or("sso").to_owned();
    let revoked = event_type == "benefit_grant.revoked";
    let created = event_type == "benefit_grant.created";
    let benefit_id = format!("benefit_{key}");
    Ok(json!({
        "created_at": at, "modified_at": (!created).then_some(&at),
        "id": spec.object_id.clone().unwrap_or_else(|| format!("grant_{customer}_{key}")),
        "granted_at": (!revoked).then_some(&at), "is_granted": !revoked,
        "revoked_at": revoked.then_some(&at), "is_revoked": revoked,
        "subscription_id": format!("sub_{customer}"), "order_id": null,
        "customer_id": customer, "member_id": null, "benefit_id": benefit_id, "error": null,
        "customer": {
            "id": customer, "created_at": at, "modified_at": null, "metadata": {},
            "external_id": null, "email": format!("{customer}@example.com"),
            "email_verified": false, "type": "individual", "name": null, "billing_name": null,
            "billing_address": {"line1": null, "line2": null, "postal_code": null,
                                "city": null, "state": null, "country": "US"},
            "tax_id": null, "locale": null, "organization_id": ORGANIZATION,
            "default_payment_method_id": null, "deleted_at": null,
            "first_user_event_at": null, "avatar_url": null
        },
        "member": null,
        "benefit": {
            "id": benefit_id, "created_at": at, "modified_at": null, "type": "feature_flag",
            "description": format!("Feature {key}"), "selectable": true, "deletable": true,
            "is_deleted": false, "organization_id": ORGANIZATION, "metadata": metadata,
            "visibility": "private", "properties": {}, "visibility_configurable": true
        },
        "properties": {}, "previous_properties": {},
        "user_id": customer
    }))
}

/// The development source's signing secret (a dev-only value), used as its raw bytes as
/// Polar's secrets are (`secret_encoding: raw`, docs/design.md §6.3).
pub const DEV_SECRET: &str = "polar_whs_devsecret_0123456789";

const KINDS: &[&str] = &[
    "subscription",
    "revoked",
    "order-paid",
    "order-refunded",
    "benefit-grant-created",
    "benefit-grant-updated",
    "benefit-grant-cycled",
    "benefit-grant-revoked",
];

/// The development organization that owns the benefits below.
const ORGANIZATION: &str = "ba0685ff-8e13-446c-97b7-47b5a75ca925";

impl Fixtures for StandardFixtures {
    fn kinds(&self) -> &'static [&'static str] {
        KINDS
    }

    fn sample_plan(&self) -> &'static str {
        "prod_pro"
    }

    /// Named `polar`: the development source stands for Polar.
    fn dev_source(&self, _local: &Local) -> Value {
        json!({"name": "polar", "kind": SourceKind::StandardWebhooks.as_str(),
               "secrets": [DEV_SECRET], "secret_encoding": "raw"})
    }

    fn payload(&self, spec: &Spec) -> Result<(String, Value), String> {
        let at = spec.at;
        let customer = spec.customer.as_str();
        let message_id = spec.event_id.clone().unwrap_or_else(|| random_id("msg_"));
        let product = spec.plan.clone().unwrap_or_else(|| "prod_pro".into());
        let (event_type, data) = match spec.kind.as_str() {
            "subscription" | "revoked" => {
                let revoked = spec.kind == "revoked";
                let status = spec
                    .status
                    .clone()
                    .unwrap_or_else(|| (if revoked { "canceled" } else { "active" }).into());
                // Polar's ends: a cancellation at period end sets `ends_at` to the period end
                // and `canceled_at` to now; a revoked subscription ended now.
                let end = (at + Duration::days(30)).to_rfc3339();
                let cancel = spec.cancel_at_period_end && !revoked;
                let now = at.to_rfc3339();
                let trialing = status == "trialing";
                (
                    if revoked {
                        "subscription.revoked"
                    } else if cancel {
                        "subscription.canceled"
                    } else {
                        "subscription.updated"
                    },
                    json!({"id": spec.object_id.clone().unwrap_or_else(|| format!("sub_{customer}")),
                           "customer_id": customer, "status": status, "product_id": product,
                           "modified_at": now, "created_at": now,
                           "current_period_start": now, "current_period_end": end,
                           "trial_start": trialing.then_some(&now), "trial_end": trialing.then_some(&end),
                           "cancel_at_period_end": cancel,
                           "canceled_at": (cancel || revoked).then_some(&now),
                           "ends_at": if cancel { Some(&end) } else if revoked { Some(&now) } else { None },
                           "ended_at": revoked.then_some(&now)}),
                )
            }
            "order-paid" | "order-refunded" => {
                let refunded = spec.kind == "order-refunded";
                (
                    if refunded {
                        "order.refunded"
                    } else {
                        "order.paid"
                    },
                    json!({"id": spec.object_id.clone().unwrap_or_else(|| random_id("ord_")),
                           "customer_id": customer, "product_id": product,
                           "status": if refunded { "refunded" } else { "paid" },
                           "modified_at": at.to_rfc3339(), "created_at": at.to_rfc3339()}),
                )
            }
            kind if kind.starts_with("benefit-grant-") => {
                let event_type = match kind {
                    "benefit-grant-created" => "benefit_grant.created",
                    "benefit-grant-updated" => "benefit_grant.updated",
                    "benefit-grant-cycled" => "benefit_grant.cycled",
                    "benefit-grant-revoked" => "benefit_grant.revoked",
                    other => return Err(unknown_kind(other, KINDS)),
                };
                (event_type, benefit_grant(spec, event_type)?)
            }
            other => return Err(unknown_kind(other, KINDS)),
        };
        Ok((
            message_id,
            json!({"type": event_type, "timestamp": at.to_rfc3339(), "data": data}),
        ))
    }

    fn sign(
        &self,
        source: &SourceConfig,
        id: &str,
        payload: &Value,
        _kinde_key: Option<&KindeKey>,
    ) -> Result<SignedDelivery, String> {
        let secret = source.secrets.first().ok_or("the source has no secret")?;
        let key = decode_secret(
            secret,
            source.secret_encoding.unwrap_or(SecretEncoding::Base64),
        )?;
        let body = serde_json::to_vec(payload).map_err(|e| e.to_string())?;
        let now = Utc::now().timestamp();
        Ok(SignedDelivery {
            headers: vec![
                ("content-type".into(), "application/json".into()),
                (ID_HEADER.into(), id.to_owned()),
                (TIMESTAMP_HEADER.into(), now.to_string()),
                (SIGNATURE_HEADER.into(), signature(&key, id, now, &body)),
            ],
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::{Decision, Effect};
    use crate::domain::{Catalog, Features};
    use crate::providers::decide;

    fn spec(kind: &str, feature: Option<&str>) -> Spec {
        Spec {
            kind: kind.into(),
            customer: "cus_1".into(),
            at: Utc::now(),
            feature: feature.map(str::to_owned),
            ..Default::default()
        }
    }

    fn entitlement(kind: &str, feature: Option<&str>) -> (bool, Features) {
        let (_, payload) = StandardFixtures.payload(&spec(kind, feature)).unwrap();
        let event_type = payload["type"].as_str().unwrap();
        let catalog = Catalog::parse("{}").unwrap();
        match decide(SourceKind::StandardWebhooks, event_type, &payload, &catalog) {
            Decision::Apply { effects, .. } => match effects.as_slice() {
                [Effect::Entitlement {
                    active, features, ..
                }] => (*active, features.clone()),
                other => panic!("{kind}: {other:?}"),
            },
            other => panic!("{kind}: {other:?}"),
        }
    }

    #[test]
    fn the_benefit_grant_kinds_give_and_take_the_named_feature() {
        let seats =
            crate::domain::features::of_json_object(json!({"seats": 20}).as_object().unwrap())
                .unwrap();
        for kind in [
            "benefit-grant-created",
            "benefit-grant-updated",
            "benefit-grant-cycled",
        ] {
            assert_eq!(entitlement(kind, Some("seats=20")), (true, seats.clone()));
        }
        assert_eq!(
            entitlement("benefit-grant-revoked", Some("seats=20")),
            (false, Features::new())
        );
        let sso = entitlement("benefit-grant-created", None).1;
        assert_eq!(sso.keys().collect::<Vec<_>>(), ["sso"], "sso unless told");
        assert_eq!(
            feature_metadata("export=csv").unwrap(),
            json!({"feature": "export", "value": "csv"})
        );
        assert_eq!(
            feature_metadata("beta=false").unwrap(),
            json!({"feature": "beta", "value": false})
        );
        assert!(StandardFixtures
            .payload(&spec("benefit-grant-created", Some("=3")))
            .is_err());
    }
}
