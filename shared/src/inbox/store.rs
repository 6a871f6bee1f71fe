//! Storing a verified delivery: the event once per `(source, dedupe_key)`, a copy counted, a
//! conflict recorded, one `deliveries` row per attempt — in one statement (docs/design.md §3).

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use tokio::time::{timeout_at, Instant};

use crate::domain::{CustomerId, DedupeKey, EventStatus, ProviderTime, Verdict, VerifiedEvent};
use crate::platform::db::exec;

/// One verified delivery, ready to store.
#[derive(Debug)]
pub struct NewDelivery<'a> {
    pub source: &'a str,
    pub dedupe_key: &'a DedupeKey,
    pub event_type: &'a str,
    pub payload: Option<&'a Value>,
    pub raw_body: &'a [u8],
    /// The payload is the raw body's JSON ([`body_is_payload`]): only the body is stored, and
    /// every reader parses it (`inbox_payload`, docs/design.md §3).
    pub body_is_payload: bool,
    pub payload_hash: &'a [u8],
    pub customer_key: Option<&'a CustomerId>,
    pub occurred_at: Option<ProviderTime>,
    /// `Received`, or `Unprocessable` for a signed envelope that could not be parsed.
    pub status: EventStatus,
    pub reason: Option<&'a str>,
    pub delivery_id: Option<&'a str>,
    pub sent_at: Option<DateTime<Utc>>,
    pub headers: &'a Value,
    /// Which configured secret verified the delivery (`VerifiedEvent::signed_with`).
    pub secret_index: Option<i16>,
    /// Read back from the provider's API, not delivered: a read of a stored event is no
    /// copy (no `seen_count`, no delivery row) and marks nothing for the queue.
    pub fetched: bool,
    /// The request's own id, recorded on its delivery row (a UUID): a second attempt of the
    /// request finds its first's row by it ([`store_verified_held`]).
    pub attempt: Option<&'a str>,
    /// For a read the worker made for an event, that event's row (docs/design.md §3.9): the
    /// purge keeps the read while it is stored.
    pub made_for: Option<i64>,
}

/// Where a verified event came from.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// A webhook delivery, with the headers worth keeping.
    Delivery(&'a Value),
    /// A read from the provider's API (reconciliation).
    Fetched,
    /// The read of a thin event's object (docs/design.md §6.2), made for the event of this
    /// row: stored as a read is.
    ThinRead(i64),
    /// The read of an invoice's subscription whose register held none (docs/design.md §6.2),
    /// made for the event of this row.
    SubscriptionRead(i64),
    /// A subscription read by the sweep of the health notice of this row (docs/design.md §6.2).
    SweptRead(i64),
}

