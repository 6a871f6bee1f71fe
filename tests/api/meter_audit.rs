//! The meter audit (docs/design.md §4.13a): the reports sent to a Stripe meter compared with
//! the meter's event summaries over the month — against the fake Stripe, whose total the test
//! sets —, those sent to Polar compared with its meter's quantities — against the fake Polar,
//! which counts the events it holds as Polar does (docs/design.md §6.6) —, and the `inboxctl
//! meters` commands.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde_json::{json, Value};
use shared::domain::CustomerId;
use shared::handlers::scheduler::{self, SchedulerState};
use shared::meters::audit::{self, MeterAudit};
use shared::meters::Meters;
use shared::platform::config::SourceConfig;
use sqlx::PgPool;
use wiremock::MockServer;

use crate::cli::{database_url, inboxctl, run};
use crate::helpers::*;
use crate::meters::{self, ask, metered_entry, meters_within, polar_on_pro, stripe_on_pro};
use provider_fakes::polar::FakePolar;
use provider_fakes::stripe::FakeStripe;
use provider_fakes::ProviderServer;

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

/// Makes what Stripe's `api_calls` counts for `customer` `total`: the events it took, timed as
/// [`sent`] times the reports (half an hour ago, inside the month's settled window). Stripe's
/// count only grows, as events are taken.
fn stripe_counts(fake: &FakeStripe, customer: &str, total: f64) {
    let counted = fake.total(customer);
    assert!(total >= counted, "Stripe counts {counted} already");
    fake.takes(
        customer,
        Utc::now() - TimeDelta::minutes(30),
        total - counted,
    );
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
    stripe_counts(&fake, "cus_audit_ok", 7.0);
    let server = fake.serve().await;
    let meters = meters_of(&metered(&server.uri()));

    let found = audit_now(&pool, &meters).await;
    assert_eq!(found.checked, 1, "{found:?}");
    assert!(found.differences.is_empty(), "{found:?}");
    assert!(found.errors.is_empty(), "{found:?}");
    assert!(recorded(&pool).await.is_empty());
    let asked = &fake.summaries_asked()[0];
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

/// A reversed debit's correction takes its report's value back in the audit as Stripe's meter
/// does (docs/design.md §4.13, "Corrections"): Stripe no longer counts a cancelled event.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_sent_correction_takes_its_reports_value_back_in_the_audit(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_audit_fix").await;
    let kept = debit(&pool, "cus_audit_fix", "req_kept", 3).await;
    sent(&pool, &kept, "1 hour").await;
    let taken = debit(&pool, "cus_audit_fix", "req_taken", 4).await;
    sent(&pool, &taken, "1 hour").await;
    let usage_id: String = sqlx::query_scalar("SELECT usage_id FROM meter_reports WHERE id = $1")
        .bind(&taken)
        .fetch_one(&pool)
        .await
        .unwrap();
    let who = CustomerId::parse("cus_audit_fix").unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let correction = shared::billing::usage::reverse(
        &mut conn,
        ("stripe", &who),
        &usage_id,
        None,
        &shared::domain::Period::current(),
    )
    .await
    .unwrap()
    .correction
    .expect("Stripe holds the report: a correction");
    drop(conn);
    sent(&pool, &correction, "1 hour").await;
    let fake = FakeStripe::default();
    stripe_counts(&fake, "cus_audit_fix", 3.0);
    let server = fake.serve().await;
    let meters = meters_of(&metered(&server.uri()));

    let found = audit_now(&pool, &meters).await;
    assert_eq!(found.checked, 1, "{found:?}");
    assert!(found.differences.is_empty(), "{found:?}");
    assert!(recorded(&pool).await.is_empty());
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
    assert!(fake.summaries_asked().is_empty(), "Stripe is not asked yet");
}

