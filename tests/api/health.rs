//! `v2.core.health.event_generation_failure.resolved` (docs/design.md §6.2): Stripe's word that
//! it failed to generate events. The notification is a thin event without `data` (stripe-node's
//! `V2CoreHealthEventGenerationFailureResolvedEventNotification`); its `data` is read from
//! `GET /v2/core/events/{id}` (`alert_id`, `grouping_key`, `impact {context?, event_type,
//! related_object {id, type, url}}`, `resolved_at`, `summary`: stripe-node's
//! `V2CoreHealthEventGenerationFailureResolvedEvent.Data`, and the example in Stripe's guide
//! "Handle irrecoverable webhook events", whose `related_object.url` is a Dashboard URL). The
//! Stripe API is a fake (wiremock).

use serde_json::{json, Value};
use shared::handlers::worker::{process_event, Processed};
use sqlx::PgPool;
use wiremock::matchers::{header, method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::corpus::CORPUS_PLANS;
use crate::helpers::*;
use crate::traffic::with_stripe_api;

const ID: &str = "evt_test_65TdHe4lThGenFail16T2Kfo4Q8lSA4GfMwNYbNqcHlth";
const SUB: &str = "sub_1ThinSub0000001";
const CUSTOMER: &str = "cus_ThinCust00001";

/// The notification as delivered: a thin event that names no object and carries no data.
fn notification() -> Value {
    json!({
        "id": ID, "object": "v2.core.event",
        "type": "v2.core.health.event_generation_failure.resolved",
        "livemode": false, "created": "2026-10-01T12:30:00.000Z", "context": null, "reason": null
    })
}

/// The event as `GET /v2/core/events/{id}` shows it, with `impact` as given.
fn v2_event(impact: Option<Value>) -> Value {
    let mut data = json!({
        "alert_id": "halert_61RFBMa6o6H87usts16RFBM10hSQlYfddqcFoEMR6CPY",
        "grouping_key": "_grouping_s8PgTvizbkORV9z5PhaJSvc4dUcAMmfRpEHKm4EeJ1glsQ5XMf",
        "resolved_at": "2026-10-01T12:25:44.000Z",
        "summary": "We have failed to create a notification for your Stripe account.",
        "severity": "critical"
    });
    if let Some(impact) = impact {
        data["impact"] = impact;
    }
    let mut event = notification();
    event["data"] = data;
    event
}

fn subscription(id: &str) -> Value {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/providers/stripe/thin/objects/subscription.active.json");
    let mut object: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    object["id"] = json!(id);
    object
}

async fn app_with_api(pool: PgPool) -> (TestApp, MockServer) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(CORPUS_PLANS).unwrap();
    let api = MockServer::start().await;
    with_stripe_api(&mut app.worker, &api);
    (app, api)
}

async fn serves_event(api: &MockServer, event: Value) {
    Mock::given(method("GET"))
        .and(path(format!("/v2/core/events/{ID}")))
        .and(header("Authorization", "Bearer sk_test_reads"))
        .respond_with(ResponseTemplate::new(200).set_body_json(event))
        .mount(api)
        .await;
}

async fn deliver(app: &TestApp) -> EventRow {
    let (status, body) = app.post("stripe", &stripe_delivery(&notification())).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    app.run_worker().await;
    app.event(app.event_id("stripe", ID).await).await
}

