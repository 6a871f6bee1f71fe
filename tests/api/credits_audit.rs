//! The credits audit (docs/design.md §4.14): Stripe-mirrored grants, delivered as Stripe sends
//! them through intake and worker, compared with the fake Stripe's `GET
//! /v1/billing/credit_balance_summary` of each grant it lists (`GET /v1/billing/credit_grants`,
//! paged), the fake summing the grants and transactions it holds as Stripe does.

use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use serde_json::{json, Value};
use shared::audit::credits::{self, CreditAudit, CreditSource};
use shared::platform::config::parse_sources;
use shared::providers::Api;
use sqlx::PgPool;

use crate::helpers::*;
use crate::meters::metered_entry;
use provider_fakes::stripe::FakeStripe;

/// A day ago: the grants' and transactions' time, past for both clocks.
fn day_ago() -> i64 {
    (Utc::now() - TimeDelta::days(1)).timestamp()
}

/// `billing.credit_grant` as Stripe's OpenAPI gives it: 1000 usd for metered prices, paid,
/// effective a day ago, never expiring.
fn grant(id: &str, customer: &str) -> Value {
    json!({
        "id": id, "object": "billing.credit_grant",
        "amount": {"monetary": {"currency": "usd", "value": 1000}, "type": "monetary"},
        "applicability_config": {"scope": {"price_type": "metered"}},
        "category": "paid", "created": day_ago(), "customer": customer,
        "customer_account": null, "effective_at": day_ago(), "expires_at": null,
        "livemode": false, "metadata": {}, "name": "Welcome credit", "priority": 50,
        "test_clock": null, "updated": day_ago(), "voided_at": null
    })
}

/// `billing.credit_balance_transaction` of `grant`: a `credit` or a `debit` of `kind` and
/// `value` usd cents.
fn transaction(id: &str, grant: &str, side: &str, kind: &str, value: i64) -> Value {
    let amount = json!({"amount": {"monetary": {"currency": "usd", "value": value},
                                   "type": "monetary"},
                        "type": kind});
    let mut t = json!({
        "id": id, "object": "billing.credit_balance_transaction", "created": day_ago(),
        "credit": null, "credit_grant": grant, "debit": null, "effective_at": day_ago(),
        "livemode": false, "test_clock": null, "type": side
    });
    t[side] = amount;
    if side == "debit" {
        t["debit"]["credits_applied"] = json!(null);
    }
    t
}

/// The event Stripe sends of `object`.
fn event_of(id: &str, kind: &str, object: &Value) -> Value {
    json!({"id": id, "object": "event", "api_version": "2025-03-31.basil", "created": day_ago(),
           "data": {"object": object}, "livemode": false, "pending_webhooks": 1,
           "request": {"id": null, "idempotency_key": null}, "type": kind})
}

/// A grant of 1000, granted and 300 applied, as the fake Stripe holds them and as the events
/// of them are, in that order: grant, granted, applied.
fn granted_and_applied(fake: &FakeStripe, customer: &str, g: &str) -> Vec<Value> {
    let objects = [
        ("billing.credit_grant.created", grant(g, customer)),
        (
            "billing.credit_balance_transaction.created",
            transaction(&format!("{g}_in"), g, "credit", "credits_granted", 1000),
        ),
        (
            "billing.credit_balance_transaction.created",
            transaction(&format!("{g}_out"), g, "debit", "credits_applied", 300),
        ),
    ];
    objects
        .into_iter()
        .enumerate()
        .map(|(n, (kind, object))| {
            fake.holds(object.clone());
            event_of(&format!("evt_{g}_{n}"), kind, &object)
        })
        .collect()
}

async fn deliver(app: &TestApp, events: &[Value]) {
    for event in events {
        let (status, answer) = app.post("stripe", &stripe_delivery(event)).await;
        assert_eq!(status, http::StatusCode::OK, "{answer}");
        app.run_worker().await;
    }
}

/// The test source `stripe` reading the fake at `base`.
fn stripe_at(base: &str) -> Vec<CreditSource> {
    let mut entry = metered_entry("stripe", base, json!({"event_name": "api_calls"}));
    entry.as_object_mut().unwrap().remove("meter");
    let config = parse_sources(&json!([entry]).to_string())
        .unwrap()
        .remove(0);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let api = Api::for_source(&config, &http).expect("the source has an API key");
    vec![CreditSource {
        source: "stripe".into(),
        api,
    }]
}

