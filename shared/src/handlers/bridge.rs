//! The EventBridge function's handler: Stripe's events through its Amazon EventBridge event
//! destination (a partner event source, its partner event bus and a rule that targets this
//! function), stored as the intake stores a verified HTTPS delivery — the same statement, the
//! same dedupe key (the Stripe event's id), the same enqueue — under the configured Stripe
//! source (docs/design.md §1.1, §6.2).
//!
//! There is no signature to check: only AWS can put an event with an `aws.partner/…` source
//! on a partner bus, so the trust is the bus and the source. The one check is that the event
//! came from the one partner source configured; anything else is refused.
//!
//! EventBridge invokes the function asynchronously: an error answer is retried by Lambda's
//! asynchronous invocation (the function's `EventInvokeConfig`) and then sent to the DLQ, as
//! an event EventBridge itself could not hand over is after the rule's retry policy. Those
//! retries are the provider's retries here (docs/deploy.md).

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use chrono::Utc;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::inbox::enqueue_or_unmark;
use crate::inbox::store::{store_verified_held, Origin, StoreError};
use crate::platform::db::Held;
use crate::platform::queue::Queue;
use crate::providers::stripe::event_destination::BridgeConfig;
use crate::providers::stripe::parse_event;

pub struct BridgeState {
    /// The instance's own connection, for the store: one round trip per event.
    pub conn: Held,
    /// For what is rare (unmarking an event the queue refused).
    pub pool: PgPool,
    pub queue: Queue,
    /// The only EventBridge `source` taken: `aws.partner/stripe.com/…`.
    pub event_source: String,
    /// The `INBOX_SOURCES` source the events are stored as.
    pub source: String,
}

impl BridgeState {
    /// A state whose held connection goes where `pool` does.
    pub fn new(pool: PgPool, queue: Queue, event_source: &str, source: &str) -> Self {
        Self {
            conn: Held::new(pool.connect_options().as_ref().clone()),
            pool,
            queue,
            event_source: event_source.to_owned(),
            source: source.to_owned(),
        }
    }

    /// Built once, at cold start; nothing connects before the first event.
    pub async fn from_config(config: &BridgeConfig) -> anyhow::Result<Self> {
        let database = crate::platform::database::Database::open(&config.database).await?;
        let pool = database.pool(2);
        let queue = Queue::from_env(config.queue_url.clone()).await;
        Ok(Self {
            conn: Held::on(database),
            pool,
            queue,
            event_source: config.event_source.clone(),
            source: config.source.clone(),
        })
    }
}

/// Every answer but success: each is an error of the invocation, so that nothing is lost
/// silently — Lambda retries it, then the DLQ holds it and its alarm fires.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// Not the configured partner source: the rule matches only that source, so this is an
    /// event put on the bus some other way, or a rule edited by hand. Never stored.
    #[error("the event's source '{got}' is not the configured Stripe partner event source")]
    ForeignSource { got: String },
    #[error("the event could not be stored; retry later: {0}")]
    StoreUnavailable(#[source] StoreError),
    /// The database refused even the bare record of the event.
    #[error("the event could not be stored: {0}")]
    StoreRefused(#[source] StoreError),
}

impl BridgeError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::ForeignSource { .. } => "foreign_source",
            Self::StoreUnavailable(_) => "store_unavailable",
            Self::StoreRefused(_) => "store_refused",
        }
    }
}

/// Stores one EventBridge event's `detail` (the Stripe event, snapshot or thin) and hands it
/// to the queue. The answer is the intake's: `{status, event_id}`.
///
/// A `detail` that is not a Stripe event (no `id`, no `type`, no `created`) is still stored,
/// `unprocessable` with the reason and keyed by its bytes, exactly as the intake stores a
/// signed body it cannot read, and the answer is success. Failing would not make it valid:
/// Lambda would retry it twice and the DLQ would hold it for 14 days at most, where the
/// inbox keeps it, with its reason, for the operator and a replay. (Stripe's guidance for any
/// destination is the same: acknowledge what arrived, and handle it on your side.)
#[tracing::instrument(skip_all, fields(source = %state.source, eventbridge_id, event_id, verdict))]
pub async fn handle(state: &BridgeState, event: EventBridgeEvent) -> Result<Value, BridgeError> {
    if event.source != state.event_source {
        tracing::warn!(
            code = "foreign_source",
            event_source = %event.source,
            detail_type = %event.detail_type,
            "an EventBridge event from another source is refused"
        );
        return Err(BridgeError::ForeignSource { got: event.source });
    }
    if let Some(id) = &event.id {
        tracing::Span::current().record("eventbridge_id", id.as_str());
    }
    // The stored raw body is the detail as sent on the bus (EventBridge hands over JSON, not
    // Stripe's bytes); the content hash is over the canonical JSON without the per-delivery
    // fields, so the same event arriving over HTTPS too is a duplicate, not a conflict.
    let body = serde_json::to_vec(&event.detail).expect("a JSON value serializes");
    let mut verified = parse_event(&body, event.time.unwrap_or_else(Utc::now));
    verified.delivery_id = event.id.clone();
    let headers = json!({
        "via": "eventbridge",
        "eventbridge-source": event.source,
        "eventbridge-detail-type": event.detail_type,
    });
    let stored = store_verified_held(
        &state.conn,
        &state.source,
        &body,
        &verified,
        Origin::Delivery(&headers),
    )
    .await
    .map_err(|e| {
        let error = if e.is_unavailable() {
            BridgeError::StoreUnavailable(e)
        } else {
            BridgeError::StoreRefused(e)
        };
        tracing::error!(code = error.code(), error = %error, "the EventBridge event was not stored");
        error
    })?;
    if super::intake::stored_needs_enqueue(&stored, &state.source, &verified) {
        // A failed send is not EventBridge's problem: the event is stored and marked, and the
        // scheduler's rescue sends it (docs/design.md §3.7).
        if let Err(e) = enqueue_or_unmark(&state.pool, &state.queue, &[stored.event_id]).await {
            tracing::warn!(
                event_id = stored.event_id,
                error = format!("{e:#}"),
                "could not clear enqueued_at"
            );
        }
    }
    Ok(json!({"status": stored.verdict.as_str(), "event_id": stored.event_id}))
}
