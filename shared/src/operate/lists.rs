//! The admin API's lists (docs/api.md, `/v1/admin/…`): events by what an operator searches
//! for, one event's whole story, effects by status, the audit's open divergences and the
//! provider audits' open differences.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;

use super::{cut, Place};
use crate::billing::fold::Via;
use crate::domain::EventStatus;
use crate::effects::outbox::EffectStatus;
use crate::inbox::read::{event_detail, DeliveryView};
use crate::platform::db::exec;

/// What the events list is narrowed to; each is exact.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub status: Option<EventStatus>,
    pub source: Option<String>,
    pub event_type: Option<String>,
    /// The store's customer id.
    pub customer: Option<String>,
    pub provider_event_id: Option<String>,
}

/// One event of the admin list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedEvent {
    pub event_id: i64,
    pub source: String,
    pub provider_event_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub customer_id: Option<String>,
    pub occurred_at: Option<DateTime<Utc>>,
    pub received_at: DateTime<Utc>,
    pub status: EventStatus,
    pub outcome: Option<String>,
    pub reason: Option<String>,
    pub seen_count: i32,
    pub attempts: i32,
    pub via: Via,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventsPage {
    pub events: Vec<ListedEvent>,
    /// The id the next page starts below.
    pub next: Option<String>,
}

/// An events list's row as the statements read it.
struct EventRow {
    id: i64,
    source: String,
    dedupe_key: String,
    event_type: String,
    customer_key: Option<String>,
    occurred_at: Option<DateTime<Utc>>,
    received_at: DateTime<Utc>,
    status: EventStatus,
    outcome: Option<String>,
    reason: Option<String>,
    seen_count: i32,
    attempts: i32,
    via: Option<String>,
}

/// The newest events that pass `filter`, `limit` of them, below the id `before`. Events of a
/// status in flight or given up are read from their rows in `inbox_work` (docs/design.md §3.4),
/// the event's row keeping no index on its status: the answer costs those events, not the
/// store's whole history.
pub async fn events(
    conn: &mut PgConnection,
    filter: &EventFilter,
    limit: i64,
    before: Option<i64>,
) -> Result<EventsPage, sqlx::Error> {
    let rows = if filter.status.is_some_and(EventStatus::has_work_row) {
        sqlx::query_as!(
            EventRow,
            r#"
            SELECT e.id, e.source, e.dedupe_key, e.type AS event_type, e.customer_key, e.occurred_at,
                   e.received_at, e.status AS "status: EventStatus", l.outcome AS "outcome?",
                   COALESCE(l.reason, e.reason) AS reason, e.seen_count, e.attempts,
                   (SELECT d.headers->>'via' FROM deliveries d WHERE d.event_id = e.id
                    ORDER BY d.id LIMIT 1) AS via
            FROM inbox_work w
            JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
            LEFT JOIN account_log l ON l.event_id = e.id
            WHERE w.stage = inbox_stage($1) AND e.status = $1
              AND ($2::text IS NULL OR e.source = $2)
              AND ($3::text IS NULL OR e.type = $3)
              AND ($4::text IS NULL OR e.customer_key = $4)
              AND ($5::text IS NULL OR e.dedupe_key = $5)
              AND ($6::bigint IS NULL OR w.event_id < $6)
            ORDER BY w.event_id DESC
            LIMIT $7
            "#,
            filter.status.map(EventStatus::as_str),
            filter.source.as_deref(),
            filter.event_type.as_deref(),
            filter.customer.as_deref(),
            filter.provider_event_id.as_deref(),
            before,
            limit + 1,
        )
        .fetch_all(exec(conn))
        .await?
    } else {
        sqlx::query_as!(
            EventRow,
            r#"
            SELECT e.id, e.source, e.dedupe_key, e.type AS event_type, e.customer_key, e.occurred_at,
                   e.received_at, e.status AS "status: EventStatus", l.outcome AS "outcome?",
                   COALESCE(l.reason, e.reason) AS reason, e.seen_count, e.attempts,
                   (SELECT d.headers->>'via' FROM deliveries d WHERE d.event_id = e.id
                    ORDER BY d.id LIMIT 1) AS via
            FROM inbox_events e LEFT JOIN account_log l ON l.event_id = e.id
            WHERE ($1::text IS NULL OR e.status = $1)
              AND ($2::text IS NULL OR e.source = $2)
              AND ($3::text IS NULL OR e.type = $3)
              AND ($4::text IS NULL OR e.customer_key = $4)
              AND ($5::text IS NULL OR e.dedupe_key = $5)
              AND ($6::bigint IS NULL OR e.id < $6)
            ORDER BY e.id DESC
            LIMIT $7
            "#,
            filter.status.map(EventStatus::as_str),
            filter.source.as_deref(),
            filter.event_type.as_deref(),
            filter.customer.as_deref(),
            filter.provider_event_id.as_deref(),
            before,
            limit + 1,
        )
        .fetch_all(exec(conn))
        .await?
    };
    let events: Vec<ListedEvent> = rows
        .into_iter()
        .map(|row| ListedEvent {
            via: Via::of(&row.dedupe_key, row.via.as_deref()),
            event_id: row.id,
            source: row.source,
            provider_event_id: row.dedupe_key,
            event_type: row.event_type,
            customer_id: row.customer_key,
            occurred_at: row.occurred_at,
            received_at: row.received_at,
            status: row.status,
            outcome: row.outcome,
            reason: row.reason,
            seen_count: row.seen_count,
            attempts: row.attempts,
        })
        .collect();
    let (events, next) = cut(events, limit, |last| last.event_id.to_string());
    Ok(EventsPage { events, next })
}

