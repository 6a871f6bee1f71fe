//! Alerts: each dead or unprocessable event, and each conflicting delivery, is reported once
//! (an operator's attention is the fix); `alerted_at` records that it was.

use anyhow::Context;
use serde::Serialize;
use sqlx::PgPool;

use crate::domain::EventStatus;
use crate::platform::db::exec;
use crate::platform::queued::ROWS_PER_STEP;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Alerts {
    pub dead: Vec<i64>,
    pub unprocessable: Vec<i64>,
    pub conflicts: Vec<i64>,
}

/// Reports each newly dead or unprocessable event and each new conflicting delivery once.
pub async fn collect_alerts(pool: &PgPool) -> anyhow::Result<Alerts> {
    let events = sqlx::query!(
        r#"
        UPDATE inbox_events SET alerted_at = inbox_now()
        WHERE (id, month) IN (
            -- The given-up events not reported yet, from their rows in `inbox_work`.
            SELECT e.id, e.month FROM inbox_work w
            JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
            WHERE w.stage <> 'pending' AND NOT w.alerted
              AND e.status IN ('dead', 'unprocessable') AND e.alerted_at IS NULL
            ORDER BY w.event_id LIMIT $1 FOR UPDATE OF e SKIP LOCKED
        )
        RETURNING id, source, type, status AS "status: EventStatus", last_error, reason
        "#,
        ROWS_PER_STEP,
    )
    .fetch_all(exec(pool))
    .await
    .context("collecting dead and unprocessable events")?;
    let mut alerts = Alerts::default();
    for e in events {
        tracing::error!(
            alert = %e.status, event_id = e.id, source = %e.source, event_type = %e.r#type,
            last_error = e.last_error.as_deref().unwrap_or(""), reason = e.reason.as_deref().unwrap_or(""),
            "event needs an operator"
        );
        if e.status == EventStatus::Dead {
            alerts.dead.push(e.id);
        } else {
            alerts.unprocessable.push(e.id);
        }
    }
    let conflicts = sqlx::query!(
        r#"
        UPDATE deliveries d SET alerted_at = inbox_now()
        FROM inbox_events e
        WHERE e.id = d.event_id
          AND d.id IN (
            SELECT id FROM deliveries
            WHERE verdict = 'conflict' AND alerted_at IS NULL
            ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
          )
        RETURNING d.id, d.event_id, e.source, e.type, e.dedupe_key
        "#,
        ROWS_PER_STEP,
    )
    .fetch_all(exec(pool))
    .await
    .context("collecting conflicting deliveries")?;
    for c in conflicts {
        tracing::error!(
            alert = "conflict", delivery_id = c.id, event_id = c.event_id, source = %c.source,
            event_type = %c.r#type, dedupe_key = %c.dedupe_key,
            "a delivery reused a stored event's key with different content"
        );
        alerts.conflicts.push(c.event_id);
    }
    Ok(alerts)
}
