//! The hand-off to the queue after a commit: rows are marked `enqueued_at` by the statement
//! that picked them, then sent; a row the queue refused is unmarked, so that the next rescue
//! of never-enqueued rows sends it. The only code that sends event ids.

use anyhow::Context;
use sqlx::PgPool;

use crate::queue::Queue;

/// Sends event ids already marked `enqueued_at`; unmarks those the queue refused. Returns the
/// refused ids. A failure to unmark leaves them marked: the rescue of stuck rows sends them,
/// a few minutes later.
pub async fn enqueue_or_unmark(
    pool: &PgPool,
    queue: &Queue,
    ids: &[i64],
) -> anyhow::Result<Vec<i64>> {
    let unsent = queue.send_events(ids).await;
    if !unsent.is_empty() {
        tracing::warn!(
            count = unsent.len(),
            "enqueue failed; the scheduler will rescue the events"
        );
        unmark(pool, &unsent)
            .await
            .context("unmarking events the queue refused")?;
    }
    Ok(unsent)
}

/// Clears the enqueue mark of rows that were not sent, so the next rescue sends them at once.
pub async fn unmark(pool: &PgPool, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE inbox_events SET enqueued_at = NULL WHERE id = ANY($1)",
        ids
    )
    .execute(pool)
    .await?;
    Ok(())
}
