//! The effects as docs/openapi.yaml's `webhooks:` section describes them (docs/effects.md): an
//! entry for every kind there is, and every body the worker and the debits write valid against
//! its kind's schema, the one the client libraries in clients/ are generated from.

use std::collections::BTreeSet;

use http::StatusCode;
use serde_json::{json, Value};
use shared::domain::effect::Kind;
use sqlx::PgPool;

use crate::app_api::{api_state, call, on_pro, openapi, schema_errors, APP_KEY};
use crate::corpus::{corpus, CORPUS_PLANS};
use crate::helpers::*;

/// The pointer of the schema of the body of effects of `kind`.
fn body_schema(kind: &str) -> String {
    format!("/webhooks/{kind}/post/requestBody/content/application~1json/schema")
}

#[test]
fn the_webhooks_section_names_every_kind_and_no_other() {
    let named: BTreeSet<&str> = openapi()["webhooks"]
        .as_object()
        .expect("docs/openapi.yaml has a webhooks section")
        .keys()
        .map(String::as_str)
        .collect();
    let kinds: BTreeSet<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(named, kinds);
    for kind in kinds {
        assert!(
            openapi().pointer(&body_schema(kind)).is_some(),
            "{kind} has a body"
        );
    }
}

fn polar(name: &str) -> Value {
    corpus("polar")
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("testdata/providers/polar/{name}.json"))
        .1
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn every_effect_written_is_what_the_webhooks_section_describes(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    // The catalog's pro has features, so a plan change moves them too.
    let plans: Value = serde_json::from_str(CORPUS_PLANS).unwrap();
    let with_features = Value::Object(
        plans
            .as_object()
            .unwrap()
            .iter()
            .map(|(key, entry)| {
                let mut entry = entry.clone();
                if entry["plan"] == "pro" {
                    entry["features"] = json!({"sso": true, "seats": 20});
                }
                (key.clone(), entry)
            })
            .collect(),
    );
    // A plan with no subscription watches usd credits at 800 (docs/effects.md, Credits).
    let mut with_features = with_features;
    with_features["free"] =
        json!({"plan": "free", "monthly_allowance": 0, "credits_low": {"usd": 800}});
    app.worker.catalog = shared::domain::Catalog::parse(&with_features.to_string()).unwrap();
    let effects_url = app.enable_effects().await;

    // Polar: a subscription, its payment and refund, the customer's deletion.
    let customer = "c1a124cb-d614-4eeb-91b9-1802cb91d276";
    let mut deleted = polar("customer.deleted");
    deleted["data"]["id"] = customer.into();
    deleted["data"]["external_id"] = Value::Null;
    for (id, name) in [
        ("msg_active", "subscription.active"),
        ("msg_paid", "order.paid"),
        ("msg_refunded", "order.refunded"),
    ] {
        let (status, answer) = app.post("polar", &polar_delivery(id, &polar(name))).await;
        assert_eq!(status, StatusCode::OK, "{name}: {answer}");
        app.run_worker().await;
    }
    app.post("polar", &polar_delivery("msg_deleted", &deleted))
        .await;
    app.run_worker().await;

    // Kinde: pro, its allowance spent to the end (exhausted), the debit reversed.
    on_pro(&app, "kc_schemas").await;
    let mut api = api_state(&pool);
    api.effects = Some(shared::platform::queue::Queue::new(
        app.sqs.clone(),
        effects_url,
    ));
    let debited = call(
        &api,
        "POST",
        "/v1/accounts/kinde/kc_schemas/usage",
        Some(APP_KEY),
        &[("idempotency-key", "all_of_it")],
        Some(json!({"amount": 500})),
    )
    .await;
    assert_eq!(debited.status, StatusCode::OK, "{}", debited.body);
    let usage_id = debited.body["usage_id"].as_str().unwrap();
    let path = format!("/v1/accounts/kinde/kc_schemas/usage/{usage_id}/reversal");
    let reversed = call(&api, "POST", &path, Some(APP_KEY), &[], None).await;
    assert_eq!(reversed.status, StatusCode::OK, "{}", reversed.body);

    // Stripe Billing Credits: the corpus's grant, applied below 800 and expired (granted, low,
    // expired, depleted), and a second grant voided.
    let mut credits: Vec<Value> = corpus("stripe/credits")
        .into_iter()
        .map(|(_, event)| event)
        .filter(|event| !event["type"].as_str().unwrap().starts_with("v1."))
        .collect();
    let mut voided = credits[0].clone();
    voided["id"] = json!("evt_1CrdGrantVoidedSchema1");
    voided["data"]["object"]["id"] = json!("credgr_test_61CrdGrant02Voided00Schema");
    voided["data"]["object"]["voided_at"] = json!(1_767_300_000);
    credits.push(voided);
    for event in &credits {
        let (status, answer) = app.post("stripe", &stripe_delivery(event)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        app.run_worker().await;
    }

    let effects = app.effects().await;
    let mut told = BTreeSet::new();
    for effect in &effects {
        let errors = schema_errors(openapi(), &body_schema(&effect.kind), &effect.body);
        assert!(errors.is_empty(), "{}: {errors:?}", effect.body);
        let envelope = schema_errors(openapi(), "/components/schemas/Effect", &effect.body);
        assert!(envelope.is_empty(), "{}: {envelope:?}", effect.body);
        told.insert(effect.kind.as_str());
    }
    let expected: BTreeSet<&str> = Kind::ALL
        .iter()
        .map(|k| k.as_str())
        .filter(|k| !["billing.payment_failed"].contains(k))
        .collect();
    assert_eq!(
        told, expected,
        "every kind but a failed payment was written"
    );
}
