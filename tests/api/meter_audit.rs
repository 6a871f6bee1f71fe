//! The meter audit (docs/design.md §4.13a): the reports sent to a Stripe meter compared with
//! the meter's event summaries over the month — against a fake Stripe (wiremock) whose total
//! the test sets — and the `inboxctl meters` commands.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{json, Value};
use shared::domain::CustomerId;
use shared::handlers::scheduler::{self, SchedulerState};
use shared::meters::audit::{self, MeterAudit};
use shared::meters::Meters;
use shared::platform::config::SourceConfig;
use sqlx::PgPool;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::cli::{database_url, inboxctl, run};
use crate::helpers::*;
use crate::meters::{self, ask, metered_entry, meters_within, stripe_on_pro};

/// The test source `stripe`, its API at `base`, metered on `api_calls`: as `INBOX_SOURCES`
/// holds it.
fn metered_json(base: &str) -> Value {
    json!([metered_entry(
        "stripe",
        base,
        json!({"event_name": "api_calls"})
    )])
}

fn metered(base: &str) -> Vec<SourceConfig> {
    vec![meters::metered(
        "stripe",
        base,
        json!({"event_name": "api_calls"}),
    )]
}

fn meters_of(sources: &[SourceConfig]) -> Meters {
    meters_within(sources, Duration::from_secs(5))
}

/// A fake Stripe meter API: the meters list, and event summaries whose `aggregated_value` is
/// what the test set (the same for any window), as `GET /v1/billing/meters/{id}/event_summaries`
/// answers without a grouping window: one summary over the range asked.
#[derive(Clone, Default)]
struct FakeStripe {
    total: Arc<Mutex<f64>>,
    /// Each summaries request's query.
    asked: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

impl FakeStripe {
    async fn serve(&self) -> MockServer {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/v1/billing/meters"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "object": "list", "url": "/v1/billing/meters", "has_more": false,
                "data": [{"id": "mtr_seats", "object": "billing.meter", "event_name": "seats"},
                         {"id": "mtr_api", "object": "billing.meter", "event_name": "api_calls"}]})))
            .mount(&server)
            .await;
        let fake = self.clone();
        Mock::given(method("GET"))
            .and(path("/v1/billing/meters/mtr_api/event_summaries"))
            .respond_with(move |request: &Request| {
                let query: HashMap<String, String> =
                    request.url.query_pairs().into_owned().collect();
                let start: i64 = query["start_time"].parse().unwrap();
                let end: i64 = query["end_time"].parse().unwrap();
                fake.asked.lock().unwrap().push(query);
                ResponseTemplate::new(200).set_body_json(json!({
                    "object": "list", "has_more": false,
                    "url": "/v1/billing/meters/mtr_api/event_summaries",
                    "data": [{"id": "mtrusg_1", "object": "billing.meter_event_summary",
                              "aggregated_value": *fake.total.lock().unwrap(),
                              "start_time": start, "end_time": end,
                              "livemode": false, "meter": "mtr_api"}]}))
            })
            .mount(&server)
            .await;
        server
    }

    fn set(&self, total: f64) {
        *self.total.lock().unwrap() = total;
    }

    fn asked(&self) -> Vec<HashMap<String, String>> {
        self.asked.lock().unwrap().clone()
    }
}

/// A debit of `amount` under `key`, reported to `api_calls`: the report's id.
async fn debit(pool: &PgPool, customer: &str, key: &str, amount: i64) -> String {
    let who = CustomerId::parse(customer).unwrap();
    meters::debit(pool, &ask("stripe", &who, key, amount, Some("api_calls")))
        .await
        .reported
        .unwrap()
}

/// The report as the dispatcher leaves it once Stripe took it: sent `sent_ago` ago, timed
/// half an hour ago (inside the month's settled window).
async fn sent(pool: &PgPool, id: &str, sent_ago: &str) {
    sqlx::query(
        "UPDATE meter_reports SET status = 'sent', attempts = 1, first_sent_at = now() - $2::interval,
                sent_at = now() - $2::interval, occurred_at = now() - interval '30 minutes'
         WHERE id = $1",
    )
    .bind(id)
    .bind(sent_ago)
    .execute(pool)
    .await
    .unwrap();
}

async fn audit_now(pool: &PgPool, meters: &Meters) -> MeterAudit {
    let deadline = Instant::now() + Duration::from_secs(30);
    audit::run(pool, meters, None, audit::MAX_CHECKED_PER_RUN, deadline)
        .await
        .unwrap()
}

