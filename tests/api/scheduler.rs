//! The scheduler: rescue, alerts, reconciliation against a provider API (wiremock), purge,
//! metrics and replay.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{json, Value};
use shared::handlers::scheduler::{self, SchedulerState};
use shared::inbox::{purge::purge, replay::replay, rescue::rescue};
use shared::platform::config::parse_sources;
use shared::platform::queue::Queue;
use shared::reconcile::Reconciler;
use sqlx::PgPool;
use wiremock::MockServer;

use crate::helpers::*;
use provider_fakes::stripe::On;
use provider_fakes::stripe::{FakeStripe, Fault};
use provider_fakes::{FakeLemonSqueezy, FakePolar, ProviderServer};

pub(crate) fn scheduler_for(app: &TestApp, reconcilers: Vec<Reconciler>) -> SchedulerState {
    SchedulerState {
        pool: app.pool.clone(),
        queue: Queue::new(app.sqs.clone(), app.queue_url.clone()),
        reconcilers,
        // The test app's sources: every run measures their silence.
        sources: ["stripe", "polar", "kinde"].map(String::from).to_vec(),
        retention: Duration::from_secs(30 * 86_400),
        effects: None,
        outbox: None,
        budget: Duration::from_secs(30),
        database: None,
        audit: Some(test_audit()),
    }
}

/// `runs` scheduler runs, each followed by the worker; each run's first reconciliation report.
pub(crate) async fn reconcile_runs(
    app: &TestApp,
    scheduler: &SchedulerState,
    runs: usize,
) -> Vec<shared::reconcile::ReconcileReport> {
    let mut reports = Vec::with_capacity(runs);
    for _ in 0..runs {
        let report = scheduler::run(scheduler).await;
        app.run_worker().await;
        reports.push(report.reconciliation[0].clone());
    }
    reports
}

/// A deadline no rescue in these tests reaches.
pub(crate) fn soon() -> std::time::Instant {
    std::time::Instant::now() + Duration::from_secs(60)
}

pub(crate) async fn exec(app: &TestApp, sql: &str) {
    sqlx::query(sql).execute(&app.pool).await.unwrap();
}

pub(crate) async fn status_of(app: &TestApp, id: i64) -> String {
    app.event(id).await.status
}

/// Stores a Stripe event through the intake and drains its message, leaving it `received`.
pub(crate) async fn stored_unapplied(app: &TestApp, id: &str) -> i64 {
    stored_unapplied_at(app, id, Utc::now().timestamp()).await
}

