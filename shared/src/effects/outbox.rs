//! The one home of an effect row's life (docs/design.md §11). Every statement that moves
//! an `effects` row is here, but its birth: the event's one statement that writes the
//! change writes its effects too (`inbox::commit`), so they commit or vanish together.
//!
//! ```text
//!  write (one worker statement) ──▶ pending ──claim──▶ (dispatcher holds it) ──record──▶ sent
//!                                     ▲  ▲                    │
//!                                     │  └── retry due ───────┘ failed: next attempt later,
//!                                     │                         or dead after the last one
//!                                     └──────── replay (sent or dead) ◀──────────────────
//! ```
//!
//! A message on the effects queue only names an effect; the row is the fact. A failed
//! delivery waits and is tried again on the events' retry policy (`domain::retry`). The
//! scheduler's rescue re-enqueues what the queue lost, expired holds and due retries; its
//! purge deletes sent effects once older than the retention. The loops of the send, the
//! rescue, the replay and the purge are the life every queued row shares
//! (`platform::queued`); [`Effects`] gives them the effects' statements.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::domain::retry::RetryPolicy;
use crate::platform::db::exec;
use crate::platform::queue::Queue;
use crate::platform::queued::{self, Outbox, Rows, PURGE_BATCH, ROWS_PER_STEP};

/// How long a dispatcher holds an effect: longer than its sinks' timeouts together.
pub const DISPATCH_LEASE: Duration = Duration::from_secs(60);
/// A pending effect older than this is reported as stuck (the alarm's metric).
pub const STUCK_ALERT_AFTER: Duration = Duration::from_secs(15 * 60);

/// An effect's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EffectStatus {
    Pending,
    Sent,
    Dead,
}

impl EffectStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            EffectStatus::Pending => "pending",
            EffectStatus::Sent => "sent",
            EffectStatus::Dead => "dead",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Pending, Self::Sent, Self::Dead]
            .into_iter()
            .find(|s| s.as_str() == raw)
    }
}

/// The pending effects of an event that are marked as on their way to the queue.
pub async fn marked_of_event(pool: &PgPool, event_id: i64) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT id FROM effects
         WHERE event_id = $1 AND status = 'pending' AND enqueued_at IS NOT NULL
         ORDER BY sequence",
        event_id
    )
    .fetch_all(exec(pool))
    .await
}

/// An effect a dispatcher holds: what it delivers, and where it was already delivered.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: String,
    pub kind: String,
    pub body: Value,
    pub sent_to: Vec<String>,
    /// This attempt's number; with the id, it names the hold.
    pub attempts: i32,
}

/// Takes a pending effect for one delivery attempt, if no other dispatcher holds it and no
/// retry wait is running. Commits at once, so the hold outlives a crash.
pub async fn claim(
    pool: &PgPool,
    id: &str,
    lease: Duration,
) -> Result<Option<Claimed>, sqlx::Error> {
    sqlx::query_as!(
        Claimed,
        r#"
        UPDATE effects f
        SET locked_until = inbox_now() + make_interval(secs => $2), attempts = f.attempts + 1
        WHERE f.id = (
            SELECT id FROM effects
            WHERE id = $1 AND status = 'pending' AND attempts < $3
              AND outbox_free(locked_until, next_attempt_at)
            FOR UPDATE SKIP LOCKED
        )
        RETURNING f.id, f.kind, f.body, f.sent_to, f.attempts
        "#,
        id,
        lease.as_secs_f64(),
        RetryPolicy::MAX_ATTEMPTS,
    )
    .fetch_optional(exec(pool))
    .await
}

/// What one delivery attempt achieved.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// Every sink that has the effect now, this attempt's and earlier ones'.
    pub sent_to: Vec<String>,
    /// Whether every configured sink has it.
    pub complete: bool,
    /// Why the attempt is incomplete (each failing sink, named).
    pub error: Option<String>,
}

