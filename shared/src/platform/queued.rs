//! The hand-off to the queue after a commit: rows are marked `enqueued_at` by the statement
//! that picked them, then sent; a row the queue refused is unmarked, so that the next rescue
//! of never-enqueued rows sends it. The only code that sends event ids.

use std::future::Future;
use std::time::Duration;

use anyhow::{anyhow, Context};
use sqlx::PgPool;

use crate::platform::db::exec;
use crate::platform::queue::Queue;

/// How long clearing the marks of rows the queue refused may take, a connection included:
/// one statement by primary key, normally a millisecond. A database that has not answered by
/// then leaves the marks in place, and the rescue's rule for old marks
/// ([`super::STUCK_AFTER`]) sends the rows in place of its rule for unmarked ones. The
/// caller goes on: the intake answers the provider rather than waiting until Lambda stops
/// the instance.
pub const UNMARK_TIMEOUT: Duration = Duration::from_secs(1);

/// An unmark, given up after [`UNMARK_TIMEOUT`].
pub async fn bounded_unmark(
    unmark: impl Future<Output = Result<(), sqlx::Error>>,
) -> anyhow::Result<()> {
    tokio::time::timeout(UNMARK_TIMEOUT, unmark)
        .await
        .map_err(|_| anyhow!("no answer within {UNMARK_TIMEOUT:?}"))?
        .map_err(Into::into)
}

/// Sends rows a rescue marked, ten ids to a request, while `deadline` allows: `send` hands a
/// chunk to the queue and answers the ids it refused (unmarked already), `unmark` clears the
/// marks of those the time left unsent, for the next run. Returns the ids sent. Outbox rows
/// (effects, meter reports) go this way; events have their own batches (`rescue`).
pub async fn send_in_tens(
    ids: &[String],
    deadline: std::time::Instant,
    send: impl AsyncFn(&[String]) -> anyhow::Result<Vec<String>>,
    unmark: impl AsyncFn(&[String]) -> Result<(), sqlx::Error>,
) -> anyhow::Result<Vec<String>> {
    let mut sent = Vec::with_capacity(ids.len());
    for (n, chunk) in ids.chunks(10).enumerate() {
        if std::time::Instant::now() >= deadline {
            unmark(&ids[n * 10..]).await?;
            break;
        }
        let unsent = send(chunk).await?;
        sent.extend(chunk.iter().filter(|id| !unsent.contains(id)).cloned());
    }
    Ok(sent)
}

/// Sends event ids already marked `enqueued_at`; unmarks those the queue refused. Returns the
/// refused ids. A failure to unmark, or no answer within [`UNMARK_TIMEOUT`], leaves them
/// marked: the rescue of stuck rows sends them, a few minutes later.
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
        bounded_unmark(unmark(pool, &unsent))
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
    .execute(exec(pool))
    .await?;
    Ok(())
}
