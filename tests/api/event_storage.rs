//! The event's stored layout (docs/design.md §3): an event whose signed body is its JSON is
//! kept once, as that body, and a store of the earlier layout (the parsed payload beside the
//! body) upgrades in place, every event reading as it did.

use std::borrow::Cow;
use std::time::Duration;

use serde_json::{json, Value};
use shared::domain::{CustomerId, DedupeKey};
use shared::inbox::{kept, lease, read, thin};
use sqlx::migrate::Migrator;
use sqlx::PgPool;

use crate::helpers::*;

/// The first migration of the layout that keeps an event once.
const ONE_COPY: i64 = 20261231500001;

/// An event stored as the intake stored it before, its payload parsed beside its raw body.
async fn store_earlier(pool: &PgPool, id: &str, status: &str, payload: Option<&Value>) -> i64 {
    let body = match payload {
        Some(payload) => serde_json::to_vec(payload).unwrap(),
        None => b"{\"id\": \"evt_cut".to_vec(),
    };
    sqlx::query_scalar(
        "INSERT INTO inbox_events (source, dedupe_key, type, payload, raw_body, payload_hash,
                                   customer_key, occurred_at, status, processed_at)
         VALUES ('stripe', $1, 'customer.subscription.updated', $2, $3, sha256($3),
                 'cus_old', now() - interval '1 hour', $4,
                 CASE WHEN $4 <> 'received' THEN now() END)
         RETURNING id",
    )
    .bind(id)
    .bind(payload)
    .bind(body)
    .bind(status)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_store_of_the_earlier_layout_upgrades_in_place_and_every_event_reads_whole(pool: PgPool) {
    let earlier = Migrator {
        migrations: Cow::Owned(
            shared::MIGRATOR
                .iter()
                .filter(|m| m.version < ONE_COPY)
                .cloned()
                .collect(),
        ),
        ..Migrator::DEFAULT
    };
    earlier.run(&pool).await.unwrap();
    let applied_payload = stripe_event("evt_old_applied", "cus_old", 1_767_225_600);
    let waiting_payload = stripe_event("evt_old_waiting", "cus_old", 1_767_225_601);
    let applied = store_earlier(&pool, "evt_old_applied", "applied", Some(&applied_payload)).await;
    let waiting = store_earlier(&pool, "evt_old_waiting", "received", Some(&waiting_payload)).await;
    let cut = store_earlier(&pool, "evt_old_cut", "unprocessable", None).await;

    shared::MIGRATOR.run(&pool).await.unwrap();

    let mut conn = pool.acquire().await.unwrap();
    for (id, payload) in [
        (applied, Some(&applied_payload)),
        (waiting, Some(&waiting_payload)),
        (cut, None),
    ] {
        let detail = read::event_detail(&mut conn, id).await.unwrap().unwrap();
        assert_eq!(detail.payload.as_ref(), payload, "event {id}");
    }
    let found = thin::find(
        &mut conn,
        "stripe",
        &DedupeKey::parse("evt_old_waiting").unwrap(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(found.payload.as_ref(), Some(&waiting_payload));
    let folded = kept::account_events(
        &mut conn,
        "stripe",
        &CustomerId::parse("cus_old").unwrap(),
        &[],
        (None, 10),
    )
    .await
    .unwrap();
    assert_eq!(
        folded
            .iter()
            .map(|e| (e.id, e.payload.clone()))
            .collect::<Vec<_>>(),
        vec![(applied, Some(applied_payload))]
    );
    let claimed = lease::claim(&mut conn, &[waiting], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].payload.as_ref(), Some(&waiting_payload));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_delivery_whose_body_is_its_json_is_kept_once_and_read_whole(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let event = stripe_event("evt_once", "cus_once", chrono::Utc::now().timestamp());
    let (_, answer) = app.post("stripe", &stripe_delivery(&event)).await;
    let id = answer["event_id"].as_i64().expect("stored");

    let (payload, body_is_payload, body): (Option<Value>, bool, Vec<u8>) =
        sqlx::query_as("SELECT payload, body_is_payload, raw_body FROM inbox_events WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(payload, None, "no second copy of the body");
    assert!(body_is_payload);
    assert_eq!(
        body,
        serde_json::to_vec(&event).unwrap(),
        "the signed bytes"
    );

    let mut conn = pool.acquire().await.unwrap();
    let detail = read::event_detail(&mut conn, id).await.unwrap().unwrap();
    assert_eq!(detail.payload, Some(event.clone()));
    let claimed = lease::claim(&mut conn, &[id], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed[0].payload, Some(event));
    assert_eq!(
        json!(claimed[0].customer.as_ref().map(|c| c.as_str())),
        json!("cus_once")
    );
}

/// The first migration of the layout by month (docs/design.md §3.14).
const BY_MONTH: i64 = 20270101500001;

/// An event stored in the one table of before, created at `occurred_at`, with one delivery.
async fn store_unpartitioned(
    pool: &PgPool,
    id: &str,
    status: &str,
    body: &[u8],
    occurred_at: Option<chrono::DateTime<chrono::Utc>>,
) -> i64 {
    sqlx::query_scalar(
        "WITH e AS (
             INSERT INTO inbox_events (source, dedupe_key, type, raw_body, body_is_payload,
                                       payload_hash, customer_key, occurred_at, status,
                                       processed_at)
             VALUES ('stripe', $1, 'customer.subscription.updated', $2, $3, sha256($2),
                     'cus_old', $4, $5, CASE WHEN $5 <> 'received' THEN now() END)
             RETURNING id, payload_hash
         ), d AS (
             INSERT INTO deliveries (event_id, verdict, payload_hash)
             SELECT id, 'stored', payload_hash FROM e
         )
         SELECT id FROM e",
    )
    .bind(id)
    .bind(body)
    .bind(occurred_at.is_some())
    .bind(occurred_at)
    .bind(status)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_store_of_one_table_upgrades_to_months_and_every_event_reads_whole(pool: PgPool) {
    let earlier = Migrator {
        migrations: Cow::Owned(
            shared::MIGRATOR
                .iter()
                .filter(|m| m.version < BY_MONTH)
                .cloned()
                .collect(),
        ),
        ..Migrator::DEFAULT
    };
    earlier.run(&pool).await.unwrap();
    let now = chrono::Utc::now();
    let long_ago = now - chrono::Duration::days(100);
    let old_payload = stripe_event("evt_long_ago", "cus_old", long_ago.timestamp());
    let new_payload = stripe_event("evt_this_month", "cus_old", now.timestamp());
    let body = |payload: &Value| serde_json::to_vec(payload).unwrap();
    let old = store_unpartitioned(
        &pool,
        "evt_long_ago",
        "applied",
        &body(&old_payload),
        Some(long_ago),
    )
    .await;
    let waiting = store_unpartitioned(
        &pool,
        "evt_this_month",
        "received",
        &body(&new_payload),
        Some(now),
    )
    .await;
    let cut = store_unpartitioned(
        &pool,
        "evt_cut",
        "unprocessable",
        b"{\"id\": \"evt_cut",
        None,
    )
    .await;

    shared::MIGRATOR.run(&pool).await.unwrap();

    // Every event reads whole, under its id, with its delivery, in its provider month (an
    // event older than the oldest month in the kept partition; one with no time in the month
    // it arrived in).
    let this_month = format!("inbox_events_{}", now.format("%Y_%m"));
    let mut conn = pool.acquire().await.unwrap();
    for (id, payload, partition) in [
        (old, Some(&old_payload), "inbox_events_kept"),
        (waiting, Some(&new_payload), this_month.as_str()),
        (cut, None, this_month.as_str()),
    ] {
        let detail = read::event_detail(&mut conn, id).await.unwrap().unwrap();
        assert_eq!(detail.payload.as_ref(), payload, "event {id}");
        let (stored_in, deliveries): (String, i64) = sqlx::query_as(
            "SELECT e.tableoid::regclass::text,
                    (SELECT count(*) FROM deliveries d WHERE d.event_id = e.id AND d.month = e.month)
             FROM inbox_events e WHERE e.id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(
            (stored_in.as_str(), deliveries),
            (partition, 1),
            "event {id}"
        );
    }
    let claimed = lease::claim(&mut conn, &[waiting], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed[0].payload.as_ref(), Some(&new_payload));
    drop(conn);

    // A copy finds its original; a new event takes an id after every one stored before.
    let app = TestApp::spawn(pool.clone()).await;
    let (_, copy) = app.post("stripe", &stripe_delivery(&old_payload)).await;
    assert_eq!(copy["event_id"].as_i64(), Some(old), "{copy}");
    assert_ne!(copy["status"], "stored", "{copy}");
    let fresh = app
        .store_stripe_event("evt_after", "cus_old", now.timestamp())
        .await;
    assert!(fresh > cut, "{fresh}");
}