/// An effect an event caused, as its story lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CausedEffect {
    pub effect_id: String,
    pub kind: String,
    pub status: String,
}

/// One event's whole story: the row, every delivery, the payload as verified (no signature,
/// no secret: the store keeps neither in it), the effects it caused.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventStory {
    pub event: StoryEvent,
    pub deliveries: Vec<StoryDelivery>,
    pub payload: Option<Value>,
    pub effects: Vec<CausedEffect>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoryEvent {
    #[serde(flatten)]
    pub listed: ListedEvent,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub locked_until: Option<DateTime<Utc>>,
    pub enqueued_at: Option<DateTime<Utc>>,
    pub processed_at: Option<DateTime<Utc>>,
    pub replays: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoryDelivery {
    pub delivery_id: i64,
    pub received_at: DateTime<Utc>,
    pub verdict: String,
    pub provider_delivery_id: Option<String>,
    pub sent_at: Option<DateTime<Utc>>,
    /// The delivery headers the intake keeps (never a signature).
    pub headers: Value,
}

impl From<DeliveryView> for StoryDelivery {
    fn from(d: DeliveryView) -> Self {
        Self {
            delivery_id: d.id,
            received_at: d.received_at,
            verdict: d.verdict,
            provider_delivery_id: d.delivery_id,
            sent_at: d.sent_at,
            headers: d.headers,
        }
    }
}

/// The story of the event `id`; `None` when there is no such event (or the purge took it).
pub async fn event_story(
    conn: &mut PgConnection,
    id: i64,
) -> Result<Option<EventStory>, sqlx::Error> {
    let Some(detail) = event_detail(&mut *conn, id).await? else {
        return Ok(None);
    };
    let more = sqlx::query!(
        r#"SELECT (SELECT outcome FROM account_log WHERE event_id = $1) AS outcome,
                  (SELECT replays FROM inbox_events WHERE id = $1) AS "replays!"
        "#,
        id
    )
    .fetch_one(exec(&mut *conn))
    .await?;
    let effects = sqlx::query_as!(
        CausedEffect,
        "SELECT id AS effect_id, kind, status FROM effects WHERE event_id = $1 ORDER BY sequence",
        id
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    let s = detail.summary;
    let first_via = detail
        .deliveries
        .first()
        .and_then(|d| d.headers.get("via"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(Some(EventStory {
        event: StoryEvent {
            listed: ListedEvent {
                via: Via::of(&s.dedupe_key, first_via.as_deref()),
                event_id: s.id,
                source: s.source,
                provider_event_id: s.dedupe_key,
                event_type: s.event_type,
                customer_id: s.customer_id,
                occurred_at: s.occurred_at,
                received_at: s.received_at,
                status: s.status,
                outcome: more.outcome,
                reason: s.reason,
                seen_count: s.seen_count,
                attempts: s.attempts,
            },
            last_error: s.last_error,
            next_attempt_at: detail.next_attempt_at,
            locked_until: detail.locked_until,
            enqueued_at: detail.enqueued_at,
            processed_at: detail.processed_at,
            replays: more.replays,
        },
        deliveries: detail.deliveries.into_iter().map(Into::into).collect(),
        payload: detail.payload,
        effects,
    }))
}

/// One effect of the admin list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedEffect {
    pub effect_id: String,
    pub kind: String,
    pub source: String,
    pub customer_id: String,
    pub sequence: i64,
    /// `None` for an effect a debit told.
    pub event_id: Option<i64>,
    pub occurred_at: DateTime<Utc>,
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectsPage {
    pub effects: Vec<ListedEffect>,
    pub next: Option<String>,
}

/// The newest effects (with `status` when given), `limit` of them, after `after`.
pub async fn effects(
    conn: &mut PgConnection,
    status: Option<EffectStatus>,
    limit: i64,
    after: Option<&Place<String>>,
) -> Result<EffectsPage, sqlx::Error> {
    let (at, id) = match after {
        Some(place) => (Some(place.at), Some(place.id.as_str())),
        None => (None, None),
    };
    let effects = sqlx::query_as!(
        ListedEffect,
        r#"
        SELECT id AS effect_id, kind, source, customer_id, sequence, event_id, occurred_at,
               status, attempts, last_error, created_at, sent_at
        FROM effects
        WHERE ($1::text IS NULL OR status = $1)
          AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3::text))
        ORDER BY created_at DESC, id DESC
        LIMIT $4
        "#,
        status.map(EffectStatus::as_str),
        at,
        id,
        limit + 1,
    )
    .fetch_all(exec(conn))
    .await?;
    let (effects, next) = cut(effects, limit, |last| {
        Place {
            at: last.created_at,
            id: last.effect_id.clone(),
        }
        .encode()
    });
    Ok(EffectsPage { effects, next })
}

/// A difference the audit found and that still stands: the audit's own, with when it was
/// first and last seen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    #[serde(flatten)]
    pub found: crate::audit::Divergence,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

/// The most divergences one answer lists, the latest seen first.
pub const MAX_DIVERGENCES: i64 = 500;

pub async fn divergences(conn: &mut PgConnection) -> Result<Vec<Divergence>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT source, customer_id, field, stored, folded, first_seen, last_seen
         FROM audit_divergences ORDER BY last_seen DESC, source, customer_id, field LIMIT $1",
        MAX_DIVERGENCES
    )
    .fetch_all(exec(conn))
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| Divergence {
            found: crate::audit::Divergence {
                source: row.source,
                customer_id: row.customer_id,
                field: row.field,
                stored: row.stored,
                folded: row.folded,
            },
            first_seen: row.first_seen,
            last_seen: row.last_seen,
        })
        .collect())
}

/// The provider audits' open differences (docs/design.md §4.13a, §4.14): each account's meter
/// month whose provider total differs from the reports sent to it, and each Stripe-mirrored
/// credit grant whose ledger balance differs from Stripe's; each oldest first, at most
/// [`MAX_DIVERGENCES`] of each.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProviderDifferences {
    pub meter_differences: Vec<crate::meters::audit::Difference>,
    pub credit_differences: Vec<crate::audit::credits::CreditDifference>,
}

pub async fn provider_differences(
    conn: &mut PgConnection,
) -> Result<ProviderDifferences, sqlx::Error> {
    let limit = Some(MAX_DIVERGENCES);
    Ok(ProviderDifferences {
        meter_differences: crate::meters::audit::open(conn, None, limit).await?,
        credit_differences: crate::audit::credits::open(conn, None, limit).await?,
    })
}
