//! Purge: applied and ignored events older than the retention go, with their deliveries, in
//! batches. Dead, unprocessable and pending rows stay for the operator.

use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::PgPool;

/// Rows deleted per statement.
const PURGE_BATCH: i64 = 500;

/// Deletes applied and ignored events (and their deliveries) older than the retention, in
/// batches. Dead, conflicting and unprocessable rows are kept for the operator.
pub async fn purge(pool: &PgPool, retention: Duration, deadline: Instant) -> anyhow::Result<u64> {
    let mut purged = 0;
    loop {
        let deleted = sqlx::query!(
            r#"
            DELETE FROM inbox_events
            WHERE id IN (
                SELECT id FROM inbox_events
                WHERE status IN ('applied', 'ignored')
                  AND received_at < inbox_now() - make_interval(secs => $1)
                LIMIT $2 FOR UPDATE SKIP LOCKED
            )
            "#,
            retention.as_secs_f64(),
            PURGE_BATCH,
        )
        .execute(pool)
        .await
        .context("purging finished events")?
        .rows_affected();
        purged += deleted;
        if deleted < PURGE_BATCH as u64 || Instant::now() >= deadline {
            return Ok(purged);
        }
    }
}
