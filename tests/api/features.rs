//! Features (docs/design.md §4.12) through the real intake and worker: the catalog's features
//! of the derived plan, told once by `billing.features_changed` when they move, explained by
//! `why` and held by the audit. The providers' own entitlements have their tests beside
//! their events (Stripe's summaries, Polar's benefit grants, Kinde's entitlements).

use serde_json::{json, Value};
use shared::audit::Cut;
use sqlx::PgPool;

use crate::corpus::corpus;
use crate::helpers::*;

const CUSTOMER: &str = "c1a124cb-d614-4eeb-91b9-1802cb91d276";
const PRO_PRODUCT: &str = "1bd0bcfe-5205-4fab-af9f-a0162303a64c";

fn polar(name: &str) -> Value {
    corpus("polar")
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("testdata/providers/polar/{name}.json"))
        .1
}

/// The Polar corpus's pro product with features, and a free plan that gives one seat.
fn catalog() -> shared::domain::Catalog {
    shared::domain::Catalog::parse(
        &json!({
            PRO_PRODUCT: {"plan": "pro", "monthly_allowance": 500,
                          "features": {"sso": true, "seats": 20, "export": "csv"}},
            "free": {"plan": "free", "monthly_allowance": 10, "features": {"seats": 1}}
        })
        .to_string(),
    )
    .unwrap()
}

async fn deliver(app: &TestApp, id: &str, name: &str) {
    app.post("polar", &polar_delivery(id, &polar(name))).await;
    app.run_worker().await;
}

fn features_changed(effects: &[EffectRow]) -> Vec<&Value> {
    effects
        .iter()
        .filter(|e| e.kind == "billing.features_changed")
        .map(|e| &e.body["data"])
        .collect()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_plans_features_follow_the_plan_and_each_move_is_told_once(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = catalog();
    app.enable_effects().await;

    // Active on pro, delivered three times and replayed: pro's features, told once.
    for _ in 0..3 {
        deliver(&app, "msg_active", "subscription.active").await;
    }
    let active = app.event_id("polar", "msg_active").await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[active])
        .await
        .unwrap();
    app.run_worker().await;
    let account = app.account("polar", CUSTOMER, "2025-12").await;
    assert_eq!(
        serde_json::to_value(&account.features).unwrap(),
        json!({"sso": true, "seats": 20, "export": "csv"})
    );
    let origin = &account.feature_origins["sso"];
    assert_eq!(origin.source, "catalog");
    assert_eq!(origin.decided_by.as_ref().unwrap().event_id, active);
    let effects = app.effects().await;
    let told = features_changed(&effects);
    assert_eq!(told.len(), 1, "told once: {told:?}");
    assert_eq!(told[0]["added"], json!(["export", "sso"]));
    assert_eq!(told[0]["removed"], json!([]));
    assert_eq!(
        told[0]["changed"],
        json!([{"key": "seats", "from": 1, "to": 20}])
    );
    assert_eq!(
        told[0]["features"],
        json!({"sso": true, "seats": 20, "export": "csv"})
    );
    assert_eq!(told[0]["account"]["features"], told[0]["features"]);
    let kinds: Vec<&str> = effects.iter().map(|e| e.kind.as_str()).collect();
    let plan_at = kinds.iter().position(|k| *k == "billing.plan_changed");
    let features_at = kinds.iter().position(|k| *k == "billing.features_changed");
    assert!(
        plan_at < features_at,
        "the plan, then its features: {kinds:?}"
    );

    // A later change that keeps the plan moves no feature and tells none.
    deliver(&app, "msg_updated", "subscription.updated").await;
    assert_eq!(features_changed(&app.effects().await).len(), 1);

    // Revoked: back to free, whose one seat is all that is left.
    deliver(&app, "msg_revoked", "subscription.revoked").await;
    let effects = app.effects().await;
    let told = features_changed(&effects);
    assert_eq!(told.len(), 2);
    assert_eq!(told[1]["added"], json!([]));
    assert_eq!(told[1]["removed"], json!(["export", "sso"]));
    assert_eq!(
        told[1]["changed"],
        json!([{"key": "seats", "from": 20, "to": 1}])
    );
    let account = app.account("polar", CUSTOMER, "2026-01").await;
    assert_eq!(
        serde_json::to_value(&account.features).unwrap(),
        json!({"seats": 1})
    );

    // A late copy of the activation changes nothing and tells nothing.
    deliver(&app, "msg_active_late", "subscription.active").await;
    assert_eq!(features_changed(&app.effects().await).len(), 2);

    // `why` gives each feature its source's decider; `--at` the features of the time.
    let why = app.why("polar", CUSTOMER, Cut::default()).await;
    let seats = why
        .fields
        .iter()
        .find(|f| f.field == "feature:seats")
        .unwrap();
    assert_eq!(seats.value, json!(1));
    let revoked = app.event_id("polar", "msg_revoked").await;
    assert_eq!(seats.decided_by.as_ref().unwrap().event_id, revoked);
    assert!(!why.fields.iter().any(|f| f.field == "feature:sso"));
    let then = Cut {
        at: Some("2025-12-05T00:00:00Z".parse().unwrap()),
        received_before: None,
    };
    let why = app.why("polar", CUSTOMER, then).await;
    let sso = why
        .fields
        .iter()
        .find(|f| f.field == "feature:sso")
        .unwrap();
    assert_eq!(sso.value, json!(true));
    assert!(app.audit().await.divergent.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_catalog_change_moves_the_features_without_an_event(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = catalog();
    deliver(&app, "msg_active", "subscription.active").await;
    let mut conn = app.pool.acquire().await.unwrap();
    let customer = shared::domain::CustomerId::parse(CUSTOMER).unwrap();
    let period = shared::domain::Period::parse("2025-12").unwrap();
    let richer = shared::domain::Catalog::parse(
        &json!({PRO_PRODUCT: {"plan": "pro", "monthly_allowance": 500,
                              "features": {"sso": true, "seats": 50}}})
        .to_string(),
    )
    .unwrap();
    let snapshot =
        shared::billing::account::snapshot(&mut conn, "polar", &customer, &period, &richer)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(
        serde_json::to_value(&snapshot.features).unwrap(),
        json!({"sso": true, "seats": 50})
    );
    let (allowed, value, origin) = snapshot.feature("export");
    assert!(!allowed);
    assert_eq!((value, origin), (None, None), "a feature it lacks");
    let (allowed, value, _) = snapshot.feature("seats");
    assert!(allowed);
    assert_eq!(value, Some(&shared::domain::FeatureValue::Number(50)));
}
