//! The life every queued row shares, written once (docs/design.md §3.7): `inbox_events`,
//! `effects` and `meter_reports` rows are marked `enqueued_at` by the statement that picks
//! them, sent ten ids to a request, unmarked when the queue refuses them, buried when their
//! holder died on the last allowed attempt, rescued when the queue lost them, alerted on once,
//! replayed under their table's guard and purged in batches. Each table gives its own static
//! statements ([`Rows`]) and keeps its own transitions (claim, record) beside them; the loop
//! that runs them is here alone, the way one set of queue functions serves every queue.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use sqlx::{PgConnection, PgPool};

use crate::platform::db::exec;
use crate::platform::queue::Queue;

/// The most rows one scheduled step touches.
pub const ROWS_PER_STEP: i64 = 1000;
/// A pending row whose last enqueue mark is this old is enqueued again, whatever wrote the
/// mark: its message was lost, or never sent (a run that died between mark and send).
pub const STUCK_AFTER: Duration = Duration::from_secs(300);
/// Rows a purge deletes per statement.
pub const PURGE_BATCH: i64 = 500;
/// How long clearing the marks of rows the queue refused may take, a connection included:
/// one statement by primary key, normally a millisecond. A database that has not answered by
/// then leaves the marks in place, and the rescue's rule for old marks ([`STUCK_AFTER`])
/// sends the rows in place of its rule for unmarked ones. The caller goes on: the intake
/// answers the provider rather than waiting until Lambda stops the instance.
pub const UNMARK_TIMEOUT: Duration = Duration::from_secs(1);
/// Ids one send request carries (SQS's `SendMessageBatch` takes ten).
const IDS_PER_SEND: usize = 10;

/// A table of queued rows: the statements its rows' life runs, each the table's own and
/// static. The table's claim and record, which differ in what they carry, stay beside them.
pub trait Rows {
    /// The id a queue message names a row by.
    type Id: Clone + PartialEq + Ord + Send + Sync;
    /// What the scheduler reports of the rows that need an operator.
    type Alerts: Send;
    /// The rows' name in logs and in a failed step's error (`events`, `effects`, …).
    const NAME: &'static str;

    /// Hands ids to the queue; answers the ids it refused.
    fn send(queue: &Queue, ids: &[Self::Id]) -> impl Future<Output = Vec<Self::Id>> + Send;

