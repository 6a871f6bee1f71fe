//! Stripe through Amazon EventBridge (docs/design.md §1.1): the rule on the partner bus
//! invokes the bridge function with the event Stripe documents for EventBridge destinations
//! (`version`, `id`, `detail-type` = the Stripe type, `source` = `aws.partner/stripe.com/…`,
//! `account`, `time`, `region`, `resources`, `detail` = the Stripe event; sources in
//! `testdata/providers/README.md`). Its `detail` is stored, deduped and enqueued as the signed
//! HTTPS delivery of the same event is, then applied by the worker.

use serde_json::{json, Value};
use shared::handlers::bridge::{self, BridgeError, BridgeState};
use shared::platform::queue::Queue;
use sqlx::PgPool;

use crate::corpus::{assert_generation, corpus, corpus_app, BASIL};
use crate::helpers::*;
use crate::thin::{app_with_api, period, shows, status_of, thin_events, CUSTOMER};

/// The partner event source the tests' bridge takes (a destination id as Stripe names it).
const PARTNER: &str = "aws.partner/stripe.com/ed_test_61RBridge00000001";

/// The EventBridge event carrying `detail` from `source`, as Stripe's destination puts it on
/// the partner bus, and parsed as the Lambda runtime parses the invocation: the envelope AWS
/// documents for every event on a bus (`id` a version 4 UUID, `account` 12 digits;
/// https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-events-structure.html).
fn envelope_from(
    source: &str,
    detail: &Value,
) -> aws_lambda_events::event::eventbridge::EventBridgeEvent {
    let time = match &detail["created"] {
        Value::Number(n) => chrono::DateTime::from_timestamp(n.as_i64().unwrap(), 0)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        Value::String(s) => s.clone(),
        _ => chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    };
    let event = json!({
        "version": "0",
        "id": uuid::Uuid::new_v4().to_string(),
        "detail-type": detail["type"].as_str().unwrap_or("unknown"),
        "source": source,
        "account": "123456789012",
        "time": time,
        "region": "us-east-1",
        "resources": [],
        "detail": detail,
    });
    serde_json::from_value(event).expect("the documented envelope parses")
}

fn envelope(detail: &Value) -> aws_lambda_events::event::eventbridge::EventBridgeEvent {
    envelope_from(PARTNER, detail)
}

/// The bridge for the test app's source `stripe`, on `pool`, sending to the app's queue.
fn bridge_on(app: &TestApp, pool: PgPool) -> BridgeState {
    let queue = Queue::new(app.sqs.clone(), app.queue_url.clone());
    BridgeState::new(pool, queue, PARTNER, "stripe")
}