async fn audit_now(pool: &PgPool, sources: &[CreditSource]) -> CreditAudit {
    let deadline = Instant::now() + Duration::from_secs(60);
    credits::run(pool, sources, credits::MAX_CHECKED_PER_RUN, deadline)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_grant_and_its_transactions_in_any_order_agree_with_stripes_summary(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let fake = FakeStripe::default();
    let in_order = granted_and_applied(&fake, "cus_AuditOrder1", "credgr_order1");
    let mut reversed = granted_and_applied(&fake, "cus_AuditOrder2", "credgr_order2");
    reversed.reverse();
    deliver(&app, &in_order).await;
    deliver(&app, &reversed).await;
    let server = fake.serve().await;

    let found = audit_now(&pool, &stripe_at(&server.uri())).await;
    assert_eq!(found.checked, 2, "{found:?}");
    assert_eq!(found.grants, 2, "{found:?}");
    assert!(found.errors.is_empty(), "{found:?}");
    assert!(found.differences.is_empty(), "{found:?}");
    assert_eq!(found.new, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_transaction_not_delivered_is_one_difference_alarmed_once_across_runs(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let fake = FakeStripe::default();
    let mut events = granted_and_applied(&fake, "cus_AuditMissed", "credgr_missed");
    // Stripe applied 300 of the grant; the event of it never came.
    events.pop();
    deliver(&app, &events).await;
    let server = fake.serve().await;
    let sources = stripe_at(&server.uri());

    let first = audit_now(&pool, &sources).await;
    assert!(first.errors.is_empty(), "{first:?}");
    assert_eq!(first.new, 1, "{first:?}");
    assert_eq!(first.differences.len(), 1);
    let d = &first.differences[0];
    assert_eq!(
        (d.grant_id.as_str(), d.unit.as_str()),
        ("credgr_missed", "usd")
    );
    assert_eq!(
        (d.ours.as_deref(), d.theirs.as_deref()),
        (Some("1000"), Some("700"))
    );

    let second = audit_now(&pool, &sources).await;
    assert_eq!(second.new, 0, "told once: {second:?}");
    assert_eq!(second.differences.len(), 1);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM credit_audit_differences")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);

    // The transaction comes late: the balances agree, the difference is resolved.
    let applied = transaction(
        "credgr_missed_out",
        "credgr_missed",
        "debit",
        "credits_applied",
        300,
    );
    deliver(
        &app,
        &[event_of(
            "evt_late",
            "billing.credit_balance_transaction.created",
            &applied,
        )],
    )
    .await;
    let third = audit_now(&pool, &sources).await;
    assert_eq!(third.resolved, 1, "{third:?}");
    assert!(third.differences.is_empty(), "{third:?}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_grant_only_stripe_knows_is_a_difference(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let fake = FakeStripe::default();
    let events = granted_and_applied(&fake, "cus_AuditUnknown", "credgr_known");
    deliver(&app, &events).await;
    // A second grant Stripe holds, of which no event came.
    granted_and_applied(&fake, "cus_AuditUnknown", "credgr_unknown");
    let server = fake.serve().await;

    let found = audit_now(&pool, &stripe_at(&server.uri())).await;
    assert!(found.errors.is_empty(), "{found:?}");
    assert_eq!(found.grants, 2, "{found:?}");
    let said: Vec<_> = found
        .differences
        .iter()
        .map(|d| (d.grant_id.as_str(), d.ours.as_deref(), d.theirs.as_deref()))
        .collect();
    assert_eq!(said, vec![("credgr_unknown", None, Some("700"))]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn every_grant_stripe_lists_is_read_past_its_first_page(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let fake = FakeStripe::default();
    let events = granted_and_applied(&fake, "cus_AuditPaged", "credgr_paged000");
    deliver(&app, &events).await;
    // 104 more grants at Stripe, none mirrored: more than Stripe's largest page (100).
    for n in 1..=104 {
        fake.holds(grant(&format!("credgr_paged{n:03}"), "cus_AuditPaged"));
    }
    // A second of Stripe's clock passes with each read, so that its rate limiter (25 reads a
    // second in a sandbox) is not what this test meets.
    let clock = fake.clone();
    fake.clock_at(Utc::now());
    fake.deciding_reads(move |_: &provider_fakes::stripe::Asked<'_>| {
        clock.clock_advance(TimeDelta::seconds(1));
        None
    });
    let server = fake.serve().await;

    let found = audit_now(&pool, &stripe_at(&server.uri())).await;
    assert!(found.errors.is_empty(), "{found:?}");
    assert_eq!(found.throttled, 0, "{found:?}");
    assert_eq!(found.grants, 105, "{found:?}");
    assert_eq!(
        found.differences.len(),
        104,
        "every unmirrored grant listed"
    );
    assert!(found
        .differences
        .iter()
        .all(|d| d.ours.is_none() && d.theirs.as_deref() == Some("0")));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn inboxctl_differences_lists_the_open_credit_and_meter_differences_and_not_resolved_ones(
    pool: PgPool,
) {
    use crate::cli::{database_url, inboxctl, run};
    let app = TestApp::spawn(pool.clone()).await;
    let fake = FakeStripe::default();
    let mut events = granted_and_applied(&fake, "cus_AuditListed", "credgr_listed");
    events.pop();
    deliver(&app, &events).await;
    let server = fake.serve().await;
    let found = audit_now(&pool, &stripe_at(&server.uri())).await;
    assert_eq!(found.new, 1, "{found:?}");
    // A meter difference open and one resolved, as the meter audit leaves them.
    sqlx::query(
        "INSERT INTO meter_audit_differences (source, customer_id, period, meter, ours, theirs,
                                              resolved_at)
         VALUES ('stripe', 'cus_MeterOpen', '2026-11', 'api_calls', 12, 9, NULL),
                ('stripe', 'cus_MeterDone', '2026-11', 'api_calls', 3, 2, now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let url = database_url(&pool).await;

    let (output, stdout, stderr) = run(inboxctl()
        .args(["differences", "--json"])
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    let credits = listed["credit_differences"].as_array().unwrap();
    assert_eq!(credits.len(), 1, "{listed}");
    assert_eq!(
        (
            &credits[0]["grant_id"],
            &credits[0]["ours"],
            &credits[0]["theirs"]
        ),
        (&json!("credgr_listed"), &json!("1000"), &json!("700"))
    );
    let meters = listed["meter_differences"].as_array().unwrap();
    assert_eq!(meters.len(), 1, "only the open one: {listed}");
    assert_eq!(
        (
            &meters[0]["customer_id"],
            &meters[0]["ours"],
            &meters[0]["theirs"]
        ),
        (&json!("cus_MeterOpen"), &json!(12), &json!(9.0))
    );

    let (output, stdout, stderr) = run(inboxctl().arg("differences").env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    assert!(
        stdout.contains("1 meter and 1 credits difference(s) open"),
        "{stdout}"
    );
    for shown in [
        "stripe/cus_AuditListed",
        "credgr_listed",
        "700",
        "cus_MeterOpen",
    ] {
        assert!(stdout.contains(shown), "{shown}: {stdout}");
    }
    assert!(!stdout.contains("cus_MeterDone"), "{stdout}");

    // The console's list (`GET /v1/admin/divergences`) answers the same, as docs/openapi.yaml
    // describes it.
    let state = crate::app_api::api_state(&pool);
    let answer = crate::app_api::call(
        &state,
        "GET",
        "/v1/admin/divergences",
        Some(crate::app_api::ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(answer.status, http::StatusCode::OK, "{}", answer.body);
    assert_eq!(
        answer.body["credit_differences"],
        listed["credit_differences"]
    );
    assert_eq!(
        answer.body["meter_differences"],
        listed["meter_differences"]
    );
    // The overview counts both and says where they are listed.
    let overview = crate::app_api::call(
        &state,
        "GET",
        "/v1/admin/overview",
        Some(crate::app_api::ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(overview.status, http::StatusCode::OK, "{}", overview.body);
    assert_eq!(overview.body["credit_differences_open"], 1);
    assert_eq!(overview.body["meter_reports"]["differences_open"], 1);
    let attention: Vec<(&str, &str)> = overview.body["needs_attention"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"].as_str().unwrap().ends_with("_differences"))
        .map(|a| (a["kind"].as_str().unwrap(), a["link"].as_str().unwrap()))
        .collect();
    assert_eq!(
        attention,
        [
            ("meter_differences", "divergences"),
            ("credit_differences", "divergences")
        ]
    );

    // Once resolved, nothing is listed.
    sqlx::query("UPDATE credit_audit_differences SET resolved_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE meter_audit_differences SET resolved_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    let (output, stdout, _) = run(inboxctl().arg("differences").env("DATABASE_URL", &url));
    assert!(output.status.success());
    assert!(stdout.contains("no open difference"), "{stdout}");
}
