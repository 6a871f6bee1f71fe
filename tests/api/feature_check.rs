//! The app's feature check (docs/api.md, docs/design.md §4.12) through the api function's real
//! handler, on real Postgres: `GET …/features/{key}` answers whether the customer may use a
//! feature, its value, and where it comes from with the event behind it; a feature the
//! customer lacks is a 200 that says so; the account carries all of them. Every answer is
//! checked against docs/openapi.yaml by `app_api::call`.

use chrono::Utc;
use http::StatusCode;
use serde_json::{json, Map, Value};
use shared::domain::Catalog;
use sqlx::PgPool;

use crate::app_api::{api_state, call, on_pro, Answer, APP_KEY, READER_KEY};
use crate::helpers::*;

/// The test plans (`INBOX_PLANS`) with features on pro (a flag given as `false` too, so that
/// a provider's `true` can beat it) and one seat on free.
pub(crate) fn plans_with_features() -> String {
    let mut entries: Map<String, Value> = serde_json::from_str(PLANS).unwrap();
    for entry in entries.values_mut() {
        entry["features"] = match entry["plan"].as_str() {
            Some("pro") => json!({"sso": true, "seats": 20, "export": "csv", "audit-log": false}),
            Some("free") => json!({"seats": 1}),
            _ => continue,
        };
    }
    Value::Object(entries).to_string()
}

fn catalog() -> Catalog {
    Catalog::parse(&plans_with_features()).unwrap()
}

/// A test app and an api instance that both use [`catalog`].
async fn app_and_api(pool: &PgPool) -> (TestApp, shared::handlers::api::ApiState) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = catalog();
    let mut state = api_state(pool);
    state.catalog = catalog();
    (app, state)
}

async fn get(state: &shared::handlers::api::ApiState, path: &str) -> Answer {
    call(state, "GET", path, Some(READER_KEY), &[], None).await
}

async fn event_of(app: &TestApp, id: i64) -> Value {
    let (kind, occurred_at): (String, chrono::DateTime<Utc>) =
        sqlx::query_as("SELECT type, occurred_at FROM inbox_events WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    json!({"event_id": id, "type": kind,
           "occurred_at": occurred_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)})
}

