//! `v2.core.health.event_generation_failure.resolved` (docs/design.md §6.2): Stripe's word that
//! it failed to generate events. The notification is a thin event without `data` (stripe-node's
//! `V2CoreHealthEventGenerationFailureResolvedEventNotification`); its `data` is read from
//! `GET /v2/core/events/{id}` (`alert_id`, `grouping_key`, `impact {context?, event_type,
//! related_object {id, type, url}}`, `resolved_at`, `summary`: stripe-node's
//! `V2CoreHealthEventGenerationFailureResolvedEvent.Data`, and the example in Stripe's guide
//! "Handle irrecoverable webhook events", whose `related_object.url` is a Dashboard URL). The
//! Stripe API is the fake Stripe (`provider_fakes::stripe`).

use serde_json::{json, Value};
use shared::handlers::worker::{process_event, Processed};
use sqlx::PgPool;

use crate::corpus::CORPUS_PLANS;
use crate::helpers::*;
use crate::thin::StripeApi;
use crate::traffic::with_stripe_api;
use provider_fakes::stripe::Fault;
use provider_fakes::stripe::On;

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

async fn app_with_api(pool: PgPool) -> (TestApp, StripeApi) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(CORPUS_PLANS).unwrap();
    let api = StripeApi::start().await;
    with_stripe_api(&mut app.worker, &api);
    (app, api)
}

