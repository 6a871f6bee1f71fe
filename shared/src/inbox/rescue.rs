//! Rescue: what the queue lost goes back to it — rows stored but never enqueued, `received`
//! rows whose message was lost, expired leases and failed rows that are due — and a row whose
//! worker died on its last allowed attempt is dead (docs/design.md §3).

use std::time::Instant;

use anyhow::Context;
use sqlx::PgPool;

use super::{enqueue_or_unmark, NEVER_ENQUEUED_AFTER, ROWS_PER_STEP, STUCK_AFTER};
use crate::domain::retry::RetryPolicy;
use crate::platform::db::exec;
use crate::platform::queue::Queue;

/// Re-enqueues the rows the queue lost, within the run's time: [`mark_lost`], then
/// [`send_marked`] until `deadline`. A run that dies between the two (or a send that never
/// happened for any other reason) leaves marks that the next runs treat as lost once they
/// are [`STUCK_AFTER`] old, so no row is stranded, whatever wrote its mark.
pub async fn rescue(pool: &PgPool, queue: &Queue, deadline: Instant) -> anyhow::Result<Vec<i64>> {
    let mut ids = mark_lost(pool).await?;
    if crate::platform::sim::planted(crate::platform::sim::Bug::RescueSkipsLeases) {
        let leases: Vec<i64> = sqlx::query_scalar(
            "UPDATE inbox_events SET enqueued_at = NULL WHERE id = ANY($1) AND status = 'processing' RETURNING id",
        )
        .bind(&ids)
        .fetch_all(exec(pool))
        .await?;
        ids.retain(|id| !leases.contains(id));
    }
    if ids.is_empty() {
        return Ok(ids);
    }
    crate::platform::sim::point(crate::platform::sim::Point::RescueMarked, ids[0]).await;
    let sent = send_marked(pool, queue, &ids, deadline).await?;
    tracing::info!(count = sent.len(), "rescued events enqueued");
    Ok(sent)
}

/// Buries the rows whose worker died on their last allowed attempt, then marks (and
/// returns) the pending rows the queue has lost: stored but never enqueued or enqueued long
/// ago (`received`), expired leases, due retries — each not enqueued since it became due,
/// or whose last mark is older than [`STUCK_AFTER`]. Each row is marked in the statement
/// that picks it (SKIP LOCKED), so two overlapping runs never enqueue one row twice. Each
/// branch reads its own partial index.
pub async fn mark_lost(pool: &PgPool) -> anyhow::Result<Vec<i64>> {
    // An event whose worker died on its last allowed attempt is dead, not retried: nothing
    // else would stop an event that crashes every worker.
    let buried = sqlx::query!(
        r#"
        UPDATE inbox_events
        SET status = 'dead', locked_until = NULL, next_attempt_at = NULL,
            last_error = COALESCE(last_error || '; ', '') || 'the worker stopped during the last attempt (lease expired)'
        WHERE status = 'processing' AND locked_until < inbox_now() AND attempts >= $1
        "#,
        RetryPolicy::MAX_ATTEMPTS,
    )
    .execute(exec(pool))
    .await
    .context("burying events whose last attempt crashed")?
    .rows_affected();
    if buried > 0 {
        tracing::warn!(
            count = buried,
            "events died with their worker on the last attempt"
        );
    }
    let ids: Vec<i64> = sqlx::query_scalar!(
        r#"
        WITH received AS (
            SELECT id FROM inbox_events
            WHERE status = 'received' AND received_at < inbox_now() - make_interval(secs => $2)
              AND (enqueued_at IS NULL OR enqueued_at < inbox_now() - make_interval(secs => $3))
            LIMIT $1 FOR UPDATE SKIP LOCKED
        ), leases AS (
            SELECT id FROM inbox_events
            WHERE status = 'processing' AND locked_until < inbox_now() AND attempts < $4
              AND (enqueued_at IS NULL OR enqueued_at < locked_until
                   OR enqueued_at < inbox_now() - make_interval(secs => $3))
            LIMIT $1 FOR UPDATE SKIP LOCKED
        ), due AS (
            SELECT id FROM inbox_events
            WHERE status = 'failed' AND next_attempt_at <= inbox_now()
              AND (enqueued_at IS NULL OR enqueued_at < next_attempt_at
                   OR enqueued_at < inbox_now() - make_interval(secs => $3))
            LIMIT $1 FOR UPDATE SKIP LOCKED
        )
        UPDATE inbox_events SET enqueued_at = inbox_now()
        WHERE id IN (SELECT id FROM received UNION ALL SELECT id FROM leases
                     UNION ALL SELECT id FROM due)
        RETURNING id
        "#,
        ROWS_PER_STEP,
        NEVER_ENQUEUED_AFTER.as_secs_f64(),
        STUCK_AFTER.as_secs_f64(),
        RetryPolicy::MAX_ATTEMPTS,
    )
    .fetch_all(exec(pool))
    .await
    .context("picking rows to rescue")?;
    let mut ids = ids;
    ids.sort_unstable();
    Ok(ids)
}

/// Sends marked rows, ten to a request, while `deadline` allows; returns those sent. What
/// the queue refused, and what time did not allow, is unmarked, for the next run at once.
pub async fn send_marked(
    pool: &PgPool,
    queue: &Queue,
    ids: &[i64],
    deadline: Instant,
) -> anyhow::Result<Vec<i64>> {
    let mut sent = Vec::with_capacity(ids.len());
    let mut left: Vec<i64> = Vec::new();
    for (n, chunk) in ids.chunks(10).enumerate() {
        if Instant::now() >= deadline {
            left.extend(ids.iter().skip(n * 10));
            tracing::warn!(
                count = left.len(),
                "the run's time is up; the rest waits for the next run"
            );
            break;
        }
        let unsent = enqueue_or_unmark(pool, queue, chunk).await?;
        sent.extend(chunk.iter().filter(|id| !unsent.contains(id)));
    }
    if !left.is_empty() {
        super::unmark(pool, &left).await?;
    }
    Ok(sent)
}