    /// Clears the enqueue mark of rows that were not sent, so the next rescue sends them at
    /// once.
    fn unmark(
        pool: &PgPool,
        ids: &[Self::Id],
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Buries the rows whose holder died on their last allowed attempt (nothing else would stop
    /// a row that crashes every holder); how many.
    fn bury(pool: &PgPool) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Marks (and returns) the pending rows the queue lost, each marked in the statement that
    /// picks it (`SKIP LOCKED`), so two overlapping runs never send one row twice.
    fn mark(pool: &PgPool) -> impl Future<Output = anyhow::Result<Vec<Self::Id>>> + Send;

    /// Reports each row newly needing an operator once (`alerted_at`), and counts what waits.
    fn alerts(pool: &PgPool) -> impl Future<Output = anyhow::Result<Self::Alerts>> + Send;

    /// Deletes at most [`PURGE_BATCH`] finished rows older than `retention`; the rows deleted.
    /// Rows kept forever leave it as it is: it deletes nothing.
    fn purge_batch(
        _pool: &PgPool,
        _retention: Duration,
    ) -> impl Future<Output = anyhow::Result<u64>> + Send {
        async { Ok(0) }
    }
}

/// An unmark, given up after [`UNMARK_TIMEOUT`].
async fn bounded_unmark(
    unmark: impl Future<Output = Result<(), sqlx::Error>>,
) -> anyhow::Result<()> {
    tokio::time::timeout(UNMARK_TIMEOUT, unmark)
        .await
        .map_err(|_| anyhow!("no answer within {UNMARK_TIMEOUT:?}"))?
        .map_err(Into::into)
}

/// Sends ids already marked `enqueued_at`; unmarks those the queue refused. Returns the
/// refused ids. A failure to unmark, or no answer within [`UNMARK_TIMEOUT`], leaves them
/// marked: the rescue of stuck rows sends them, a few minutes later.
pub async fn enqueue_or_unmark<R: Rows>(
    pool: &PgPool,
    queue: &Queue,
    ids: &[R::Id],
) -> anyhow::Result<Vec<R::Id>> {
    let unsent = R::send(queue, ids).await;
    if !unsent.is_empty() {
        tracing::warn!(
            count = unsent.len(),
            rows = R::NAME,
            "enqueue failed; the scheduler will rescue the rows"
        );
        bounded_unmark(R::unmark(pool, &unsent))
            .await
            .with_context(|| format!("unmarking {} the queue refused", R::NAME))?;
    }
    Ok(unsent)
}

/// Sends marked rows, ten ids to a request, while `deadline` allows; returns those sent. What
/// the queue refused, and what time did not allow, is unmarked, for the next run at once.
pub async fn send_in_tens<R: Rows>(
    pool: &PgPool,
    queue: &Queue,
    ids: &[R::Id],
    deadline: Instant,
) -> anyhow::Result<Vec<R::Id>> {
    let mut sent = Vec::with_capacity(ids.len());
    for (n, chunk) in ids.chunks(IDS_PER_SEND).enumerate() {
        if Instant::now() >= deadline {
            let left = &ids[n * IDS_PER_SEND..];
            tracing::warn!(
                count = left.len(),
                rows = R::NAME,
                "the run's time is up; the rest waits for the next run"
            );
            R::unmark(pool, left).await?;
            break;
        }
        let unsent = enqueue_or_unmark::<R>(pool, queue, chunk).await?;
        sent.extend(chunk.iter().filter(|id| !unsent.contains(id)).cloned());
    }
    Ok(sent)
}

/// Buries the rows whose holder died on their last allowed attempt, then marks (and returns,
/// in id order) the pending rows the queue lost.
pub async fn mark_lost<R: Rows>(pool: &PgPool) -> anyhow::Result<Vec<R::Id>> {
    let buried = R::bury(pool)
        .await
        .with_context(|| format!("burying {} whose last attempt crashed", R::NAME))?;
    if buried > 0 {
        tracing::warn!(
            count = buried,
            rows = R::NAME,
            "rows died with their holder on the last attempt"
        );
    }
    let mut ids = R::mark(pool)
        .await
        .with_context(|| format!("picking {} to rescue", R::NAME))?;
    ids.sort_unstable();
    Ok(ids)
}

/// An outbox table (`effects`, `meter_reports`): its rescue's bury and mark are one SQL
/// function each for both tables (`outbox_bury`, `outbox_mark`, migration
/// `20261220000002_outbox_rescue.sql`), the table an argument, as pgmq's functions take a
/// queue's name.
#[derive(Debug, Clone, Copy)]
pub struct Outbox(pub &'static str);

impl Outbox {
    /// Buries the pending rows whose last attempt's hold expired (no attempt left).
    pub async fn bury(self, pool: &PgPool, max_attempts: i32) -> Result<u64, sqlx::Error> {
        let buried = sqlx::query_scalar!(
            r#"SELECT outbox_bury($1::text::regclass, $2) AS "buried!""#,
            self.0,
            max_attempts,
        )
        .fetch_one(exec(pool))
        .await?;
        Ok(u64::try_from(buried).unwrap_or_default())
    }

    /// Marks and returns the pending rows the queue lost, oldest first, at most
    /// [`ROWS_PER_STEP`] (`outbox_lost`, the rule every outbox row shares).
    pub async fn mark(self, pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar!(
            r#"SELECT id AS "id!" FROM outbox_mark($1::text::regclass, $2, $3) AS id"#,
            self.0,
            ROWS_PER_STEP,
            STUCK_AFTER.as_secs_f64(),
        )
        .fetch_all(exec(pool))
        .await
    }
}

/// Re-enqueues the rows the queue lost, within the run's time: [`mark_lost`], then
/// [`send_in_tens`] until `deadline`. A run that dies between the two (or a send that never
/// happened for any other reason) leaves marks that the next runs treat as lost once they
/// are [`STUCK_AFTER`] old, so no row is stranded, whatever wrote its mark. Its span, one per
/// row kind, is the parent of the rescued rows' own (their messages carry it).
#[tracing::instrument(name = "rescue", skip_all, fields(rows = R::NAME))]
pub async fn rescue<R: Rows>(
    pool: &PgPool,
    queue: &Queue,
    deadline: Instant,
) -> anyhow::Result<Vec<R::Id>> {
    let ids = mark_lost::<R>(pool).await?;
    if ids.is_empty() {
        return Ok(ids);
    }
    let sent = send_in_tens::<R>(pool, queue, &ids, deadline).await?;
    tracing::info!(count = sent.len(), rows = R::NAME, "rescued rows enqueued");
    Ok(sent)
}

/// Replays rows: `reset` puts them back to pending, marked as on their way to the queue,
/// under the table's guard (a row a holder has now is left alone), on a connection of its
/// own; then they are sent (with `queue`; without, the rescue sends them). What the queue
/// refused stays pending and unmarked: the next rescue sends it. Returns the ids reset.
pub async fn replay<R: Rows>(
    pool: &PgPool,
    queue: Option<&Queue>,
    reset: impl AsyncFnOnce(&mut PgConnection) -> Result<Vec<R::Id>, sqlx::Error>,
) -> anyhow::Result<Vec<R::Id>> {
    let mut conn = pool
        .acquire()
        .await
        .with_context(|| format!("connecting to replay {}", R::NAME))?;
    let reset = reset(&mut conn)
        .await
        .with_context(|| format!("resetting {} for replay", R::NAME))?;
    drop(conn);
    if let Some(queue) = queue {
        enqueue_or_unmark::<R>(pool, queue, &reset).await?;
    }
    Ok(reset)
}

/// Runs [`Rows::purge_batch`] until a batch comes back short or `deadline` has passed; the
/// rows deleted in all.
pub async fn purge<R: Rows>(
    pool: &PgPool,
    retention: Duration,
    deadline: Instant,
) -> anyhow::Result<u64> {
    let mut purged = 0;
    loop {
        let deleted = R::purge_batch(pool, retention).await?;
        purged += deleted;
        if deleted < PURGE_BATCH as u64 || Instant::now() >= deadline {
            return Ok(purged);
        }
    }
}
