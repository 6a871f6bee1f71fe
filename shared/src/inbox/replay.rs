//! Replay: stored events go back to `received` and to the queue. Applying an event again is
//! harmless by construction, so this is the one repair operators need.

use sqlx::{PgConnection, PgPool};

use super::Events;
use crate::domain::EventStatus;
use crate::platform::db::exec;
use crate::platform::queue::Queue;
use crate::platform::queued;

/// Puts stored events back to `received` and enqueues them: the one way to replay, used by
/// operators. Applying an event again is harmless by construction. A row a worker holds right
/// now is left alone. Returns the ids replayed.
pub async fn replay(pool: &PgPool, queue: &Queue, ids: &[i64]) -> anyhow::Result<Vec<i64>> {
    // What the queue refused stays `received` and unmarked: the next rescue sends it.
    queued::replay::<Events>(pool, Some(queue), async |conn| reset(conn, ids).await).await
}

/// Puts the events back to `received`, marked as on their way to the queue (the caller sends
/// them after its commit, [`super::enqueue_or_unmark`]; the rescue sends what it does not), except a
/// row a worker holds right now. Returns the ids reset.
pub async fn reset(conn: &mut PgConnection, ids: &[i64]) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        UPDATE inbox_events
        SET status = 'received', attempts = 0, next_attempt_at = NULL, locked_until = NULL,
            processed_at = NULL, alerted_at = NULL, reason = NULL, enqueued_at = inbox_now(),
            replays = replays + 1
        WHERE id = ANY($1) AND NOT (status = 'processing' AND locked_until > inbox_now())
        RETURNING id
        "#,
        ids,
    )
    .fetch_all(exec(conn))
    .await
}

/// The ids of events in `status` (optionally of one source), oldest first, at most `limit`.
pub async fn ids_with_status(
    conn: &mut PgConnection,
    status: EventStatus,
    source: Option<&str>,
    limit: i64,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        SELECT id FROM inbox_events
        WHERE status = $1 AND ($2::text IS NULL OR source = $2)
        ORDER BY id LIMIT $3
        "#,
        status.as_str(),
        source,
        limit,
    )
    .fetch_all(exec(conn))
    .await
}
