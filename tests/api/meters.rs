//! Meter reports (docs/design.md §4.13): an accepted debit of a metered source writes its
//! report in the statement that accepts it, and the dispatcher tells the provider's meter
//! once — against fake provider APIs (wiremock) that take a report, fail, refuse, and answer
//! after the client gave up while keeping what they were sent, as Stripe does with an
//! `identifier` it holds. Retries run with zero waits.

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use http::StatusCode;
use serde_json::{json, Value};
use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest, Debited};
use shared::domain::meter::{identifier, MeterReport};
use shared::domain::retry::RetryPolicy;
use shared::domain::{CustomerId, Period, SourceKind};
use shared::handlers::dispatcher::{self, DispatcherState};
use shared::meters::outbox::{self, ReportStatus};
use shared::meters::{self, Meters, Reported};
use shared::platform::config::{parse_sources, DispatcherConfig, FromEnv, SourceConfig};
use shared::platform::queue::Queue;
use shared::providers::meter::Sent;
use shared::providers::{provider, Api};
use sqlx::PgPool;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::app_api::{api_state, call, on_pro};
use crate::helpers::*;
pub(crate) use provider_fakes::stripe::{FakeStripe, Fault};
use provider_fakes::traffic::Fault as ApiFault;
use provider_fakes::{FakeKinde, FakePolar, Metered};

const NO_WAITS: RetryPolicy = RetryPolicy::new([Duration::ZERO; 5]);
/// The client gives up on a send after this; the slow fake answers after three times as long.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(400);

pub(crate) fn customer(id: &str) -> CustomerId {
    CustomerId::parse(id).unwrap()
}

/// A debit of `amount` under `key` in this month, reported to `meter` when given.
pub(crate) fn ask<'a>(
    source: &'a str,
    customer: &'a CustomerId,
    key: &'a str,
    amount: i64,
    meter: Option<&'a str>,
) -> DebitRequest<'a> {
    DebitRequest {
        source,
        customer,
        key,
        amount,
        period: DebitPeriod::Arrival(Period::current()),
        note: None,
        effects: None,
        meter,
        unit: shared::billing::credits::ALLOWANCE_UNIT,
    }
}

pub(crate) async fn debit(pool: &PgPool, request: &DebitRequest<'_>) -> Debited {
    let mut conn = pool.acquire().await.unwrap();
    usage::debit(&mut conn, request).await.unwrap()
}

pub(crate) async fn reports(pool: &PgPool) -> Vec<outbox::ReportLine> {
    let mut conn = pool.acquire().await.unwrap();
    outbox::list(&mut conn, None, None, 100).await.unwrap()
}

pub(crate) async fn report(pool: &PgPool, id: &str) -> outbox::ReportLine {
    reports(pool)
        .await
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("report {id}"))
}

/// The source `name` of the test sources, its API at `base` with a key, and its meter: its
/// `INBOX_SOURCES` entry.
pub(crate) fn metered_entry(name: &str, base: &str, meter: Value) -> Value {
    let sources = shared::providers::fixtures::dev_sources(&shared::providers::fixtures::Local {
        jwks_url: &format!("{base}/.well-known/jwks"),
    });
    let mut source = sources
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no test source {name}"))
        .clone();
    source["api_key"] = json!("key_for_meters");
    source["api_base_url"] = json!(base);
    source["meter"] = meter;
    if source["kind"] == "kinde" {
        source["api_client_id"] = json!("m2m_client");
    }
    source
}

/// [`metered_entry`], as the configuration reads it.
pub(crate) fn metered(name: &str, base: &str, meter: Value) -> SourceConfig {
    parse_sources(&json!([metered_entry(name, base, meter)]).to_string())
        .unwrap()
        .remove(0)
}

/// The meters of `sources`, their client giving up after `timeout`.
pub(crate) fn meters_within(sources: &[SourceConfig], timeout: Duration) -> Meters {
    let http = reqwest::Client::builder().timeout(timeout).build().unwrap();
    Meters::build(sources, &http)
}

pub(crate) fn meters_of(sources: &[SourceConfig]) -> Meters {
    meters_within(sources, CLIENT_TIMEOUT)
}

/// The test source `stripe`, metered on `api_calls`, its API `server`.
pub(crate) fn stripe_meters(server: &MockServer) -> Meters {
    meters_of(&[metered(
        "stripe",
        &server.uri(),
        json!({"event_name": "api_calls"}),
    )])
}

pub(crate) async fn send(pool: &PgPool, meters: &Meters, id: &str) -> Reported {
    meters::send(pool, meters, id, outbox::SEND_LEASE, &NO_WAITS)
        .await
        .unwrap()
}

/// `customer` on Stripe's pro plan (500 this month), through the intake and the worker.
pub(crate) async fn stripe_on_pro(app: &TestApp, customer: &str) {
    let event = stripe_event(
        &format!("evt_{customer}_pro"),
        customer,
        Utc::now().timestamp(),
    );
    let (status, answer) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
}