async fn serves_event(api: &StripeApi, event: Value) {
    api.fake.has_v2_event(event);
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
    api.fake.holds(subscription(SUB));
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
    // Two pages of Stripe's 100: the customer's two subscriptions after 100 of others.
    let (first, second) = ("sub_1ThinSweep00001", "sub_1ThinSweep00002");
    let base = subscription(SUB);
    for n in 0..100 {
        api.fake.holds(nth_subscription(&base, n));
    }
    api.fake
        .holds(subscription(first))
        .holds(subscription(second));
    let row = deliver(&app).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let reason = row.reason.unwrap();
    assert!(
        reason.contains(
            "swept 102 subscriptions in 2 pages: 102 differ from their registers, 102 stored as reads"
        ),
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
    serves_event(&api, v2_event(None)).await;
    api.fake.read_fails(
        On::Path(format!("/v2/core/events/{ID}")),
        Fault::Fails(
            503,
            json!({"error": {"type": "api_error", "message": "Service unavailable"}}),
        ),
        usize::MAX,
    );
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

/// The fixture subscription as `n`th of a large account: its own id and customer.
fn nth_subscription(base: &Value, n: usize) -> Value {
    let mut object = base.clone();
    object["id"] = json!(format!("sub_1Sweep{n:06}"));
    object["customer"] = json!(format!("cus_Sweep{n:06}"));
    object
}

/// The account holds `total` subscriptions, listed in the order of `n` (newest first: the
/// first made last), and answers `GET /v1/subscriptions` each time `delay` late (a slow API,
/// never more than Stripe's 25 requests a second of a sandbox).
fn slow_subscriptions(api: &StripeApi, total: usize, delay: std::time::Duration) {
    let base = subscription(SUB);
    for n in 0..total {
        let mut object = nth_subscription(&base, n);
        object["created"] = json!(1_764_547_200 - n as i64);
        api.fake.holds(object);
    }
    api.fake.read_fails(
        On::Path("/v1/subscriptions".into()),
        Fault::Slow(delay),
        usize::MAX,
    );
}

/// A sweep larger than one attempt's budget (5,000 subscriptions, 50 pages, through an API
/// that answers each page late) keeps its place between attempts: each attempt reads what
/// its budget allows and gives the notice back, not counted against it, and the next goes on
/// from the page after; the notice never goes dead, and every page is read once.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_sweep_longer_than_its_budget_goes_on_from_its_place_until_every_subscription_is_read(
    pool: PgPool,
) {
    let (mut app, api) = app_with_api(pool).await;
    // Small, so that the sweep takes several attempts and the test a few seconds.
    app.worker.sweep_budget = std::time::Duration::from_millis(150);
    serves_event(&api, v2_event(None)).await;
    slow_subscriptions(&api, 5_000, std::time::Duration::from_millis(50));
    // Most registers show what the provider lists; every 50th subscription has none, and
    // every 50th another status, written after the notice. Every one is stored as a read,
    // whatever its register holds (what is stored does not depend on the events' order).
    sqlx::query("INSERT INTO accounts (source, customer_id) VALUES ('stripe', 'cus_SweepKnown')")
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO subscriptions (source, subscription_id, customer_id, status, plan_key, plan,
                                    version_at, version_key, event_id, current_period_end)
         SELECT 'stripe', 'sub_1Sweep' || lpad(n::text, 6, '0'), 'cus_SweepKnown',
                CASE WHEN n % 50 = 25 THEN 'past_due' ELSE 'active' END,
                'price_1ProMonthlyBas01', 'pro',
                CASE WHEN n % 50 = 25 THEN timestamptz '2026-10-01T13:00:00Z'
                     ELSE timestamptz '2026-09-01T00:00:00Z' END,
                'evt_seed', 0, to_timestamp(1767225600)
         FROM generate_series(0, 4999) AS n WHERE n % 50 <> 0",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let (status, body) = app.post("stripe", &stripe_delivery(&notification())).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    let id = app.event_id("stripe", ID).await;

    // The first attempt as the queue hands it over: its message is acknowledged, and the
    // notice waits unmarked for the rescue, which sends it at its next run.
    let response = shared::handlers::worker::handle_batch(&app.worker, sqs_batch(&[id])).await;
    assert!(response.batch_item_failures.is_empty());
    let row = app.event(id).await;
    assert_eq!(row.status, "received", "{:?}", row.reason);
    assert_eq!(row.enqueued_at, None);
    let mut attempts = 1;
    let reason = loop {
        attempts += 1;
        assert!(attempts <= 500, "the sweep ends");
        match process_event(&app.worker, id).await.unwrap() {
            Processed::Unfinished { progress } => {
                let row = app.event(id).await;
                assert_eq!(row.status, "received", "given back to be continued");
                assert_eq!(row.reason.as_deref(), Some(progress.as_str()));
                let counted: i32 =
                    sqlx::query_scalar("SELECT attempts FROM inbox_events WHERE id = $1")
                        .bind(id)
                        .fetch_one(&app.pool)
                        .await
                        .unwrap();
                assert_eq!(counted, 0, "an attempt that moved the sweep is not counted");
            }
            Processed::Finished { status, reason } => {
                assert_eq!(status.as_str(), "applied", "{reason}");
                break reason;
            }
            other => panic!("attempt {attempts}: {other:?}"),
        }
    };
    assert!(attempts > 2, "the sweep took several attempts ({attempts})");
    assert!(
        reason.contains("swept 5000 subscriptions in 50 pages: 200 differ from their registers, 5000 stored as reads"),
        "{reason}"
    );
    // Every page read once, each from where the one before ended; the event once.
    let requests = api.received_requests().await.unwrap();
    let pages: Vec<Option<String>> = requests
        .iter()
        .filter(|r| r.url.path() == "/v1/subscriptions")
        .map(|r| {
            r.url
                .query_pairs()
                .find(|(k, _)| k == "starting_after")
                .map(|(_, v)| v.into_owned())
        })
        .collect();
    let expected: Vec<Option<String>> = std::iter::once(None)
        .chain((1..50).map(|p| Some(format!("sub_1Sweep{:06}", p * 100 - 1))))
        .collect();
    assert_eq!(pages, expected);
    assert_eq!(
        requests.len(),
        51,
        "the pages and the notice's event, each once"
    );
    let reads: Vec<String> = sqlx::query_scalar(
        "SELECT dedupe_key FROM inbox_events WHERE dedupe_key LIKE $1 AND status = 'received'
         ORDER BY dedupe_key",
    )
    .bind(format!("read:{ID}:sub_1Sweep%"))
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let listed: Vec<String> = (0..5_000)
        .map(|n| format!("read:{ID}:sub_1Sweep{n:06}"))
        .collect();
    assert_eq!(reads, listed, "a read of each subscription listed, once");
}

/// The first instant of the month `now` is in.
fn month_start(now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    use chrono::{Datelike, TimeZone};
    chrono::Utc
        .with_ymd_and_hms(now.year(), now.month(), 1, 0, 0, 0)
        .unwrap()
}

/// A swept subscription's read stands for the notice it was made for: a notice sent 2 s
/// before a month began, swept after, grants in the notice's month, not in the month the
/// read was made, so the ledger does not depend on when the sweep ran.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_sweeps_read_takes_the_notices_time_and_month_across_a_month_boundary(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    let start = month_start(chrono::Utc::now());
    let sent = start - chrono::Duration::seconds(2);
    let mut notice = notification();
    notice["created"] = json!(sent.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    let mut event = v2_event(None);
    event["created"] = notice["created"].clone();
    serves_event(&api, event).await;
    api.fake.holds(subscription(SUB));
    let (status, body) = app.post("stripe", &stripe_delivery(&notice)).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    app.run_worker().await;
    let read_id = app.event_id("stripe", &format!("read:{ID}:{SUB}")).await;
    assert_eq!(app.event(read_id).await.occurred_at, Some(sent));
    let applied = process_event(&app.worker, read_id).await.unwrap();
    assert!(
        matches!(&applied, Processed::Finished { status, .. } if status.as_str() == "applied"),
        "{applied:?}"
    );
    let ledger: Vec<(String, i64)> = sqlx::query_as(
        "SELECT period, allowance FROM ledger WHERE source = 'stripe' AND customer_id = $1 ORDER BY period",
    )
    .bind(CUSTOMER)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(ledger, vec![(sent.format("%Y-%m").to_string(), 500)]);
}

/// A sweep's reads are events nothing sends at once: stored unmarked, so that the rescue's
/// rule for rows never enqueued sends them a minute later. Left marked, they said a message
/// was on its way and waited for the 5-minute rule.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_sweeps_reads_are_left_unmarked_for_the_rescue_to_send_a_minute_later(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    serves_event(&api, v2_event(None)).await;
    api.fake.holds(subscription(SUB));
    let row = deliver(&app).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let read_id = app.event_id("stripe", &format!("read:{ID}:{SUB}")).await;
    let read = app.event(read_id).await;
    assert_eq!(read.status, "received");
    assert_eq!(read.enqueued_at, None, "no message is on its way");
    // A minute and a half later, the rescue's next run sends it.
    sqlx::query("UPDATE inbox_events SET received_at = received_at - interval '90 seconds'")
        .execute(&app.pool)
        .await
        .unwrap();
    let rescued = shared::inbox::rescue::mark_lost(&app.pool).await.unwrap();
    assert_eq!(rescued, vec![read_id]);
}

