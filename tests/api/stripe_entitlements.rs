//! Stripe's entitlement summaries (docs/design.md §6.2, §4.12) through the signed intake and
//! the worker: a complete list is the customer's features; one that says `has_more` is never
//! applied, and its complete list is read from the fake Stripe (`provider_fakes::stripe`), page
//! by page, and stored as an event of its own. The payloads and the pages are the corpus files in
//! `testdata/providers/stripe/entitlements/` (sources in `testdata/providers/README.md`).

use chrono::Utc;
use serde_json::{json, Value};
use shared::domain::features::{FeatureValue, Features};
use shared::handlers::scheduler;
use shared::handlers::worker::{process_event, Processed};
use sqlx::PgPool;
use wiremock::MockServer;

use crate::helpers::*;
use crate::thin::{app_with_api, status_of, StripeApi};
use provider_fakes::stripe::Fault;
use provider_fakes::stripe::On;

const CUSTOMER: &str = "cus_EntCust000001";
const CONNECTED: &str = "acct_1EntConnect0001";
const LIST: &str = "/v1/entitlements/active_entitlements";

/// A file of the corpus directory, by its name without `.json`.
fn file(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/providers/stripe/entitlements")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Three entitlements, the whole list.
fn complete() -> Value {
    file("1-entitlements.active_entitlement_summary.updated")
}

/// Twelve entitlements, of which the event embeds ten and says `has_more`.
fn has_more() -> Value {
    file("2-entitlements.active_entitlement_summary.updated.has_more")
}

/// The thin twin of `has_more()`.
fn thin_summary() -> Value {
    file("3-v1.entitlements.active_entitlement_summary.updated")
}

fn id_of(event: &Value) -> &str {
    event["id"].as_str().unwrap()
}

/// The lookup keys of a list (an embedded one, or a page).
fn keys_of(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["lookup_key"].as_str().unwrap().to_owned())
        .collect()
}

/// The customer's active entitlements as Stripe lists them: the corpus's twelve (its two
/// pages), then a hundred more, so that Stripe's pages of 100 make two.
fn listed() -> Vec<Value> {
    let mut listed = Vec::new();
    for page in 1..=2 {
        let page = file(&format!("objects/active_entitlements.page{page}"));
        listed.extend(page["data"].as_array().unwrap().iter().cloned());
    }
    listed.extend((0..100).map(|n| {
        json!({"id": format!("ent_test_61EntMore{n:03}qW3xRb9mYv2Lp5Nc8Ht4J"),
               "object": "entitlements.active_entitlement",
               "feature": format!("feat_test_61EntMore{n:03}wE8rT5yU1iO9pA3sD7fG4h"),
               "livemode": false, "lookup_key": format!("more-{n:03}")})
    }));
    listed
}

/// Every lookup key the customer's list holds.
fn every_key() -> Vec<String> {
    keys_of(&json!({ "data": listed() }))
}

fn flags(keys: &[String]) -> Features {
    keys.iter()
        .map(|k| (k.clone(), FeatureValue::Flag(true)))
        .collect()
}

/// The fake Stripe lists the customer's active entitlements ([`listed`]), held by the
/// connected account `account` (read as another, Stripe's 404), or the platform.
async fn lists_entitlements(api: &StripeApi, account: Option<&str>) {
    api.fake.entitlements_of(account, CUSTOMER, listed());
}

/// Every list read `api` received was made as the source's reads are: Stripe's largest page,
/// the key, and the API version the reads are written against.
async fn listed_as_the_source(api: &MockServer) {
    for read in requests_to(api, LIST).await {
        assert!(read
            .url
            .query_pairs()
            .any(|(k, v)| k == "limit" && v == "100"));
        assert_eq!(read.headers["Stripe-Version"], "2025-03-31.basil");
        assert_eq!(read.headers["Authorization"], "Bearer sk_test_reads");
    }
}

