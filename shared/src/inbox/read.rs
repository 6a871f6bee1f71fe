//! What operators read: event lists, one event with its deliveries, pipeline statistics, the
//! backlog and each source's silence.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;

use crate::domain::EventStatus;
use crate::platform::db::exec;

#[derive(Debug, Clone, Serialize)]
pub struct EventSummary {
    pub id: i64,
    pub source: String,
    pub dedupe_key: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub status: EventStatus,
    pub customer_id: Option<String>,
    pub occurred_at: Option<DateTime<Utc>>,
    pub received_at: DateTime<Utc>,
    pub seen_count: i32,
    pub attempts: i32,
    pub reason: Option<String>,
    pub last_error: Option<String>,
}

/// The newest events, of `status` and `source` when given. Events of a status in flight or
/// given up are read from their rows in `inbox_work` (docs/design.md §3.4), the event's row
/// keeping no index on its status.
pub async fn list_events(
    conn: &mut PgConnection,
    status: Option<EventStatus>,
    source: Option<&str>,
    limit: i64,
) -> Result<Vec<EventSummary>, sqlx::Error> {
    if status.is_some_and(EventStatus::has_work_row) {
        return sqlx::query_as!(
            EventSummary,
            r#"
            SELECT e.id, e.source, e.dedupe_key, e.type AS event_type,
                   e.status AS "status: EventStatus", e.customer_key AS customer_id,
                   e.occurred_at, e.received_at, e.seen_count, e.attempts, e.reason, e.last_error
            FROM inbox_work w JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
            WHERE w.stage = inbox_stage($1) AND e.status = $1
              AND ($2::text IS NULL OR e.source = $2)
            ORDER BY w.event_id DESC
            LIMIT $3
            "#,
            status.map(EventStatus::as_str),
            source,
            limit
        )
        .fetch_all(exec(conn))
        .await;
    }
    sqlx::query_as!(
        EventSummary,
        r#"
        SELECT id, source, dedupe_key, type AS event_type, status AS "status: EventStatus",
               customer_key AS customer_id,
               occurred_at, received_at, seen_count, attempts, reason, last_error
        FROM inbox_events
        WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR source = $2)
        ORDER BY id DESC
        LIMIT $3
        "#,
        status.map(EventStatus::as_str),
        source,
        limit
    )
    .fetch_all(exec(conn))
    .await
}

#[derive(Debug, Clone, Serialize)]
pub struct DeliveryView {
    pub id: i64,
    pub received_at: DateTime<Utc>,
    pub verdict: String,
    pub delivery_id: Option<String>,
    pub sent_at: Option<DateTime<Utc>>,
    pub headers: Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventDetail {
    #[serde(flatten)]
    pub summary: EventSummary,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub locked_until: Option<DateTime<Utc>>,
    pub enqueued_at: Option<DateTime<Utc>>,
    pub processed_at: Option<DateTime<Utc>>,
    pub payload: Option<Value>,
    pub deliveries: Vec<DeliveryView>,
}

pub async fn event_detail(
    conn: &mut PgConnection,
    id: i64,
) -> Result<Option<EventDetail>, sqlx::Error> {
    let Some(row) = sqlx::query!(
        r#"
        SELECT id, source, dedupe_key, type, status AS "status: EventStatus", customer_key, occurred_at, received_at,
               seen_count, attempts, reason, last_error, next_attempt_at, locked_until,
               enqueued_at, processed_at,
               inbox_payload(payload, raw_body, body_is_payload) AS payload
        FROM inbox_events WHERE id = $1
        "#,
        id
    )
    .fetch_optional(exec(&mut *conn))
    .await?
    else {
        return Ok(None);
    };
    let deliveries = sqlx::query_as!(
        DeliveryView,
        r#"SELECT id, received_at, verdict, delivery_id, sent_at, headers FROM deliveries
           WHERE event_id = $1 ORDER BY id"#,
        id
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    Ok(Some(EventDetail {
        summary: EventSummary {
            id: row.id,
            source: row.source,
            dedupe_key: row.dedupe_key,
            event_type: row.r#type,
            status: row.status,
            customer_id: row.customer_key,
            occurred_at: row.occurred_at,
            received_at: row.received_at,
            seen_count: row.seen_count,
            attempts: row.attempts,
            reason: row.reason,
            last_error: row.last_error,
        },
        next_attempt_at: row.next_attempt_at,
        locked_until: row.locked_until,
        enqueued_at: row.enqueued_at,
        processed_at: row.processed_at,
        payload: row.payload,
        deliveries,
    }))
}

/// Events by status, and the age of the oldest one not yet applied.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Backlog {
    pub by_status: std::collections::BTreeMap<String, i64>,
    pub oldest_unapplied_age_secs: f64,
}

pub async fn backlog(conn: &mut PgConnection) -> Result<Backlog, sqlx::Error> {
    // The statuses that need watching: the pending ones and `dead`. Counting them reads the
    // events in flight and those given up (`inbox_work`, docs/design.md §3.4), not the finished
    // rows, whatever their number.
    let by_status = sqlx::query!(
        r#"
        SELECT e.status AS "status!", count(*) AS "count!"
        FROM inbox_work w JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
        WHERE w.stage IN ('pending', 'dead') AND e.status IN ('received', 'processing', 'failed', 'dead')
        GROUP BY e.status
        "#
    )
    .fetch_all(exec(&mut *conn))
    .await?
    .into_iter()
    .map(|r| (r.status, r.count))
    .collect();
    let oldest = sqlx::query_scalar!(
        r#"
        SELECT COALESCE(EXTRACT(EPOCH FROM inbox_now() - min(e.received_at))::float8, 0) AS "age!"
        FROM inbox_work w JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
        WHERE w.stage = 'pending'
        "#
    )
    .fetch_one(exec(&mut *conn))
    .await?;
    Ok(Backlog {
        by_status,
        oldest_unapplied_age_secs: oldest,
    })
}

/// How long a source has been silent: hours since its newest stored event was received, on
/// the store's clock; `None` when none of its events is stored (a source that never sent, or
/// whose events the purge has all removed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceSilence {
    pub source: String,
    pub hours: Option<f64>,
}