/// The reads a sweep stored, applied as the rescue's send would bring them.
async fn apply_swept_reads(app: &TestApp) {
    let reads: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM inbox_events WHERE dedupe_key LIKE 'read:%' AND status = 'received'
         ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    for id in reads {
        let applied = process_event(&app.worker, id).await.unwrap();
        assert!(
            matches!(&applied, Processed::Finished { .. }),
            "{applied:?}"
        );
    }
}

/// A change of the subscription at 23:59:00 on October 31 (a snapshot event) and a notice
/// that names no object at 00:00:30 on November 1, whose sweep lists the subscription as the
/// change left it, delivered and applied in the order asked: the account's ledger by period,
/// its subscription's status and plan, and what the audit finds.
async fn change_and_notice_across_a_month(
    pool: PgPool,
    change_first: bool,
) -> (Vec<(String, i64)>, (String, String), usize) {
    let (app, api) = app_with_api(pool).await;
    let sent = "2026-11-01T00:00:30.000Z";
    let mut notice = notification();
    notice["created"] = json!(sent);
    let mut event = v2_event(None);
    event["created"] = json!(sent);
    serves_event(&api, event).await;
    api.fake.holds(subscription(SUB));
    let changed_at = chrono::DateTime::parse_from_rfc3339("2026-10-31T23:59:00Z").unwrap();
    let change = json!({
        "id": "evt_1ChangeBeforeNov0001", "object": "event", "api_version": "2025-03-31.basil",
        "created": changed_at.timestamp(), "livemode": false, "pending_webhooks": 1,
        "type": "customer.subscription.updated", "data": {"object": subscription(SUB)}
    });
    let deliveries = match change_first {
        true => [change, notice],
        false => [notice, change],
    };
    for delivery in &deliveries {
        let (status, body) = app.post("stripe", &stripe_delivery(delivery)).await;
        assert_eq!(status, http::StatusCode::OK, "{body}");
        app.run_worker().await;
        apply_swept_reads(&app).await;
    }
    let ledger: Vec<(String, i64)> = sqlx::query_as(
        "SELECT period, sum(delta)::bigint FROM ledger WHERE customer_id = $1
         GROUP BY period ORDER BY period",
    )
    .bind(CUSTOMER)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let account = app.account("stripe", CUSTOMER, "2026-11").await;
    let subscription = (
        account.subscriptions[0].status.clone(),
        account.plan.clone(),
    );
    (ledger, subscription, app.audit().await.divergent.len())
}

/// Regression: a sweep stored a subscription's read only where its register did not show what
/// Stripe lists, so what was stored depended on whether the subscription's own change came
/// first. The change at 23:59:00 on October 31 first, the sweep found the register matching
/// and stored nothing: `[(2026-10, 500)]`; the notice first, it stored the read, which granted
/// November at the notice's time: `[(2026-10, 500), (2026-11, 500)]`. Every listed
/// subscription is stored, so both orders store the same reads and end the same.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_change_before_the_month_began_then_a_sweep_after_it_store_what_the_other_order_does(
    pool: PgPool,
) {
    let ended = change_and_notice_across_a_month(pool, true).await;
    assert_eq!(
        ended,
        (
            vec![("2026-10".to_owned(), 500), ("2026-11".to_owned(), 500)],
            ("active".to_owned(), "pro".to_owned()),
            0
        )
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_sweep_after_the_month_began_then_the_change_before_it_store_what_the_other_order_does(
    pool: PgPool,
) {
    let ended = change_and_notice_across_a_month(pool, false).await;
    assert_eq!(
        ended,
        (
            vec![("2026-10".to_owned(), 500), ("2026-11".to_owned(), 500)],
            ("active".to_owned(), "pro".to_owned()),
            0
        )
    );
}
