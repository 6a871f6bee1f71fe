//! The event's work state (docs/design.md §3.3, §3.4): the event's row keeps no index that
//! names a column its life changes, so its status changes are HOT updates, and `inbox_work`
//! holds a row for each event in flight or given up, kept by the statement that changes the
//! event, which the rescue, the alerts, the backlog and the account's view read.

use std::borrow::Cow;
use std::time::Duration;

use shared::domain::retry::RetryPolicy;
use shared::domain::{CustomerId, EventStatus};
use shared::inbox::{alerts, kept, lease, read, replay, rescue};
use sqlx::migrate::Migrator;
use sqlx::{Connection, PgPool};

use crate::helpers::*;

/// The first migration of the work rows.
const WORK_ROWS: i64 = 20270102200001;

/// Events whose `inbox_work` row is not what their status says (a missing row, a row too
/// many, a stage, customer or alert mark of another event's state): none, ever.
async fn work_rows_out_of_step(pool: &PgPool) -> Vec<(Option<i64>, Option<String>)> {
    sqlx::query_as(
        "SELECT COALESCE(e.id, w.event_id), e.status
         FROM (SELECT * FROM inbox_events WHERE inbox_stage(status) IS NOT NULL) e
         FULL JOIN inbox_work w ON w.event_id = e.id AND w.month = e.month
         WHERE e.id IS NULL OR w.event_id IS NULL
            OR w.stage <> inbox_stage(e.status)
            OR w.source <> e.source
            OR w.customer_key IS DISTINCT FROM e.customer_key
            OR w.alerted <> (e.alerted_at IS NOT NULL)",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn stage(pool: &PgPool, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT stage FROM inbox_work WHERE event_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_claim_and_the_finish_of_an_event_are_hot_updates_of_its_row(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let id = app
        .store_stripe_event("evt_hot", "cus_hot", chrono::Utc::now().timestamp())
        .await;
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let claimed = lease::claim(&mut tx, &[id], Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let finished = lease::finish_held(&mut tx, &claimed[0], EventStatus::Ignored, "test", None)
        .await
        .unwrap();
    assert!(finished);
    // This transaction's own counts: every update of the event's row, and the HOT ones.
    let (updated, hot): (i64, i64) = sqlx::query_as(
        "SELECT sum(n_tup_upd)::bigint, sum(n_tup_hot_upd)::bigint FROM pg_stat_xact_user_tables
         WHERE relid IN (SELECT relid FROM pg_partition_tree('inbox_events'))",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!((updated, hot), (2, 2), "the claim and the finish");
    assert_eq!(
        stage(&pool, id).await,
        None,
        "a finished event has no work row"
    );
    assert!(work_rows_out_of_step(&pool).await.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_work_row_follows_the_event_through_failure_death_alert_and_replay(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let id = app
        .store_stripe_event("evt_life", "cus_life", chrono::Utc::now().timestamp())
        .await;
    assert_eq!(stage(&pool, id).await.as_deref(), Some("pending"));
    let mut conn = pool.acquire().await.unwrap();
    let once = RetryPolicy::new([Duration::ZERO; 5]);
    // Six claims, each failed: the sixth makes the event dead.
    for attempt in 1..=6 {
        let claimed = lease::claim(&mut conn, &[id], Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "claim {attempt}");
        assert_eq!(stage(&pool, id).await.as_deref(), Some("pending"));
        lease::record_failure(&mut conn, &claimed[0], "boom", &once)
            .await
            .unwrap();
        assert!(work_rows_out_of_step(&pool).await.is_empty(), "{attempt}");
    }
    assert_eq!(app.event(id).await.status, "dead");
    assert_eq!(stage(&pool, id).await.as_deref(), Some("dead"));
    assert_eq!(
        read::backlog(&mut conn)
            .await
            .unwrap()
            .by_status
            .get("dead"),
        Some(&1)
    );
    let alerted = alerts::collect_alerts(&pool).await.unwrap();
    assert_eq!(alerted.dead, vec![id]);
    assert!(alerts::collect_alerts(&pool).await.unwrap().dead.is_empty());
    assert!(work_rows_out_of_step(&pool).await.is_empty());
    // A replay makes it pending again; the worker applies it and its row goes.
    assert_eq!(replay::reset(&mut conn, &[id]).await.unwrap(), vec![id]);
    assert_eq!(stage(&pool, id).await.as_deref(), Some("pending"));
    assert_eq!(
        kept::pending(&mut conn, "stripe", &CustomerId::parse("cus_life").unwrap())
            .await
            .unwrap(),
        vec![id]
    );
    drop(conn);
    app.drain_queue().await;
    let queue = shared::platform::queue::Queue::new(app.sqs.clone(), app.queue_url.clone());
    assert!(queue.send_events(&[id]).await.is_empty());
    app.run_worker().await;
    assert_eq!(app.event(id).await.status, "applied");
    assert_eq!(stage(&pool, id).await, None);
    assert!(work_rows_out_of_step(&pool).await.is_empty());
}

/// An event stored as the store held it before the work rows, in status `status`.
async fn store_before(pool: &PgPool, key: &str, status: &str, set: &str) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO inbox_events (source, dedupe_key, type, raw_body, body_is_payload,
                                   payload_hash, customer_key, occurred_at, status,
                                   received_at, month)
         VALUES ('stripe', $1, 'customer.subscription.updated', '{}', false, sha256('{}'),
                 'cus_old', now(), $2, now() - interval '10 minutes', inbox_month(now()))
         RETURNING id",
    )
    .bind(key)
    .bind(status)
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(&format!("UPDATE inbox_events SET {set} WHERE id = $1"))
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    id
}

#[sqlx::test(migrations = false)]
async fn a_store_with_events_in_flight_upgrades_to_work_rows_and_every_reader_answers_as_before(
    pool: PgPool,
) {
    let earlier = Migrator {
        migrations: Cow::Owned(
            shared::MIGRATOR
                .iter()
                .filter(|m| m.version < WORK_ROWS)
                .cloned()
                .collect(),
        ),
        ..Migrator::DEFAULT
    };
    earlier.run(&pool).await.unwrap();
    let received = store_before(&pool, "evt_received", "received", "enqueued_at = NULL").await;
    let leased = store_before(
        &pool,
        "evt_leased",
        "processing",
        "locked_until = now() - interval '1 minute', attempts = 1",
    )
    .await;
    let due = store_before(
        &pool,
        "evt_due",
        "failed",
        "next_attempt_at = now() - interval '1 minute', attempts = 1",
    )
    .await;
    let dead = store_before(&pool, "evt_dead", "dead", "attempts = 6").await;
    let cut = store_before(&pool, "evt_cut", "unprocessable", "processed_at = now()").await;
    let applied = store_before(&pool, "evt_applied", "applied", "processed_at = now()").await;

    shared::MIGRATOR.run(&pool).await.unwrap();

    assert!(work_rows_out_of_step(&pool).await.is_empty());
    assert_eq!(stage(&pool, applied).await, None);
    let mut conn = pool.acquire().await.unwrap();
    let backlog = read::backlog(&mut conn).await.unwrap();
    assert_eq!(
        backlog.by_status.into_iter().collect::<Vec<_>>(),
        vec![
            ("dead".to_string(), 1),
            ("failed".to_string(), 1),
            ("processing".to_string(), 1),
            ("received".to_string(), 1),
        ]
    );
    assert!(backlog.oldest_unapplied_age_secs >= 590.0);
    assert_eq!(
        kept::pending(&mut conn, "stripe", &CustomerId::parse("cus_old").unwrap())
            .await
            .unwrap(),
        vec![received, leased, due]
    );
    let listed: Vec<i64> = sqlx::query_scalar(
        "SELECT event_id FROM account_events WHERE source = 'stripe' AND customer_id = 'cus_old'
         ORDER BY event_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(listed, vec![received, leased, due, dead, cut]);
    drop(conn);
    assert_eq!(
        rescue::mark_lost(&pool).await.unwrap(),
        vec![received, leased, due]
    );
    let alerted = alerts::collect_alerts(&pool).await.unwrap();
    assert_eq!(
        (alerted.dead, alerted.unprocessable),
        (vec![dead], vec![cut])
    );
    assert!(work_rows_out_of_step(&pool).await.is_empty());
    // No index of the event's row names a column its life changes.
    let changing: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT i.indexrelid::regclass::text FROM pg_index i
         JOIN pg_partition_tree('inbox_events') t ON t.relid = i.indrelid
         WHERE t.relid <> 'inbox_events_kept'::regclass
           AND (pg_get_indexdef(i.indexrelid) ~ '(status|enqueued_at|locked_until|next_attempt_at|alerted_at|attempts)'
                OR pg_get_expr(i.indpred, i.indrelid) IS NOT NULL)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(changing.is_empty(), "{changing:?}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_in_flight_keeps_its_work_row_when_its_month_is_dropped_and_made_again(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let now = chrono::Utc::now();
    let waiting = app
        .store_stripe_event("evt_waiting", "cus_m", now.timestamp())
        .await;
    let done = app
        .store_stripe_event("evt_done", "cus_m", now.timestamp() - 1)
        .await;
    app.drain_queue().await;
    sqlx::query("UPDATE inbox_events SET status = 'applied', processed_at = now() WHERE id = $1;")
        .bind(done)
        .execute(&pool)
        .await
        .unwrap();
    let month: chrono::NaiveDate =
        sqlx::query_scalar("SELECT month FROM inbox_events WHERE id = $1")
            .bind(waiting)
            .fetch_one(&pool)
            .await
            .unwrap();
    // The month dropped: the event in flight is kept (in the kept partition), the finished one
    // goes; then made again, the kept event moved back into it.
    sqlx::query("SELECT inbox_drop_month($1)")
        .bind(month)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(stage(&pool, waiting).await.as_deref(), Some("pending"));
    assert!(work_rows_out_of_step(&pool).await.is_empty());
    sqlx::query("SELECT inbox_make_months($1, 1)")
        .bind(month)
        .execute(&pool)
        .await
        .unwrap();
    assert!(work_rows_out_of_step(&pool).await.is_empty());
    // Lost by the queue, it is found again and sent.
    sqlx::query("UPDATE inbox_events SET received_at = now() - interval '10 minutes', enqueued_at = NULL WHERE id = $1")
        .bind(waiting)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(rescue::mark_lost(&pool).await.unwrap(), vec![waiting]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_statuses_with_a_work_row_are_the_same_in_rust_and_in_sql(pool: PgPool) {
    for status in EventStatus::ALL {
        let in_sql: bool = sqlx::query_scalar("SELECT inbox_stage($1) IS NOT NULL")
            .bind(status.as_str())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(status.has_work_row(), in_sql, "{status}");
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_events_lists_by_status_answer_from_the_work_rows_as_from_the_events(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let now = chrono::Utc::now().timestamp();
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(
            app.store_stripe_event(&format!("evt_list_{n}"), "cus_list", now - n)
                .await,
        );
    }
    sqlx::query("UPDATE inbox_events SET status = 'dead' WHERE id = ANY($1)")
        .bind(&ids[..2])
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE inbox_events SET status = 'applied' WHERE id = $1")
        .bind(ids[2])
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for status in EventStatus::ALL {
        let expected: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM inbox_events WHERE status = $1 ORDER BY id DESC")
                .bind(status.as_str())
                .fetch_all(&pool)
                .await
                .unwrap();
        let listed: Vec<i64> = read::list_events(&mut conn, Some(status), Some("stripe"), 50)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(listed, expected, "{status}");
        let filter = shared::operate::lists::EventFilter {
            status: Some(status),
            ..Default::default()
        };
        let page = shared::operate::lists::events(&mut conn, &filter, 1, None)
            .await
            .unwrap();
        let first: Vec<i64> = page.events.iter().map(|e| e.event_id).collect();
        assert_eq!(
            first,
            expected.iter().copied().take(1).collect::<Vec<_>>(),
            "{status}"
        );
        assert_eq!(page.next.is_some(), expected.len() > 1, "{status}");
    }
}