/// The fake Stripe's clock at the corpus's day: `event`'s time, running on.
fn at_the_corpus_day(api: &StripeApi, event: &Value) {
    let created = chrono::DateTime::from_timestamp(event["created"].as_i64().unwrap(), 0).unwrap();
    api.fake.clock_from(created + chrono::Duration::minutes(10));
}

/// The requests the fake API served at `path`.
async fn requests_to(api: &MockServer, at: &str) -> Vec<wiremock::Request> {
    api.received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.path() == at)
        .collect()
}

async fn deliver(app: &TestApp, event: &Value) {
    let (status, body) = app.post("stripe", &stripe_delivery(event)).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    app.run_worker().await;
}

/// The account as the app reads it (`GET /v1/accounts/…`, the feature check): its one-statement
/// snapshot.
async fn snapshot(app: &TestApp, customer: &str) -> shared::billing::account::AccountSnapshot {
    let mut conn = app.pool.acquire().await.unwrap();
    shared::billing::account::snapshot(
        &mut conn,
        "stripe",
        &shared::domain::CustomerId::parse(customer).unwrap(),
        &shared::domain::Period::parse("2026-01").unwrap(),
        &app.worker.catalog,
    )
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("account {customer} exists"))
}

/// The `billing.features_changed` effects written, their data.
async fn features_changed(app: &TestApp) -> Vec<Value> {
    app.effects()
        .await
        .into_iter()
        .filter(|e| e.kind == "billing.features_changed")
        .map(|e| e.body["data"].clone())
        .collect()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_complete_summary_is_the_customers_features_and_copies_and_late_ones_change_nothing(
    pool: PgPool,
) {
    let (mut app, api) = app_with_api(pool).await;
    app.enable_effects().await;
    let summary = complete();
    for _ in 0..2 {
        deliver(&app, &summary).await;
    }
    let row = status_of(&app, id_of(&summary)).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let keys = keys_of(&summary["data"]["object"]["entitlements"]);
    let account = snapshot(&app, CUSTOMER).await;
    assert_eq!(account.features, flags(&keys));
    // The app's check of one feature, and of one the customer lacks.
    let (allowed, value, origin) = account.feature("audit-log");
    assert_eq!((allowed, value), (true, Some(&FeatureValue::Flag(true))));
    let origin = origin.unwrap();
    assert_eq!(origin.source, "provider");
    let decided_by = origin.decided_by.as_ref().unwrap();
    assert_eq!(
        decided_by.event_id,
        app.event_id("stripe", id_of(&summary)).await
    );
    assert_eq!(
        decided_by.event_type,
        "entitlements.active_entitlement_summary.updated"
    );
    assert_eq!(account.feature("export-csv"), (false, None, None));
    let told = features_changed(&app).await;
    assert_eq!(told.len(), 1, "told once: {told:?}");
    assert_eq!(
        told[0]["added"],
        json!(["audit-log", "priority-support", "sso"])
    );

    // A summary from an hour before (sso alone), arriving late: older than the register's.
    let mut late = complete();
    late["id"] = json!("evt_1Sk9U0En7tL3mQ8vLate0001");
    late["created"] = json!(summary["created"].as_i64().unwrap() - 3600);
    late["data"]["object"]["entitlements"]["data"] =
        json!([summary["data"]["object"]["entitlements"]["data"][0].clone()]);
    deliver(&app, &late).await;
    let row = status_of(&app, id_of(&late)).await;
    assert_eq!(row.status, "ignored");
    assert!(
        row.reason
            .as_deref()
            .unwrap()
            .contains("a newer state of entitlement active_entitlement_summary is already stored"),
        "{:?}",
        row.reason
    );
    assert_eq!(snapshot(&app, CUSTOMER).await.features, flags(&keys));
    assert_eq!(features_changed(&app).await.len(), 1, "nothing more told");
    assert!(
        api.received_requests().await.unwrap().is_empty(),
        "a complete list needs no read"
    );
    assert_eq!(app.audit().await.divergent, []);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_later_summary_replaces_the_set_and_tells_what_moved(pool: PgPool) {
    let (mut app, _api) = app_with_api(pool).await;
    app.enable_effects().await;
    deliver(&app, &complete()).await;
    // An hour later: audit-log is gone, export-csv came.
    let mut later = complete();
    later["id"] = json!("evt_1Sk9Z0En7tL3mQ8vLater001");
    later["created"] = json!(complete()["created"].as_i64().unwrap() + 3600);
    let list = &mut later["data"]["object"]["entitlements"]["data"];
    list[1]["lookup_key"] = json!("export-csv");
    // `previous_attributes` as Stripe may send it, or not at all: never read.
    later["data"]
        .as_object_mut()
        .unwrap()
        .remove("previous_attributes");
    deliver(&app, &later).await;
    let keys = ["export-csv", "priority-support", "sso"].map(String::from);
    assert_eq!(snapshot(&app, CUSTOMER).await.features, flags(&keys));
    let told = features_changed(&app).await;
    assert_eq!(told.len(), 2, "{told:?}");
    assert_eq!(told[1]["added"], json!(["export-csv"]));
    assert_eq!(told[1]["removed"], json!(["audit-log"]));
}

/// Stripe embeds ten of the twelve and says `has_more`. The ten are never applied: the worker
/// reads the whole list (two pages from the fake API, as the connected account), stores it as
/// `read:<event id>` and applies that, and the account has all twelve.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_summary_that_says_has_more_is_applied_as_its_complete_list_read_as_its_account(
    pool: PgPool,
) {
    let (mut app, api) = app_with_api(pool).await;
    app.enable_effects().await;
    lists_entitlements(&api, Some(CONNECTED)).await;
    let mut summary = has_more();
    summary["account"] = json!(CONNECTED);
    let embedded = &summary["data"]["object"]["entitlements"];
    assert_eq!(
        (
            embedded["data"].as_array().unwrap().len(),
            &embedded["has_more"]
        ),
        (10, &json!(true))
    );
    deliver(&app, &summary).await;

    let row = status_of(&app, id_of(&summary)).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let reads = requests_to(&api, LIST).await;
    assert_eq!(reads.len(), 2, "two pages");
    listed_as_the_source(&api).await;
    for read in &reads {
        assert_eq!(read.headers["Stripe-Account"].to_str().unwrap(), CONNECTED);
        assert_eq!(
            read.headers["Stripe-Request-Trigger"].to_str().unwrap(),
            format!("event={}", id_of(&summary))
        );
    }
    // The read is an event of its own: the summary again, whole, at the summary's time.
    let read = status_of(&app, &format!("read:{}", id_of(&summary))).await;
    assert_eq!(read.status, "applied", "{:?}", read.reason);
    assert_eq!(
        read.event_type,
        "entitlements.active_entitlement_summary.updated"
    );
    let customer = format!("{CONNECTED}/{CUSTOMER}");
    assert_eq!(read.customer_key.as_deref(), Some(customer.as_str()));
    assert_eq!(
        read.occurred_at.map(|t| t.timestamp()),
        summary["created"].as_i64()
    );
    let stored = read.payload.unwrap();
    assert_eq!(stored["summary_event"], id_of(&summary));
    assert_eq!(stored["data"]["object"]["entitlements"]["has_more"], false);
    assert_eq!(
        keys_of(&stored["data"]["object"]["entitlements"]),
        every_key()
    );

    let account = snapshot(&app, &customer).await;
    assert_eq!(account.features, flags(&every_key()));
    assert!(account.features.len() > 10);
    assert!(
        account.feature("data-retention-1y").0,
        "one of the two past the ten"
    );
    let told = features_changed(&app).await;
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(
        told[0]["added"].as_array().unwrap().len(),
        every_key().len()
    );

    // A copy, and a replay: the read is found by its key, nothing is read again or told.
    deliver(&app, &summary).await;
    let id = app.event_id("stripe", id_of(&summary)).await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[id])
        .await
        .unwrap();
    app.run_worker().await;
    assert_eq!(app.event(id).await.status, "applied");
    assert_eq!(requests_to(&api, LIST).await.len(), 2, "read once");
    assert_eq!(features_changed(&app).await.len(), 1);
    assert_eq!(
        snapshot(&app, &customer).await.features,
        flags(&every_key())
    );
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
            .await,
        1
    );
    // The fold takes the read as the event (the summary it was made for carries nothing).
    assert_eq!(app.audit().await.divergent, []);
    let why = app.why("stripe", &customer, Cut::default()).await;
    let register = why
        .fields
        .iter()
        .find(|f| f.field == "entitlement:active_entitlement_summary")
        .unwrap();
    let by = register.decided_by.as_ref().unwrap();
    assert_eq!(by.via, shared::billing::fold::Via::Fetch);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_summarys_list_read_that_fails_is_retried_then_dead_with_its_reason_and_alert(
    pool: PgPool,
) {
    let (app, api) = app_with_api(pool).await;
    lists_entitlements(&api, None).await;
    api.fake.read_fails(
        On::Path(LIST.into()),
        Fault::Fails(
            500,
            json!({"error": {"type": "api_error", "message": "An unknown error occurred"}}),
        ),
        usize::MAX,
    );
    let summary = has_more();
    let (status, _) = app.post("stripe", &stripe_delivery(&summary)).await;
    assert_eq!(status, http::StatusCode::OK);
    let id = app.event_id("stripe", id_of(&summary)).await;

    // The test worker's retries are due at once; the sixth failed attempt is the last.
    for attempt in 1..=6 {
        let processed = process_event(&app.worker, id).await.unwrap();
        let expected = if attempt < 6 { "failed" } else { "dead" };
        assert!(
            matches!(&processed, Processed::Failed { status, error }
                if status.as_str() == expected && error.contains("500") && error.contains(LIST)),
            "attempt {attempt}: {processed:?}"
        );
    }
    let (status, last_error): (String, Option<String>) =
        sqlx::query_as("SELECT status, last_error FROM inbox_events WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(status, "dead");
    let last_error = last_error.unwrap();
    assert!(
        last_error.contains(&format!("GET {LIST} answered 500")),
        "{last_error}"
    );
    assert_eq!(
        requests_to(&api, LIST).await.len(),
        6,
        "one read per attempt"
    );
    // The ten embedded entitlements were never applied, nor anything read.
    assert_eq!(app.count("SELECT count(*) FROM entitlements").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
            .await,
        0
    );
    let report = scheduler::run(&crate::scheduler::scheduler_for(&app, vec![])).await;
    assert_eq!(report.alerts.dead, [id]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_summary_with_has_more_on_a_source_without_an_api_key_is_unprocessable(pool: PgPool) {
    // The test worker's sources have no API key.
    let app = TestApp::spawn(pool).await;
    let summary = has_more();
    deliver(&app, &summary).await;
    let row = status_of(&app, id_of(&summary)).await;
    assert_eq!(row.status, "unprocessable");
    let reason = row.reason.unwrap();
    assert!(
        reason.contains("source 'stripe' needs an API key (api_key or api_key_secret_id)")
            && reason.contains(&format!("{LIST}?customer={CUSTOMER}")),
        "{reason}"
    );
    assert_eq!(app.count("SELECT count(*) FROM entitlements").await, 0);
}

/// The thin twin names no related object: its first read is the snapshot event it names (for
/// the customer), then the list; the snapshot twin arriving after it reads the list for
/// itself and changes nothing.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_summary_reads_its_snapshot_event_then_the_complete_list(pool: PgPool) {
    let (mut app, api) = app_with_api(pool).await;
    app.enable_effects().await;
    lists_entitlements(&api, None).await;
    let twin = has_more();
    let thin = thin_summary();
    assert_eq!(thin["snapshot_event"], twin["id"], "the corpus pairs them");
    // Stripe keeps an event 30 days: the corpus's day, not today's.
    at_the_corpus_day(&api, &twin);
    api.fake.has_event(twin.clone());
    deliver(&app, &thin).await;
    let row = status_of(&app, id_of(&thin)).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let twin_reads = requests_to(&api, &format!("/v1/events/{}", id_of(&twin))).await;
    assert_eq!(twin_reads.len(), 1);
    assert_eq!(
        twin_reads[0].headers["Stripe-Request-Trigger"],
        format!("event={}", id_of(&thin)).as_str()
    );
    assert_eq!(requests_to(&api, LIST).await.len(), 2);
    let read = status_of(&app, &format!("read:{}", id_of(&thin))).await;
    assert_eq!(read.customer_key.as_deref(), Some(CUSTOMER));
    assert_eq!(read.payload.unwrap()["thin_event"], id_of(&thin));
    assert_eq!(snapshot(&app, CUSTOMER).await.features, flags(&every_key()));

    deliver(&app, &twin).await;
    let twin_row = status_of(&app, id_of(&twin)).await;
    assert!(
        ["applied", "ignored"].contains(&twin_row.status.as_str()),
        "{twin_row:?}"
    );
    assert_eq!(snapshot(&app, CUSTOMER).await.features, flags(&every_key()));
    assert_eq!(features_changed(&app).await.len(), 1, "told once");
    assert_eq!(app.audit().await.divergent, []);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_summary_after_its_snapshot_twin_reads_nothing(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    lists_entitlements(&api, None).await;
    let twin = has_more();
    deliver(&app, &twin).await;
    assert_eq!(requests_to(&api, LIST).await.len(), 2);
    let thin = thin_summary();
    deliver(&app, &thin).await;
    let row = status_of(&app, id_of(&thin)).await;
    assert_eq!(row.status, "ignored");
    let reason = row.reason.unwrap();
    assert!(
        reason.starts_with(&format!("its snapshot event {} (event ", id_of(&twin))),
        "{reason}"
    );
    assert_eq!(requests_to(&api, LIST).await.len(), 2, "nothing more read");
    assert!(requests_to(&api, &format!("/v1/events/{}", id_of(&twin)))
        .await
        .is_empty());
}

/// A summary the webhooks missed is listed by the events walk (its type is among the
/// `types[]` it asks for), stored, and its complete list read and applied like a delivered
/// one's.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_missed_summary_is_found_by_the_events_walk_and_its_list_read(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let mut missed = has_more();
    // Inside the walk's first window (from three days back to the lag before now).
    missed["created"] = json!(Utc::now().timestamp() - 3600);
    missed["pending_webhooks"] = json!(0);
    let server = StripeApi::start().await;
    server.fake.has_event(missed.clone());
    crate::traffic::with_stripe_api(&mut app.worker, &server);
    lists_entitlements(&server, None).await;
    let scheduler =
        crate::scheduler::scheduler_for(&app, vec![crate::scheduler::stripe_reconciler(&server)]);
    let report = scheduler::run(&scheduler).await.reconciliation[0].clone();
    assert_eq!(
        (report.stored_new, report.discrepancies),
        (1, 1),
        "{report:?}"
    );
    app.run_worker().await;
    let row = status_of(&app, id_of(&missed)).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    assert_eq!(snapshot(&app, CUSTOMER).await.features, flags(&every_key()));
}

/// What `inboxctl send stripe entitlements` sends (its payload and signature, as the dev
/// source signs them) is a summary the intake takes and the worker applies.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_dev_kind_entitlements_is_a_summary_the_pipeline_applies(pool: PgPool) {
    use shared::providers::fixtures::{self, Spec};
    let app = TestApp::spawn(pool).await;
    let spec = Spec {
        kind: "entitlements".into(),
        customer: "cus_send".into(),
        at: Utc::now(),
        ..Default::default()
    };
    let (id, payload) = fixtures::payload(shared::domain::SourceKind::Stripe, &spec).unwrap();
    let source = test_sources("http://127.0.0.1:9/unused")
        .into_iter()
        .find(|s| s.name == "stripe")
        .unwrap();
    let signed = fixtures::sign_delivery(&source, &id, &payload, None).unwrap();
    let delivery = Delivery {
        headers: signed.headers,
        body: signed.body,
    };
    let (status, body) = app.post("stripe", &delivery).await;
    assert_eq!(
        (status, &body["status"]),
        (http::StatusCode::OK, &json!("stored"))
    );
    app.run_worker().await;
    assert_eq!(status_of(&app, &id).await.status, "applied");
    let keys: Vec<String> = shared::providers::stripe::fixtures::DEV_LOOKUP_KEYS
        .iter()
        .map(|k| (*k).to_owned())
        .collect();
    let account = app
        .account(
            "stripe",
            "cus_send",
            &Utc::now().format("%Y-%m").to_string(),
        )
        .await;
    assert_eq!(account.features, flags(&keys));
}

/// After the retention the purge keeps the summary (the entitlement register names it) and
/// the read made for it (kept as long as its event): the audit still holds, and a replay
/// applies what was read without reading again.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_purge_keeps_a_summary_and_its_read_so_a_replay_reads_nothing(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    lists_entitlements(&api, None).await;
    let summary = has_more();
    deliver(&app, &summary).await;
    sqlx::query("UPDATE inbox_events SET received_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    let retention = std::time::Duration::from_secs(30 * 86_400);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    shared::inbox::purge::purge(&app.pool, retention, deadline)
        .await
        .unwrap();
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events").await,
        2,
        "the summary and its read"
    );
    assert_eq!(app.audit().await.divergent, []);
    api.reset().await;
    let id = app.event_id("stripe", id_of(&summary)).await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[id])
        .await
        .unwrap();
    app.run_worker().await;
    assert_eq!(app.event(id).await.status, "applied");
    assert!(api.received_requests().await.unwrap().is_empty());
    assert_eq!(snapshot(&app, CUSTOMER).await.features, flags(&every_key()));
}