/// The silence of each named source, in one statement: per source, one step down the
/// (source, received_at) index.
pub async fn source_silence(
    conn: &mut PgConnection,
    sources: &[String],
) -> Result<Vec<SourceSilence>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT s.source AS "source!",
               (SELECT EXTRACT(EPOCH FROM inbox_now() - max(e.received_at))::float8 / 3600
                  FROM inbox_events e WHERE e.source = s.source) AS hours
        FROM unnest($1::text[]) WITH ORDINALITY AS s(source, n)
        ORDER BY s.n
        "#,
        sources,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| SourceSilence {
            source: r.source,
            hours: r.hours,
        })
        .collect())
}

#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    #[serde(flatten)]
    pub backlog: Backlog,
    pub events: i64,
    pub deliveries: i64,
    /// Mean deliveries per stored event (1.0: no copies).
    pub copies_per_event: f64,
    /// Delivery lag: from the provider's time for an event to our first receipt of it, over
    /// events that have a provider time. A late event (a retry, a reconciliation fetch) lags
    /// by as long as it was late.
    pub delivery_lag_p50_secs: Option<f64>,
    pub delivery_lag_p99_secs: Option<f64>,
}

/// The whole inbox at a glance, for an operator (`inboxctl stats`): unlike the scheduler's
/// [`backlog`], every status is counted, finished ones included.
pub async fn stats(conn: &mut PgConnection) -> Result<Stats, sqlx::Error> {
    let mut backlog = backlog(&mut *conn).await?;
    backlog.by_status =
        sqlx::query!(r#"SELECT status, count(*) AS "count!" FROM inbox_events GROUP BY status"#)
            .fetch_all(exec(&mut *conn))
            .await?
            .into_iter()
            .map(|r| (r.status, r.count))
            .collect();
    let row = sqlx::query!(
        r#"
        SELECT count(*) AS "events!",
               COALESCE(sum(seen_count), 0)::bigint AS "deliveries!",
               COALESCE(avg(seen_count), 0)::float8 AS "copies!",
               percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM received_at - occurred_at))
                   FILTER (WHERE occurred_at IS NOT NULL) AS p50,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM received_at - occurred_at))
                   FILTER (WHERE occurred_at IS NOT NULL) AS p99
        FROM inbox_events
        "#,
    )
    .fetch_one(exec(&mut *conn))
    .await?;
    Ok(Stats {
        backlog,
        events: row.events,
        deliveries: row.deliveries,
        copies_per_event: row.copies,
        delivery_lag_p50_secs: row.p50,
        delivery_lag_p99_secs: row.p99,
    })
}