/// `customer` on Polar's pro product (500 this month): its `subscription.active`, through the
/// intake and the worker.
pub(crate) async fn polar_on_pro(app: &TestApp, customer: &str) {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let event = json!({"type": "subscription.active", "timestamp": now,
        "data": {"id": format!("sub_{customer}"), "customer_id": customer, "status": "active",
                 "product_id": "prod_pro", "modified_at": now}});
    let (status, answer) = app
        .post(
            "polar",
            &polar_delivery(&format!("msg_{customer}_pro"), &event),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_accepted_debit_writes_its_report_in_its_own_statement_and_nothing_else_does(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_meter").await;
    let who = customer("kc_meter");

    let first = debit(&pool, &ask("kinde", &who, "req_1", 7, Some("api_calls"))).await;
    assert!(matches!(
        first.debit,
        Debit::Accepted {
            replayed: false,
            ..
        }
    ));
    let id = first.reported.clone().expect("an accepted debit's report");
    let row = report(&pool, &id).await;
    assert_eq!(
        (row.value, row.meter.as_str(), row.status.as_str()),
        (7, "api_calls", "pending")
    );
    assert_eq!(row.identifier, identifier("kinde", &who, "req_1"));
    assert_eq!(row.idempotency_key, "req_1");
    let recorded_at: chrono::DateTime<Utc> =
        sqlx::query_scalar("SELECT recorded_at FROM usage_debits WHERE usage_id = $1")
            .bind(&row.usage_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        row.occurred_at, recorded_at,
        "the report is timed by its debit"
    );

    // The same request again: its first answer, and no second report.
    let again = debit(&pool, &ask("kinde", &who, "req_1", 7, Some("api_calls"))).await;
    assert!(matches!(
        again.debit,
        Debit::Accepted { replayed: true, .. }
    ));
    assert_eq!(again.reported, None);
    // The key with another amount: a conflict, reported nowhere.
    let conflict = debit(&pool, &ask("kinde", &who, "req_1", 8, Some("api_calls"))).await;
    assert_eq!(conflict.debit, Debit::KeyConflict);
    assert_eq!(conflict.reported, None);
    // Past the allowance: refused, never reported.
    let refused = debit(
        &pool,
        &ask("kinde", &who, "req_big", 10_000, Some("api_calls")),
    )
    .await;
    assert!(matches!(refused.debit, Debit::Exhausted { .. }));
    assert_eq!(refused.reported, None);
    // A source without a meter reports nothing.
    let unmetered = debit(&pool, &ask("kinde", &who, "req_2", 1, None)).await;
    assert!(matches!(unmetered.debit, Debit::Accepted { .. }));
    assert_eq!(unmetered.reported, None);

    assert_eq!(
        reports(&pool).await.len(),
        1,
        "one report: the one accepted metered debit"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_through_the_api_reaches_stripes_meter_once_after_its_commit(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_metered").await;
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    let source = metered("stripe", &server.uri(), json!({"event_name": "api_calls"}));

    // The app's API, metered, handing reports to the dispatcher's queue.
    let outbox_url = create_queue(&app.sqs).await;
    let outbox_queue = Queue::new(app.sqs.clone(), outbox_url.clone());
    let mut api = api_state(&pool);
    api.outbox = Some(outbox_queue.clone());
    api.meters = HashMap::from([("stripe".to_owned(), "api_calls".to_owned())]);
    let answer = call(
        &api,
        "POST",
        "/v1/accounts/stripe/cus_metered/usage",
        Some(crate::app_api::APP_KEY),
        &[("idempotency-key", "req-42")],
        Some(json!({"amount": 3})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);

    // The dispatcher, fed by the queue as its event source mapping feeds it.
    let mut state = DispatcherState::new(
        pool.clone(),
        shared::effects::sinks::Sinks::from_config(&[]).unwrap(),
    );
    state.meters = meters_of(&[source]);
    state.retry = NO_WAITS;
    let pumped = app.drain(&outbox_url).await;
    assert_eq!(pumped.len(), 1, "one message: the report's id");
    let batch = sqs_bodies(&pumped);
    let response = dispatcher::handle_batch(&state, batch.clone()).await;
    assert!(response.batch_item_failures.is_empty());
    // SQS delivers a message twice now and then: the second finds the report sent.
    dispatcher::handle_batch(&state, batch).await;

    assert_eq!(fake.posts(), 1, "one request reached Stripe");
    let held = fake.held();
    let expected = identifier("stripe", &customer("cus_metered"), "req-42");
    let sent = &held[&expected];
    assert_eq!(sent["event_name"], "api_calls");
    assert_eq!(sent["payload[stripe_customer_id]"], "cus_metered");
    assert_eq!(sent["payload[value]"], "3");
    let row = &reports(&pool).await[0];
    assert_eq!(row.status, "sent");
    assert_eq!(sent["timestamp"], row.occurred_at.timestamp().to_string());
    let requests = server.received_requests().await.unwrap();
    assert_eq!(
        requests[0].headers.get("idempotency-key").unwrap(),
        format!("{}-1", row.id).as_str(),
        "the attempt's own key, never the identifier"
    );
    assert_eq!(
        requests[0].headers.get("authorization").unwrap(),
        "Bearer key_for_meters"
    );
}

/// The bodies `drain` received, as one SQS batch.
fn sqs_bodies(bodies: &[String]) -> aws_lambda_events::event::sqs::SqsEvent {
    let mut event = aws_lambda_events::event::sqs::SqsEvent::default();
    for (n, body) in bodies.iter().enumerate() {
        let mut message = aws_lambda_events::event::sqs::SqsMessage::default();
        message.message_id = Some(format!("m{n}"));
        message.body = Some(body.clone());
        event.records.push(message);
    }
    event
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_send_stripe_took_but_never_answered_is_resent_under_its_identifier_and_counted_once(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_slow").await;
    let fake = FakeStripe::default();
    fake.then(Fault::Slow(CLIENT_TIMEOUT * 3));
    let server = fake.serve().await;
    let meters = stripe_meters(&server);
    let who = customer("cus_slow");
    let id = debit(
        &pool,
        &ask("stripe", &who, "req_slow", 5, Some("api_calls")),
    )
    .await
    .reported
    .unwrap();

    // The first send reaches Stripe, which keeps it; its answer comes after the client gave up.
    let first = send(&pool, &meters, &id).await;
    assert!(
        matches!(&first, Reported::Failed { status: ReportStatus::Pending, error } if error.contains("no answer")),
        "{first:?}"
    );
    assert!(report(&pool, &id).await.unanswered);
    // The retry is the same identifier: Stripe says it has it, which is taken as the receipt.
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    assert_eq!(fake.posts(), 2);
    assert_eq!(fake.held().len(), 1, "Stripe counts the report once");
    assert_eq!(report(&pool, &id).await.status, "sent");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_failing_meter_is_retried_then_dead_alerted_once_and_replayed(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_down").await;
    let down = FakeStripe::failing(503, json!({"error": {"message": "Service unavailable"}}));
    let server = down.serve().await;
    let meters = stripe_meters(&server);
    let who = customer("cus_down");
    let id = debit(
        &pool,
        &ask("stripe", &who, "req_down", 2, Some("api_calls")),
    )
    .await
    .reported
    .unwrap();
    // While it waits, its age is what the pending-report alarm watches (written two hours ago).
    sqlx::query(
        "UPDATE meter_reports SET created_at = created_at - interval '2 hours' WHERE id = $1",
    )
    .bind(&id)
    .execute(&pool)
    .await
    .unwrap();
    let waiting = outbox::collect_alerts(&pool).await.unwrap();
    assert_eq!(waiting.pending, 1);
    assert!(
        waiting.oldest_pending_secs >= 7200.0,
        "{}",
        waiting.oldest_pending_secs
    );
    for _ in 0..RetryPolicy::MAX_ATTEMPTS {
        assert!(matches!(
            send(&pool, &meters, &id).await,
            Reported::Failed { .. }
        ));
    }
    let row = report(&pool, &id).await;
    assert_eq!(
        (row.status.as_str(), row.attempts),
        ("dead", RetryPolicy::MAX_ATTEMPTS)
    );
    assert!(row.last_error.unwrap().contains("Service unavailable"));
    assert_eq!(send(&pool, &meters, &id).await, Reported::Skipped);

    let alerts = outbox::collect_alerts(&pool).await.unwrap();
    assert_eq!(alerts.dead, vec![id.clone()]);
    assert_eq!(alerts.dead_total, 1);
    assert_eq!(
        (alerts.pending, alerts.oldest_pending_secs),
        (0, 0.0),
        "no report waits"
    );
    assert!(
        outbox::collect_alerts(&pool).await.unwrap().dead.is_empty(),
        "alerted once"
    );

    // Replayed after Stripe is back, the report is still one Stripe may hold: its identifier
    // is sent again, within Stripe's window.
    let queue = Queue::new(app.sqs.clone(), create_queue(&app.sqs).await);
    let replayed = outbox::replay(&pool, Some(&queue), std::slice::from_ref(&id), false)
        .await
        .unwrap();
    assert_eq!(replayed, vec![id.clone()]);
    let up = FakeStripe::default();
    let server = up.serve().await;
    let meters = stripe_meters(&server);
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    assert_eq!(up.held().len(), 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_report_stripe_refuses_is_dead_at_once(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_unknown_there").await;
    let refusing = FakeStripe::failing(
        400,
        json!({"error": {"type": "invalid_request_error", "code": "resource_missing",
                         "message": "No such customer: 'cus_unknown_there'"}}),
    );
    let server = refusing.serve().await;
    let meters = stripe_meters(&server);
    let who = customer("cus_unknown_there");
    let id = debit(&pool, &ask("stripe", &who, "req_1", 1, Some("api_calls")))
        .await
        .reported
        .unwrap();
    let sent = send(&pool, &meters, &id).await;
    assert!(
        matches!(&sent, Reported::Failed { status: ReportStatus::Dead, error } if error.contains("No such customer")),
        "{sent:?}"
    );
    assert_eq!(refusing.posts(), 1);
}

/// An unanswered report whose first send is older than Stripe's window is read back from the
/// meter's event summaries: found there, it is not sent again; not found, it is.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_unanswered_report_older_than_stripes_window_is_read_back_before_any_resend(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_old").await;
    let who = customer("cus_old");
    let mut ids = Vec::new();
    for key in ["req_held", "req_lost"] {
        let id = debit(&pool, &ask("stripe", &who, key, 4, Some("api_calls")))
            .await
            .reported
            .unwrap();
        ids.push(id);
    }
    // Both went out two days ago and were never answered; they are minutes apart.
    sqlx::query(
        "UPDATE meter_reports SET first_sent_at = now() - interval '2 days',
                unanswered_at = now() - interval '2 days',
                occurred_at = date_trunc('minute', now()) - interval '2 days'
                              + CASE WHEN idempotency_key = 'req_lost' THEN interval '5 minutes'
                                     ELSE interval '10 seconds' END",
    )
    .execute(&pool)
    .await
    .unwrap();
    let held_minute = (Utc::now() - chrono::Duration::days(2))
        .timestamp()
        .div_euclid(60)
        * 60;

    let fake = FakeStripe::default();
    let server = fake.serve().await;
    Mock::given(method("GET"))
        .and(path("/v1/billing/meters"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "list", "url": "/v1/billing/meters", "has_more": false,
            "data": [{"id": "mtr_other", "object": "billing.meter", "event_name": "seats"},
                     {"id": "mtr_123", "object": "billing.meter", "event_name": "api_calls"}]})))
        .mount(&server)
        .await;
    // Stripe counted 4 in the first report's minute, and nothing in the second's.
    Mock::given(method("GET"))
        .and(path("/v1/billing/meters/mtr_123/event_summaries"))
        .respond_with(move |request: &Request| {
            let query: HashMap<String, String> = request.url.query_pairs().into_owned().collect();
            let start: i64 = query["start_time"].parse().unwrap();
            let value = if start == held_minute { 4 } else { 0 };
            ResponseTemplate::new(200).set_body_json(json!({
                "object": "list", "has_more": false,
                "url": "/v1/billing/meters/mtr_123/event_summaries",
                "data": [{"id": "mtrusg_1", "object": "billing.meter_event_summary",
                          "aggregated_value": value, "start_time": start, "end_time": start + 60,
                          "livemode": false, "meter": "mtr_123"}]}))
        })
        .mount(&server)
        .await;
    let meters = stripe_meters(&server);
    assert_eq!(send(&pool, &meters, &ids[0]).await, Reported::Sent);
    assert_eq!(
        fake.posts(),
        0,
        "found in Stripe's summaries: not sent again"
    );
    assert_eq!(send(&pool, &meters, &ids[1]).await, Reported::Sent);
    assert_eq!(fake.posts(), 1, "missing from Stripe's summaries: sent");
}

/// Kinde documents no dedupe key and no read-back: after a send without an answer, the report
/// is never sent again by itself; an operator who sees Kinde without it replays it.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_unanswered_kinde_report_is_never_sent_twice_by_itself(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_metered").await;
    let kinde = FakeKinde::new("m2m_client", "key_for_meters");
    kinde.agreement(
        "kc_metered",
        json!({"id": "agreement_0195ac80a14c2ca2cec97d026d864de0", "plan_code": "pro",
               "expires_on": null, "billing_group_id": null,
               "current_period_start": "2026-12-01T00:00:00Z",
               "current_period_end": "2027-01-01T00:00:00Z",
               "entitlements": [{"feature_code": "api_calls",
                                 "entitlement_id": "entitlement_0195ac80a14e8d71f42b98e75d3c61ad"}]}),
    );
    // The first usage record fails inside Kinde, unanswered.
    kinde.then(Some("/api/v1/billing/meter_usage"), ApiFault::Fails(500));
    let server = kinde.serve().await;
    let usage_posts = || async {
        server
            .received_requests()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|r| {
                r.method.as_str() == "POST" && r.url.path() == "/api/v1/billing/meter_usage"
            })
            .collect::<Vec<_>>()
    };
    let meters = meters_of(&[metered(
        "kinde",
        &server.uri(),
        json!({"feature_code": "api_calls"}),
    )]);
    let who = customer("kc_metered");
    let id = debit(&pool, &ask("kinde", &who, "req_k", 6, Some("api_calls")))
        .await
        .reported
        .unwrap();
    let first = send(&pool, &meters, &id).await;
    assert!(
        matches!(
            first,
            Reported::Failed {
                status: ReportStatus::Pending,
                ..
            }
        ),
        "{first:?}"
    );
    let posted = usage_posts().await;
    assert_eq!(posted.len(), 1);
    let body: Value = serde_json::from_slice(&posted[0].body).unwrap();
    assert_eq!(
        body,
        json!({"customer_agreement_id": "agreement_0195ac80a14c2ca2cec97d026d864de0",
               "billing_feature_code": "api_calls", "meter_value": "6",
               "meter_usage_timestamp": report(&pool, &id).await.occurred_at
                   .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
               "meter_type_code": "delta"})
    );
    assert!(posted[0]
        .headers
        .get("authorization")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("Bearer "));
    assert!(
        kinde.usage().is_empty(),
        "Kinde kept nothing of the failed record"
    );
    // Every later attempt stops short of Kinde, and the report dies for an operator to see.
    for _ in 1..RetryPolicy::MAX_ATTEMPTS {
        let attempt = send(&pool, &meters, &id).await;
        assert!(
            matches!(&attempt, Reported::Failed { error, .. } if error.contains("not sent again")),
            "{attempt:?}"
        );
    }
    assert_eq!(usage_posts().await.len(), 1, "never a blind second send");
    let row = report(&pool, &id).await;
    assert_eq!((row.status.as_str(), row.unanswered), ("dead", true));
    // The operator saw Kinde without it: replayed as not held, it is sent.
    outbox::replay(&pool, None, std::slice::from_ref(&id), true)
        .await
        .unwrap();
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    assert_eq!(usage_posts().await.len(), 2);
    assert_eq!(kinde.usage().len(), 1, "Kinde holds the replayed record");
}

#[tokio::test]
async fn a_polar_report_is_one_ingested_event_that_polar_dedupes_by_external_id() {
    let polar = FakePolar::default();
    let server = polar.serve().await;
    let source = metered("polar", &server.uri(), json!({"event_name": "api_calls"}));
    let http = reqwest::Client::new();
    let meter = provider(SourceKind::StandardWebhooks)
        .meter(Api::for_source(&source, &http).unwrap(), "api_calls")
        .unwrap();
    let report = MeterReport {
        id: "mrp_00000000000000000000000000000001".into(),
        source: "polar".into(),
        customer: customer("992fae2a-2a17-4b7a-8d9e-e287cf90131b"),
        identifier: "bi_x".into(),
        meter: "api_calls".into(),
        value: 12,
        occurred_at: "2026-12-03T09:00:00Z".parse().unwrap(),
        first_sent_at: None,
        unanswered: false,
        take_back: None,
        send_key: None,
    };
    assert_eq!(meter.send(&report).await, Sent::Taken);
    assert_eq!(meter.dedupe(), shared::providers::meter::Dedupe::Always);
    let requests = server.received_requests().await.unwrap();
    let body: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(body["events"][0]["external_id"], "bi_x");
    assert_eq!(
        body["events"][0]["customer_id"],
        "992fae2a-2a17-4b7a-8d9e-e287cf90131b"
    );
    assert_eq!(body["events"][0]["metadata"]["value"], 12);
    assert_eq!(
        requests[0].headers.get("authorization").unwrap(),
        "Bearer key_for_meters"
    );
    // Sent again, Polar skips it as a duplicate: the meter counts it once.
    assert_eq!(meter.send(&report).await, Sent::Taken);
    assert_eq!(polar.events().len(), 1);
    assert_eq!(
        polar.total("api_calls", "992fae2a-2a17-4b7a-8d9e-e287cf90131b"),
        12.0
    );
}

#[test]
fn the_dispatcher_runs_for_effects_or_for_meters_and_refuses_neither() {
    let stripe = metered(
        "stripe",
        "http://127.0.0.1:9",
        json!({"event_name": "api_calls"}),
    );
    let sources = serde_json::to_string(&json!([{
        "name": stripe.name, "kind": "stripe", "secrets": ["whsec_x"], "api_key": "sk_test",
        "meter": {"event_name": "api_calls"}}]))
    .unwrap();
    let env = |sources: Option<String>| {
        move |var: &str| match var {
            "DATABASE_URL" => Some("postgres://u@127.0.0.1:1/db".to_owned()),
            "INBOX_SOURCES" => sources.clone(),
            _ => None,
        }
    };
    let config = DispatcherConfig::from_lookup(env(Some(sources))).unwrap();
    assert!(config.effects.is_none());
    assert_eq!(config.sources.len(), 1);
    let error = DispatcherConfig::from_lookup(env(None))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("the dispatcher has nothing to send"),
        "{error}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_report_the_queue_lost_is_sent_by_the_scheduler(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_lost").await;
    let who = customer("kc_lost");
    let id = debit(&pool, &ask("kinde", &who, "req_lost", 1, Some("api_calls")))
        .await
        .reported
        .unwrap();
    // The API's send to the queue never happened (it crashed right after the commit).
    sqlx::query("UPDATE meter_reports SET enqueued_at = NULL")
        .execute(&pool)
        .await
        .unwrap();
    let outbox_url = create_queue(&app.sqs).await;
    let scheduler = shared::handlers::scheduler::SchedulerState {
        outbox: Some(Queue::new(app.sqs.clone(), outbox_url.clone())),
        ..crate::scheduler::scheduler_for(&app, vec![])
    };
    let run = shared::handlers::scheduler::run(&scheduler).await;
    assert!(run.errors.is_empty(), "{:?}", run.errors);
    assert_eq!(run.rescued_reports, vec![id.clone()]);
    assert_eq!(app.drain(&outbox_url).await, vec![id]);
    assert_eq!(run.report_alerts.pending, 1);
}

const METER_NOTICE: &str = "evt_test_65TmeterErr0rReport16T2Kfo4Q8lSA4GfMwNYbNqc";

/// Stripe's notice `METER_NOTICE`, made an hour ago, that it could not count the meter event
/// `identifier`: delivered thin (no `data`), read back as `GET /v2/core/events/{id}` from
/// `api` in the shape of stripe-node's `V1BillingMeterErrorReportTriggeredEvent`, and applied.
/// Returns the stored event's id.
async fn meter_error_notice(app: &TestApp, api: &MockServer, identifier: &str) -> i64 {
    let made = Utc::now() - chrono::Duration::hours(1);
    let at = |t: chrono::DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let notification = json!({
        "id": METER_NOTICE, "object": "v2.core.event",
        "type": "v1.billing.meter.error_report_triggered", "livemode": false,
        "created": at(made), "context": null, "reason": null,
        "related_object": {"id": "mtr_123", "type": "billing.meter",
                           "url": "/v1/billing/meters/mtr_123"}
    });
    let mut read = notification.clone();
    read["data"] = json!({
        "developer_message_summary": "There is 1 invalid event",
        "validation_start": at(made - chrono::Duration::hours(1)),
        "validation_end": at(made),
        "reason": {"error_count": 1, "error_types": [{
            "code": "meter_event_customer_not_found", "error_count": 1,
            "sample_errors": [{"error_message": "Customer cus_counted not found",
                               "request": {"identifier": identifier}}]}]}
    });
    Mock::given(method("GET"))
        .and(path(format!("/v2/core/events/{METER_NOTICE}")))
        .respond_with(ResponseTemplate::new(200).set_body_json(read))
        .mount(api)
        .await;
    let (status, body) = app.post("stripe", &stripe_delivery(&notification)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    app.run_worker().await;
    app.event_id("stripe", METER_NOTICE).await
}

/// Two reports Stripe took two hours ago.
async fn two_sent_reports(pool: &PgPool, who: &CustomerId) -> (String, String) {
    let bad = debit(pool, &ask("stripe", who, "req_bad", 2, Some("api_calls")))
        .await
        .reported
        .unwrap();
    let good = debit(pool, &ask("stripe", who, "req_good", 3, Some("api_calls")))
        .await
        .reported
        .unwrap();
    sqlx::query(
        "UPDATE meter_reports SET status = 'sent', sent_at = now() - interval '2 hours',
                first_sent_at = now() - interval '2 hours', last_sent_at = now() - interval '2 hours'",
    )
    .execute(pool)
    .await
    .unwrap();
    (bad, good)
}

/// Stripe's notice that meter events it took could not be counted marks the reports it names
/// dead with Stripe's reason, alerted, and counted.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_meter_error_report_from_stripe_marks_the_reports_it_names(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_counted").await;
    let api = MockServer::start().await;
    crate::traffic::with_stripe_api(&mut app.worker, &api);
    let who = customer("cus_counted");
    let (bad, good) = two_sent_reports(&pool, &who).await;
    let bad_identifier = report(&pool, &bad).await.identifier;

    let event_id = meter_error_notice(&app, &api, &bad_identifier).await;
    let event = app.event(event_id).await;
    assert_eq!(event.status, "applied", "{:?}", event.reason);
    assert!(
        event.reason.as_deref().unwrap().contains(&bad),
        "{:?}",
        event.reason
    );
    let marked = report(&pool, &bad).await;
    assert_eq!(marked.status, "dead");
    assert_eq!(
        marked.provider_error.as_deref(),
        Some("meter_event_customer_not_found: Customer cus_counted not found")
    );
    assert_eq!(
        report(&pool, &good).await.status,
        "sent",
        "a report it does not name stands"
    );
    let alerts = outbox::collect_alerts(&pool).await.unwrap();
    assert_eq!((alerts.dead, alerts.provider_errors), (vec![bad], 1));
}

/// Stripe names a sample by the request's idempotency key (stripe-node: `request.identifier`,
/// "The request idempotency key"): an attempt's key, which begins with the report's id, names
/// the report as its identifier does.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_meter_error_report_naming_an_attempts_key_marks_its_report(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_counted").await;
    let api = MockServer::start().await;
    crate::traffic::with_stripe_api(&mut app.worker, &api);
    let who = customer("cus_counted");
    let (bad, good) = two_sent_reports(&pool, &who).await;
    meter_error_notice(&app, &api, &format!("{bad}-1")).await;
    assert_eq!(report(&pool, &bad).await.status, "dead");
    assert_eq!(report(&pool, &good).await.status, "sent");
}

/// A replayed notice speaks of the sends before it: the report it named, fixed by an operator
/// and sent again since (Stripe counted it), is not marked dead again.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_replayed_meter_error_notice_leaves_a_report_sent_again_since_alone(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_counted").await;
    let api = MockServer::start().await;
    crate::traffic::with_stripe_api(&mut app.worker, &api);
    let who = customer("cus_counted");
    let (bad, _good) = two_sent_reports(&pool, &who).await;
    let bad_identifier = report(&pool, &bad).await.identifier;
    let event_id = meter_error_notice(&app, &api, &bad_identifier).await;
    assert_eq!(report(&pool, &bad).await.status, "dead");

    // The operator fixes the customer at Stripe and replays the report: Stripe counts it.
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    outbox::replay(&pool, None, std::slice::from_ref(&bad), true)
        .await
        .unwrap();
    assert_eq!(
        send(&pool, &stripe_meters(&server), &bad).await,
        Reported::Sent
    );
    assert_eq!(fake.total("cus_counted"), 2.0);

    // The notice is replayed (an operator's bulk replay, a reconciliation's copy).
    let queue = Queue::new(app.sqs.clone(), app.queue_url.clone());
    shared::inbox::replay::replay(&pool, &queue, &[event_id])
        .await
        .unwrap();
    app.run_worker().await;
    let again = report(&pool, &bad).await;
    assert_eq!(
        (again.status.as_str(), again.provider_error.as_deref()),
        ("sent", None),
        "{:?}",
        again.last_error
    );
    let event = app.event(event_id).await;
    assert_eq!(event.status, "ignored", "{:?}", event.reason);
}

/// A connected account's customer's report is read back in that account: its meter and its
/// summaries are the connected account's own (`Stripe-Account`), not the platform's.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_connected_customers_report_is_read_back_in_its_account(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let mut event = stripe_event("evt_conn_meter", "cus_conn", Utc::now().timestamp());
    event["account"] = json!("acct_1Conn");
    let (status, answer) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    let who = customer("acct_1Conn/cus_conn");
    let id = debit(
        &pool,
        &ask("stripe", &who, "req_conn", 4, Some("api_calls")),
    )
    .await
    .reported
    .unwrap();
    sqlx::query(
        "UPDATE meter_reports SET first_sent_at = now() - interval '2 days',
                unanswered_at = now() - interval '2 days',
                occurred_at = date_trunc('minute', now()) - interval '2 days'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    Mock::given(method("GET"))
        .and(path("/v1/billing/meters"))
        .and(wiremock::matchers::header("Stripe-Account", "acct_1Conn"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "list", "url": "/v1/billing/meters", "has_more": false,
            "data": [{"id": "mtr_conn", "object": "billing.meter", "event_name": "api_calls"}]})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/billing/meters/mtr_conn/event_summaries"))
        .and(wiremock::matchers::header("Stripe-Account", "acct_1Conn"))
        .and(wiremock::matchers::query_param("customer", "cus_conn"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "list", "has_more": false,
            "url": "/v1/billing/meters/mtr_conn/event_summaries",
            "data": [{"id": "mtrusg_1", "object": "billing.meter_event_summary",
                      "aggregated_value": 4, "livemode": false, "meter": "mtr_conn"}]})))
        .mount(&server)
        .await;
    let meters = stripe_meters(&server);
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    assert_eq!(
        fake.posts(),
        0,
        "found in the connected account's summaries"
    );
}