/// The audit's settled window is the store's (`inbox_now()`), the clock every report row is
/// written on, not the machine's: with the store an hour ahead of the machine (as in the
/// simulator), a report sent 45 minutes ago by the store's clock, timed 30 minutes ago, is
/// settled and compared, and Stripe counting less is a difference.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_audit_settles_its_window_on_the_stores_clock_not_the_machines(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_audit_ahead").await;
    let id = debit(&pool, "cus_audit_ahead", "req_1", 5).await;
    let store_now = Utc::now() + TimeDelta::hours(1);
    let occurred_at = store_now - TimeDelta::minutes(30);
    sqlx::query(
        "UPDATE meter_reports SET status = 'sent', attempts = 1, first_sent_at = $2,
                sent_at = $2, occurred_at = $3
         WHERE id = $1",
    )
    .bind(&id)
    .bind(store_now - TimeDelta::minutes(45))
    .bind(occurred_at)
    .execute(&pool)
    .await
    .unwrap();
    let fake = FakeStripe::default();
    fake.clock_from(store_now);
    fake.takes("cus_audit_ahead", occurred_at, 2.0);
    let server = fake.serve().await;
    let meters = meters_of(&metered(&server.uri()));
    let ahead = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SELECT set_config('inbox.clock_offset_secs', '3600', false)")
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();

    let found = audit_now(&ahead, &meters).await;
    assert_eq!((found.checked, found.new), (1, 1), "{found:?}");
    assert_eq!(recorded(&pool).await, vec![(5, 2.0, false)]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_difference_is_recorded_and_reported_once_and_resolved_when_stripe_agrees(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_audit_off").await;
    let id = debit(&pool, "cus_audit_off", "req_1", 5).await;
    sent(&pool, &id, "1 hour").await;
    let fake = FakeStripe::default();
    stripe_counts(&fake, "cus_audit_off", 2.0);
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
    stripe_counts(&fake, "cus_audit_off", 3.0);
    let again = audit_now(&pool, &meters).await;
    assert_eq!(again.new, 0, "{again:?}");
    assert_eq!(again.differences.len(), 1);
    assert_eq!(recorded(&pool).await, vec![(5, 3.0, false)]);

    // Stripe catches up: resolved, and nothing open.
    stripe_counts(&fake, "cus_audit_off", 5.0);
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
    stripe_counts(&fake, "cus_audit_run", 4.0);
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
    assert_eq!(
        fake.summaries_asked().len(),
        2,
        "one read per run with a meter"
    );
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
            "unknown report status 'lost' (pending, sent, dead, withdrawn)",
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
    stripe_counts(&fake, "cus_audit_cli", 4.0);
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
    stripe_counts(&fake, "cus_audit_cli", 5.0);
    let (output, stdout, stderr) = run(inboxctl()
        .args(["meters", "audit"])
        .env("DATABASE_URL", &url)
        .env("INBOX_SOURCES", &sources));
    assert!(output.status.success(), "{stdout} {stderr}");
    assert!(stdout.contains("1 resolved"), "{stdout}");
}

/// A meter as Polar's `Meter` schema writes it (polarsource/polar
/// `server/polar/meter/schemas.py`, `filter.py`, `aggregation.py`), created `n` minutes after
/// the first.
fn polar_meter(id: &str, n: i64, clauses: Value, aggregation: Value) -> Value {
    let created =
        DateTime::parse_from_rfc3339("2026-01-05T09:00:00Z").unwrap() + TimeDelta::minutes(n);
    json!({"id": id, "created_at": created.to_rfc3339(), "modified_at": null, "metadata": {},
        "name": format!("Meter {n}"), "unit": "scalar", "custom_label": null,
        "custom_multiplier": null, "filter": {"conjunction": "and", "clauses": clauses},
        "aggregation": aggregation, "organization_id": "1dbfc517-0bbf-4301-9ba8-555ca42b9737",
        "archived_at": null})
}

fn named(event_name: &str) -> Value {
    json!([{"property": "name", "operator": "eq", "value": event_name}])
}

fn summed() -> Value {
    json!({"func": "sum", "property": "value"})
}

/// The meter of `api_calls` reports, after a hundred meters of other events: on the list's
/// second page.
const POLAR_METER: &str = "7b2b8ef7-7a3b-4bd4-9a63-55d0b45a2c63";

fn polar_meters() -> Vec<Value> {
    let mut meters: Vec<Value> = (0..100)
        .map(|n| {
            polar_meter(
                &format!("00000000-0000-4000-8000-{n:012}"),
                n,
                named(&format!("event_{n}")),
                summed(),
            )
        })
        .collect();
    meters.push(polar_meter(POLAR_METER, 100, named("api_calls"), summed()));
    meters
}

/// The fake Polar (`provider_fakes::polar::FakePolar`, docs/design.md §6.6) holding `meters`
/// and, for `api_calls`, the events `counted` (customer, time, value), as if ingested: its
/// `GET /v1/meters/` pages them as Polar's `ListResource`, its quantities count its events as
/// Polar's `get_quantities` does.
async fn polar_serving(
    meters: Vec<Value>,
    counted: &[(&str, DateTime<Utc>, f64)],
) -> (FakePolar, ProviderServer) {
    let fake = FakePolar::default();
    for meter in meters {
        fake.meter(meter);
    }
    for (customer, at, value) in counted {
        fake.takes("api_calls", customer, *at, *value);
    }
    let server = fake.serve().await;
    (fake, server)
}

/// The test source `polar`, its API at `base`, metered on `api_calls`.
fn polar_metered(base: &str) -> Vec<SourceConfig> {
    vec![meters::metered(
        "polar",
        base,
        json!({"event_name": "api_calls"}),
    )]
}

/// A Polar debit of `amount` under `key`, reported to `api_calls`, sent an hour ago and timed
/// at `at`.
async fn polar_sent(pool: &PgPool, customer: &str, key: &str, amount: i64, at: DateTime<Utc>) {
    let who = CustomerId::parse(customer).unwrap();
    let id = meters::debit(pool, &ask("polar", &who, key, amount, Some("api_calls")))
        .await
        .reported
        .unwrap();
    sent(pool, &id, "1 hour").await;
    sqlx::query("UPDATE meter_reports SET occurred_at = $2 WHERE id = $1")
        .bind(&id)
        .bind(at)
        .execute(pool)
        .await
        .unwrap();
}

/// Where the audit's window ends for Polar: the last whole hour by the settled minute.
fn polar_window_end() -> DateTime<Utc> {
    (Utc::now() - TimeDelta::from_std(audit::SETTLE).unwrap())
        .duration_trunc(TimeDelta::hours(1))
        .unwrap()
}

async fn requests_to(server: &MockServer, suffix: &str) -> Vec<HashMap<String, String>> {
    server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.path().ends_with(suffix))
        .map(|r| r.url.query_pairs().into_owned().collect())
        .collect()
}

