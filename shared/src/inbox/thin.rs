//! The rows a thin event's worker touches besides its own (docs/design.md §6.2): the read of
//! its related object, stored as an event of its own and found again by its key, and finished
//! once the thin event has applied it; and the snapshot twin, looked up by its key.

use serde_json::Value;
use sqlx::PgConnection;

use super::store::{store_verified_on, Origin, StoreError, Stored};
use crate::domain::{CustomerId, DedupeKey, EventStatus, ProviderTime, VerifiedEvent};
use crate::platform::db::exec;

/// A stored event as the worker applies it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub id: i64,
    pub dedupe_key: DedupeKey,
    pub event_type: String,
    pub payload: Option<Value>,
    pub customer: Option<CustomerId>,
    pub occurred_at: Option<ProviderTime>,
    pub status: String,
}

/// The event of `source` stored under `key`, if any.
pub async fn find(
    conn: &mut PgConnection,
    source: &str,
    key: &DedupeKey,
) -> Result<Option<StoredEvent>, sqlx::Error> {
    sqlx::query_as!(
        StoredEvent,
        r#"
        SELECT id, dedupe_key AS "dedupe_key: DedupeKey", type AS event_type,
               inbox_payload(payload, raw_body, body_is_payload) AS payload,
               customer_key AS "customer: CustomerId",
               occurred_at AS "occurred_at: ProviderTime", status
        FROM inbox_events
        WHERE source = $1 AND dedupe_key = $2
        "#,
        source,
        key.as_str(),
    )
    .fetch_optional(exec(conn))
    .await
}

/// Whether the thin event `thin_id` applied a read before: its line in its account's log is
/// written only by the write that applied one. A read it no longer finds then was taken by a
/// purge from before reads were kept with their events (docs/design.md §3.9).
pub async fn applied_a_read(conn: &mut PgConnection, thin_id: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM account_log WHERE event_id = $1) AS "applied!""#,
        thin_id,
    )
    .fetch_one(exec(conn))
    .await
}

/// Stores a read made for the thin event of row `made_for` through the store's one statement,
/// as reconciliation stores what it reads (a read, not a delivery: no copy counted, no
/// delivery row); the read names that row, which the purge keeps it with.
pub async fn store_read(
    conn: &mut PgConnection,
    source: &str,
    body: &[u8],
    verified: &VerifiedEvent,
    made_for: i64,
) -> Result<Stored, StoreError> {
    store_verified_on(conn, source, body, verified, Origin::ThinRead(made_for)).await
}

/// Stores the read of an invoice's subscription made because its register held none (a read,
/// not a delivery), for the event of row `made_for` (the invoice's, or the thin event that
/// carried it), which the purge keeps it with: marked for the queue, the worker sends it after
/// the invoice's commit (the rescue, if that send never happens), and it applies as the
/// subscription's state at the invoice's time.
pub async fn store_subscription_read(
    conn: &mut PgConnection,
    source: &str,
    body: &[u8],
    verified: &VerifiedEvent,
    made_for: i64,
) -> Result<Stored, StoreError> {
    store_verified_on(
        conn,
        source,
        body,
        verified,
        Origin::SubscriptionRead(made_for),
    )
    .await
}

/// Finishes a read the thin event `thin_id` has applied: `applied`, with the reason naming
/// that event, if no worker has taken it meanwhile (a pending read is otherwise applied by
/// itself once the rescue sends it, which finds its work done). Returns whether it did.
pub async fn finish_read(
    conn: &mut PgConnection,
    read_id: i64,
    thin_id: i64,
) -> Result<bool, sqlx::Error> {
    let reason = format!("applied with thin event {thin_id}, which fetched it");
    let finished = sqlx::query_scalar!(
        r#"
        UPDATE inbox_events
        SET status = $2, reason = $3, processed_at = inbox_now(), enqueued_at = NULL,
            next_attempt_at = NULL, last_error = NULL
        WHERE id = $1 AND status = 'received'
        RETURNING id
        "#,
        read_id,
        EventStatus::Applied.as_str(),
        reason,
    )
    .fetch_optional(exec(conn))
    .await?;
    Ok(finished.is_some())
}