async fn through_the_bus(state: &BridgeState, detail: &Value) -> Value {
    bridge::handle(state, envelope(detail))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", detail["id"]))
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_basil_corpus_through_the_bus_is_stored_enqueued_and_applied_as_over_https(
    pool: PgPool,
) {
    let app = corpus_app(pool.clone()).await;
    let state = bridge_on(&app, pool);
    for (name, detail) in corpus("stripe/basil") {
        let answer = through_the_bus(&state, &detail).await;
        assert_eq!(answer["status"], "stored", "{name}: {answer}");
        let id = answer["event_id"].as_i64().unwrap();
        let row = app.event(id).await;
        assert_eq!(row.source, "stripe");
        assert_eq!(
            row.dedupe_key,
            detail["id"].as_str().unwrap(),
            "keyed by the event id"
        );
        assert_eq!(row.event_type, detail["type"].as_str().unwrap());
        assert_eq!(app.run_worker().await, 1, "{name} was enqueued");
        let row = app.event(id).await;
        assert!(
            row.status == "applied" || row.status == "ignored",
            "{name} is {}: {:?}",
            row.status,
            row.reason
        );
    }
    assert_generation(&app, BASIL).await;
    // Each field's deciding event says it came through the bus.
    let audit = app.audit().await;
    assert_eq!(audit.divergent, []);
    let customers: Vec<String> = sqlx::query_scalar("SELECT customer_id FROM accounts")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    for customer in customers {
        let why = app.why("stripe", &customer, Cut::default()).await;
        for f in why.fields.iter().filter_map(|f| f.decided_by.as_ref()) {
            assert_eq!(
                f.via,
                shared::billing::fold::Via::EventBridge,
                "{customer}: {f:?}"
            );
        }
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_event_through_the_bus_is_read_and_applied(pool: PgPool) {
    let (app, api) = app_with_api(pool.clone()).await;
    let state = bridge_on(&app, pool);
    shows(&api, "subscription.active").await;
    let thin = thin_events().remove(1);
    assert!(thin["type"].as_str().unwrap().starts_with("v1."), "{thin}");

    let answer = through_the_bus(&state, &thin).await;
    assert_eq!(answer["status"], "stored", "{answer}");
    app.run_worker().await;

    let row = status_of(&app, thin["id"].as_str().unwrap()).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let account = app.account("stripe", CUSTOMER, &period()).await;
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!(account.plan, "pro");
}

/// One event by both ways in, in the order given: stored once, the second a duplicate.
async fn both_ways(pool: PgPool, bus_first: bool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = bridge_on(&app, pool);
    let event = stripe_event("evt_1BothWays", "cus_both", chrono::Utc::now().timestamp());
    let over_https = || async {
        let (status, answer) = app.post("stripe", &stripe_delivery(&event)).await;
        assert_eq!(status, http::StatusCode::OK, "{answer}");
        answer
    };
    let (first, second) = if bus_first {
        let first = through_the_bus(&state, &event).await;
        (first, over_https().await)
    } else {
        let first = over_https().await;
        (first, through_the_bus(&state, &event).await)
    };
    assert_eq!(first["status"], "stored", "{first}");
    assert_eq!(second["status"], "duplicate", "{second}");
    assert_eq!(first["event_id"], second["event_id"]);
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 1);
    let id = first["event_id"].as_i64().unwrap();
    assert_eq!(app.verdicts(id).await, ["stored", "duplicate"]);
    // The bus's delivery row says how it came, under the EventBridge event's id.
    let (via, delivery_id): (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT headers->>'via', delivery_id FROM deliveries
         WHERE event_id = $1 AND headers ? 'eventbridge-source'",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(via.as_deref(), Some("eventbridge"));
    assert!(
        delivery_id.is_some_and(|d| uuid::Uuid::parse_str(&d).is_ok()),
        "the EventBridge event's id"
    );
    assert_eq!(app.event(id).await.seen_count, 2);
    app.run_worker().await;
    assert_eq!(app.event(id).await.status, "applied");
    assert_eq!(
        app.account("stripe", "cus_both", &period()).await.plan,
        "pro"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_over_https_then_through_the_bus_is_stored_once(pool: PgPool) {
    both_ways(pool, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_through_the_bus_then_over_https_is_stored_once(pool: PgPool) {
    both_ways(pool, true).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_from_another_source_is_refused_and_nothing_is_stored(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = bridge_on(&app, pool);
    let event = stripe_event(
        "evt_1Foreign",
        "cus_foreign",
        chrono::Utc::now().timestamp(),
    );
    for source in [
        "aws.partner/stripe.com/ed_test_61ROtherDest00001",
        "aws.partner/example.com/ed_test_61RBridge00000001",
        "stripe.custom",
    ] {
        let refused = bridge::handle(&state, envelope_from(source, &event))
            .await
            .expect_err(source);
        assert!(
            matches!(&refused, BridgeError::ForeignSource { got } if got == source),
            "{refused:?}"
        );
        assert_eq!(refused.code(), "foreign_source");
    }
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM deliveries").await, 0);
    assert!(app.drain_queue().await.is_empty());
}

/// A Postgres URL on which nothing listens: the database is down.
fn unreachable_database_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("postgres://postgres@127.0.0.1:{port}/down")
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_database_that_cannot_be_reached_is_an_error_that_eventbridge_retries(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let down = bridge_on(
        &app,
        shared::platform::db::lazy_pool(&unreachable_database_url(), 2).unwrap(),
    );
    let event = stripe_event("evt_1DbDown", "cus_down", chrono::Utc::now().timestamp());
    let envelope = envelope(&event);

    let failed = bridge::handle(&down, envelope.clone())
        .await
        .expect_err("no database, no success");
    assert!(
        matches!(failed, BridgeError::StoreUnavailable(_)),
        "{failed:?}"
    );
    assert!(
        !failed.to_string().contains("postgres://"),
        "no connection details in the error: {failed}"
    );
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);

    // Lambda's retry of the same invocation, once the database is back: stored and sent.
    let up = bridge_on(&app, pool);
    let answer = bridge::handle(&up, envelope).await.unwrap();
    assert_eq!(answer["status"], "stored");
    assert_eq!(
        app.drain_queue().await,
        [answer["event_id"].as_i64().unwrap()]
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_detail_that_is_no_stripe_event_is_kept_unprocessable_and_acknowledged(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = bridge_on(&app, pool);
    for (detail, said) in [
        (
            json!({"object": "event", "type": "invoice.paid", "created": 1}),
            "no id",
        ),
        (
            json!({"id": "evt_1NoType", "object": "event", "created": 1}),
            "no type",
        ),
    ] {
        let answer = through_the_bus(&state, &detail).await;
        assert_eq!(answer["status"], "stored", "{answer}");
        let row = app.event(answer["event_id"].as_i64().unwrap()).await;
        assert_eq!(row.status, "unprocessable");
        assert!(
            row.reason.as_deref().unwrap().contains(said),
            "{:?}",
            row.reason
        );
        assert!(row.enqueued_at.is_none(), "nothing to apply: not enqueued");
    }
    assert!(app.drain_queue().await.is_empty());
}

/// The intake's configuration with `sources`, and the bus feeding `stripe` when `bus_fed`.
fn intake_config(
    pool: &PgPool,
    sources: Value,
    bus_fed: bool,
) -> Result<shared::platform::config::IntakeConfig, shared::platform::config::ConfigError> {
    use shared::platform::config::FromEnv;
    let options = pool.connect_options();
    let url = format!(
        "postgres://postgres@{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap()
    );
    shared::platform::config::IntakeConfig::from_lookup(move |var| match var {
        "DATABASE_URL" => Some(url.clone()),
        "QUEUE_URL" => Some("http://127.0.0.1:1/000000000000/unused".into()),
        "INBOX_SOURCES" => Some(sources.to_string()),
        "INBOX_STRIPE_EVENT_SOURCE_FOR" if bus_fed => Some("stripe".into()),
        _ => None,
    })
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_stripe_source_fed_only_by_the_bus_needs_no_signing_secret_and_refuses_https(
    pool: PgPool,
) {
    let bus_only = json!([{"name": "stripe", "kind": "stripe"}]);
    // Without the bus, a Stripe source with no signing secret stops the intake's cold start.
    let config = intake_config(&pool, bus_only.clone(), false).unwrap();
    let refused = shared::handlers::intake::IntakeState::from_config(&config).await;
    assert!(refused.is_err(), "a Stripe source needs its secrets");

    // Fed by the bus, it needs none: the intake starts, and its HTTPS route says why not.
    let config = intake_config(&pool, bus_only, true).unwrap();
    let state = shared::handlers::intake::IntakeState::from_config(&config)
        .await
        .expect("the intake starts");
    let event = stripe_event("evt_1HttpsToBus", "cus_1", chrono::Utc::now().timestamp());
    let delivery = stripe_delivery(&event);
    let mut request = http::Request::builder()
        .method("POST")
        .uri("https://example.test/webhooks/stripe");
    for (name, value) in &delivery.headers {
        request = request.header(name, value);
    }
    let response = shared::handlers::intake::handle(
        &state,
        request
            .body(lambda_http::Body::from(delivery.body.clone()))
            .unwrap(),
    )
    .await;
    assert_eq!(response.status(), 404);
    let lambda_http::Body::Text(body) = response.body() else {
        panic!("a JSON answer")
    };
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["code"], "eventbridge_only", "{body}");
    assert!(body["detail"]
        .as_str()
        .unwrap()
        .contains("Amazon EventBridge"));
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0);
}
