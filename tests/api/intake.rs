//! The intake's contract (docs/design.md §5.1): every row of the answer table.

use std::net::TcpListener;

use chrono::Utc;
use futures::future::join_all;
use http::StatusCode;
use serde_json::json;
use shared::handlers::intake::IntakeState;
use shared::platform::config::FromEnv;
use shared::platform::queue::Queue;
use sqlx::PgPool;

use crate::helpers::*;

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn new_event_is_stored_enqueued_and_answered_with_its_id(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let created = Utc::now().timestamp() - 30;
    let event = stripe_event("evt_new", "cus_1", created);

    let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "stored");
    let id = body["event_id"]
        .as_i64()
        .expect("the answer carries the event id");
    let row = app.event(id).await;
    assert_eq!(row.source, "stripe");
    assert_eq!(row.dedupe_key, "evt_new");
    assert_eq!(row.event_type, "customer.subscription.updated");
    assert_eq!(row.status, "received");
    assert_eq!(row.seen_count, 1);
    assert_eq!(row.customer_key.as_deref(), Some("cus_1"));
    assert_eq!(row.occurred_at.unwrap().timestamp(), created);
    assert!(
        row.enqueued_at.is_some(),
        "enqueued_at is recorded after the send"
    );
    assert_eq!(row.payload.unwrap()["id"], "evt_new");
    assert_eq!(app.verdicts(id).await, ["stored"]);
    assert_eq!(app.drain_queue().await, [id]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn copy_re_signed_later_is_a_duplicate_and_not_enqueued_twice(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let event = stripe_event("evt_copy", "cus_1", Utc::now().timestamp() - 60);
    let now = Utc::now().timestamp();

    let (_, first) = app
        .post("stripe", &stripe_delivery_at(&event, now - 20))
        .await;
    // Stripe's retry: same body, new `t`, and a different pending_webhooks count.
    let mut retry = event.clone();
    retry["pending_webhooks"] = json!(0);
    let (status, second) = app.post("stripe", &stripe_delivery_at(&retry, now)).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        second,
        json!({"status": "duplicate", "event_id": first["event_id"]})
    );
    let id = first["event_id"].as_i64().unwrap();
    assert_eq!(app.event(id).await.seen_count, 2);
    assert_eq!(app.verdicts(id).await, ["stored", "duplicate"]);
    assert_eq!(
        app.drain_queue().await,
        [id],
        "the first message is still on its way: the copy sends no second one"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn copy_of_an_event_whose_message_is_overdue_or_refused_is_enqueued_again(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let event = stripe_event("evt_overdue", "cus_1", Utc::now().timestamp() - 60);
    let (_, first) = app.post("stripe", &stripe_delivery(&event)).await;
    let id = first["event_id"].as_i64().unwrap();
    assert_eq!(app.drain_queue().await, [id]);

    // The message was lost more than the rescue's grace period ago.
    sqlx::query("UPDATE inbox_events SET enqueued_at = now() - interval '6 minutes' WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(app.drain_queue().await, [id], "an overdue mark is renewed");

    // The queue refused the last send: the mark was cleared.
    sqlx::query("UPDATE inbox_events SET enqueued_at = NULL WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(app.drain_queue().await, [id], "a cleared mark is set again");
    assert_eq!(app.event(id).await.seen_count, 3);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn twenty_concurrent_copies_give_one_event_seen_twenty_times(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let delivery = stripe_delivery(&stripe_event("evt_burst", "cus_1", Utc::now().timestamp()));

    let answers = join_all((0..20).map(|_| app.post("stripe", &delivery))).await;

    assert!(
        answers.iter().all(|(s, _)| *s == StatusCode::OK),
        "{answers:?}"
    );
    let stored = answers
        .iter()
        .filter(|(_, b)| b["status"] == "stored")
        .count();
    assert_eq!(stored, 1);
    let id = answers[0].1["event_id"].as_i64().unwrap();
    assert!(answers.iter().all(|(_, b)| b["event_id"] == id));
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 1);
    assert_eq!(app.event(id).await.seen_count, 20);
    assert_eq!(app.count("SELECT count(*) FROM deliveries").await, 20);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn same_key_with_different_content_is_a_conflict_that_keeps_the_stored_event(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let original = stripe_event("evt_same", "cus_1", Utc::now().timestamp());
    let mut forged = original.clone();
    forged["data"]["object"]["status"] = json!("canceled");

    let (_, first) = app.post("stripe", &stripe_delivery(&original)).await;
    app.drain_queue().await;
    let (status, second) = app.post("stripe", &stripe_delivery(&forged)).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(second["status"], "conflict");
    let id = first["event_id"].as_i64().unwrap();
    let row = app.event(id).await;
    assert_eq!(row.payload.unwrap()["data"]["object"]["status"], "active");
    assert_eq!(row.seen_count, 1, "a conflicting delivery is not a copy");
    assert_eq!(app.verdicts(id).await, ["stored", "conflict"]);
    assert!(app.drain_queue().await.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn authentication_failures_are_401_and_store_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let event = stripe_event("evt_bad", "cus_1", Utc::now().timestamp());
    let good = stripe_delivery(&event);

    let mut tampered = stripe_delivery(&event);
    tampered.body = serde_json::to_vec(&stripe_event("evt_bad", "cus_2", 1)).unwrap();
    let stale = stripe_delivery_at(&event, Utc::now().timestamp() - 3600);
    let future = stripe_delivery_at(&event, Utc::now().timestamp() + 3600);
    let unsigned = Delivery {
        headers: vec![],
        body: good.body.clone(),
    };
    let mut bare_polar = polar_delivery("msg_bare", &json!({"type": "order.paid", "data": {}}));
    for (name, value) in &mut bare_polar.headers {
        if name == "webhook-signature" {
            *value = "v1,".into();
        }
    }
    let cases = [
        ("stripe", tampered),
        ("stripe", stale),
        ("stripe", future),
        ("stripe", unsigned),
        ("polar", bare_polar),
    ];
    for (source, delivery) in &cases {
        let (status, body) = app.post(source, delivery).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(body["code"], "unauthorized");
        assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM deliveries").await, 0);
    assert!(app.drain_queue().await.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn unknown_source_wrong_route_and_wrong_method_are_refused(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let delivery = stripe_delivery(&stripe_event("evt_x", "cus_1", Utc::now().timestamp()));

    let (status, body) = app.post("paypal", &delivery).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "unknown_source");

    let request = http::Request::builder()
        .method("POST")
        .uri("/other/stripe")
        .body(lambda_http::Body::Empty)
        .unwrap();
    assert_eq!(app.send(request).await.0, StatusCode::NOT_FOUND);

    let request = http::Request::builder()
        .method("GET")
        .uri("/webhooks/stripe")
        .body(lambda_http::Body::Empty)
        .unwrap();
    assert_eq!(app.send(request).await.0, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn body_over_one_mib_is_413_and_stores_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let mut event = stripe_event("evt_big", "cus_1", Utc::now().timestamp());
    event["padding"] = json!("x".repeat(1_048_576));

    let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;

    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["code"], "payload_too_large");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
}

/// A Postgres URL on which nothing listens: the database is down.
fn unreachable_database_url() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("postgres://postgres@127.0.0.1:{port}/down")
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn postgres_down_answers_503_with_retry_after_and_writes_nothing(pool: PgPool) {
    let sqs = sqs_client().await;
    let queue_url = create_queue(&sqs).await;
    let queue = Queue::new(sqs.clone(), queue_url.clone());
    let down = shared::platform::db::lazy_pool(&unreachable_database_url(), 2).unwrap();
    let app = TestApp::with_parts(pool, down, sqs, queue_url, queue).await;

    let delivery = stripe_delivery(&stripe_event("evt_down", "cus_1", Utc::now().timestamp()));
    let (status, body) = app.post("stripe", &delivery).await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["code"], "store_unavailable");
    assert!(
        !body.to_string().contains("postgres://"),
        "no connection details leak: {body}"
    );
    let response = shared::handlers::intake::handle(&app.state, {
        let mut b = http::Request::builder()
            .method("POST")
            .uri("/webhooks/stripe");
        for (n, v) in &delivery.headers {
            b = b.header(n, v);
        }
        b.body(lambda_http::Body::from(delivery.body.clone()))
            .unwrap()
    })
    .await;
    assert_eq!(response.headers()["retry-after"], "10");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
    assert!(
        app.drain_queue().await.is_empty(),
        "nothing is enqueued without a stored row"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn postgres_stopping_mid_flight_answers_503_and_loses_nothing_stored(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (_, first) = app
        .post(
            "stripe",
            &stripe_delivery(&stripe_event("evt_before", "cus_1", Utc::now().timestamp())),
        )
        .await;

    // The database stops taking connections, and every open one is cut.
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let admin = admin_connection().await;
    sqlx::query(&format!(r#"ALTER DATABASE "{db}" ALLOW_CONNECTIONS false"#))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
        .bind(&db)
        .execute(&admin)
        .await
        .unwrap();

    let delivery = stripe_delivery(&stripe_event("evt_during", "cus_1", Utc::now().timestamp()));
    let (status, body) = app.post("stripe", &delivery).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");

    sqlx::query(&format!(r#"ALTER DATABASE "{db}" ALLOW_CONNECTIONS true"#))
        .execute(&admin)
        .await
        .unwrap();
    let ids: Vec<String> = sqlx::query_scalar("SELECT dedupe_key FROM inbox_events ORDER BY id")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        ids,
        ["evt_before"],
        "the stored event survives, the refused one is absent"
    );
    assert_eq!(
        app.event(first["event_id"].as_i64().unwrap())
            .await
            .seen_count,
        1
    );

    // The provider's retry, once the database is back, is stored normally.
    let (status, body) = app.post("stripe", &delivery).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "stored");
}

/// A connection to the server's maintenance database, for stopping and starting test databases.
async fn admin_connection() -> PgPool {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for the tests");
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn sqs_unreachable_after_commit_still_answers_200_with_enqueued_at_empty(pool: PgPool) {
    let sqs = sqs_client().await;
    let queue = unreachable_queue().await;
    let queue_url = create_queue(&sqs).await;
    let app = TestApp::with_parts(pool.clone(), pool, sqs, queue_url, queue).await;

    let (status, body) = app
        .post(
            "stripe",
            &stripe_delivery(&stripe_event("evt_nosqs", "cus_1", Utc::now().timestamp())),
        )
        .await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "stored");
    let row = app.event(body["event_id"].as_i64().unwrap()).await;
    assert_eq!(row.status, "received");
    assert!(
        row.enqueued_at.is_none(),
        "left for the scheduler to enqueue"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn kinde_token_is_stored_under_its_signed_event_id_and_a_re_signed_retry_is_a_copy(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let happened = Utc::now() - chrono::Duration::minutes(3);
    let claims = json!({
        "type": "customer.plan_changed",
        "event_id": "event_0001",
        "event_timestamp": happened.to_rfc3339(),
        "source": "api",
        "data": {"customer_id": "kc_1", "plan": {"key": "pro"}}
    });

    let (status, first) = app.post("kinde", &kinde_delivery("wh_1", &claims)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "stored");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    // Kinde re-signs a retry: a new token with a later timestamp, same event.
    let (_, second) = app.post("kinde", &kinde_delivery("wh_1", &claims)).await;
    assert_eq!(second["status"], "duplicate");

    // A captured token replayed under other webhook ids is the same event: the id that
    // counts is the signed one.
    for forged in ["wh_forged", "wh_future_id"] {
        let (_, replay) = app.post("kinde", &kinde_delivery(forged, &claims)).await;
        assert_eq!(replay["status"], "duplicate", "{replay}");
        assert_eq!(replay["event_id"], first["event_id"]);
    }

    let row = app.event(first["event_id"].as_i64().unwrap()).await;
    assert_eq!(row.dedupe_key, "event_0001");
    assert_eq!(row.event_type, "customer.plan_changed");
    assert_eq!(row.customer_key.as_deref(), Some("kc_1"));
    assert_eq!(row.occurred_at.unwrap().timestamp(), happened.timestamp());
    assert_eq!(row.seen_count, 4);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_captured_kinde_payment_token_without_an_event_id_replayed_under_new_webhook_ids_is_one_payment(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool).await;
    app.enable_effects().await;
    // A payment event that names neither an event id nor a payment id: its dedupe key is the
    // unsigned webhook-id header, which whoever holds the token can change at will.
    let claims = json!({
        "data": {"customer_id": "kc_replayed", "plan": {"key": "pro"}},
        "event_timestamp": (Utc::now() - chrono::Duration::minutes(1)).to_rfc3339(),
        "source": "user",
        "timestamp": Utc::now().to_rfc3339(),
        "type": "customer.payment_succeeded"
    });
    let token = shared::providers::kinde::fixtures::token(KINDE_KEY, KINDE_KID, &claims).unwrap();
    for webhook_id in ["wh_genuine", "wh_replay_1", "wh_replay_2"] {
        let delivery = Delivery {
            headers: vec![
                ("content-type".into(), "application/jwt".into()),
                ("webhook-id".into(), webhook_id.into()),
            ],
            body: token.clone().into_bytes(),
        };
        let (status, answer) = app.post("kinde", &delivery).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        app.run_worker().await;
    }

    let payments = app
        .count(
            "SELECT count(*) FROM payments WHERE customer_id = 'kc_replayed' AND status = 'paid'",
        )
        .await;
    assert_eq!(payments, 1, "one signed payment is one payment");
    let succeeded = app
        .effects()
        .await
        .iter()
        .filter(|e| e.kind == "billing.payment_succeeded")
        .count();
    assert_eq!(succeeded, 1, "and the app is told of it once");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn kinde_token_signed_with_hs256_is_refused(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let claims = json!({"type": "customer.plan_changed", "timestamp": Utc::now().to_rfc3339(),
                        "event_id": "e", "data": {"customer_id": "kc_1"}});
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"guess").unwrap(),
    )
    .unwrap();
    let delivery = Delivery {
        headers: vec![("content-type".into(), "application/jwt".into())],
        body: token.into_bytes(),
    };
    let (status, body) = app.post("kinde", &delivery).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["detail"], "signing algorithm 'HS256' is not allowed");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn polar_event_is_ordered_by_its_modified_at(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let payload = json!({
        "type": "subscription.updated",
        "timestamp": "2026-03-01T10:00:05Z",
        "data": {"id": "sub_p", "customer_id": "pc_1", "status": "active", "product_id": "pro",
                 "modified_at": "2026-03-01T10:00:00Z"}
    });
    let id = unique("msg");
    let (status, body) = app.post("polar", &polar_delivery(&id, &payload)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let row = app.event(body["event_id"].as_i64().unwrap()).await;
    assert_eq!(row.dedupe_key, id);
    assert_eq!(row.customer_key.as_deref(), Some("pc_1"));
    assert_eq!(
        row.occurred_at.unwrap().to_rfc3339(),
        "2026-03-01T10:00:00+00:00"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn signed_but_unparseable_is_stored_unprocessable_and_not_enqueued(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let delivery = polar_delivery("msg_garbage", &json!(["not", "an", "event"]));

    let (status, body) = app.post("polar", &delivery).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "stored");
    let row = app.event(body["event_id"].as_i64().unwrap()).await;
    assert_eq!(row.status, "unprocessable");
    assert_eq!(row.reason.as_deref(), Some("the event has no type"));
    assert!(app.drain_queue().await.is_empty(), "never retried");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn copy_of_an_event_already_applied_is_counted_but_not_enqueued(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let delivery = stripe_delivery(&stripe_event("evt_done", "cus_1", Utc::now().timestamp()));
    let (_, first) = app.post("stripe", &delivery).await;
    app.drain_queue().await;
    sqlx::query("UPDATE inbox_events SET status = 'applied' WHERE id = $1")
        .bind(first["event_id"].as_i64().unwrap())
        .execute(&app.pool)
        .await
        .unwrap();

    let (_, second) = app.post("stripe", &delivery).await;

    assert_eq!(second["status"], "duplicate");
    assert!(app.drain_queue().await.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn api_gateway_http_api_event_is_routed_by_its_path_parameter(pool: PgPool) {
    use base64::Engine;
    let app = TestApp::spawn(pool).await;
    let delivery = stripe_delivery(&stripe_event("evt_apigw", "cus_1", Utc::now().timestamp()));
    let headers: serde_json::Map<String, serde_json::Value> = delivery
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    // The event API Gateway's HTTP API (payload v2) sends for `POST /webhooks/{source}`.
    let event = json!({
        "version": "2.0",
        "routeKey": "POST /webhooks/{source}",
        "rawPath": "/webhooks/stripe",
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012", "apiId": "api", "domainName": "api.example.test",
            "domainPrefix": "api", "requestId": "req-1", "routeKey": "POST /webhooks/{source}",
            "stage": "$default", "time": "01/Jan/2026:00:00:00 +0000", "timeEpoch": 1767225600000u64,
            "http": {"method": "POST", "path": "/webhooks/stripe", "protocol": "HTTP/1.1",
                     "sourceIp": "203.0.113.1", "userAgent": "Stripe/1.0"}
        },
        "pathParameters": {"source": "stripe"},
        "body": base64::engine::general_purpose::STANDARD.encode(&delivery.body),
        "isBase64Encoded": true
    });
    let request = lambda_http::request::from_str(&event.to_string()).unwrap();

    let (status, body) = app.send(request).await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "stored");
}

/// A state whose sources fail to build names the source in its error.
#[test]
fn bad_source_secret_is_named_at_start() {
    let config = shared::platform::config::IntakeConfig::from_lookup(|var| match var {
        "DATABASE_URL" => Some("postgres://x/y".into()),
        "QUEUE_URL" => Some("http://q".into()),
        "INBOX_SOURCES" => {
            Some(r#"[{"name":"polar","kind":"standard-webhooks","secrets":["whsec_%%%"]}]"#.into())
        }
        _ => None,
    })
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let error = runtime
        .block_on(IntakeState::from_config(&config))
        .err()
        .expect("a secret that is not base64 fails at start");
    assert!(error.to_string().contains("source 'polar'"), "{error}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_signed_payload_with_nul_is_stored_exactly_and_applied(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let mut event = stripe_event("evt_nul", "cus_nul", Utc::now().timestamp() - 30);
    event["data"]["object"]["metadata"] = json!({"note": "a\u{0000}b"});
    let delivery = stripe_delivery(&event);
    assert!(String::from_utf8_lossy(&delivery.body).contains("\\u0000"));

    let (status, body) = app.post("stripe", &delivery).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "stored");
    app.run_worker().await;
    let id = body["event_id"].as_i64().unwrap();
    let row = app.event(id).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    assert_eq!(
        row.payload.unwrap()["data"]["object"]["metadata"]["note"],
        "ab"
    );
    let raw: Vec<u8> = sqlx::query_scalar("SELECT raw_body FROM inbox_events WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(raw, delivery.body, "the body is kept byte for byte");
    // A retry is a copy, not a conflict: the content hash is of what was signed.
    let (_, again) = app.post("stripe", &delivery).await;
    assert_eq!(again["status"], "duplicate");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_provider_time_postgres_cannot_hold_or_not_trusted_is_unprocessable(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let day = 86_400;
    for (id, created, why) in [
        ("evt_ancient", -8_000_000_000_000_i64, "before 2000-01-01"),
        ("evt_1999", 946_684_799, "before 2000-01-01"),
        (
            "evt_future",
            Utc::now().timestamp() + 2 * day,
            "more than a day ahead",
        ),
    ] {
        let event = stripe_event(id, "cus_time", created);
        let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;
        assert_eq!(status, StatusCode::OK, "{id}: {body}");
        let row = app.event(body["event_id"].as_i64().unwrap()).await;
        assert_eq!(row.status, "unprocessable", "{id}");
        assert!(
            row.reason.as_deref().unwrap().contains(why),
            "{id}: {:?}",
            row.reason
        );
    }
    assert!(
        app.drain_queue().await.is_empty(),
        "nothing unprocessable is enqueued"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_the_database_refuses_is_stored_bare_or_answered_503(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // Content the database refuses (a constraint stands for any such refusal).
    sqlx::query("ALTER TABLE inbox_events ADD CONSTRAINT no_updates CHECK (type <> 'customer.subscription.updated')")
        .execute(&app.pool)
        .await
        .unwrap();
    let event = stripe_event("evt_refused", "cus_r", Utc::now().timestamp());
    let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let row = app.event(body["event_id"].as_i64().unwrap()).await;
    assert_eq!(row.status, "unprocessable");
    assert_eq!(
        row.reason.as_deref(),
        Some("the database refused the parsed event (SQLSTATE 23514)")
    );
    let raw: Vec<u8> = sqlx::query_scalar("SELECT raw_body FROM inbox_events WHERE id = $1")
        .bind(body["event_id"].as_i64().unwrap())
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(!raw.is_empty(), "the evidence is kept");

    // Refused even bare: 503 with Retry-After, never a 500 the provider retries forever.
    sqlx::query(
        "ALTER TABLE inbox_events ADD CONSTRAINT no_stripe CHECK (source <> 'stripe') NOT VALID",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let event = stripe_event("evt_refused_2", "cus_r", Utc::now().timestamp());
    let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["code"], "store_refused");
}

/// An app whose intake's connections start with these server settings, as a `DATABASE_URL`
/// with `options=-c …` gives them, or a role's or server's defaults.
async fn app_with_settings(pool: &PgPool, settings: &[(&str, &str)]) -> TestApp {
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .options(settings.iter().copied());
    let intake_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    let sqs = sqs_client().await;
    let queue_url = create_queue(&sqs).await;
    let queue = Queue::new(sqs.clone(), queue_url.clone());
    TestApp::with_parts(pool.clone(), intake_pool, sqs, queue_url, queue).await
}

/// Found by reading the store's error handling: a statement the server cancelled was taken
/// for a refusal of the event's content, and the event stored bare, `unprocessable`,
/// without its parsed form, so the provider's retry found a copy and the event was lost to
/// billing.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_statement_the_database_cancels_is_answered_503_and_the_retry_stores_the_event_whole(
    pool: PgPool,
) {
    // A server slow for this statement (the parsed event) and quick for a bare record, with
    // a statement timeout: the first is cancelled (57014), the second would pass.
    sqlx::raw_sql(
        r#"CREATE FUNCTION slow_parsed() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NEW.payload IS NOT NULL OR NEW.body_is_payload THEN PERFORM pg_sleep(30); END IF;
           RETURN NEW; END $$;
           CREATE TRIGGER slow_parsed BEFORE INSERT ON inbox_events
               FOR EACH ROW EXECUTE FUNCTION slow_parsed();"#,
    )
    .execute(&pool)
    .await
    .unwrap();
    let app = app_with_settings(&pool, &[("statement_timeout", "300ms")]).await;
    let delivery = stripe_delivery(&stripe_event(
        "evt_slow",
        "cus_slow",
        Utc::now().timestamp(),
    ));

    let (status, body) = app.post("stripe", &delivery).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "store_unavailable");
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events").await,
        0,
        "nothing stands in the event's place"
    );

    // The server is quick again; the provider retries and the event is stored whole.
    sqlx::raw_sql("DROP TRIGGER slow_parsed ON inbox_events")
        .execute(&pool)
        .await
        .unwrap();
    let (status, body) = app.post("stripe", &delivery).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "stored");
    let id = body["event_id"].as_i64().unwrap();
    let row = app.event(id).await;
    assert_eq!(row.status, "received");
    assert!(row.payload.is_some(), "the parsed event is kept");
    assert_eq!(app.drain_queue().await, vec![id]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_server_that_became_read_only_in_a_failover_is_answered_503_and_nothing_is_stored(
    pool: PgPool,
) {
    // A connection that reached the old primary, now a replica: every write is refused with
    // 25006. That is the database's state, not the event's content.
    let app = app_with_settings(&pool, &[("default_transaction_read_only", "on")]).await;
    let delivery = stripe_delivery(&stripe_event("evt_ro", "cus_ro", Utc::now().timestamp()));

    let (status, body) = app.post("stripe", &delivery).await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "store_unavailable");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn which_secret_verified_a_delivery_is_kept_and_an_older_one_is_a_metric(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    // A Stripe source mid-rotation lists an unused secret first: its deliveries verify with
    // the second.
    let rolling = shared::platform::config::parse_sources(
        &json!([{"name": "stripe", "kind": "stripe", "secrets": ["whsec_old_unused", STRIPE_SECRET]}])
            .to_string(),
    )
    .unwrap();
    let sources = shared::providers::Sources::build(
        &rolling,
        std::time::Duration::from_secs(300),
        reqwest::Client::new(),
    )
    .unwrap();
    app.state = IntakeState::new(
        pool,
        Queue::new(app.sqs.clone(), app.queue_url.clone()),
        sources,
    );
    let event = stripe_event("evt_roll", "cus_roll", Utc::now().timestamp());
    let (_, body) = app.post("stripe", &stripe_delivery(&event)).await;
    let index: Option<i16> =
        sqlx::query_scalar("SELECT secret_index FROM deliveries WHERE event_id = $1")
            .bind(body["event_id"].as_i64().unwrap())
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(index, Some(1));

    let line = shared::handlers::intake::older_secret_metric("stripe", 1, Utc::now());
    let spec = &line["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(spec["Namespace"], "BillingInbox");
    assert_eq!(spec["Dimensions"], json!([["Stack", "Source"]]));
    assert_eq!(spec["Metrics"][0]["Name"], "OldSecretDeliveries");
    assert_eq!(line["Stack"], shared::platform::metrics::LOCAL_STACK);
    assert_eq!(
        (
            &line["Source"],
            &line["SecretIndex"],
            &line["OldSecretDeliveries"]
        ),
        (&json!("stripe"), &json!(1), &json!(1))
    );
    assert!(!line.to_string().contains(STRIPE_SECRET), "never the value");
}

#[test]
fn a_refused_delivery_is_a_metric_by_stack_source_and_reason_never_the_signature() {
    let line = shared::handlers::intake::rejected_delivery_metric(
        "stripe",
        shared::signing::AuthError::BadSignature.reason(),
        Utc::now(),
    );
    let spec = &line["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(spec["Namespace"], "BillingInbox");
    // By source for the alarm, by source and reason for the first look.
    assert_eq!(
        spec["Dimensions"],
        json!([["Stack", "Source"], ["Stack", "Source", "Reason"]])
    );
    assert_eq!(
        spec["Metrics"],
        json!([{"Name": "RejectedDeliveries", "Unit": "Count"}])
    );
    assert_eq!(
        (
            &line["Stack"],
            &line["Source"],
            &line["Reason"],
            &line["RejectedDeliveries"]
        ),
        (
            &json!(shared::platform::metrics::LOCAL_STACK),
            &json!("stripe"),
            &json!("bad_signature"),
            &json!(1)
        )
    );
}

#[test]
fn every_refusal_reason_is_a_fixed_name_of_its_own() {
    use shared::signing::AuthError;
    // The Reason dimension's values: one per variant, none carrying what the sender chose.
    let reasons = [
        AuthError::Missing("Stripe-Signature"),
        AuthError::Malformed("Stripe-Signature"),
        AuthError::TooManySignatures("Stripe-Signature", 8),
        AuthError::BadSignature,
        AuthError::Stale(300),
        AuthError::Future(300),
        AuthError::UnknownKey("kid-from-the-sender".into()),
        AuthError::AlgorithmNotAllowed("HS256".into()),
        AuthError::WrongKeyType("kid-from-the-sender".into()),
        AuthError::KeysUnavailable,
    ]
    .map(|e| e.reason());
    let distinct: std::collections::BTreeSet<_> = reasons.iter().collect();
    assert_eq!(distinct.len(), reasons.len(), "{reasons:?}");
    assert!(reasons
        .iter()
        .all(|r| r.chars().all(|c| c.is_ascii_lowercase() || c == '_')));
}

/// An event the size of a real subscription event is kept once, as its raw body (its payload
/// is that body's JSON: no parsed copy beside it, migration `20261231500001`), and the body
/// lives out of line, so the worker's updates of the row (its claim, its finish) copy a
/// pointer, not the body again (docs/design.md §8, migration `20261213100001`). Under
/// Postgres's default the raw body stayed inline once the payload had gone out, and each
/// update wrote it to the WAL.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_real_sized_event_is_kept_once_out_of_line_through_its_updates(pool: PgPool) {
    let app = crate::corpus::corpus_app(pool.clone()).await;
    let (_, event) = crate::corpus::corpus("stripe/pre-basil")
        .into_iter()
        .find(|(name, _)| name == "customer.subscription.updated")
        .expect("the corpus's subscription update");
    let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["event_id"].as_i64().expect("the event id");
    // The TOAST of the month's partition that holds the event (docs/design.md §3.14).
    let toast: String = sqlx::query_scalar(
        "SELECT reltoastrelid::regclass::text FROM pg_class
         WHERE oid = (SELECT tableoid FROM inbox_events WHERE id = $1)",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    let values = format!("SELECT count(DISTINCT chunk_id) FROM {toast}");
    let out_of_line = |pool: PgPool, sql: String| async move {
        sqlx::query_scalar::<_, i64>(&sql)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let (raw, payload): (i32, Option<i32>) = sqlx::query_as(
        "SELECT pg_column_size(raw_body), pg_column_size(payload) FROM inbox_events WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(raw > 512, "a real-sized event: {raw} bytes");
    assert_eq!(payload, None, "no parsed copy beside the raw body");
    assert_eq!(
        out_of_line(pool.clone(), values.clone()).await,
        1,
        "the raw body, a value of its own out of line"
    );
    app.run_worker().await;
    let final_status = app.event(id).await.status;
    assert!(
        ["applied", "ignored"].contains(&final_status.as_str()),
        "{final_status}"
    );
    assert_eq!(
        out_of_line(pool, values).await,
        1,
        "the claim and the finish kept the same value, not a copy"
    );
}

/// AWS-LC is built without its CPU-jitter entropy source (`.cargo/config.toml`,
/// docs/design.md §8 "Cold start"): with it, the first TLS handshake of every process (the
/// intake's first store, its first send) spent 30–40 ms gathering jitter. This binary links the
/// same AWS-LC as the functions (through sqlx's and the SDK's rustls), so its symbols say how
/// AWS-LC was built.
#[test]
fn aws_lc_is_built_without_cpu_jitter_entropy() {
    let exe = std::env::current_exe().unwrap();
    // Put together at run time: the whole name written here would be in this binary itself.
    let symbol = ["jent", "read", "entropy"].join("_");
    let found = std::process::Command::new("grep")
        .args(["-c", "-a", &symbol])
        .arg(&exe)
        .output()
        .expect("grep runs");
    let count = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    assert_eq!(
        count,
        "0",
        "{} carries AWS-LC's jitter entropy; build from the checkout so cargo reads .cargo/config.toml",
        exe.display()
    );
}