impl Origin<'_> {
    /// The row of the event a read was made for; `None` for anything delivered or listed.
    fn made_for(self) -> Option<i64> {
        match self {
            Self::ThinRead(id) | Self::SubscriptionRead(id) | Self::SweptRead(id) => Some(id),
            Self::Delivery(_) | Self::Fetched => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub event_id: i64,
    pub verdict: Verdict,
    /// The stored event's status as this statement left it.
    pub status: EventStatus,
    /// This statement marked the event `enqueued_at`: the caller sends it after the commit.
    pub marked: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// No connection could be had: whatever the cause, the sender should retry later.
    #[error("no database connection: {0}")]
    NoConnection(#[source] sqlx::Error),
    /// The database did not answer in time: a server that stopped, or a network that drops
    /// what it carries without closing the connection.
    #[error("the database did not answer within {0:?}")]
    NoAnswer(Duration),
    /// The database refused the event as parsed, and then its bare record too.
    #[error("the database refused the event: {0}")]
    Refused(#[source] Box<StoreError>),
}

impl StoreError {
    /// The database refused the statement for what the event holds: a value it cannot take
    /// (SQLSTATE class 22), a constraint (23), a limit (54). Only these make the event's
    /// bare record the answer; the same delivery again would be refused the same way.
    fn refuses_content(&self) -> bool {
        match self {
            Self::Database(sqlx::Error::Encode(_)) => true,
            Self::Database(sqlx::Error::Database(db)) => db.code().is_some_and(|code| {
                code.starts_with("22") || code.starts_with("23") || code.starts_with("54")
            }),
            _ => false,
        }
    }

    /// Anything but a refusal of the event's content: the database could not be reached, did
    /// not answer, or could not run the statement now — cancelled or timed out (57014), a
    /// lock wait given up (55P03), a read-only server after a failover (25006), a conflict
    /// (40001, 40P01), a shutdown. The sender should retry later, and nothing stands in the
    /// event's place meanwhile: a bare record would keep the provider's retry from storing
    /// the event whole.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Refused(inner) => inner.is_unavailable(),
            other => !other.refuses_content(),
        }
    }
}

/// Stores a delivery in one statement: the event is inserted, or its copy counted, and the
/// delivery row written beside it. A copy whose content differs is a conflict: the stored
/// event is kept as is and only the delivery records it.
///
/// A new pending event is marked `enqueued_at` in the same statement, for the send that
/// follows the commit: one round trip per delivery. A copy of a pending event is marked (and
/// sent) again only when a worker could take the event now (not a retry that is not due, not
/// a live lease) and no message is on its way: the mark was cleared, is older than the
/// rescue's grace period ([`crate::platform::queued::STUCK_AFTER`]), or predates the retry's time or the
/// lease's end — the rescue's own rule (§3.7). A send
/// that fails unmarks the event ([`super::enqueue_or_unmark`]); a crash between the commit
/// and the send leaves it marked, and the scheduler's rescue of stuck `received` rows sends
/// it.
#[tracing::instrument(skip_all, fields(source = d.source, dedupe_key = d.dedupe_key.as_str()))]
pub async fn store_delivery(
    conn: &mut PgConnection,
    d: &NewDelivery<'_>,
) -> Result<Stored, StoreError> {
    let row = sqlx::query!(
        r#"
        WITH upsert AS (
            INSERT INTO inbox_events AS e
                (source, dedupe_key, type, payload, raw_body, payload_hash, customer_key,
                 occurred_at, status, reason, processed_at, enqueued_at, made_for,
                 body_is_payload, month)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                    CASE WHEN $9 = 'unprocessable' THEN inbox_now() END,
                    CASE WHEN $9 = 'received' THEN inbox_now() END, $19, $20,
                    inbox_month(COALESCE($8, inbox_now())))
            ON CONFLICT (dedupe_key, source, month) DO UPDATE
                SET seen_count = e.seen_count
                        + (e.payload_hash = EXCLUDED.payload_hash AND NOT $16)::int,
                    enqueued_at = CASE
                        WHEN e.payload_hash = EXCLUDED.payload_hash
                             AND e.status = ANY($14) AND NOT $16
                             AND (e.enqueued_at IS NULL
                                  OR e.enqueued_at < inbox_now() - make_interval(secs => $17)
                                  OR e.enqueued_at < CASE e.status WHEN 'failed' THEN e.next_attempt_at
                                                                   WHEN 'processing' THEN e.locked_until END)
                             AND CASE e.status WHEN 'failed' THEN e.next_attempt_at <= inbox_now()
                                               WHEN 'processing' THEN e.locked_until < inbox_now()
                                               ELSE true END
                        THEN inbox_now()
                        ELSE e.enqueued_at END
            -- The row is new when it has the id this statement drew (a partitioned table
            -- shows no `xmax` here); a copy's row has an older one.
            RETURNING e.id, e.month, e.status,
                      (e.id = currval('inbox_events_id_seq')) AS inserted,
                      COALESCE(e.enqueued_at = inbox_now(), false) AS marked,
                      CASE WHEN e.id = currval('inbox_events_id_seq') THEN 'stored'
                           WHEN e.payload_hash = $6 THEN 'duplicate'
                           ELSE 'conflict' END AS verdict
        ), delivery AS (
            INSERT INTO deliveries (event_id, month, verdict, delivery_id, sent_at, payload_hash,
                                    headers, secret_index, attempt)
            SELECT id, month, verdict, $11, $12, $6, $13, $15, $18::text::uuid
            FROM upsert
            WHERE inserted OR NOT $16
        )
        SELECT upsert.id AS "event_id!", upsert.status AS "status!: EventStatus",
               upsert.verdict AS "verdict!: Verdict", upsert.marked AS "marked!"
        FROM upsert
        "#,
        d.source,
        d.dedupe_key.as_str(),
        d.event_type,
        d.payload.filter(|_| !d.body_is_payload),
        d.raw_body,
        d.payload_hash,
        d.customer_key.map(CustomerId::as_str),
        d.occurred_at.map(|t| t.as_datetime()),
        d.status.as_str(),
        d.reason,
        d.delivery_id,
        d.sent_at,
        d.headers,
        &super::pending_names()[..] as &[&str],
        d.secret_index,
        d.fetched,
        crate::platform::queued::STUCK_AFTER.as_secs_f64(),
        d.attempt,
        d.made_for,
        d.body_is_payload,
    )
    .fetch_one(exec(conn))
    .await?;
    Ok(Stored {
        event_id: row.event_id,
        verdict: row.verdict,
        status: row.status,
        marked: row.marked,
    })
}