/// Stripe answers a list of a customer it does not have with 404 and its error body (the
/// Errors reference, https://docs.stripe.com/api/errors: "404 Not Found — The requested
/// resource doesn't exist", `{"error": {"type", "code", "message", "param", "doc_url"}}`; the
/// code `resource_missing`, https://docs.stripe.com/error-codes#resource-missing). A key of the
/// other mode or of another account gets the same answer for a customer that does exist, so a
/// 404 says nothing of the customer's features: the summary is unprocessable with its reason,
/// alerted once, and the features stay as they were.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_summary_whose_list_stripe_does_not_find_is_unprocessable_alerted_once_and_changes_nothing(
    pool: PgPool,
) {
    let (app, api) = app_with_api(pool).await;
    let before = complete();
    deliver(&app, &before).await;
    let keys = keys_of(&before["data"]["object"]["entitlements"]);
    assert_eq!(snapshot(&app, CUSTOMER).await.features, flags(&keys));
    api.fake.read_fails(
        On::Path(LIST.into()),
        Fault::Fails(
            404,
            json!({"error": {
                "code": "resource_missing",
                "doc_url": "https://stripe.com/docs/error-codes/resource-missing",
                "message": format!("No such customer: '{CUSTOMER}'"),
                "param": "customer",
                "type": "invalid_request_error"}}),
        ),
        usize::MAX,
    );
    // A day later, the twelve (ten embedded, has_more): the list is read, and not found.
    let mut summary = has_more();
    summary["created"] = json!(before["created"].as_i64().unwrap() + 86_400);
    deliver(&app, &summary).await;
    let row = status_of(&app, id_of(&summary)).await;
    assert_eq!(row.status, "unprocessable", "{:?}", row.reason);
    let reason = row.reason.unwrap();
    assert!(
        reason.contains(&format!("GET {LIST}?customer={CUSTOMER} answered 404"))
            && reason.contains("the features stay as they were"),
        "{reason}"
    );
    assert_eq!(
        requests_to(&api, LIST).await.len(),
        1,
        "decided, not retried"
    );
    assert_eq!(
        snapshot(&app, CUSTOMER).await.features,
        flags(&keys),
        "the features stay as they were"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
            .await,
        0
    );
    // Alerted once, as every unprocessable event is.
    let id = app.event_id("stripe", id_of(&summary)).await;
    let report = scheduler::run(&crate::scheduler::scheduler_for(&app, vec![])).await;
    assert_eq!(report.alerts.unprocessable, [id]);
    let again = scheduler::run(&crate::scheduler::scheduler_for(&app, vec![])).await;
    assert!(again.alerts.unprocessable.is_empty(), "{:?}", again.alerts);
    assert_eq!(app.audit().await.divergent, []);
}