async fn recorded(pool: &PgPool) -> Vec<(i64, f64, bool)> {
    sqlx::query_as(
        "SELECT ours, theirs, resolved_at IS NOT NULL FROM meter_audit_differences ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn reports_stripe_counts_in_full_make_no_difference(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_audit_ok").await;
    for (key, amount) in [("req_1", 3), ("req_2", 4)] {
        let id = debit(&pool, "cus_audit_ok", key, amount).await;
        sent(&pool, &id, "1 hour").await;
    }
    let fake = FakeStripe::default();
    fake.set(7.0);
    let server = fake.serve().await;
    let meters = meters_of(&metered(&server.uri()));

    let found = audit_now(&pool, &meters).await;
    assert_eq!(found.checked, 1, "{found:?}");
    assert!(found.differences.is_empty(), "{found:?}");
    assert!(found.errors.is_empty(), "{found:?}");
    assert!(recorded(&pool).await.is_empty());
    let asked = &fake.asked()[0];
    assert_eq!(asked["customer"], "cus_audit_ok");
    let (start, end): (i64, i64) = (
        asked["start_time"].parse().unwrap(),
        asked["end_time"].parse().unwrap(),
    );
    assert_eq!(start % 60, 0, "Stripe takes whole minutes");
    assert_eq!(end % 60, 0, "Stripe takes whole minutes");
    assert!(
        end <= Utc::now().timestamp() - 15 * 60,
        "only the settled part of the month is compared"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_report_sent_moments_ago_waits_until_stripe_has_counted_it(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_audit_fresh").await;
    let id = debit(&pool, "cus_audit_fresh", "req_1", 3).await;
    sent(&pool, &id, "1 minute").await;
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    let meters = meters_of(&metered(&server.uri()));

    let found = audit_now(&pool, &meters).await;
    assert_eq!((found.checked, found.unsettled), (0, 1), "{found:?}");
    assert!(found.differences.is_empty());
    assert!(fake.asked().is_empty(), "Stripe is not asked yet");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_difference_is_recorded_and_reported_once_and_resolved_when_stripe_agrees(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_audit_off").await;
    let id = debit(&pool, "cus_audit_off", "req_1", 5).await;
    sent(&pool, &id, "1 hour").await;
    let fake = FakeStripe::default();
    fake.set(2.0);
    let server = fake.serve().await;
    let meters = meters_of(&metered(&server.uri()));

    let first = audit_now(&pool, &meters).await;
    assert_eq!(first.new, 1, "{first:?}");
    assert_eq!(first.differences.len(), 1);
    let difference = &first.differences[0];
    assert_eq!(
        (
            difference.source.as_str(),
            difference.customer_id.as_str(),
            difference.meter.as_str(),
            difference.ours,
            difference.theirs
        ),
        ("stripe", "cus_audit_off", "api_calls", 5, 2.0)
    );
    assert_eq!(difference.period, Utc::now().format("%Y-%m").to_string());

    // Seen again: the same row, not a new alert.
    fake.set(3.0);
    let again = audit_now(&pool, &meters).await;
    assert_eq!(again.new, 0, "{again:?}");
    assert_eq!(again.differences.len(), 1);
    assert_eq!(recorded(&pool).await, vec![(5, 3.0, false)]);

    // Stripe catches up: resolved, and nothing open.
    fake.set(5.0);
    let agreed = audit_now(&pool, &meters).await;
    assert_eq!((agreed.new, agreed.resolved), (0, 1), "{agreed:?}");
    assert!(agreed.differences.is_empty());
    assert_eq!(recorded(&pool).await, vec![(5, 3.0, true)]);
    let quiet = audit_now(&pool, &meters).await;
    assert_eq!((quiet.new, quiet.resolved), (0, 0));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_scheduler_counts_open_meter_differences_in_its_metrics(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_audit_run").await;
    let id = debit(&pool, "cus_audit_run", "req_1", 5).await;
    sent(&pool, &id, "1 hour").await;
    let fake = FakeStripe::default();
    fake.set(4.0);
    let server = fake.serve().await;
    let mut state: SchedulerState = crate::scheduler::scheduler_for(&app, vec![]);
    state.audit.as_mut().unwrap().meters = meters_of(&metered(&server.uri()));

    let report = scheduler::run(&state).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        (report.meter_differences, report.new_meter_differences),
        (1, 1)
    );
    let metrics = scheduler::emf(&report, Utc::now());
    assert_eq!(metrics["MeterDifferences"], json!(1.0));
    let again = scheduler::run(&state).await;
    assert_eq!(
        (again.meter_differences, again.new_meter_differences),
        (1, 0),
        "still open, reported once"
    );

    // No source with a meter: no step, nothing counted.
    let unmetered = crate::scheduler::scheduler_for(&app, vec![]);
    let report = scheduler::run(&unmetered).await;
    assert_eq!(report.meter_differences, 0);
    assert_eq!(fake.asked().len(), 2, "one read per run with a meter");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn meters_commands_list_replay_and_audit(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_audit_cli").await;
    let sent_id = debit(&pool, "cus_audit_cli", "req_sent", 5).await;
    sent(&pool, &sent_id, "1 hour").await;
    let dead_id = debit(&pool, "cus_audit_cli", "req_dead", 2).await;
    sqlx::query(
        "UPDATE meter_reports SET status = 'dead', attempts = 5, last_error = 'no connection'
         WHERE id = $1",
    )
    .bind(&dead_id)
    .execute(&pool)
    .await
    .unwrap();
    let url = database_url(&pool).await;

    // The list, filtered, in JSON and as a table.
    let (output, stdout, stderr) = run(inboxctl()
        .args(["meters", "--status", "dead", "--json"])
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], json!(dead_id));
    assert_eq!(listed[0]["last_error"], json!("no connection"));
    let (output, stdout, stderr) = run(inboxctl()
        .args([
            "meters",
            "--source",
            "stripe",
            "--customer",
            "cus_audit_cli",
        ])
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    assert!(
        stdout.contains(&sent_id) && stdout.contains(&dead_id),
        "{stdout}"
    );
    assert!(stdout.contains("no connection"), "{stdout}");

    // Replayed without a queue: pending again, left to the scheduler's rescue.
    let (output, stdout, stderr) = run(inboxctl()
        .env_remove("EFFECTS_QUEUE_URL")
        .args(["meters", "replay", "--dead", "--source", "stripe"])
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains(&dead_id), "{stdout}");
    assert!(stdout.contains("scheduler's rescue"), "{stdout}");
    let status: String = sqlx::query_scalar("SELECT status FROM meter_reports WHERE id = $1")
        .bind(&dead_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "pending");

    // Unknown and not-dead reports are named, with a non-zero exit.
    for (args, message) in [
        (
            vec!["meters", "replay", "mrp_0000"],
            "no such report: [\"mrp_0000\"]",
        ),
        (
            vec!["meters", "replay", sent_id.as_str()],
            "not dead (only a dead report is replayed)",
        ),
        (
            vec!["meters", "replay"],
            "name report ids to replay, or --dead",
        ),
        (
            vec!["meters", "--status", "lost"],
            "unknown report status 'lost' (pending, sent, dead)",
        ),
    ] {
        let (output, _, stderr) = run(inboxctl()
            .env_remove("EFFECTS_QUEUE_URL")
            .args(&args)
            .env("DATABASE_URL", &url));
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }

    // The audit on demand: Stripe counts 4 of the 5 sent; the replayed report is on its way
    // again, timed now, outside the settled window.
    sqlx::query("UPDATE meter_reports SET occurred_at = now() WHERE id = $1")
        .bind(&dead_id)
        .execute(&pool)
        .await
        .unwrap();
    let fake = FakeStripe::default();
    fake.set(4.0);
    let server = fake.serve().await;
    let sources = metered_json(&server.uri()).to_string();
    let (output, stdout, stderr) = run(inboxctl()
        .args(["meters", "audit", "--source", "stripe", "--json"])
        .env("DATABASE_URL", &url)
        .env("INBOX_SOURCES", &sources));
    assert_eq!(output.status.code(), Some(1), "{stdout} {stderr}");
    let found: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(found["new"], json!(1));
    assert_eq!(found["differences"][0]["ours"], json!(5));
    assert_eq!(found["differences"][0]["theirs"], json!(4.0));
    fake.set(5.0);
    let (output, stdout, stderr) = run(inboxctl()
        .args(["meters", "audit"])
        .env("DATABASE_URL", &url)
        .env("INBOX_SOURCES", &sources));
    assert!(output.status.success(), "{stdout} {stderr}");
    assert!(stdout.contains("1 resolved"), "{stdout}");
}