/// What the first attempt of this request stored, if its delivery row is there: found by the
/// request's id among the event's deliveries. Asked only after a break that may have
/// committed, so the one statement of every other delivery stays as it is.
async fn stored_by_attempt(
    conn: &mut PgConnection,
    d: &NewDelivery<'_>,
) -> Result<Option<Stored>, sqlx::Error> {
    let Some(attempt) = d.attempt else {
        return Ok(None);
    };
    let row = sqlx::query!(
        r#"
        SELECT e.id, e.status AS "status: EventStatus", d.verdict AS "verdict: Verdict"
        FROM inbox_events e
        JOIN deliveries d ON d.event_id = e.id AND d.month = e.month
        WHERE e.source = $1 AND e.dedupe_key = $2 AND d.attempt = $3::text::uuid
        "#,
        d.source,
        d.dedupe_key.as_str(),
        attempt,
    )
    .fetch_optional(exec(conn))
    .await?;
    Ok(row.map(|row| Stored {
        event_id: row.id,
        verdict: row.verdict,
        status: row.status,
        marked: false,
    }))
}

/// The earliest provider time trusted: no provider here sent events before it.
pub const EARLIEST_TRUSTED: &str = "2000-01-01T00:00:00Z";
/// How far ahead of the intake's clock a provider time may be (clock skew, not a future).
pub const LATEST_AHEAD: chrono::Duration = chrono::Duration::days(1);

/// Why a provider time is not trusted (it orders the registers, so an absurd one would win
/// every comparison, or not fit Postgres at all); `None` when it is.
pub fn untrusted_time(at: ProviderTime, now: DateTime<Utc>) -> Option<String> {
    let earliest = DateTime::parse_from_rfc3339(EARLIEST_TRUSTED)
        .expect("a valid constant")
        .with_timezone(&Utc);
    let at = at.as_datetime();
    if at < earliest {
        Some(format!(
            "the provider time {} is before {EARLIEST_TRUSTED}: not trusted",
            at.format("%Y-%m-%dT%H:%M:%SZ")
        ))
    } else if at > now + LATEST_AHEAD {
        Some(format!(
            "the provider time {} is more than a day ahead: not trusted",
            at.format("%Y-%m-%dT%H:%M:%SZ")
        ))
    } else {
        None
    }
}

/// Whether `payload` is `body` read as JSON, so that the body alone keeps the event whole:
/// the payload as stored (NUL removed, [`storable`]) must be exactly what parsing the body
/// gives, as every reader parses it again. A body that is no JSON (a signed token), or a
/// payload built around it (a read), keeps its payload.
pub fn body_is_payload(body: &[u8], payload: &Value) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|parsed| parsed == *payload)
}