/// Two summaries of one customer in the same second (Stripe's `created` has one-second
/// resolution; its event ids are random): the first says `sso`, the later one `sso` and
/// `audit-log`, and their ids sort the other way. The second to arrive finds the register
/// holding the other at the same second: the worker reads the customer's list, as Stripe shows
/// it, stores it as `read:<its id>` at its time and applies that in its place. In both orders
/// the features are Stripe's list, the fold agrees, and a replay reads nothing again.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn two_summaries_of_one_second_end_as_stripes_list_in_both_orders(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    let entitlement = |n: u32, key: &str| {
        json!({"id": format!("ent_test_61TieEnt{n:02}K7qW3xRb9mYv2Lp5Nc8Ht4Jdx"),
               "object": "entitlements.active_entitlement",
               "feature": format!("feat_test_61TieFeat{n:02}Q2wE8rT5yU1iO9pA3sD7fG4h"),
               "livemode": false, "lookup_key": key})
    };
    let newest = [entitlement(1, "sso"), entitlement(2, "audit-log")];
    // Stripe's list now: the later summary's set.
    for n in 0..2 {
        api.fake
            .entitlements_of(None, &format!("cus_EntTie{n:06}"), newest.to_vec());
    }
    let created = complete()["created"].as_i64().unwrap();
    let summary = |customer: &str, id: &str, listed: &[Value]| {
        let mut event = complete();
        event["id"] = json!(id);
        event["created"] = json!(created);
        event["data"]["object"]["customer"] = json!(customer);
        event["data"]["object"]["entitlements"]["data"] = json!(listed);
        event
    };
    let stripes = flags(&["audit-log", "sso"].map(String::from));
    for (n, earlier_first) in [(0, true), (1, false)] {
        let customer = format!("cus_EntTie{n:06}");
        // The earlier change's id sorts last, the later one's first: the ids say the wrong way.
        let earlier = summary(&customer, &format!("evt_1TieZz{n}Earlier"), &newest[..1]);
        let later = summary(&customer, &format!("evt_1TieAa{n}Later"), &newest);
        assert!(id_of(&later) < id_of(&earlier));
        let (first, second) = match earlier_first {
            true => (&earlier, &later),
            false => (&later, &earlier),
        };
        let reads = requests_to(&api, LIST).await.len();
        deliver(&app, first).await;
        deliver(&app, second).await;
        let order = format!("{} then {}", id_of(first), id_of(second));
        assert_eq!(
            snapshot(&app, &customer).await.features,
            stripes,
            "{order}: Stripe's list"
        );
        for event in [first, second] {
            let row = status_of(&app, id_of(event)).await;
            assert!(
                ["applied", "ignored"].contains(&row.status.as_str()),
                "{order}: {row:?}"
            );
        }
        assert_eq!(
            requests_to(&api, LIST).await.len(),
            reads + 1,
            "{order}: one read, by the second"
        );
        let read = status_of(&app, &format!("read:{}", id_of(second))).await;
        assert_eq!(read.status, "applied", "{order}: {:?}", read.reason);
        assert_eq!(read.occurred_at.map(|t| t.timestamp()), Some(created));
        let stored = read.payload.unwrap();
        assert_eq!(stored["summary_event"], id_of(second));
        assert!(stored["read_at"].is_string(), "{stored}");
        // A replay of each applies what was stored: nothing is read again, nothing moves.
        let ids = [
            app.event_id("stripe", id_of(first)).await,
            app.event_id("stripe", id_of(second)).await,
        ];
        shared::inbox::replay::replay(&app.pool, &app.state.queue, &ids)
            .await
            .unwrap();
        app.run_worker().await;
        assert_eq!(requests_to(&api, LIST).await.len(), reads + 1, "{order}");
        assert_eq!(snapshot(&app, &customer).await.features, stripes, "{order}");
    }
    assert_eq!(app.audit().await.divergent, []);
}

