//! An account's event log as the app reads it (docs/api.md, `GET …/events`): its events in
//! provider order, those the purge took still listed from the account's log.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::Place;
use crate::billing::fold::Via;
use crate::domain::CustomerId;
use crate::platform::db::exec;

/// 0001-01-01T00:00:00Z, where the first page starts.
const EARLIEST_SECS: i64 = -62_135_596_800;

/// One event of an account's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoggedEvent {
    pub event_id: i64,
    /// The provider's id for the event (the store's key for it); `None` once purged.
    pub provider_event_id: Option<String>,
    #[serde(rename = "type")]
    pub event_type: String,
    pub occurred_at: DateTime<Utc>,
    /// `None` once purged.
    pub received_at: Option<DateTime<Utc>>,
    /// The inbox's status, or `purged` for an event only the log remembers.
    pub status: String,
    /// `applied`, `ignored` or `unprocessable` once the event is finished.
    pub outcome: Option<String>,
    pub reason: Option<String>,
    pub seen_count: Option<i32>,
    pub via: Option<Via>,
}

/// One page of the log, and the place the next one starts after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogPage {
    pub events: Vec<LoggedEvent>,
    pub next: Option<String>,
}

/// The account's events after `after` in provider order (provider time, then id), `limit` of
/// them. An event whose provider time could not be read has no place in that order; the admin
/// events list shows it.
pub async fn account_events(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    limit: i64,
    after: Option<&Place<i64>>,
) -> Result<LogPage, sqlx::Error> {
    let (at, id) = match after {
        Some(place) => (place.at, place.id),
        // Before any provider's time (Postgres has no time as early as chrono's earliest).
        None => (
            DateTime::from_timestamp(EARLIEST_SECS, 0).expect("year 1 is a time"),
            i64::MIN,
        ),
    };
    let rows = sqlx::query!(
        r#"
        SELECT id AS "id!", dedupe_key, event_type AS "event_type!", occurred_at AS "occurred_at!",
               received_at, status AS "status!", outcome, reason, seen_count, via
        FROM (
            SELECT e.id, e.dedupe_key, e.type AS event_type, e.occurred_at, e.received_at,
                   e.status, l.outcome, COALESCE(l.reason, e.reason) AS reason, e.seen_count,
                   (SELECT d.headers->>'via' FROM deliveries d WHERE d.event_id = e.id
                    ORDER BY d.id LIMIT 1) AS via
            FROM inbox_events e LEFT JOIN account_log l ON l.event_id = e.id
            WHERE e.source = $1 AND e.customer_key = $2
              AND e.occurred_at >= $3 AND (e.occurred_at, e.id) > ($3, $4)
            UNION ALL
            SELECT l.event_id, NULL, l.event_type, l.occurred_at, NULL, 'purged', l.outcome,
                   l.reason, NULL, NULL
            FROM account_log l
            WHERE l.source = $1 AND l.customer_id = $2
              AND l.occurred_at >= $3 AND (l.occurred_at, l.event_id) > ($3, $4)
              AND NOT EXISTS (SELECT 1 FROM inbox_events e WHERE e.id = l.event_id)
        ) page
        ORDER BY occurred_at, id
        LIMIT $5
        "#,
        source,
        customer.as_str(),
        at,
        id,
        limit + 1,
    )
    .fetch_all(exec(conn))
    .await?;
    let mut events: Vec<LoggedEvent> = rows
        .into_iter()
        .map(|row| LoggedEvent {
            via: row
                .dedupe_key
                .as_deref()
                .map(|key| Via::of(key, row.via.as_deref())),
            event_id: row.id,
            provider_event_id: row.dedupe_key,
            event_type: row.event_type,
            occurred_at: row.occurred_at,
            received_at: row.received_at,
            status: row.status,
            outcome: row.outcome,
            reason: row.reason,
            seen_count: row.seen_count,
        })
        .collect();
    let next = (events.len() as i64 > limit).then(|| {
        events.truncate(limit as usize);
        let last = events
            .last()
            .expect("a page over its limit has a last event");
        Place {
            at: last.occurred_at,
            id: last.event_id,
        }
        .encode()
    });
    Ok(LogPage { events, next })
}

/// Whether the account's log names the event (an event of the account that the purge took).
pub async fn logged(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    event_id: i64,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM account_log
                          WHERE event_id = $1 AND source = $2 AND customer_id = $3) AS "logged!""#,
        event_id,
        source,
        customer.as_str(),
    )
    .fetch_one(exec(conn))
    .await
}
