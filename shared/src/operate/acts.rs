//! Replays asked for through the API (docs/design.md §12.5): each one checked, counted against
//! the key's replays of the minute and written to the audit trail in the transaction that
//! resets the rows; the rows go to their queue after the commit (the rescue sends what the
//! queue refuses). Replaying is harmless by construction, so a repeat only replays again.

use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool};

use super::trail::{self, Limited};
use crate::domain::{CustomerId, EventStatus};
use crate::effects::outbox::{self, EffectStatus, Effects};
use crate::inbox::replay::{ids_with_status, reset};
use crate::inbox::{enqueue_or_unmark, unmark};
use crate::meters::outbox::{self as meter_outbox, MeterReports, ReportStatus};
use crate::platform::db::exec;
use crate::platform::queue::Queue;
use crate::platform::queued;

/// The most events one bulk replay takes; the answer says when more are left.
pub const MAX_BULK: i64 = 100;

/// What a replay of one event or effect came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay<T> {
    Done(T),
    /// No such event (for an account: none of that account's).
    NotFound,
    /// The account's own event, which the purge took: nothing is left to replay.
    Purged,
    Limited(Limited),
}

/// An event replayed: its status now (`received`, or `processing` when a worker held it and
/// it was left alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayedEvent {
    pub event_id: i64,
    pub status: EventStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayedEffect {
    pub effect_id: String,
    pub status: EffectStatus,
}

/// A meter report replayed: its status now (`pending`, or as it was when it was not dead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayedReport {
    pub report_id: String,
    pub status: ReportStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BulkReplay {
    pub replayed: usize,
    pub event_ids: Vec<i64>,
    /// More events of that status are left: ask again.
    pub more: bool,
}

/// Who asks for an event's replay, and for which events.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// The admin API: any event.
    Any,
    /// An app's key: only the events of this account.
    Account {
        source: &'a str,
        customer: &'a CustomerId,
    },
}

/// Replays one event for `who` (a key's name), within `scope`.
pub async fn replay_event(
    pool: &PgPool,
    queue: Option<&Queue>,
    who: &str,
    scope: Scope<'_>,
    event_id: i64,
) -> Result<Replay<ReplayedEvent>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let (action, target_detail) = match scope {
        Scope::Any => {
            let stored = sqlx::query_scalar!(
                r#"SELECT EXISTS (SELECT 1 FROM inbox_events WHERE id = $1) AS "stored!""#,
                event_id
            )
            .fetch_one(exec(&mut *tx))
            .await?;
            if !stored {
                return Ok(Replay::NotFound);
            }
            ("event.replay", json!({}))
        }
        // The account's events are what its log lists (`operate::log`), whichever row names
        // the account: a thin event's row names no customer, its line does. Another account's
        // event answers as a missing one; the account's own purged event is told as such.
        Scope::Account { source, customer } => {
            match super::log::status_in_log(&mut tx, source, customer, event_id).await? {
                None => return Ok(Replay::NotFound),
                Some(status) if status == super::log::PURGED => return Ok(Replay::Purged),
                Some(_) => (
                    "account_event.replay",
                    json!({"source": source, "customer_id": customer.as_str()}),
                ),
            }
        }
    };
    let id = match trail::take(&mut tx, who, action, &event_id.to_string(), &target_detail).await? {
        Ok(id) => id,
        Err(limited) => return Ok(Replay::Limited(limited)),
    };
    let reset_ids = reset(&mut tx, &[event_id]).await?;
    let status = status_of(&mut tx, event_id).await?;
    trail::settle(&mut tx, id, &json!({"status": status.as_str()})).await?;
    tx.commit().await?;
    send(pool, queue, &reset_ids).await;
    Ok(Replay::Done(ReplayedEvent { event_id, status }))
}

/// Replays up to [`MAX_BULK`] events in `status` (of one source when given), oldest first.
pub async fn replay_events(
    pool: &PgPool,
    queue: Option<&Queue>,
    who: &str,
    status: EventStatus,
    source: Option<&str>,
) -> Result<Result<BulkReplay, Limited>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let target = json!({"status": status.as_str(), "source": source});
    let id = match trail::take(&mut tx, who, "events.replay", &target.to_string(), &target).await? {
        Ok(id) => id,
        Err(limited) => return Ok(Err(limited)),
    };
    let ids = ids_with_status(&mut tx, status, source, MAX_BULK + 1).await?;
    let more = ids.len() as i64 > MAX_BULK;
    let ids = &ids[..ids.len().min(MAX_BULK as usize)];
    let event_ids = reset(&mut tx, ids).await?;
    trail::settle(&mut tx, id, &json!({"event_ids": event_ids})).await?;
    tx.commit().await?;
    send(pool, queue, &event_ids).await;
    Ok(Ok(BulkReplay {
        replayed: event_ids.len(),
        event_ids,
        more,
    }))
}