/// The audit compares a summary register whatever event holds it: here the thin summary,
/// under whose id its read was applied (the thin event names no customer). Moved by hand after
/// the account was found clean and its point kept, the register is named.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_summary_register_a_thin_summary_holds_is_audited_from_the_accounts_point(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    lists_entitlements(&api, None).await;
    let twin = has_more();
    let thin = thin_summary();
    at_the_corpus_day(&api, &twin);
    api.fake.has_event(twin.clone());
    deliver(&app, &thin).await;
    assert_eq!(status_of(&app, id_of(&thin)).await.status, "applied");
    let holder: i64 = sqlx::query_scalar("SELECT event_id FROM entitlements")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(holder, app.event_id("stripe", id_of(&thin)).await);
    assert_eq!(app.audit().await.divergent, []);
    assert_eq!(
        app.count("SELECT count(*) FROM audit_points WHERE state IS NOT NULL")
            .await,
        1,
        "the account keeps a point"
    );
    for change in [r#"features = '{"sso": true}'"#, "active = false"] {
        let whole = sqlx::query_scalar::<_, Value>("SELECT features FROM entitlements")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        sqlx::query(&format!("UPDATE entitlements SET {change}"))
            .execute(&app.pool)
            .await
            .unwrap();
        let found: Vec<String> = app
            .audit()
            .await
            .divergent
            .iter()
            .map(|d| format!("{}/{}", d.customer_id, d.field))
            .collect();
        assert_eq!(
            found,
            [format!("{CUSTOMER}/entitlement:active_entitlement_summary")],
            "{change}"
        );
        sqlx::query("UPDATE entitlements SET active = true, features = $1")
            .bind(whole)
            .execute(&app.pool)
            .await
            .unwrap();
        assert_eq!(app.audit().await.divergent, [], "{change} undone");
    }
}

