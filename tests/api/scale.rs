//! The scheduler's queries at a million rows (docs/design.md §3): with `inbox_events` full of
//! finished events and a few pending ones, rescue, alerts, purge, the backlog and the
//! customer sweep read their indexes, never the whole table. Postgres' own counter of
//! rows read by sequential scans of the table (`pg_stat_user_tables.seq_tup_read`) must not move while each
//! step runs; each step's time is printed, never asserted. `INBOX_SCALE_ROWS` sets the row count (default 1,000,000).

use std::time::{Duration, Instant};

use shared::inbox::{alerts::collect_alerts, purge::purge, read::backlog, rescue::mark_lost};
use shared::reconcile::{recent_customers, MAX_CUSTOMERS};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};

/// The rows sequential scans have read from the table so far (from each month's partition,
/// docs/design.md §3.14: a scan of an empty one reads none), as seen from `conn`'s own backend
/// once its pending statistics are flushed.
async fn seq_scans(pool: &PgPool) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    conn.execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    conn.execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT COALESCE(sum(seq_tup_read), 0)::bigint FROM pg_stat_user_tables
         WHERE relid IN (SELECT relid FROM pg_partition_tree('inbox_events'))",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn scheduler_queries_read_indexes_at_a_million_rows(pool: PgPool) {
    let rows: i64 = std::env::var("INBOX_SCALE_ROWS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1_000_000);
    let fill = Instant::now();
    sqlx::query(
        r#"
        INSERT INTO inbox_events (source, dedupe_key, type, raw_body, payload_hash, customer_key,
                                  occurred_at, received_at, status, attempts, processed_at, reason)
        SELECT 'stripe', 'evt_' || g, 'invoice.paid', '\x7b7d'::bytea, sha256(g::text::bytea),
               'cus_' || (g % 5000), now() - (g % 20) * interval '1 day',
               now() - (g % 20) * interval '1 day',
               CASE WHEN g % 3 = 0 THEN 'ignored' ELSE 'applied' END, 1, now(), 'done'
        FROM generate_series(1, $1) g
        "#,
    )
    .bind(rows)
    .execute(&pool)
    .await
    .unwrap();
    // A few of every pending kind, and unreported dead and unprocessable ones.
    pool.execute(
        r#"
        INSERT INTO inbox_events (source, dedupe_key, type, raw_body, payload_hash, status,
                                  received_at, enqueued_at, locked_until, next_attempt_at, attempts)
        SELECT 'stripe', 'pending_' || g || '_' || s, 'invoice.paid', '\x7b7d'::bytea,
               sha256(('p' || g || s)::bytea), s, now() - interval '10 minutes',
               CASE WHEN s = 'received' THEN NULL ELSE now() - interval '10 minutes' END,
               CASE WHEN s = 'processing' THEN now() - interval '1 minute' END,
               CASE WHEN s = 'failed' THEN now() - interval '1 minute' END,
               CASE WHEN s IN ('processing', 'failed') THEN 1 ELSE 0 END
        FROM generate_series(1, 5) g,
             unnest(ARRAY['received', 'processing', 'failed', 'dead', 'unprocessable']) s
        "#,
    )
    .await
    .unwrap();
    pool.execute("ANALYZE inbox_events; ANALYZE deliveries")
        .await
        .unwrap();
    eprintln!(
        "scale: {rows} finished rows and 25 others in {:?}",
        fill.elapsed()
    );

    // One connection: every step runs on the backend whose statistics are then flushed.
    let options = pool.connect_options().as_ref().clone();
    let one = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let deadline = || Instant::now() + Duration::from_secs(60);

    let mut timings = Vec::new();
    let before = seq_scans(&one).await;
    let t = Instant::now();
    let marked = mark_lost(&one).await.unwrap();
    timings.push(("rescue", t.elapsed()));
    assert_eq!(marked.len(), 15, "the received, expired and due rows");
    assert_eq!(seq_scans(&one).await, before, "rescue scanned inbox_events");

    let before = seq_scans(&one).await;
    let t = Instant::now();
    let alerts = collect_alerts(&one).await.unwrap();
    timings.push(("alerts", t.elapsed()));
    assert_eq!(alerts.dead.len() + alerts.unprocessable.len(), 10);
    assert_eq!(seq_scans(&one).await, before, "alerts scanned inbox_events");

    let before = seq_scans(&one).await;
    let t = Instant::now();
    // 30 days: nothing is old enough; the query still has to find that out.
    let purged = purge(&one, Duration::from_secs(30 * 86_400), deadline())
        .await
        .unwrap();
    timings.push(("purge", t.elapsed()));
    assert_eq!(purged, 0);
    assert_eq!(seq_scans(&one).await, before, "purge scanned inbox_events");

    let before = seq_scans(&one).await;
    let t = Instant::now();
    let measured = {
        let mut conn = one.acquire().await.unwrap();
        backlog(&mut conn).await.unwrap()
    };
    timings.push(("backlog", t.elapsed()));
    assert_eq!(measured.by_status.get("dead"), Some(&5));
    assert_eq!(
        seq_scans(&one).await,
        before,
        "the backlog scanned inbox_events"
    );

    let before = seq_scans(&one).await;
    let t = Instant::now();
    let since = chrono::Utc::now() - chrono::Duration::days(35);
    let customers = recent_customers(&one, "stripe", since, Some("cus_100"))
        .await
        .unwrap();
    timings.push(("customer sweep", t.elapsed()));
    assert_eq!(customers.len(), MAX_CUSTOMERS as usize);
    assert!(customers.iter().all(|c| c.as_str() > "cus_100"));
    assert_eq!(
        seq_scans(&one).await,
        before,
        "the customer sweep scanned inbox_events"
    );

    for (step, took) in timings {
        eprintln!("scale: {step} took {took:?} at {rows} rows");
    }
}
