//! The events the fold of an account reads (docs/design.md §4.11): the account's finished
//! events as kept, the events its registers name that it does not own (a thin event whose
//! read it applied, a payment-intent link that named no customer), the reads made for its
//! events already finished, and what the purge took of its log.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

use crate::domain::{CustomerId, DedupeKey, ProviderTime};
use crate::platform::db::exec;

/// At most this many events are folded for one account at once: `why` says an account with
/// more is too large; the audit folds it in steps, from its checked point (docs/design.md
/// §4.11).
pub const MAX_FOLDED_EVENTS: i64 = 20_000;

/// A stored event as the fold takes it.
#[derive(Debug, Clone)]
pub struct KeptEvent {
    pub id: i64,
    pub dedupe_key: DedupeKey,
    pub event_type: String,
    pub payload: Option<Value>,
    pub customer: Option<CustomerId>,
    pub occurred_at: ProviderTime,
    pub received_at: DateTime<Utc>,
    pub settled: Option<Value>,
    pub replays: i32,
    /// What the first delivery row says of its origin (`reconciliation`, `eventbridge`, …).
    pub via: Option<String>,
}

/// The finished events of the account, with the finished events `named` (by its registers)
/// and the reads made for its finished events (a thin event's object, an invoice's
/// subscription), in provider order; at most `limit` (the caller asks one more than it folds,
/// so that it sees when there are more). With `after` (an audit's checked point), only the
/// account's events the provider created after it, and the `named` ones wherever they sort,
/// those at or before it without their payload (the point folded them; the audit needs to
/// know they are kept).
pub async fn account_events(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    named: &[i64],
    (after, limit): (Option<DateTime<Utc>>, i64),
) -> Result<Vec<KeptEvent>, sqlx::Error> {
    sqlx::query_as!(
        KeptEvent,
        r#"
        SELECT e.id, e.dedupe_key AS "dedupe_key: DedupeKey", e.type AS event_type,
               CASE WHEN e.occurred_at > COALESCE($5::timestamptz, '-infinity')
                    THEN inbox_payload(e.payload, e.raw_body, e.body_is_payload)
               END AS payload,
               e.customer_key AS "customer: CustomerId",
               e.occurred_at AS "occurred_at!: ProviderTime", e.received_at, e.settled, e.replays,
               (SELECT d.headers->>'via' FROM deliveries d WHERE d.event_id = e.id
                ORDER BY d.id LIMIT 1) AS via
        FROM inbox_events e
        WHERE e.source = $1 AND e.occurred_at IS NOT NULL
          AND ((e.customer_key = $2
                AND e.occurred_at > COALESCE($5::timestamptz, '-infinity')
                AND (e.status IN ('applied', 'ignored')
                     -- A read stands for the event it was made for (the row it names),
                     -- which finished with it: a thin event applies its read under its own id
                     -- before the read's row is finished, an invoice its subscription's read
                     -- before that read is applied on its own.
                     OR EXISTS (SELECT 1 FROM inbox_events t
                                WHERE t.id = e.made_for AND t.status IN ('applied', 'ignored'))))
               OR (e.id = ANY($3) AND e.status IN ('applied', 'ignored')))
        ORDER BY e.occurred_at, e.id
        LIMIT $4
        "#,
        source,
        customer.as_str(),
        named,
        limit,
        after,
    )
    .fetch_all(exec(conn))
    .await
}

/// What the purge took of the account's events: how many of its log's lines have no event
/// any more, and the latest provider time among them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub count: i64,
    pub latest: Option<DateTime<Utc>>,
}

pub async fn purged(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
) -> Result<Purged, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        SELECT count(*) AS "count!", max(l.occurred_at) AS latest
        FROM account_log l
        WHERE l.source = $1 AND l.customer_id = $2
          AND NOT EXISTS (SELECT 1 FROM inbox_events e WHERE e.id = l.event_id)
        "#,
        source,
        customer.as_str(),
    )
    .fetch_one(exec(conn))
    .await?;
    Ok(Purged {
        count: row.count,
        latest: row.latest,
    })
}

/// The ids of the account's events not finished yet (received, processing, failed): what the
/// registers do not show yet. Read from the events in flight (`inbox_work`, docs/design.md
/// §3.4), so the answer costs the work in flight, not the account's history.
pub async fn pending(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        SELECT w.event_id AS "id!" FROM inbox_work w
        WHERE w.source = $1 AND w.customer_key = $2 AND w.stage = 'pending'
        ORDER BY w.event_id LIMIT 100
        "#,
        source,
        customer.as_str(),
    )
    .fetch_all(exec(conn))
    .await
}