/// JSON as Postgres' `jsonb` takes it: `\u0000` is refused there, so NUL is removed from
/// every string and key. Borrowed unchanged when there is none (almost always). The raw body
/// is kept exactly, as bytes.
pub fn storable(value: &Value) -> Cow<'_, Value> {
    fn has_nul(value: &Value) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(has_nul),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }
    fn strip(value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(s.replace('\0', "")),
            Value::Array(items) => Value::Array(items.iter().map(strip).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.replace('\0', ""), strip(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    if has_nul(value) {
        Cow::Owned(strip(value))
    } else {
        Cow::Borrowed(value)
    }
}

/// Stores a verified event, from a delivery or read back from the provider's API, with the
/// delivery headers worth keeping. An event whose envelope could not be parsed, or whose
/// provider time is not trusted, is stored as `unprocessable`, with the reason, and never
/// enqueued. An event the database refuses for its content (not for being unavailable) is
/// stored `unprocessable` without its parsed form; only if even that fails is it an error.
pub async fn store_verified(
    pool: &PgPool,
    source: &str,
    body: &[u8],
    verified: &VerifiedEvent,
    origin: Origin<'_>,
) -> Result<Stored, StoreError> {
    let prepared = Prepared::new(source, body, verified, origin);
    let mut conn = pool.acquire().await.map_err(StoreError::NoConnection)?;
    store_or_refuse(&mut conn, &prepared.delivery()).await
}

/// A verified event as the store statement takes it: its envelope read, its time checked.
struct Prepared<'a> {
    source: &'a str,
    body: &'a [u8],
    verified: &'a VerifiedEvent,
    /// The delivery's kept headers; for a read, what says it was one.
    headers: Cow<'a, Value>,
    fetched: bool,
    made_for: Option<i64>,
    event_type: String,
    customer: Option<&'a CustomerId>,
    occurred_at: Option<ProviderTime>,
    status: EventStatus,
    reason: Option<String>,
    payload: Option<Cow<'a, Value>>,
    body_is_payload: bool,
}

impl<'a> Prepared<'a> {
    fn new(
        source: &'a str,
        body: &'a [u8],
        verified: &'a VerifiedEvent,
        origin: Origin<'a>,
    ) -> Self {
        let (headers, fetched) = match origin {
            Origin::Delivery(headers) => (Cow::Borrowed(headers), false),
            Origin::Fetched => (Cow::Owned(json!({"via": "reconciliation"})), true),
            Origin::ThinRead(_) => (Cow::Owned(json!({"via": "thin event read"})), true),
            Origin::SubscriptionRead(_) => (
                Cow::Owned(json!({"via": "invoice's subscription read"})),
                true,
            ),
            Origin::SweptRead(_) => (Cow::Owned(json!({"via": "health notice's sweep"})), true),
        };
        let meta = match &verified.meta {
            Ok(meta) => match untrusted_time(meta.occurred_at, Utc::now()) {
                Some(reason) => Err(reason),
                None => Ok(meta),
            },
            Err(reason) => Err(reason.clone()),
        };
        let (event_type, customer, occurred_at, status, reason) = match meta {
            Ok(meta) => (
                meta.event_type.replace('\0', ""),
                meta.customer.as_ref(),
                Some(meta.occurred_at),
                EventStatus::Received,
                None,
            ),
            Err(reason) => (
                "unknown".to_owned(),
                None,
                None,
                EventStatus::Unprocessable,
                Some(reason),
            ),
        };
        let payload = verified.payload.as_ref().map(storable);
        Self {
            source,
            body,
            verified,
            headers,
            fetched,
            made_for: origin.made_for(),
            event_type,
            customer,
            occurred_at,
            status,
            reason,
            body_is_payload: payload
                .as_deref()
                .is_some_and(|payload| body_is_payload(body, payload)),
            payload,
        }
    }

    fn delivery(&self) -> NewDelivery<'_> {
        NewDelivery {
            source: self.source,
            dedupe_key: &self.verified.dedupe_key,
            event_type: &self.event_type,
            payload: self.payload.as_deref(),
            raw_body: self.body,
            body_is_payload: self.body_is_payload,
            payload_hash: self.verified.content_hash.as_bytes(),
            customer_key: self.customer,
            occurred_at: self.occurred_at,
            status: self.status,
            reason: self.reason.as_deref(),
            delivery_id: self.verified.delivery_id.as_deref(),
            sent_at: self.verified.sent_at,
            headers: &self.headers,
            secret_index: self
                .verified
                .signed_with
                .and_then(|i| i16::try_from(i).ok()),
            fetched: self.fetched,
            attempt: None,
            made_for: self.made_for,
        }
    }
}

/// How long one attempt of the held store waits for the database's answer. The statement
/// takes about a millisecond (13 ms for a 1 MiB body), and a row lock it may wait on is held
/// only by another one-statement write or by a worker's transaction, which the server ends
/// after 10 s idle. A connection that has not answered by then is taken for broken (a
/// network that drops what it carries, a server that stopped) and replaced.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);

/// All the held store may take, connecting and its second attempt included. The intake then
/// answers 503 within its function's timeout (template.yaml), and an instance waits on a
/// stalled database for seconds, not until Lambda stops it, so a stall does not pile up
/// instances.
pub const STORE_BUDGET: Duration = Duration::from_secs(5);