/// `decided_by` with its time read as a time (the store's and the answer's text may differ
/// in precision).
fn decider(answer: &Answer) -> Value {
    let mut decided_by = answer.body["decided_by"].clone();
    if let Some(at) = decided_by["occurred_at"].as_str() {
        let at: chrono::DateTime<Utc> = at.parse().unwrap();
        decided_by["occurred_at"] = json!(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    }
    decided_by
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_catalog_feature_is_allowed_with_its_value_and_the_event_that_gave_the_plan(
    pool: PgPool,
) {
    let (app, state) = app_and_api(&pool).await;
    on_pro(&app, "kc_feat").await;
    let plan_event: i64 = sqlx::query_scalar("SELECT id FROM inbox_events WHERE source = 'kinde'")
        .fetch_one(&app.pool)
        .await
        .unwrap();

    let sso = get(&state, "/v1/accounts/kinde/kc_feat/features/sso").await;
    assert_eq!(sso.status, StatusCode::OK, "{}", sso.body);
    assert_eq!(
        (
            &sso.body["key"],
            &sso.body["allowed"],
            &sso.body["value"],
            &sso.body["source"]
        ),
        (&json!("sso"), &json!(true), &json!(true), &json!("catalog"))
    );
    assert_eq!(decider(&sso), event_of(&app, plan_event).await);

    // A limit and a tier are allowed and carry their values.
    let seats = get(&state, "/v1/accounts/kinde/kc_feat/features/seats").await;
    assert_eq!(
        (&seats.body["allowed"], &seats.body["value"]),
        (&json!(true), &json!(20))
    );
    let export = get(&state, "/v1/accounts/kinde/kc_feat/features/export").await;
    assert_eq!(export.body["value"], "csv");
    // A flag the plan gives as false is the customer's, and not allowed.
    let audit = get(&state, "/v1/accounts/kinde/kc_feat/features/audit-log").await;
    assert_eq!(
        (
            &audit.body["allowed"],
            &audit.body["value"],
            &audit.body["source"]
        ),
        (&json!(false), &json!(false), &json!("catalog"))
    );

    // The account carries every feature.
    let account = get(&state, "/v1/accounts/kinde/kc_feat").await;
    assert_eq!(
        account.body["features"],
        json!({"sso": true, "seats": 20, "export": "csv", "audit-log": false})
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_feature_the_customer_lacks_is_not_allowed_with_nulls_and_an_unknown_customer_is_404(
    pool: PgPool,
) {
    let (app, state) = app_and_api(&pool).await;
    on_pro(&app, "kc_feat").await;

    let lacking = get(&state, "/v1/accounts/kinde/kc_feat/features/ai-assist").await;
    assert_eq!(lacking.status, StatusCode::OK, "{}", lacking.body);
    assert_eq!(
        lacking.body,
        json!({"key": "ai-assist", "allowed": false, "value": null, "source": null,
               "decided_by": null})
    );
    // A key is matched exactly, as the catalog and the provider name it.
    let other_case = get(&state, "/v1/accounts/kinde/kc_feat/features/SSO").await;
    assert_eq!(other_case.body["allowed"], false);
    // A key is a path segment: what the app percent-encodes comes back decoded.
    let encoded = get(&state, "/v1/accounts/kinde/kc_feat/features/team%20seats").await;
    assert_eq!(
        (encoded.status, &encoded.body["key"]),
        (StatusCode::OK, &json!("team seats"))
    );

    let unknown = get(&state, "/v1/accounts/kinde/kc_nobody/features/sso").await;
    assert_eq!(
        (unknown.status, unknown.body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_customer"))
    );
    let no_source = get(&state, "/v1/accounts/paddle/kc_feat/features/sso").await;
    assert_eq!(no_source.body["code"], "unknown_source");
    let no_key = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_feat/features/sso",
        None,
        &[],
        None,
    )
    .await;
    assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
    let post = call(
        &state,
        "POST",
        "/v1/accounts/kinde/kc_feat/features/sso",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_deleted_customer_has_no_feature(pool: PgPool) {
    let (app, state) = app_and_api(&pool).await;
    let now = Utc::now().timestamp();
    app.post(
        "stripe",
        &stripe_delivery(&stripe_event("evt_fdel_1", "cus_fgone", now - 60)),
    )
    .await;
    app.run_worker().await;
    let before = get(&state, "/v1/accounts/stripe/cus_fgone/features/sso").await;
    assert_eq!(before.body["allowed"], true, "{}", before.body);
    // Stripe's customer.deleted carries the deleted customer object.
    let deleted = json!({
        "id": "evt_fdel_2", "object": "event", "api_version": "2024-06-20", "created": now,
        "livemode": false, "pending_webhooks": 1,
        "request": {"id": "req_fdel", "idempotency_key": null},
        "type": "customer.deleted",
        "data": {"object": {"id": "cus_fgone", "object": "customer", "created": now - 600,
                            "email": null, "livemode": false, "metadata": {}}}
    });
    app.post("stripe", &stripe_delivery(&deleted)).await;
    app.run_worker().await;

    let after = get(&state, "/v1/accounts/stripe/cus_fgone/features/sso").await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.body);
    assert_eq!(
        (&after.body["allowed"], &after.body["value"]),
        (&json!(false), &Value::Null)
    );
    let account = get(&state, "/v1/accounts/stripe/cus_fgone").await;
    assert_eq!(account.body["features"], json!({}));
}

/// Stripe's `entitlements.active_entitlement_summary.updated` for `customer`, as Stripe sends
/// it (stripe-node's `Entitlements.ActiveEntitlementSummary`): the customer's active
/// entitlements, each with its feature's `lookup_key`.
pub(crate) fn entitlement_summary(id: &str, customer: &str, created: i64, keys: &[&str]) -> Value {
    let data: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(n, key)| {
            json!({"id": format!("ent_test_61Feat{n:02}Check"),
                   "object": "entitlements.active_entitlement",
                   "feature": format!("feat_test_61Feat{n:02}Check"),
                   "livemode": false, "lookup_key": key})
        })
        .collect();
    json!({
        "id": id, "object": "event", "api_version": "2025-03-31.basil", "created": created,
        "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "type": "entitlements.active_entitlement_summary.updated",
        "data": {"object": {
            "object": "entitlements.active_entitlement_summary", "customer": customer,
            "entitlements": {"object": "list", "data": data, "has_more": false,
                             "url": format!("/v1/customer/{customer}/entitlements")},
            "livemode": false
        }}
    })
}

/// The customer's summary register as the worker wrote it from the event: `keys`, held by
/// `event_id`.
pub(crate) async fn summary_register(app: &TestApp, customer: &str, event_id: i64, keys: &[&str]) {
    let features: Map<String, Value> = keys.iter().map(|k| (k.to_string(), json!(true))).collect();
    let held: (Value, i64) = sqlx::query_as(
        "SELECT features, event_id FROM entitlements
         WHERE source = 'stripe' AND customer_id = $1 AND grant_id = 'active_entitlement_summary'",
    )
    .bind(customer)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(held, (Value::Object(features), event_id));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_providers_entitlement_gives_a_feature_and_the_larger_value_wins(pool: PgPool) {
    let (app, state) = app_and_api(&pool).await;
    let now = Utc::now().timestamp();
    let subscribed = app
        .store_stripe_event("evt_fsub", "cus_feat", now - 60)
        .await;
    app.run_worker().await;
    let summary = entitlement_summary("evt_fsum", "cus_feat", now, &["sso", "audit-log"]);
    let (status, answer) = app.post("stripe", &stripe_delivery(&summary)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let summarised = answer["event_id"].as_i64().unwrap();
    app.run_worker().await;
    summary_register(&app, "cus_feat", summarised, &["sso", "audit-log"]).await;

    // The plan gives audit-log as false, the provider as true: true is the larger value.
    let audit = get(&state, "/v1/accounts/stripe/cus_feat/features/audit-log").await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.body);
    assert_eq!(
        (
            &audit.body["allowed"],
            &audit.body["value"],
            &audit.body["source"]
        ),
        (&json!(true), &json!(true), &json!("provider"))
    );
    assert_eq!(decider(&audit), event_of(&app, summarised).await);
    assert_eq!(
        audit.body["decided_by"]["type"],
        "entitlements.active_entitlement_summary.updated"
    );
    // Both give sso the same value: the catalog's, through the event that gave the plan.
    let sso = get(&state, "/v1/accounts/stripe/cus_feat/features/sso").await;
    assert_eq!(
        (&sso.body["allowed"], &sso.body["source"]),
        (&json!(true), &json!("catalog"))
    );
    assert_eq!(decider(&sso), event_of(&app, subscribed).await);

    let account = get(&state, "/v1/accounts/stripe/cus_feat").await;
    assert_eq!(
        account.body["features"],
        json!({"sso": true, "seats": 20, "export": "csv", "audit-log": true})
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_connect_customers_feature_is_checked_beside_its_account(pool: PgPool) {
    let (app, state) = app_and_api(&pool).await;
    let mut event = stripe_event("evt_fconnect", "cus_fshared", Utc::now().timestamp());
    event["account"] = json!("acct_1FConn");
    app.post("stripe", &stripe_delivery(&event)).await;
    app.run_worker().await;

    let connected = get(
        &state,
        "/v1/accounts/stripe/cus_fshared/features/seats?stripe_account=acct_1FConn",
    )
    .await;
    assert_eq!(connected.status, StatusCode::OK, "{}", connected.body);
    assert_eq!(connected.body["value"], 20);
    // The platform's own cus_fshared is another account, which has no events.
    let platform = get(&state, "/v1/accounts/stripe/cus_fshared/features/seats").await;
    assert_eq!(platform.body["code"], "unknown_customer");
    let not_stripe = get(
        &state,
        "/v1/accounts/kinde/cus_fshared/features/seats?stripe_account=acct_1FConn",
    )
    .await;
    assert_eq!(not_stripe.body["code"], "bad_stripe_account");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_key_no_feature_can_have_is_refused_with_its_own_code(pool: PgPool) {
    let (app, state) = app_and_api(&pool).await;
    on_pro(&app, "kc_feat").await;
    let long = "k".repeat(256);
    let cases = [
        ("/v1/accounts/kinde/kc_feat/features", "bad_feature_key"),
        ("/v1/accounts/kinde/kc_feat/features/", "bad_feature_key"),
        (
            "/v1/accounts/kinde/kc_feat/features/%20%20",
            "bad_feature_key",
        ),
        (
            "/v1/accounts/kinde/kc_feat/features/sso%00",
            "bad_feature_key",
        ),
        (
            "/v1/accounts/kinde/kc_feat/features/%1B%5B2J",
            "bad_feature_key",
        ),
        (
            &format!("/v1/accounts/kinde/kc_feat/features/{long}"),
            "bad_feature_key",
        ),
        ("/v1/accounts/kinde/kc_feat/features/%FF", "bad_path"),
        (
            "/v1/accounts/kinde/kc_feat/features/sso?period=2026-01",
            "unknown_parameter",
        ),
    ];
    for (path, code) in cases {
        let refused = get(&state, path).await;
        assert_eq!(
            (refused.status, refused.body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code)),
            "{path}: {}",
            refused.body
        );
    }
    // 255 characters are a key (one the customer lacks).
    let longest = get(
        &state,
        &format!("/v1/accounts/kinde/kc_feat/features/{}", "k".repeat(255)),
    )
    .await;
    assert_eq!(longest.status, StatusCode::OK, "{}", longest.body);
}
