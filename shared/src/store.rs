//! The inbox tables: storing a verified delivery, and what the intake records after it.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

/// Event statuses (DESIGN §3). Stored as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventStatus {
    Received,
    Processing,
    Applied,
    Ignored,
    Failed,
    Dead,
    Unprocessable,
}

impl EventStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Processing => "processing",
            Self::Applied => "applied",
            Self::Ignored => "ignored",
            Self::Failed => "failed",
            Self::Dead => "dead",
            Self::Unprocessable => "unprocessable",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "received" => Self::Received,
            "processing" => Self::Processing,
            "applied" => Self::Applied,
            "ignored" => Self::Ignored,
            "failed" => Self::Failed,
            "dead" => Self::Dead,
            "unprocessable" => Self::Unprocessable,
            _ => return None,
        })
    }

    /// Still waiting to be applied: a copy of it should wake a worker.
    pub fn is_pending(self) -> bool {
        matches!(self, Self::Received | Self::Processing | Self::Failed)
    }
}

/// What a delivery turned out to be, relative to what was stored before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Stored,
    Duplicate,
    Conflict,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Duplicate => "duplicate",
            Self::Conflict => "conflict",
        }
    }

    fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "stored" => Self::Stored,
            "duplicate" => Self::Duplicate,
            "conflict" => Self::Conflict,
            _ => return None,
        })
    }
}

/// One verified delivery, ready to store.
#[derive(Debug)]
pub struct NewDelivery<'a> {
    pub source: &'a str,
    pub dedupe_key: &'a str,
    pub event_type: &'a str,
    pub payload: Option<&'a Value>,
    pub raw_body: &'a [u8],
    pub payload_hash: &'a [u8],
    pub customer_key: Option<&'a str>,
    pub occurred_at: Option<DateTime<Utc>>,
    /// `Received`, or `Unprocessable` for a signed envelope that could not be parsed.
    pub status: EventStatus,
    pub reason: Option<&'a str>,
    pub delivery_id: Option<&'a str>,
    pub sent_at: Option<DateTime<Utc>>,
    pub headers: &'a Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub event_id: i64,
    pub verdict: Verdict,
    /// The stored event's status as this statement left it.
    pub status: EventStatus,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("the database returned an unknown {0} '{1}'")]
    Unexpected(&'static str, String),
}

impl StoreError {
    /// The database could not be reached or is overloaded: the sender should retry later.
    pub fn is_unavailable(&self) -> bool {
        let Self::Database(e) = self else {
            return false;
        };
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                // 08: connection exception, 53: insufficient resources, 57P: operator
                // intervention (shutdown), 40001/40P01: serialization failure, deadlock.
                code.starts_with("08")
                    || code.starts_with("53")
                    || code.starts_with("57P")
                    || code == "40001"
                    || code == "40P01"
            }),
            _ => false,
        }
    }
}

/// Stores a delivery in one statement: the event is inserted, or its copy counted, and the
/// delivery row written beside it. A copy whose content differs is a conflict: the stored
/// event is kept as is and only the delivery records it.
///
/// A pending event is marked `enqueued_at` in the same statement, for the send that follows
/// the commit: one round trip per delivery. A send that fails unmarks it
/// ([`unmark_enqueued`]); a crash between the commit and the send leaves it marked, and the
/// scheduler's rescue of stuck `received` rows sends it.
#[tracing::instrument(skip_all, fields(source = d.source))]
pub async fn store_delivery(
    conn: &mut PgConnection,
    d: &NewDelivery<'_>,
) -> Result<Stored, StoreError> {
    let row = sqlx::query!(
        r#"
        WITH upsert AS (
            INSERT INTO inbox_events AS e
                (source, dedupe_key, type, payload, raw_body, payload_hash, customer_key,
                 occurred_at, status, reason, processed_at, enqueued_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                    CASE WHEN $9 = 'unprocessable' THEN now() END,
                    CASE WHEN $9 = 'received' THEN now() END)
            ON CONFLICT (source, dedupe_key) DO UPDATE
                SET seen_count = e.seen_count + (e.payload_hash = EXCLUDED.payload_hash)::int,
                    enqueued_at = CASE
                        WHEN e.payload_hash = EXCLUDED.payload_hash
                             AND e.status IN ('received', 'processing', 'failed') THEN now()
                        ELSE e.enqueued_at END
            RETURNING e.id, e.status, e.payload_hash = $6 AS same_content, (e.xmax = 0) AS inserted
        ), delivery AS (
            INSERT INTO deliveries (event_id, verdict, delivery_id, sent_at, payload_hash, headers)
            SELECT id,
                   CASE WHEN inserted THEN 'stored'
                        WHEN same_content THEN 'duplicate'
                        ELSE 'conflict' END,
                   $11, $12, $6, $13
            FROM upsert
            RETURNING verdict
        )
        SELECT upsert.id AS "event_id!", upsert.status AS "status!", delivery.verdict AS "verdict!"
        FROM upsert CROSS JOIN delivery
        "#,
        d.source,
        d.dedupe_key,
        d.event_type,
        d.payload,
        d.raw_body,
        d.payload_hash,
        d.customer_key,
        d.occurred_at,
        d.status.as_str(),
        d.reason,
        d.delivery_id,
        d.sent_at,
        d.headers,
    )
    .fetch_one(conn)
    .await?;
    Ok(Stored {
        event_id: row.event_id,
        verdict: Verdict::parse(&row.verdict)
            .ok_or_else(|| StoreError::Unexpected("verdict", row.verdict.clone()))?,
        status: EventStatus::parse(&row.status)
            .ok_or_else(|| StoreError::Unexpected("status", row.status.clone()))?,
    })
}

/// Records that the send after the commit failed, so that the scheduler's next rescue (of
/// rows never enqueued) sends the event.
#[tracing::instrument(skip_all, fields(event_id))]
pub async fn unmark_enqueued(conn: &mut PgConnection, event_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE inbox_events SET enqueued_at = NULL WHERE id = $1",
        event_id
    )
    .execute(conn)
    .await?;
    Ok(())
}
