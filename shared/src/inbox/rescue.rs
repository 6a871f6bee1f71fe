//! Rescue: what the queue lost goes back to it — rows stored but never enqueued, `received`
//! rows whose message was lost, expired leases and failed rows that are due — and a row whose
//! worker died on its last allowed attempt is dead (docs/design.md §3).

use anyhow::Context;
use sqlx::PgPool;

use super::{enqueue_or_unmark, MAX_ATTEMPTS, NEVER_ENQUEUED_AFTER, ROWS_PER_STEP, STUCK_AFTER};
use crate::queue::Queue;

/// Re-enqueues the rows the queue lost: stored but never enqueued, stuck `received`, leases
/// that expired and failed rows that are due. Each row is marked in the same statement that
/// picks it (SKIP LOCKED), so two overlapping runs never enqueue one row twice.
pub async fn rescue(pool: &PgPool, queue: &Queue) -> anyhow::Result<Vec<i64>> {
    // An event whose worker died on its last allowed attempt is dead, not retried: nothing
    // else would stop an event that crashes every worker.
    let buried = sqlx::query!(
        r#"
        UPDATE inbox_events
        SET status = 'dead', locked_until = NULL, next_attempt_at = NULL,
            last_error = COALESCE(last_error || '; ', '') || 'the worker stopped during the last attempt (lease expired)'
        WHERE status = 'processing' AND locked_until < now() AND attempts >= $1
        "#,
        MAX_ATTEMPTS,
    )
    .execute(pool)
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
        UPDATE inbox_events SET enqueued_at = now()
        WHERE id IN (
            SELECT id FROM inbox_events
            WHERE (status = 'received' AND received_at < now() - make_interval(secs => $2)
                   AND (enqueued_at IS NULL OR enqueued_at < now() - make_interval(secs => $3)))
               OR (status = 'processing' AND locked_until < now() AND attempts < $4
                   AND (enqueued_at IS NULL OR enqueued_at < locked_until))
               OR (status = 'failed' AND next_attempt_at <= now()
                   AND (enqueued_at IS NULL OR enqueued_at < next_attempt_at))
            ORDER BY id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        RETURNING id
        "#,
        ROWS_PER_STEP,
        NEVER_ENQUEUED_AFTER.as_secs_f64(),
        STUCK_AFTER.as_secs_f64(),
        MAX_ATTEMPTS,
    )
    .fetch_all(pool)
    .await
    .context("picking rows to rescue")?;
    if ids.is_empty() {
        return Ok(ids);
    }
    let unsent = enqueue_or_unmark(pool, queue, &ids).await?;
    let sent: Vec<i64> = ids.into_iter().filter(|id| !unsent.contains(id)).collect();
    tracing::info!(count = sent.len(), "rescued events enqueued");
    Ok(sent)
}