/// Stripe's answer to a server error, as its API gives one.
fn api_error() -> Value {
    json!({"error": {"type": "api_error", "message": "An unknown error occurred"}})
}

/// Stripe saves the first answer to an `Idempotency-Key` for 24 hours, 500s included: each
/// attempt sends a key of its own, so a report whose first send got a 500 is sent on its next
/// attempt, and one Stripe took before its 500 is found by its identifier, counted once.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_report_whose_first_send_got_a_500_is_delivered_on_its_next_attempt(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_saved").await;
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    let meters = stripe_meters(&server);
    let who = customer("cus_saved");
    let lost = debit(
        &pool,
        &ask("stripe", &who, "req_lost", 3, Some("api_calls")),
    )
    .await
    .reported
    .unwrap();
    let taken = debit(
        &pool,
        &ask("stripe", &who, "req_taken", 4, Some("api_calls")),
    )
    .await
    .reported
    .unwrap();
    fake.then(Fault::Fails(500, api_error()))
        .then(Fault::TakesThenFails(500, api_error()));
    for id in [&lost, &taken] {
        let first = send(&pool, &meters, id).await;
        assert!(
            matches!(
                &first,
                Reported::Failed {
                    status: ReportStatus::Pending,
                    ..
                }
            ),
            "{first:?}"
        );
    }
    assert_eq!(send(&pool, &meters, &lost).await, Reported::Sent);
    assert_eq!(send(&pool, &meters, &taken).await, Reported::Sent);
    assert_eq!(fake.total("cus_saved"), 7.0, "each counted once");
    assert_eq!(fake.events().len(), 2);
}