/// Like [`store_verified`], on a function instance's held connection: one round trip. A
/// connection found broken, or that does not answer within [`STATEMENT_TIMEOUT`], is
/// replaced, and the statement tried once more, all within [`STORE_BUDGET`].
///
/// A statement whose connection broke after it was sent may have committed: only its reply
/// was lost. The delivery row carries the request's own id, so the second attempt first
/// looks for its first's row (one statement more, on this path only); if it is there,
/// nothing is counted or recorded again, and the first's verdict is the answer. The first
/// marked the event for a send that never happened, so after such a break a pending event is
/// sent whether or not this statement marked it: at worst one message more, which the
/// worker's claim makes nothing of.
pub async fn store_verified_held(
    held: &crate::platform::db::Held,
    source: &str,
    body: &[u8],
    verified: &VerifiedEvent,
    origin: Origin<'_>,
) -> Result<Stored, StoreError> {
    let prepared = Prepared::new(source, body, verified, origin);
    let attempt = uuid::Uuid::new_v4().to_string();
    let delivery = NewDelivery {
        attempt: Some(&attempt),
        ..prepared.delivery()
    };
    let deadline = Instant::now() + STORE_BUDGET;
    let mut conn = held.lock().await;
    let mut retried = false;
    // Whether the first attempt broke after its statement reached the server.
    let mut maybe_committed = false;
    loop {
        let result = match timeout_at(deadline, conn.get()).await {
            Err(_) => Err(StoreError::NoAnswer(STORE_BUDGET)),
            Ok(Err(e)) => Err(StoreError::NoConnection(e)),
            Ok(Ok(c)) => {
                let bound = deadline.min(Instant::now() + STATEMENT_TIMEOUT);
                let attempt = async {
                    if maybe_committed {
                        if let Some(first) = stored_by_attempt(&mut *c, &delivery).await? {
                            return Ok(first);
                        }
                    }
                    store_or_refuse(c, &delivery).await
                };
                timeout_at(bound, attempt)
                    .await
                    .unwrap_or(Err(StoreError::NoAnswer(STATEMENT_TIMEOUT)))
            }
        };
        match result {
            Err(error) if error.is_unavailable() => {
                conn.discard();
                if retried {
                    return Err(error);
                }
                tracing::info!(error = %error, "the held connection failed; trying a new one");
                retried = true;
                maybe_committed = !matches!(error, StoreError::NoConnection(_));
            }
            Ok(stored) if maybe_committed && !delivery.fetched => {
                let resend = stored.verdict != Verdict::Conflict && stored.status.is_pending();
                return Ok(Stored {
                    marked: stored.marked || resend,
                    ..stored
                });
            }
            other => return other,
        }
    }
}

/// [`store_verified`] on a connection the caller holds (the worker's, storing a thin event's
/// read).
pub async fn store_verified_on(
    conn: &mut PgConnection,
    source: &str,
    body: &[u8],
    verified: &VerifiedEvent,
    origin: Origin<'_>,
) -> Result<Stored, StoreError> {
    let prepared = Prepared::new(source, body, verified, origin);
    store_or_refuse(conn, &prepared.delivery()).await
}

/// The statement, and the bare record when the database refuses the parsed event.
async fn store_or_refuse(
    conn: &mut PgConnection,
    delivery: &NewDelivery<'_>,
) -> Result<Stored, StoreError> {
    match store_delivery(&mut *conn, delivery).await {
        Err(error) if error.refuses_content() => {
            let code = sql_state(&error);
            // The cause goes to the log by its code only: a message may quote the payload.
            tracing::error!(source = delivery.source, dedupe_key = delivery.dedupe_key.as_str(), sql_state = %code,
                "the database refused the event as parsed; storing it unprocessable");
            let refused = format!("the database refused the parsed event (SQLSTATE {code})");
            let bare = NewDelivery {
                event_type: "unknown",
                payload: None,
                body_is_payload: false,
                customer_key: None,
                occurred_at: None,
                status: EventStatus::Unprocessable,
                reason: Some(&refused),
                delivery_id: None,
                ..*delivery
            };
            store_delivery(conn, &bare)
                .await
                .map_err(|e| StoreError::Refused(Box::new(e)))
        }
        other => other,
    }
}

fn sql_state(error: &StoreError) -> String {
    match error {
        StoreError::Database(sqlx::Error::Database(db)) => {
            db.code().map(|c| c.into_owned()).unwrap_or_default()
        }
        _ => "none".to_owned(),
    }
}