/// Records an attempt: `sent` when every sink has the effect, else `pending` with the next
/// attempt's time, or `dead` after the last. Only the holder's record lands.
pub async fn record(
    pool: &PgPool,
    effect: &Claimed,
    attempt: &Attempt,
    retry: &RetryPolicy,
) -> Result<EffectStatus, sqlx::Error> {
    let delay = retry.wait_after(effect.attempts);
    let status = match (attempt.complete, delay) {
        (true, _) => EffectStatus::Sent,
        (false, Some(_)) => EffectStatus::Pending,
        (false, None) => EffectStatus::Dead,
    };
    if let Some(error) = &attempt.error {
        tracing::warn!(effect_id = %effect.id, attempts = effect.attempts, status = status.as_str(), error = %error, "effect delivery failed");
    }
    sqlx::query!(
        r#"
        UPDATE effects
        SET status = $2, sent_to = $3, last_error = $4, locked_until = NULL,
            next_attempt_at = CASE WHEN $2 = 'pending' THEN inbox_now() + make_interval(secs => $5) END,
            sent_at = CASE WHEN $2 = 'sent' THEN inbox_now() END
        WHERE id = $1 AND status = 'pending' AND attempts = $6
        "#,
        effect.id,
        status.as_str(),
        &attempt.sent_to,
        attempt.error,
        delay.map(|d| d.as_secs_f64()).unwrap_or_default(),
        effect.attempts,
    )
    .execute(exec(pool))
    .await?;
    Ok(status)
}

/// The effects as queued rows: the statements of their life that `platform::queued` runs.
pub struct Effects;

const EFFECTS: Outbox = Outbox("effects");

impl Rows for Effects {
    type Id = String;
    type Alerts = EffectAlerts;
    const NAME: &'static str = "effects";

    async fn send(queue: &Queue, ids: &[String]) -> Vec<String> {
        queue.send_bodies(ids).await
    }

    async fn unmark(pool: &PgPool, ids: &[String]) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE effects SET enqueued_at = NULL WHERE id = ANY($1) AND status = 'pending'",
            ids
        )
        .execute(exec(pool))
        .await?;
        Ok(())
    }

    async fn bury(pool: &PgPool) -> Result<u64, sqlx::Error> {
        EFFECTS.bury(pool, RetryPolicy::MAX_ATTEMPTS).await
    }

    async fn mark(pool: &PgPool) -> anyhow::Result<Vec<String>> {
        Ok(EFFECTS.mark(pool).await?)
    }

    async fn alerts(pool: &PgPool) -> anyhow::Result<EffectAlerts> {
        collect_alerts(pool).await
    }

    /// Sent effects older than the retention (docs/design.md §11.2); pending and dead
    /// effects stay for the operator.
    async fn purge_batch(pool: &PgPool, retention: Duration) -> anyhow::Result<u64> {
        Ok(sqlx::query!(
            r#"
            DELETE FROM effects
            WHERE id IN (
                SELECT id FROM effects
                WHERE status = 'sent' AND sent_at < inbox_now() - make_interval(secs => $1)
                LIMIT $2 FOR UPDATE SKIP LOCKED
            )
            "#,
            retention.as_secs_f64(),
            PURGE_BATCH,
        )
        .execute(exec(pool))
        .await
        .context("purging sent effects")?
        .rows_affected())
    }
}

/// Deletes sent effects older than the retention, in batches while `deadline` allows
/// (docs/design.md §11.2).
pub async fn purge(pool: &PgPool, retention: Duration, deadline: Instant) -> anyhow::Result<u64> {
    queued::purge::<Effects>(pool, retention, deadline).await
}

/// What the scheduler reports of effects.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EffectAlerts {
    /// Effects that died since the last run (each reported once).
    pub dead: Vec<String>,
    /// Every dead effect not replayed yet.
    pub dead_total: i64,
    /// Pending effects older than [`STUCK_ALERT_AFTER`].
    pub stuck: i64,
    pub pending: i64,
}

/// Reports each newly dead effect once, and counts the dead, the stuck and the pending.
pub async fn collect_alerts(pool: &PgPool) -> anyhow::Result<EffectAlerts> {
    let dead = sqlx::query!(
        r#"
        UPDATE effects SET alerted_at = inbox_now()
        WHERE id IN (
            SELECT id FROM effects WHERE status = 'dead' AND alerted_at IS NULL
            ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED
        )
        RETURNING id, kind, source, customer_id, last_error
        "#,
        ROWS_PER_STEP,
    )
    .fetch_all(exec(pool))
    .await
    .context("collecting dead effects")?;
    for e in &dead {
        tracing::error!(
            alert = "dead_effect", effect_id = %e.id, kind = %e.kind, source = %e.source,
            customer_id = %e.customer_id, last_error = e.last_error.as_deref().unwrap_or(""),
            "an effect could not be delivered; it needs an operator"
        );
    }
    let counts = sqlx::query!(
        r#"
        SELECT count(*) FILTER (WHERE status = 'dead') AS "dead!",
               count(*) FILTER (WHERE status = 'pending') AS "pending!",
               count(*) FILTER (WHERE status = 'pending'
                                  AND created_at < inbox_now() - make_interval(secs => $1)) AS "stuck!"
        FROM effects WHERE status IN ('dead', 'pending')
        "#,
        STUCK_ALERT_AFTER.as_secs_f64(),
    )
    .fetch_one(exec(pool))
    .await
    .context("counting pending and dead effects")?;
    if counts.stuck > 0 {
        tracing::error!(
            alert = "stuck_effects",
            count = counts.stuck,
            "effects pending for more than 15 minutes"
        );
    }
    Ok(EffectAlerts {
        dead: dead.into_iter().map(|e| e.id).collect(),
        dead_total: counts.dead,
        stuck: counts.stuck,
        pending: counts.pending,
    })
}