/// Two reports of one minute (of `values`), the debits of the same account at Stripe's
/// meter. Both went out a day ago, during an incident: the first before Stripe took it, the
/// second after (its 500 lost the receipt); every later attempt met a 503, and both died
/// unanswered. 25 hours later, past Stripe's 24 hours for an identifier, an operator replays
/// them (as ones Stripe may hold). Returns their ids.
async fn an_incidents_minute(
    pool: &PgPool,
    fake: &FakeStripe,
    meters: &Meters,
    who: &CustomerId,
    values: [i64; 2],
) -> (String, String) {
    let first = debit(
        pool,
        &ask("stripe", who, "req_first", values[0], Some("api_calls")),
    )
    .await
    .reported
    .unwrap();
    let second = debit(
        pool,
        &ask("stripe", who, "req_second", values[1], Some("api_calls")),
    )
    .await
    .reported
    .unwrap();
    // One minute of a day ago.
    sqlx::query(
        "UPDATE meter_reports SET occurred_at = date_trunc('minute', now()) - interval '25 hours'
                + CASE WHEN idempotency_key = 'req_first' THEN interval '10 seconds'
                       ELSE interval '40 seconds' END",
    )
    .execute(pool)
    .await
    .unwrap();
    fake.then(Fault::Fails(500, api_error()));
    send(pool, meters, &first).await;
    fake.then(Fault::TakesThenFails(500, api_error()));
    send(pool, meters, &second).await;
    for _ in 1..RetryPolicy::MAX_ATTEMPTS {
        for id in [&first, &second] {
            fake.then(Fault::Fails(503, api_error()));
            send(pool, meters, id).await;
        }
    }
    for id in [&first, &second] {
        let died = report(pool, id).await;
        assert_eq!((died.status.as_str(), died.unanswered), ("dead", true));
    }
    fake.age(chrono::Duration::hours(25));
    sqlx::query(
        "UPDATE meter_reports SET first_sent_at = first_sent_at - interval '25 hours',
                last_sent_at = last_sent_at - interval '25 hours',
                unanswered_at = unanswered_at - interval '25 hours'",
    )
    .execute(pool)
    .await
    .unwrap();
    let replayed = outbox::replay(pool, None, &[first.clone(), second.clone()], false)
        .await
        .unwrap();
    assert_eq!(replayed.len(), 2);
    (first, second)
}

