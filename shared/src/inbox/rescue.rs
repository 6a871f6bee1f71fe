//! Rescue: what the queue lost goes back to it — rows stored but never enqueued, `received`
//! rows whose message was lost, expired leases and failed rows that are due — and a row whose
//! worker died on its last allowed attempt is dead (docs/design.md §3).

use std::time::Instant;

use sqlx::PgPool;

use super::{Events, NEVER_ENQUEUED_AFTER};
use crate::domain::retry::RetryPolicy;
use crate::platform::db::exec;
use crate::platform::queue::Queue;
use crate::platform::queued::{self, ROWS_PER_STEP, STUCK_AFTER};

/// Re-enqueues the events the queue lost, within the run's time (the life every queued row
/// shares, `platform::queued::rescue`).
pub async fn rescue(pool: &PgPool, queue: &Queue, deadline: Instant) -> anyhow::Result<Vec<i64>> {
    queued::rescue::<Events>(pool, queue, deadline).await
}

/// What a simulation plants between the rescue's mark and its send (docs/design.md §10): a
/// rescue that passes expired leases by, and the point a run may stop at.
pub(super) async fn simulated(pool: &PgPool, mut ids: Vec<i64>) -> anyhow::Result<Vec<i64>> {
    if crate::platform::sim::planted(crate::platform::sim::Bug::RescueSkipsLeases) {
        let leases: Vec<i64> = sqlx::query_scalar(
            "UPDATE inbox_events SET enqueued_at = NULL WHERE id = ANY($1) AND status = 'processing' RETURNING id",
        )
        .bind(&ids)
        .fetch_all(exec(pool))
        .await?;
        ids.retain(|id| !leases.contains(id));
    }
    if let Some(first) = ids.first() {
        crate::platform::sim::point(crate::platform::sim::Point::RescueMarked, *first).await;
    }
    Ok(ids)
}

/// Buries the events whose worker died on their last allowed attempt, then marks (and
/// returns) the pending events the queue has lost ([`mark`]).
pub async fn mark_lost(pool: &PgPool) -> anyhow::Result<Vec<i64>> {
    queued::mark_lost::<Events>(pool).await
}

/// An event whose worker died on its last allowed attempt is dead, not retried: nothing
/// else would stop an event that crashes every worker.
pub(super) async fn bury(pool: &PgPool) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query!(
        r#"
        UPDATE inbox_events e
        SET status = 'dead', locked_until = NULL, next_attempt_at = NULL,
            last_error = COALESCE(e.last_error || '; ', '') || 'the worker stopped during the last attempt (lease expired)'
        FROM inbox_work w
        WHERE w.stage = 'pending' AND e.id = w.event_id AND e.month = w.month
          AND e.status = 'processing' AND e.locked_until < inbox_now() AND e.attempts >= $1
        "#,
        RetryPolicy::MAX_ATTEMPTS,
    )
    .execute(exec(pool))
    .await?
    .rows_affected())
}

/// Marks (and returns, in id order) the pending events the queue has lost: stored but never
/// enqueued or enqueued long ago (`received`), expired leases, due retries — each not
/// enqueued since it became due, or whose last mark is older than [`STUCK_AFTER`]. Each
/// branch reads the events in flight (`inbox_work`, docs/design.md §3.4), one primary-key
/// probe of its month's partition each.
pub(super) async fn mark(pool: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    let mut ids: Vec<i64> = sqlx::query_scalar!(
        r#"
        WITH received AS (
            SELECT e.id, e.month FROM inbox_work w
            JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
            WHERE w.stage = 'pending'
              AND e.status = 'received' AND e.received_at < inbox_now() - make_interval(secs => $2)
              AND (e.enqueued_at IS NULL OR e.enqueued_at < inbox_now() - make_interval(secs => $3))
            LIMIT $1 FOR UPDATE OF e SKIP LOCKED
        ), leases AS (
            SELECT e.id, e.month FROM inbox_work w
            JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
            WHERE w.stage = 'pending'
              AND e.status = 'processing' AND e.locked_until < inbox_now() AND e.attempts < $4
              AND (e.enqueued_at IS NULL OR e.enqueued_at < e.locked_until
                   OR e.enqueued_at < inbox_now() - make_interval(secs => $3))
            LIMIT $1 FOR UPDATE OF e SKIP LOCKED
        ), due AS (
            SELECT e.id, e.month FROM inbox_work w
            JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
            WHERE w.stage = 'pending'
              AND e.status = 'failed' AND e.next_attempt_at <= inbox_now()
              AND (e.enqueued_at IS NULL OR e.enqueued_at < e.next_attempt_at
                   OR e.enqueued_at < inbox_now() - make_interval(secs => $3))
            LIMIT $1 FOR UPDATE OF e SKIP LOCKED
        )
        UPDATE inbox_events SET enqueued_at = inbox_now()
        WHERE (id, month) IN (SELECT id, month FROM received UNION ALL SELECT id, month FROM leases
                              UNION ALL SELECT id, month FROM due)
        RETURNING id
        "#,
        ROWS_PER_STEP,
        NEVER_ENQUEUED_AFTER.as_secs_f64(),
        STUCK_AFTER.as_secs_f64(),
        RetryPolicy::MAX_ATTEMPTS,
    )
    .fetch_all(exec(pool))
    .await?;
    ids.sort_unstable();
    Ok(ids)
}