/// Puts effects back to `pending` with fresh attempts, marked as on their way to the queue
/// (the caller sends them after its commit), except one a dispatcher holds right now.
/// Returns those reset.
pub async fn reset(conn: &mut PgConnection, ids: &[String]) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        UPDATE effects
        SET status = 'pending', attempts = 0, next_attempt_at = NULL, locked_until = NULL,
            sent_to = '{}', sent_at = NULL, alerted_at = NULL, enqueued_at = inbox_now()
        WHERE id = ANY($1) AND (status <> 'pending' OR locked_until IS NULL OR locked_until < inbox_now())
        RETURNING id
        "#,
        ids,
    )
    .fetch_all(exec(conn))
    .await
}

/// Puts effects back to `pending` with fresh attempts and enqueues them: an operator's
/// replay after fixing the app's endpoint. A held effect is left alone. Returns those
/// replayed.
pub async fn replay(pool: &PgPool, queue: &Queue, ids: &[String]) -> anyhow::Result<Vec<String>> {
    queued::replay::<Effects>(pool, Some(queue), async |conn| reset(conn, ids).await).await
}

/// The ids of every effect with this status, oldest first.
pub async fn ids_with_status(
    pool: &PgPool,
    status: EffectStatus,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT id FROM effects WHERE status = $1 ORDER BY created_at, id",
        status.as_str()
    )
    .fetch_all(exec(pool))
    .await
}

/// One line of `inboxctl effects`.
#[derive(Debug, Clone, Serialize)]
pub struct EffectSummary {
    pub id: String,
    pub kind: String,
    pub status: String,
    pub source: String,
    pub customer_id: String,
    pub sequence: i64,
    /// `None` for an effect a debit told (`billing.allowance_exhausted`).
    pub event_id: Option<i64>,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

/// The newest effects, with this status when given.
pub async fn list(
    conn: &mut PgConnection,
    status: Option<EffectStatus>,
    limit: i64,
) -> Result<Vec<EffectSummary>, sqlx::Error> {
    sqlx::query_as!(
        EffectSummary,
        r#"
        SELECT id, kind, status, source, customer_id, sequence, event_id, attempts, created_at
        FROM effects WHERE ($1::text IS NULL OR status = $1)
        ORDER BY created_at DESC, id LIMIT $2
        "#,
        status.map(EffectStatus::as_str),
        limit,
    )
    .fetch_all(exec(conn))
    .await
}

/// `inboxctl effect <id>`: the whole row, the body as the sinks receive it.
#[derive(Debug, Clone, Serialize)]
pub struct EffectDetail {
    pub id: String,
    pub kind: String,
    pub cause: String,
    pub status: String,
    pub source: String,
    pub customer_id: String,
    pub sequence: i64,
    /// `None` for an effect a debit told (`billing.allowance_exhausted`).
    pub event_id: Option<i64>,
    pub occurred_at: DateTime<Utc>,
    pub sent_to: Vec<String>,
    pub attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
    pub body: Value,
}

pub async fn detail(
    conn: &mut PgConnection,
    id: &str,
) -> Result<Option<EffectDetail>, sqlx::Error> {
    sqlx::query_as!(
        EffectDetail,
        r#"
        SELECT id, kind, cause, status, source, customer_id, sequence, event_id, occurred_at,
               sent_to, attempts, next_attempt_at, last_error, created_at, sent_at, body
        FROM effects WHERE id = $1
        "#,
        id,
    )
    .fetch_optional(exec(conn))
    .await
}