/// What this store says it sent to the meter for the account.
async fn ours(pool: &PgPool, customer_id: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(CASE kind WHEN 'correction' THEN -value ELSE value END), 0)::bigint
         FROM meter_reports WHERE customer_id = $1 AND status = 'sent'",
    )
    .bind(customer_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Stripe's summary of the minute says 5: the 5's. Read back one after the other, the 3 asks
/// first and must not be credited with it; it is sent, and the 5 is found. Stripe counts 8,
/// as this store does, and the meter audit finds no difference.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_minutes_total_is_never_credited_to_the_report_that_reads_it_back_first(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_minute").await;
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    let meters = stripe_meters(&server);
    let who = customer("cus_minute");
    let (three, five) = an_incidents_minute(&pool, &fake, &meters, &who, [3, 5]).await;

    assert_eq!(send(&pool, &meters, &three).await, Reported::Sent);
    assert_eq!(send(&pool, &meters, &five).await, Reported::Sent);
    assert_eq!(
        (fake.total("cus_minute"), ours(&pool, "cus_minute").await),
        (8.0, 8),
        "Stripe counts what this store says it sent"
    );
    assert_eq!(fake.events().len(), 2, "the 3 sent once, the 5 never again");

    // Later, the meter audit compares the month: no difference.
    sqlx::query("UPDATE meter_reports SET sent_at = sent_at - interval '20 minutes'")
        .execute(&pool)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let audit = shared::meters::audit::run(&pool, &meters, None, 50, deadline)
        .await
        .unwrap();
    assert_eq!(audit.checked, 1, "{audit:?}");
    assert!(audit.differences.is_empty(), "{audit:?}");
}

