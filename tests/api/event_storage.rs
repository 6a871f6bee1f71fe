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