/// Replays one effect: back to `pending`, to every sink again.
pub async fn replay_effect(
    pool: &PgPool,
    queue: Option<&Queue>,
    who: &str,
    effect_id: &str,
) -> Result<Replay<ReplayedEffect>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let exists = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM effects WHERE id = $1) AS "exists!""#,
        effect_id
    )
    .fetch_one(exec(&mut *tx))
    .await?;
    if !exists {
        return Ok(Replay::NotFound);
    }
    let id = match trail::take(&mut tx, who, "effect.replay", effect_id, &json!({})).await? {
        Ok(id) => id,
        Err(limited) => return Ok(Replay::Limited(limited)),
    };
    let reset_ids = outbox::reset(&mut tx, &[effect_id.to_owned()]).await?;
    let status = sqlx::query_scalar!("SELECT status FROM effects WHERE id = $1", effect_id)
        .fetch_one(exec(&mut *tx))
        .await?;
    let status = EffectStatus::parse(&status).unwrap_or(EffectStatus::Pending);
    trail::settle(&mut tx, id, &json!({"status": status.as_str()})).await?;
    tx.commit().await?;
    if let Some(queue) = queue {
        if let Err(e) = queued::enqueue_or_unmark::<Effects>(pool, queue, &reset_ids).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "replayed effect not enqueued; the rescue will"
            );
        }
    }
    Ok(Replay::Done(ReplayedEffect {
        effect_id: effect_id.to_owned(),
        status,
    }))
}

async fn status_of(conn: &mut PgConnection, event_id: i64) -> Result<EventStatus, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT status AS "status: EventStatus" FROM inbox_events WHERE id = $1"#,
        event_id
    )
    .fetch_one(exec(conn))
    .await
}

/// Hands the reset events to the worker's queue; without one (or when it refuses), the rows
/// stay `received` and the rescue sends them.
async fn send(pool: &PgPool, queue: Option<&Queue>, ids: &[i64]) {
    let result = match queue {
        Some(queue) => enqueue_or_unmark(pool, queue, ids).await.map(|_| ()),
        None => unmark(pool, ids).await.map_err(anyhow::Error::from),
    };
    if let Err(e) = result {
        tracing::warn!(
            error = format!("{e:#}"),
            "replayed events not enqueued; the rescue will"
        );
    }
}

/// Replays one dead meter report (docs/design.md §4.13): back to `pending` with fresh attempts,
/// keeping the mark of a send that may have reached the provider (so it is resent under its
/// key or read back first: `inboxctl meters replay --not-held` is the operator's way past
/// that), written to the trail, then handed to the dispatcher's queue. A report not dead is
/// left as it is and its status said.
pub async fn replay_meter_report(
    pool: &PgPool,
    queue: Option<&Queue>,
    who: &str,
    report_id: &str,
) -> Result<Replay<ReplayedReport>, sqlx::Error> {
    // Everything in the transaction's one connection: the api function's pool holds no
    // other (`reversals::a_meter_report_is_replayed_by_an_api_of_one_connection`).
    let mut tx = pool.begin().await?;
    let exists = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM meter_reports WHERE id = $1) AS "exists!""#,
        report_id
    )
    .fetch_one(exec(&mut *tx))
    .await?;
    if !exists {
        return Ok(Replay::NotFound);
    }
    let id = match trail::take(&mut tx, who, "meter_report.replay", report_id, &json!({})).await? {
        Ok(id) => id,
        Err(limited) => return Ok(Replay::Limited(limited)),
    };
    let reset_ids = meter_outbox::reset(&mut tx, &[report_id.to_owned()], false).await?;
    let status = sqlx::query_scalar!("SELECT status FROM meter_reports WHERE id = $1", report_id)
        .fetch_one(exec(&mut *tx))
        .await?;
    let status = ReportStatus::parse(&status).unwrap_or(ReportStatus::Pending);
    trail::settle(&mut tx, id, &json!({"status": status.as_str()})).await?;
    tx.commit().await?;
    if let Some(queue) = queue {
        if let Err(e) = queued::enqueue_or_unmark::<MeterReports>(pool, queue, &reset_ids).await {
            tracing::warn!(
                error = format!("{e:#}"),
                "replayed meter report not enqueued; the rescue will"
            );
        }
    }
    Ok(Replay::Done(ReplayedReport {
        report_id: report_id.to_owned(),
        status,
    }))
}