/// Three summaries of one customer — `sso` alone, then the first three, then all twelve (the
/// event embedding ten and saying `has_more`) — delivered in each of the six orders, the
/// second one twice: every order ends in the latest set, and the fold agrees.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn summaries_in_every_order_end_in_the_latest_set(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    // Each customer's list: the corpus's twelve and a hundred more, in two pages.
    for n in 0..6 {
        api.fake
            .entitlements_of(None, &format!("cus_EntOrder{n:05}"), listed());
    }
    let base = complete()["created"].as_i64().unwrap();
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for (n, order) in orders.iter().enumerate() {
        let customer = format!("cus_EntOrder{n:05}");
        let summaries: Vec<Value> = (0..3)
            .map(|step| {
                let mut event = if step == 2 { has_more() } else { complete() };
                event["id"] = json!(format!("evt_1EntOrder{n}Step{step}"));
                event["created"] = json!(base + 3600 * step as i64);
                event["data"]["object"]["customer"] = json!(customer);
                if step == 0 {
                    let first = event["data"]["object"]["entitlements"]["data"][0].clone();
                    event["data"]["object"]["entitlements"]["data"] = json!([first]);
                }
                event
            })
            .collect();
        for &step in order {
            deliver(&app, &summaries[step]).await;
            if step == 1 {
                deliver(&app, &summaries[step]).await;
            }
        }
        assert_eq!(
            snapshot(&app, &customer).await.features,
            flags(&every_key()),
            "order {order:?}"
        );
    }
    assert_eq!(app.audit().await.divergent, []);
}