/// The same minute, both read back at once (two dispatchers): each reads Stripe's 5 before
/// the other is settled. Neither takes the 5 as its own but the 5: the 3 is sent.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_minutes_reports_read_back_at_once_are_not_both_taken_as_held(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_both").await;
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    let meters = stripe_meters(&server);
    let who = customer("cus_both");
    let (three, five) = an_incidents_minute(&pool, &fake, &meters, &who, [3, 5]).await;

    // The summaries answer slowly: both reads are out before either answer comes.
    fake.summaries_after(Duration::from_millis(200));
    let (a, b) = tokio::join!(send(&pool, &meters, &three), send(&pool, &meters, &five));
    assert_eq!((a, b), (Reported::Sent, Reported::Sent));
    assert_eq!(
        (fake.total("cus_both"), ours(&pool, "cus_both").await),
        (8.0, 8)
    );
}

/// Two reports of 3 in one minute, both unanswered a day ago; Stripe counts 3. Either may be
/// the one it holds, and nothing here can tell: each goes to an operator, with both totals,
/// never credited nor sent blindly.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn reports_a_minutes_total_cannot_tell_apart_go_to_an_operator_with_both_totals(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_twins").await;
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    let meters = stripe_meters(&server);
    let who = customer("cus_twins");
    let (first, second) = an_incidents_minute(&pool, &fake, &meters, &who, [3, 3]).await;
    assert_eq!(fake.events().len(), 1, "Stripe took the second");

    for id in [&first, &second] {
        let sent = send(&pool, &meters, id).await;
        assert!(
            matches!(&sent, Reported::Failed { status: ReportStatus::Dead, error }
                if error.contains("cannot tell") && error.contains("counts 3")),
            "{sent:?}"
        );
    }
    assert_eq!(fake.events().len(), 1, "nothing sent blindly");
    let alerts = outbox::collect_alerts(&pool).await.unwrap();
    assert_eq!(alerts.dead.len(), 2);
}

