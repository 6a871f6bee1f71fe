//! The audit trail (docs/design.md §12.5): every action taken through the API that changes the
//! store, by the name of the key that asked, and the window each key's replays are counted in.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;

use crate::platform::db::exec;

/// How many replays (one event, or one bulk request) a key may ask for in a minute.
pub const REPLAYS_PER_MINUTE: i64 = 30;

/// One action of the trail.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Action {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// The key's name.
    pub who: String,
    /// What was done: `event.replay`, `events.replay`, `effect.replay`,
    /// `account_event.replay`, `engine_room.run`.
    pub action: String,
    /// What it was done to: an event's or effect's id, or the bulk request's filter.
    pub target: String,
    pub detail: Value,
}

/// A key over its replays for the minute: asked to wait this many seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub retry_after_secs: u64,
}

/// Takes one of `who`'s replays of the minute and writes the action, in the caller's
/// transaction; `Err(Limited)` when the key has had its [`REPLAYS_PER_MINUTE`] (nothing is
/// written). The key's actions are taken one at a time (a transaction lock on its name), so
/// two requests at once cannot both take the last one.
pub async fn take(
    tx: &mut PgConnection,
    who: &str,
    action: &str,
    target: &str,
    detail: &Value,
) -> Result<Result<i64, Limited>, sqlx::Error> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('api_actions:' || $1, 0))",
        who
    )
    .execute(exec(&mut *tx))
    .await?;
    let window = sqlx::query!(
        r#"SELECT count(*) AS "count!",
                  EXTRACT(EPOCH FROM min(at) + interval '1 minute' - inbox_now())::float8 AS wait
           FROM api_actions
           WHERE who = $1 AND at > inbox_now() - interval '1 minute'
             AND action LIKE '%replay'"#,
        who
    )
    .fetch_one(exec(&mut *tx))
    .await?;
    if window.count >= REPLAYS_PER_MINUTE {
        let wait = window.wait.unwrap_or(1.0).ceil().max(1.0);
        return Ok(Err(Limited {
            retry_after_secs: wait as u64,
        }));
    }
    let id = sqlx::query_scalar!(
        "INSERT INTO api_actions (who, action, target, detail) VALUES ($1, $2, $3, $4)
         RETURNING id",
        who,
        action,
        target,
        detail,
    )
    .fetch_one(exec(&mut *tx))
    .await?;
    Ok(Ok(id))
}

/// Writes an action that counts against no limit (an Engine Room run on a test customer).
pub async fn record(
    pool: &sqlx::PgPool,
    who: &str,
    action: &str,
    target: &str,
    detail: &Value,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO api_actions (who, action, target, detail) VALUES ($1, $2, $3, $4)",
        who,
        action,
        target,
        detail,
    )
    .execute(exec(pool))
    .await?;
    Ok(())
}

/// Writes what an action came to (the ids replayed, the status) once it is known.
pub async fn settle(tx: &mut PgConnection, id: i64, detail: &Value) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE api_actions SET detail = detail || $2 WHERE id = $1",
        id,
        detail
    )
    .execute(exec(tx))
    .await?;
    Ok(())
}

/// The trail, newest first: `limit` actions older than `before` (an action's id).
pub async fn list(
    conn: &mut PgConnection,
    limit: i64,
    before: Option<i64>,
) -> Result<Vec<Action>, sqlx::Error> {
    sqlx::query_as!(
        Action,
        "SELECT id, at, who, action, target, detail FROM api_actions
         WHERE ($1::bigint IS NULL OR id < $1) ORDER BY id DESC LIMIT $2",
        before,
        limit,
    )
    .fetch_all(exec(conn))
    .await
}
