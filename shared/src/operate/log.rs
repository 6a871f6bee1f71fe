//! An account's event log as the app reads it (docs/api.md, `GET …/events`): its events in
//! provider order, those the purge took still listed from the account's log. The list is the
//! view `account_events`, which `inboxctl account` reads too (`billing::account`): what the
//! account's log names, and its events not finished or given up.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::{cut, Place};
use crate::billing::fold::Via;
use crate::domain::CustomerId;
use crate::platform::db::exec;

/// The status of an event only the log remembers: the purge took its row.
pub const PURGED: &str = "purged";

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
    /// The inbox's status, or [`PURGED`] for an event only the log remembers.
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

/// A page of the log, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logged {
    Page(LogPage),
    /// `after` is no place of this account's log (another account's `next`, a made-up one).
    UnknownPlace,
}

/// The account's events after `after` in provider order (provider time, then id), `limit` of
/// them. An event whose provider time could not be read has no place in that order; the admin
/// events list shows it. `after` must be one of the account's own places, as a page's `next`
/// names them: any other is refused rather than read as a position.
pub async fn account_events(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    limit: i64,
    after: Option<&Place<i64>>,
) -> Result<Logged, sqlx::Error> {
    let (at, id) = match after {
        Some(place) => (place.at, place.id),
        // Before any provider's time (Postgres has no time as early as chrono's earliest).
        None => (
            DateTime::from_timestamp(EARLIEST_SECS, 0).expect("year 1 is a time"),
            i64::MIN,
        ),
    };
    // One row at least: whether the place is the account's, with the page beside it. The
    // page is cut from the log's lines first, then each of its events' rows read by key.
    let rows = sqlx::query!(
        r#"
        WITH place AS (
            SELECT NOT $6::bool OR EXISTS (
                SELECT 1 FROM account_events c
                WHERE c.source = $1 AND c.customer_id = $2 AND c.event_id = $4
                  AND c.occurred_at = $3) AS known
        )
        SELECT place.known AS "known!", page.event_id AS "event_id?", e.dedupe_key AS "dedupe_key?",
               page.event_type AS "event_type?", page.occurred_at AS "occurred_at?",
               e.received_at AS "received_at?", COALESCE(e.status, $7) AS "status?",
               page.outcome, page.reason, e.seen_count AS "seen_count?",
               (SELECT d.headers->>'via' FROM deliveries d WHERE d.event_id = page.event_id
                ORDER BY d.id LIMIT 1) AS via
        FROM place LEFT JOIN LATERAL (
            SELECT a.event_id, a.event_type, a.occurred_at, a.outcome, a.reason
            FROM account_events a
            WHERE place.known AND a.source = $1 AND a.customer_id = $2
              AND a.occurred_at >= $3 AND (a.occurred_at, a.event_id) > ($3, $4)
            ORDER BY a.occurred_at, a.event_id
            LIMIT $5
        ) page ON true
        LEFT JOIN inbox_events e ON e.id = page.event_id
        ORDER BY page.occurred_at, page.event_id
        "#,
        source,
        customer.as_str(),
        at,
        id,
        limit + 1,
        after.is_some(),
        PURGED,
    )
    .fetch_all(exec(conn))
    .await?;
    if rows.first().is_some_and(|row| !row.known) {
        return Ok(Logged::UnknownPlace);
    }
    let events: Vec<LoggedEvent> = rows
        .into_iter()
        .filter_map(|row| {
            Some(LoggedEvent {
                via: row
                    .dedupe_key
                    .as_deref()
                    .map(|key| Via::of(key, row.via.as_deref())),
                event_id: row.event_id?,
                provider_event_id: row.dedupe_key,
                event_type: row.event_type?,
                occurred_at: row.occurred_at?,
                received_at: row.received_at,
                status: row.status?,
                outcome: row.outcome,
                reason: row.reason,
                seen_count: row.seen_count,
            })
        })
        .collect();
    let (events, next) = cut(events, limit, |last| {
        Place {
            at: last.occurred_at,
            id: last.event_id,
        }
        .encode()
    });
    Ok(Logged::Page(LogPage { events, next }))
}

/// Where one of the account's events stands in its log: its status (`purged` when only its
/// line is left), or `None` when the log does not list it (another account's event, a read
/// made for one, no event at all). A replay by the account's key takes only what its log lists.
pub async fn status_in_log(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    event_id: i64,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT COALESCE(e.status, $4) AS "status!"
           FROM account_events a LEFT JOIN inbox_events e ON e.id = a.event_id
           WHERE a.source = $1 AND a.customer_id = $2 AND a.event_id = $3"#,
        source,
        customer.as_str(),
        event_id,
        PURGED,
    )
    .fetch_optional(exec(conn))
    .await
}