const POLAR_CUSTOMER: &str = "992fae2a-2a17-4b7a-8d9e-e287cf90131b";

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn reports_polar_counts_in_full_make_no_difference_over_whole_hours(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    polar_on_pro(&app, POLAR_CUSTOMER).await;
    let earlier = Utc::now() - TimeDelta::hours(2);
    let end = polar_window_end();
    polar_sent(&pool, POLAR_CUSTOMER, "req_1", 3, earlier).await;
    polar_sent(&pool, POLAR_CUSTOMER, "req_2", 4, earlier).await;
    // Timed in the hour not over yet: outside the window, here and at Polar alike.
    polar_sent(&pool, POLAR_CUSTOMER, "req_3", 5, end).await;
    let (_fake, server) = polar_serving(
        polar_meters(),
        &[
            (POLAR_CUSTOMER, earlier, 3.0),
            (POLAR_CUSTOMER, earlier, 4.0),
            (POLAR_CUSTOMER, end, 5.0),
            ("0f0e2c57-0a47-4bb5-9f0e-2b0e4f3a6d11", earlier, 100.0),
        ],
    )
    .await;
    let meters = meters_of(&polar_metered(&server.uri()));

    let found = audit_now(&pool, &meters).await;
    assert!(found.checked >= 1, "{found:?}");
    assert_eq!(found.unreadable, 0, "{found:?}");
    assert!(found.errors.is_empty(), "{found:?}");
    assert!(found.differences.is_empty(), "{found:?}");
    assert!(recorded(&pool).await.is_empty());
    let asked = requests_to(&server, "/quantities").await;
    assert!(!asked.is_empty());
    for query in &asked {
        assert_eq!(query["customer_id"], POLAR_CUSTOMER);
        let last: DateTime<Utc> = query["end_timestamp"].parse().unwrap();
        assert!(
            last < end,
            "the window's last bucket starts before its end: {query:?}"
        );
    }
    assert_eq!(
        requests_to(&server, "/v1/meters/").await.len(),
        2,
        "the meter found on the list's second page"
    );
    let again = audit_now(&pool, &meters).await;
    assert!(again.differences.is_empty(), "{again:?}");
    assert_eq!(
        requests_to(&server, "/v1/meters/").await.len(),
        2,
        "the meter's id is kept"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn polar_counting_less_is_one_difference_reported_once_and_resolved_when_it_agrees(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    polar_on_pro(&app, POLAR_CUSTOMER).await;
    let earlier = Utc::now() - TimeDelta::hours(2);
    polar_sent(&pool, POLAR_CUSTOMER, "req_1", 5, earlier).await;
    let (fake, server) = polar_serving(polar_meters(), &[(POLAR_CUSTOMER, earlier, 2.0)]).await;
    let meters = meters_of(&polar_metered(&server.uri()));

    let first = audit_now(&pool, &meters).await;
    assert_eq!((first.checked, first.new), (1, 1), "{first:?}");
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
        ("polar", POLAR_CUSTOMER, "api_calls", 5, 2.0)
    );
    assert_eq!(difference.period, earlier.format("%Y-%m").to_string());

    let again = audit_now(&pool, &meters).await;
    assert_eq!(
        (again.new, again.differences.len()),
        (0, 1),
        "reported once: {again:?}"
    );
    assert_eq!(recorded(&pool).await, vec![(5, 2.0, false)]);

    fake.takes("api_calls", POLAR_CUSTOMER, earlier, 3.0);
    let agreed = audit_now(&pool, &meters).await;
    assert_eq!((agreed.new, agreed.resolved), (0, 1), "{agreed:?}");
    assert!(agreed.differences.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn without_a_polar_meter_summing_exactly_the_event_name_the_audit_does_not_compare(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    polar_on_pro(&app, POLAR_CUSTOMER).await;
    let earlier = Utc::now() - TimeDelta::hours(2);
    polar_sent(&pool, POLAR_CUSTOMER, "req_1", 5, earlier).await;
    // Each counts something else than the reports: their number, a part of them, or another
    // event's.
    let narrower = json!([{"property": "name", "operator": "eq", "value": "api_calls"},
                          {"property": "region", "operator": "eq", "value": "eu"}]);
    let (_fake, server) = polar_serving(
        vec![
            polar_meter(
                "11111111-1111-4111-8111-111111111111",
                0,
                named("api_calls"),
                json!({"func": "count"}),
            ),
            polar_meter(
                "22222222-2222-4222-8222-222222222222",
                1,
                narrower,
                summed(),
            ),
            polar_meter(
                "33333333-3333-4333-8333-333333333333",
                2,
                named("seats"),
                summed(),
            ),
        ],
        &[(POLAR_CUSTOMER, earlier, 2.0)],
    )
    .await;
    let meters = meters_of(&polar_metered(&server.uri()));

    let found = audit_now(&pool, &meters).await;
    assert_eq!((found.checked, found.unreadable), (0, 1), "{found:?}");
    assert!(found.errors.is_empty(), "{found:?}");
    assert!(
        found.differences.is_empty(),
        "never a wrong total: {found:?}"
    );
    assert!(requests_to(&server, "/quantities").await.is_empty());
    let again = audit_now(&pool, &meters).await;
    assert_eq!(again.unreadable, 1, "{again:?}");
    assert_eq!(
        requests_to(&server, "/v1/meters/").await.len(),
        1,
        "the list is not read again at once"
    );
}