/// The same, created at `created`.
pub(crate) async fn stored_unapplied_at(app: &TestApp, id: &str, created: i64) -> i64 {
    let (_, body) = app
        .post(
            "stripe",
            &stripe_delivery(&stripe_event(id, "cus_sched", created)),
        )
        .await;
    app.drain_queue().await;
    body["event_id"].as_i64().unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_whose_send_failed_is_enqueued_by_the_next_run_and_applied(pool: PgPool) {
    let sqs = sqs_client().await;
    let dead = unreachable_queue().await;
    let queue_url = create_queue(&sqs).await;
    let app = TestApp::with_parts(pool.clone(), pool, sqs, queue_url, dead).await;
    let (_, body) = app
        .post(
            "stripe",
            &stripe_delivery(&stripe_event("evt_lost", "cus_l", Utc::now().timestamp())),
        )
        .await;
    let id = body["event_id"].as_i64().unwrap();
    let scheduler = scheduler_for(&app, vec![]);

    // Younger than a minute: the intake may still be sending it.
    assert!(rescue(&app.pool, &scheduler.queue, soon())
        .await
        .unwrap()
        .is_empty());
    exec(
        &app,
        "UPDATE inbox_events SET received_at = now() - interval '2 minutes'",
    )
    .await;
    let report = scheduler::run(&scheduler).await;

    assert_eq!(report.rescued, [id]);
    assert!(app.event(id).await.enqueued_at.is_some());
    app.run_worker().await;
    assert_eq!(status_of(&app, id).await, "applied");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_expired_lease_is_rescued_and_applied_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let id = stored_unapplied(&app, "evt_lease").await;
    // A worker took it and vanished; its lease has run out.
    exec(
        &app,
        "UPDATE inbox_events SET status = 'processing', attempts = 1, enqueued_at = now() - interval '1 minute', locked_until = now() - interval '1 second'",
    )
    .await;
    let scheduler = scheduler_for(&app, vec![]);

    assert_eq!(
        rescue(&app.pool, &scheduler.queue, soon()).await.unwrap(),
        [id]
    );
    assert!(
        rescue(&app.pool, &scheduler.queue, soon())
            .await
            .unwrap()
            .is_empty(),
        "enqueued once"
    );
    app.run_worker().await;
    let row = app.event(id).await;
    assert_eq!(row.status, "applied");
    assert_eq!(
        app.count("SELECT attempts::bigint FROM inbox_events").await,
        2
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_due_failed_event_is_retried_and_one_not_due_is_not(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let due = stored_unapplied(&app, "evt_due").await;
    let later = stored_unapplied(&app, "evt_later").await;
    exec(&app, "UPDATE inbox_events SET status = 'failed', attempts = 1, enqueued_at = now() - interval '10 seconds'").await;
    sqlx::query(
        "UPDATE inbox_events SET next_attempt_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(due)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE inbox_events SET next_attempt_at = now() + interval '10 minutes' WHERE id = $1",
    )
    .bind(later)
    .execute(&app.pool)
    .await
    .unwrap();
    let scheduler = scheduler_for(&app, vec![]);

    assert_eq!(
        rescue(&app.pool, &scheduler.queue, soon()).await.unwrap(),
        [due]
    );
    app.run_worker().await;
    assert_eq!(status_of(&app, due).await, "applied");
    assert_eq!(status_of(&app, later).await, "failed");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn two_overlapping_runs_enqueue_each_row_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let mut ids = Vec::new();
    for n in 0..25 {
        ids.push(stored_unapplied(&app, &format!("evt_overlap_{n}")).await);
    }
    exec(
        &app,
        "UPDATE inbox_events SET enqueued_at = NULL, received_at = now() - interval '2 minutes'",
    )
    .await;
    let a = scheduler_for(&app, vec![]);
    let other_pool = crate::helpers::second_pool(&app.pool).await;
    let b = SchedulerState {
        pool: other_pool.clone(),
        ..scheduler_for(&app, vec![])
    };

    let (first, second) = tokio::join!(
        rescue(&a.pool, &a.queue, soon()),
        rescue(&other_pool, &b.queue, soon())
    );
    let (first, second) = (first.unwrap(), second.unwrap());

    let all: Vec<i64> = first.iter().chain(second.iter()).copied().collect();
    let unique: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), unique.len(), "no row enqueued by both runs");
    assert_eq!(unique, ids.iter().copied().collect::<HashSet<_>>());
    let mut queued = app.drain_queue().await;
    queued.sort_unstable();
    assert_eq!(queued, ids, "one message per row");
}

pub(crate) fn stripe_api_event(id: &str, customer: &str, created: i64) -> Value {
    let mut event = stripe_event(id, customer, created);
    // Read back from the API, the delivery counter differs: still the same event.
    event["pending_webhooks"] = json!(0);
    event
}

/// A source's reconciler, configured as `INBOX_SOURCES` would, against the mock API.
pub(crate) fn reconciler(source: Value) -> Reconciler {
    let config = parse_sources(&json!([source]).to_string()).unwrap();
    Reconciler::for_source(&config[0], &reqwest::Client::new()).expect("the source is reconciled")
}

pub(crate) fn stripe_reconciler(server: &MockServer) -> Reconciler {
    reconciler(
        json!({"name": "stripe", "kind": "stripe", "secrets": [STRIPE_SECRET],
        "api_key": "sk_test_reconcile", "api_base_url": server.uri()}),
    )
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_provider_api_error_fails_its_source_and_not_the_run(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let stripe = FakeStripe::default();
    stripe.read_fails(
        On::Any,
        Fault::Fails(
            500,
            json!({"error": {"type": "api_error", "message": "An unknown error occurred"}}),
        ),
        usize::MAX,
    );
    let server = stripe.serve().await;
    let id = stored_unapplied(&app, "evt_rescued_anyway").await;
    exec(
        &app,
        "UPDATE inbox_events SET enqueued_at = NULL, received_at = now() - interval '2 minutes'",
    )
    .await;
    let scheduler = scheduler_for(&app, vec![stripe_reconciler(&server)]);

    let report = scheduler::run(&scheduler).await;

    assert!(
        report.reconciliation[0]
            .error
            .as_deref()
            .unwrap()
            .contains("500"),
        "{report:?}"
    );
    assert_eq!(report.rescued, [id], "the other steps ran");
    let recorded: Option<String> = sqlx::query_scalar("SELECT error FROM reconcile_runs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(recorded.is_some());
}

pub(crate) fn polar_reconciler(server: &MockServer) -> Reconciler {
    reconciler(
        json!({"name": "polar", "kind": "standard-webhooks", "secrets": [POLAR_SECRET],
        "secret_encoding": "raw", "api_key": "polar_oat_test", "api_base_url": server.uri()}),
    )
}

/// Polar now shows `subscription` (replacing what it showed of the same id).
pub(crate) fn polar_api_returns(polar: &FakePolar, subscription: Value) {
    polar.subscription(subscription);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_polar_read_older_than_the_stored_state_changes_nothing_and_a_newer_one_corrects_it(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let subscription = |status: &str, at: &str| {
        json!({"id": "sub_rc", "customer_id": "pc_rc", "status": status, "product_id": "prod_pro",
               "modified_at": at, "created_at": "2026-01-01T00:00:00Z"})
    };
    let webhook = json!({"type": "subscription.active", "timestamp": "2026-02-01T00:00:00Z",
                         "data": subscription("active", "2026-02-01T00:00:00Z")});
    app.post("polar", &polar_delivery("msg_rc", &webhook)).await;
    app.run_worker().await;
    let polar = FakePolar::default();
    let server = polar.serve().await;
    let scheduler = scheduler_for(&app, vec![polar_reconciler(&server)]);

    // The API shows an older state: ours is newer, nothing is stored.
    polar_api_returns(&polar, subscription("canceled", "2026-01-15T00:00:00Z"));
    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 0, "{report:?}");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 1);

    // The API shows a newer state the webhooks never brought: a corrective event applies it.
    polar_api_returns(&polar, subscription("canceled", "2026-03-01T00:00:00Z"));
    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 1, "{report:?}");
    app.run_worker().await;
    let account = app.account("polar", "pc_rc", "2026-03").await;
    assert_eq!(account.subscriptions[0].status, "canceled");
    assert_eq!(account.plan, "free");

    // Read again: local and remote agree.
    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn purge_removes_only_old_finished_events_and_keeps_dead_ones(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let mut ids = Vec::new();
    for (key, status, age_days) in [
        ("evt_old_applied", "applied", 40),
        ("evt_old_ignored", "ignored", 40),
        ("evt_new_applied", "applied", 2),
        ("evt_old_dead", "dead", 40),
        ("evt_old_unprocessable", "unprocessable", 40),
        ("evt_old_received", "received", 40),
    ] {
        // Created before the oldest month with a partition of its own: in the kept partition,
        // which is purged by rows (the months go whole, `partitions.rs`).
        let created = (Utc::now() - chrono::Duration::days(100)).timestamp();
        let id = stored_unapplied_at(&app, key, created).await;
        sqlx::query(
            "UPDATE inbox_events SET status = $2, received_at = now() - make_interval(days => $3) WHERE id = $1",
        )
        .bind(id)
        .bind(status)
        .bind(age_days)
        .execute(&app.pool)
        .await
        .unwrap();
        ids.push(id);
    }
    let scheduler = scheduler_for(&app, vec![]);

    let purged = purge(
        &app.pool,
        scheduler.retention,
        Instant::now() + Duration::from_secs(10),
    )
    .await
    .unwrap();

    assert_eq!(purged, 2);
    let left: Vec<String> = sqlx::query_scalar("SELECT dedupe_key FROM inbox_events ORDER BY id")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        left,
        [
            "evt_new_applied",
            "evt_old_dead",
            "evt_old_unprocessable",
            "evt_old_received"
        ]
    );
    assert_eq!(
        app.count("SELECT count(*) FROM deliveries").await,
        4,
        "their deliveries went with them"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn dead_events_are_reported_once_and_stay_counted_until_replayed(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let id = stored_unapplied(&app, "evt_dead").await;
    exec(
        &app,
        "UPDATE inbox_events SET status = 'dead', attempts = 6, last_error = 'database: boom'",
    )
    .await;
    let scheduler = scheduler_for(&app, vec![]);

    let first = scheduler::run(&scheduler).await;
    let second = scheduler::run(&scheduler).await;

    assert_eq!(first.alerts.dead, [id]);
    assert!(second.alerts.dead.is_empty(), "reported once");
    let metrics = scheduler::emf(&second, Utc::now());
    assert_eq!(metrics["DeadEvents"], 1.0, "still visible until replayed");

    let replayed = replay(&app.pool, &scheduler.queue, &[id]).await.unwrap();
    assert_eq!(replayed, [id]);
    let row = app.event(id).await;
    assert_eq!(row.status, "received");
    app.run_worker().await;
    assert_eq!(status_of(&app, id).await, "applied");
    let after = scheduler::run(&scheduler).await;
    assert_eq!(scheduler::emf(&after, Utc::now())["DeadEvents"], 0.0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn metrics_are_valid_embedded_metric_format(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let original = stripe_event("evt_emf", "cus_emf", Utc::now().timestamp());
    app.post("stripe", &stripe_delivery(&original)).await;
    let mut forged = original.clone();
    forged["data"]["object"]["status"] = json!("canceled");
    app.post("stripe", &stripe_delivery(&forged)).await;
    app.post("polar", &polar_delivery("msg_garbage", &json!([1, 2])))
        .await;
    let scheduler = scheduler_for(&app, vec![]);

    let report = scheduler::run(&scheduler).await;
    let doc = scheduler::emf(&report, Utc::now());

    let aws = &doc["_aws"];
    assert!(aws["Timestamp"].as_i64().unwrap() > 1_600_000_000_000);
    let directive = &aws["CloudWatchMetrics"][0];
    assert_eq!(directive["Namespace"], "BillingInbox");
    assert_eq!(directive["Dimensions"], json!([["Stack"]]));
    assert_eq!(doc["Stack"], shared::platform::metrics::LOCAL_STACK);
    let names: Vec<&str> = directive["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert!(["Count", "Seconds"].contains(&m["Unit"].as_str().unwrap()));
            m["Name"].as_str().unwrap()
        })
        .collect();
    for expected in [
        "DeadEvents",
        "ConflictEvents",
        "UnprocessableEvents",
        "ReconcileDiscrepancies",
        "OldestUnappliedAgeSeconds",
    ] {
        assert!(names.contains(&expected), "{expected} missing");
    }
    for name in &names {
        assert!(doc[*name].is_number(), "{name} has a numeric value");
    }
    assert_eq!(doc["ConflictEvents"], 1.0);
    assert_eq!(doc["UnprocessableEvents"], 1.0);
    assert_eq!(doc["ReceivedEvents"], 1.0);
    // The document is one line of JSON, as CloudWatch Logs reads it.
    assert!(!doc.to_string().contains('\n'));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_whose_worker_died_on_its_last_attempt_is_dead_not_retried(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let id = stored_unapplied(&app, "evt_crashes_everything").await;
    exec(
        &app,
        "UPDATE inbox_events SET status = 'processing', attempts = 6, enqueued_at = now() - interval '1 hour',
                locked_until = now() - interval '1 second'",
    )
    .await;
    let scheduler = scheduler_for(&app, vec![]);

    // No worker may claim it again...
    assert_eq!(
        shared::handlers::worker::process_event(&app.worker, id)
            .await
            .unwrap(),
        shared::handlers::worker::Processed::Skipped
    );
    // ...and the scheduler buries it and reports it.
    let report = scheduler::run(&scheduler).await;

    assert!(report.rescued.is_empty());
    assert_eq!(report.alerts.dead, [id]);
    let row: (String, Option<String>) =
        sqlx::query_as("SELECT status, last_error FROM inbox_events WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(row.0, "dead");
    assert!(row.1.unwrap().contains("lease expired"));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_marked_enqueued_whose_message_never_arrived_is_sent_again(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // The intake marks the event in its one statement; its message is lost (as when the
    // intake dies between the commit and the send, or SQS drops it).
    let id = stored_unapplied(&app, "evt_message_lost").await;
    assert!(app.event(id).await.enqueued_at.is_some());
    let scheduler = scheduler_for(&app, vec![]);
    assert!(
        rescue(&app.pool, &scheduler.queue, soon())
            .await
            .unwrap()
            .is_empty(),
        "too recent"
    );

    exec(
        &app,
        "UPDATE inbox_events SET received_at = now() - interval '6 minutes', enqueued_at = now() - interval '6 minutes'",
    )
    .await;
    assert_eq!(
        rescue(&app.pool, &scheduler.queue, soon()).await.unwrap(),
        [id]
    );
    app.run_worker().await;
    assert_eq!(status_of(&app, id).await, "applied");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn each_source_s_silence_is_the_hours_since_its_newest_event_and_a_metric(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // stripe: an event now and an older one; polar: one event, received 30 hours ago;
    // kinde: nothing stored.
    let now = Utc::now().timestamp();
    app.post(
        "stripe",
        &stripe_delivery(&stripe_event("evt_old", "cus_q", now)),
    )
    .await;
    app.post(
        "stripe",
        &stripe_delivery(&stripe_event("evt_new", "cus_q", now)),
    )
    .await;
    sqlx::query(
        "UPDATE inbox_events SET received_at = inbox_now() - interval '3 days' WHERE dedupe_key = 'evt_old'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let (status, body) = app
        .post("polar", &polar_delivery("msg_quiet", &json!([1, 2])))
        .await;
    assert_eq!(status, 200, "{body}");
    sqlx::query("UPDATE inbox_events SET received_at = inbox_now() - interval '30 hours' WHERE source = 'polar'")
        .execute(&app.pool)
        .await
        .unwrap();

    let report = scheduler::run(&scheduler_for(&app, vec![])).await;

    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let hours: Vec<(&str, Option<f64>)> = report
        .silence
        .iter()
        .map(|s| (s.source.as_str(), s.hours))
        .collect();
    assert_eq!(hours.len(), 3, "{hours:?}");
    assert_eq!(hours[0].0, "stripe");
    assert!(
        hours[0].1.unwrap() < 1.0,
        "the newest event counts: {hours:?}"
    );
    assert_eq!(hours[1].0, "polar");
    let polar = hours[1].1.unwrap();
    assert!((30.0..31.0).contains(&polar), "{hours:?}");
    assert_eq!(
        hours[2],
        ("kinde", None),
        "nothing stored, nothing measured"
    );

    let line = scheduler::silence_metric(&report.silence[1], Utc::now()).unwrap();
    let directive = &line["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(directive["Namespace"], "BillingInbox");
    assert_eq!(directive["Dimensions"], json!([["Stack", "Source"]]));
    assert_eq!(directive["Metrics"][0]["Name"], "SourceSilenceHours");
    assert_eq!(line["Source"], "polar");
    assert_eq!(line["SourceSilenceHours"], json!(polar));
    assert!(scheduler::silence_metric(&report.silence[2], Utc::now()).is_none());
}

/// A Lemon Squeezy source reconciled against `server` (its `GET /v1/subscriptions`).
fn lemonsqueezy_reconciler(server: &MockServer) -> Reconciler {
    reconciler(json!({"name": "lemonsqueezy", "kind": "lemonsqueezy",
        "secrets": [LEMONSQUEEZY_SECRET], "livemode": false, "api_key": "ls_test_key",
        "api_base_url": server.uri()}))
}

/// The store now holds `subscriptions` (each replacing what it held of the same id), listed in
/// JSON:API pages by the fake Lemon Squeezy.
fn lemonsqueezy_api_returns(store: &FakeLemonSqueezy, subscriptions: Vec<Value>) {
    for subscription in subscriptions {
        store.subscription(subscription);
    }
}

/// Whether every request `server` received carried the store's key and JSON:API's media type.
async fn keyed_json_api(server: &ProviderServer) -> bool {
    server.received_requests().await.unwrap().iter().all(|r| {
        r.headers
            .get("authorization")
            .is_some_and(|v| v == "Bearer ls_test_key")
            && r.headers
                .get("accept")
                .is_some_and(|v| v == "application/vnd.api+json")
    })
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_lemonsqueezy_sweep_corrects_a_newer_state_the_webhooks_missed_and_no_other(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(crate::corpus::CORPUS_PLANS).unwrap();
    let files = crate::corpus::corpus("lemonsqueezy");
    let file = |name: &str| files.iter().find(|(n, _)| n == name).unwrap().1.clone();
    // Delivered: the subscription's creation.
    let created = file("subscription_created");
    app.post("lemonsqueezy", &lemonsqueezy_delivery(&created))
        .await;
    app.run_worker().await;
    let store = FakeLemonSqueezy::default();
    let server = store.serve().await;
    let scheduler = scheduler_for(&app, vec![lemonsqueezy_reconciler(&server)]);

    // The API shows the state the webhooks brought: nothing is stored.
    lemonsqueezy_api_returns(&store, vec![created["data"].clone()]);
    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 0, "{report:?}");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 1);

    // An older state: ours is newer, nothing is stored.
    let mut older = file("subscription_expired")["data"].clone();
    older["attributes"]["updated_at"] = json!("2025-10-01T00:00:00.000000Z");
    lemonsqueezy_api_returns(&store, vec![older]);
    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 0, "{report:?}");

    // The expiry the webhooks never brought: a corrective event applies it.
    lemonsqueezy_api_returns(&store, vec![file("subscription_expired")["data"].clone()]);
    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 1, "{report:?}");
    app.run_worker().await;
    let account = app.account("lemonsqueezy", "1", "2025-12").await;
    assert_eq!(account.subscriptions[0].status, "canceled");
    assert_eq!(account.plan, "free");

    // Read again: local and remote agree.
    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 0, "{report:?}");
    assert!(keyed_json_api(&server).await);
}
