//! The place of a health notice's sweep of a source's subscriptions (docs/design.md §6.2): kept
//! between the notice's attempts, moved with each page's reads in the page's transaction, so
//! that an attempt that runs out of its budget is continued by the next from the page after,
//! every subscription is read once, and a finished sweep is not read again.

use sqlx::PgConnection;

use super::store::{store_verified_on, Origin, StoreError, Stored};
use crate::domain::VerifiedEvent;
use crate::platform::db::exec;

/// Where a sweep stands and what it found so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepPosition {
    /// The alert the notice's event names, as the first attempt read it.
    pub alert: String,
    /// The last subscription read: the next page starts after it (`None`: the first page).
    pub page_after: Option<String>,
    pub pages: i32,
    pub listed: i32,
    pub differing: i32,
    pub stored: i32,
    /// The last page has been read.
    pub finished: bool,
}

/// What one page of a sweep read and stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweptPage {
    pub listed: i32,
    pub differing: i32,
    /// The reads this page stored as new events.
    pub stored: Vec<i64>,
    /// Where the next page starts; `None`: this was the last.
    pub next: Option<String>,
}

/// The sweep of the notice `event_id`, if one has begun.
pub async fn position(
    conn: &mut PgConnection,
    event_id: i64,
) -> Result<Option<SweepPosition>, sqlx::Error> {
    sqlx::query_as!(
        SweepPosition,
        r#"
        SELECT alert, page_after, pages, listed, differing, stored, finished_at IS NOT NULL AS "finished!"
        FROM health_sweeps WHERE event_id = $1
        "#,
        event_id,
    )
    .fetch_optional(exec(conn))
    .await
}

/// Begins the sweep of the notice `event_id` (about `alert`) at the first page, or finds the
/// one begun.
pub async fn start(
    conn: &mut PgConnection,
    event_id: i64,
    alert: &str,
) -> Result<SweepPosition, sqlx::Error> {
    sqlx::query!(
        "INSERT INTO health_sweeps (event_id, alert) VALUES ($1, $2) ON CONFLICT (event_id) DO NOTHING",
        event_id,
        alert,
    )
    .execute(exec(&mut *conn))
    .await?;
    Ok(position(conn, event_id).await?.unwrap_or_default())
}

/// Moves the sweep past `page`, which was read from `from` (the place the sweep stood at);
/// in the transaction that stored the page's reads. The reads it stored are left unmarked:
/// nothing sends them from here, and a mark would tell the rescue that a message is on its
/// way (§3.7) and hold them back for its 5-minute rule; unmarked, the rescue sends them at
/// its next run once they are a minute old. Returns `false`, and moves nothing, when the
/// sweep no longer stands at `from` (another attempt of the notice moved it): the caller's
/// transaction then rolls back.
pub async fn advance(
    conn: &mut PgConnection,
    event_id: i64,
    from: Option<&str>,
    page: &SweptPage,
) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query_scalar!(
        r#"
        WITH unmarked AS (
            UPDATE inbox_events SET enqueued_at = NULL
            WHERE id = ANY($6) AND status = 'received'
        )
        UPDATE health_sweeps
        SET page_after = $3, pages = pages + 1, listed = listed + $4,
            differing = differing + $5, stored = stored + cardinality($6::int8[]),
            finished_at = CASE WHEN $3::text IS NULL THEN inbox_now() END,
            updated_at = inbox_now()
        WHERE event_id = $1 AND finished_at IS NULL AND page_after IS NOT DISTINCT FROM $2
        RETURNING event_id
        "#,
        event_id,
        from,
        page.next.as_deref(),
        page.listed,
        page.differing,
        &page.stored,
    )
    .fetch_optional(exec(conn))
    .await?;
    Ok(moved.is_some())
}

/// Stores a subscription the sweep of the notice `event_id` read through the store's one
/// statement, as reconciliation stores what it reads (a read, not a delivery: no copy
/// counted); the read names the notice, which the purge keeps it with. [`advance`] unmarks it
/// in the same transaction.
pub async fn store_read(
    conn: &mut PgConnection,
    source: &str,
    body: &[u8],
    verified: &VerifiedEvent,
    event_id: i64,
) -> Result<Stored, StoreError> {
    store_verified_on(conn, source, body, verified, Origin::SweptRead(event_id)).await
}