fn period() -> String {
    chrono::Utc::now().format("%Y-%m").to_string()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_generation_failure_that_names_a_subscription_reads_and_applies_it(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    // The guide's example names the object by a Dashboard URL: the path is made from its type.
    serves_event(
        &api,
        v2_event(Some(json!({
            "event_type": "customer.subscription.updated",
            "related_object": {"id": SUB, "type": "subscription",
                               "url": format!("https://dashboard.stripe.com/subscriptions/{SUB}")}
        }))),
    )
    .await;
    Mock::given(method("GET"))
        .and(path(format!("/v1/subscriptions/{SUB}")))
        .and(header("Stripe-Version", "2025-03-31.basil"))
        .respond_with(ResponseTemplate::new(200).set_body_json(subscription(SUB)))
        .mount(&api)
        .await;
    let row = deliver(&app).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let account = app.account("stripe", CUSTOMER, &period()).await;
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!(account.plan, "pro");
    let read = app
        .event(app.event_id("stripe", &format!("read:{ID}")).await)
        .await;
    assert_eq!(read.event_type, "customer.subscription.updated");
    assert_eq!(read.status, "applied");
    assert_eq!(api.received_requests().await.unwrap().len(), 2);

    // A replay applies the stored read: nothing is read again.
    let id = app.event_id("stripe", ID).await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[id])
        .await
        .unwrap();
    app.run_worker().await;
    assert_eq!(app.event(id).await.status, "applied");
    assert_eq!(api.received_requests().await.unwrap().len(), 2);
    let line = shared::apply::generation_failure_metric("stripe", chrono::Utc::now());
    assert_eq!(line["EventGenerationFailures"], 1);
    assert_eq!(
        line["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
        json!([["Stack", "Source"]])
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_generation_failure_that_names_no_object_sweeps_the_subscriptions(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    serves_event(&api, v2_event(None)).await;
    let (first, second) = ("sub_1ThinSweep00001", "sub_1ThinSweep00002");
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions"))
        .and(query_param("status", "all"))
        .and(query_param("starting_after", first))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"object": "list", "data": [subscription(second)], "has_more": false}),
        ))
        .with_priority(1)
        .mount(&api)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions"))
        .and(query_param("status", "all"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"object": "list", "data": [subscription(first)], "has_more": true}),
        ))
        .with_priority(2)
        .mount(&api)
        .await;
    let row = deliver(&app).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let reason = row.reason.unwrap();
    assert!(
        reason.contains("swept 2 subscriptions: 2 differ from their registers, 2 stored as reads"),
        "{reason}"
    );
    // Each read is an event of its own, left for the rescue to send; applied, it is the
    // subscription's state.
    for sub in [first, second] {
        let id = app.event_id("stripe", &format!("read:{ID}:{sub}")).await;
        assert_eq!(app.event(id).await.status, "received");
        let applied = process_event(&app.worker, id).await.unwrap();
        assert!(
            matches!(&applied, Processed::Finished { status, .. } if status.as_str() == "applied"),
            "{applied:?}"
        );
    }
    let account = app.account("stripe", CUSTOMER, &period()).await;
    assert_eq!(account.subscriptions.len(), 2);
    assert_eq!(account.plan, "pro");
    assert_eq!(api.received_requests().await.unwrap().len(), 3);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_generation_failure_of_a_type_not_read_is_ignored_with_the_reason(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    serves_event(
        &api,
        v2_event(Some(json!({
            "event_type": "payment_intent.requires_action",
            "related_object": {"id": "pi_1QA8PKDTvO5jCVb3TVDZP75a", "type": "payment_intent",
                               "url": "/v1/payment_intents/pi_1QA8PKDTvO5jCVb3TVDZP75a"}
        }))),
    )
    .await;
    let row = deliver(&app).await;
    assert_eq!(row.status, "ignored");
    assert!(
        row.reason
            .as_deref()
            .unwrap()
            .contains("Stripe failed to generate a payment_intent.requires_action event"),
        "{:?}",
        row.reason
    );
    assert_eq!(
        api.received_requests().await.unwrap().len(),
        1,
        "only the event"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_generation_failure_without_an_api_key_is_unprocessable(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let row = deliver(&app).await;
    assert_eq!(row.status, "unprocessable");
    assert!(
        row.reason.as_deref().unwrap().contains("needs an API key"),
        "{:?}",
        row.reason
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_generation_failure_whose_event_read_fails_is_retried(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    Mock::given(method("GET"))
        .and(path(format!("/v2/core/events/{ID}")))
        .respond_with(ResponseTemplate::new(503))
        .mount(&api)
        .await;
    let (status, _) = app.post("stripe", &stripe_delivery(&notification())).await;
    assert_eq!(status, http::StatusCode::OK);
    let id = app.event_id("stripe", ID).await;
    let first = process_event(&app.worker, id).await.unwrap();
    assert!(
        matches!(&first, Processed::Failed { status, error }
            if status.as_str() == "failed" && error.contains("503")),
        "{first:?}"
    );
}