/// The dev stack's sources on the fakes (`inboxctl dev sources --fakes-port P`, as scripts/dev
/// gives them, docs/design.md §6.6) are metered: a debit's report is written under the Stripe
/// source's meter and reaches the fake Stripe's meter on the fakes' port, as `inboxctl usage`
/// in the dev stack writes and the dispatcher sends it.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_dev_sources_on_the_fakes_report_usage_to_the_fake_stripe_meter(pool: PgPool) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = FakeStripe::default();
    let server = provider_fakes::ProviderServer::listening(&provider_fakes::STRIPE, listener).await;
    fake.mount(&server).await;
    let (output, stdout, stderr) = crate::cli::run(crate::cli::inboxctl().args([
        "dev",
        "sources",
        "--jwks-url",
        "http://127.0.0.1:61999/jwks.json",
        "--fakes-port",
        &port.to_string(),
    ]));
    assert!(output.status.success(), "{stderr}");
    let sources = parse_sources(stdout.trim()).unwrap();
    let stripe = sources
        .iter()
        .find(|s| s.kind == SourceKind::Stripe)
        .unwrap();
    let meter = stripe
        .meter
        .as_ref()
        .and_then(|m| m.name())
        .expect("the dev Stripe source has a meter on the fakes");
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_dev_fakes").await;
    let who = customer("cus_dev_fakes");
    let id = debit(&pool, &ask(&stripe.name, &who, "req_dev", 3, Some(meter)))
        .await
        .reported
        .expect("a metered debit writes its report");
    assert_eq!(send(&pool, &meters_of(&sources), &id).await, Reported::Sent);
    assert_eq!(
        fake.total("cus_dev_fakes"),
        3.0,
        "the fake's api_calls counts it"
    );
}
