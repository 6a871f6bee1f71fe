//! The worker: claims a stored event under a lease, applies its effects, writes the account's
//! log line and marks the event final, all in one transaction.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Connection, PgPool};

use crate::apply::{self, Change, EventContext};
use crate::billing::{decide, Catalog, Decision, Version};
use crate::config::{parse_sources, ConfigError, SourceKind};
use crate::queue::parse_message_body;

/// Attempts before an event is dead: the 6th failure ends it. An attempt whose worker died
/// (its lease expired) counts too, so an event that crashes every worker cannot loop forever.
pub const MAX_ATTEMPTS: i32 = 6;
/// Longer than the worker's per-event budget, shorter than the SQS visibility timeout.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Waits after the 1st..5th failed attempt; the 6th failure makes the event dead.
pub const RETRY_DELAYS: [Duration; 5] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
    Duration::from_secs(3600),
];

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub database_url: String,
    pub sources: HashMap<String, SourceKind>,
    pub catalog: Catalog,
}

impl WorkerConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        let var = |name: &'static str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .ok_or(ConfigError {
                    var: name,
                    detail: "is not set".into(),
                })
        };
        let sources = parse_sources(&var("INBOX_SOURCES")?)?
            .into_iter()
            .map(|s| (s.name, s.kind))
            .collect();
        let catalog = Catalog::parse(&var("INBOX_PLANS")?).map_err(|detail| ConfigError {
            var: "INBOX_PLANS",
            detail,
        })?;
        Ok(Self {
            database_url: var("DATABASE_URL")?,
            sources,
            catalog,
        })
    }
}

/// Where a fault can be injected, to prove that a crash at that point loses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// After an event's first register write, before the rest (e.g. the allowance grant).
    BetweenEffects,
    /// After every write, before the commit.
    BeforeCommit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Fail this many times (an error return; the transaction rolls back).
    Fail(u32),
    /// End the process on the spot, mid-transaction.
    Exit,
}

/// Injected faults, empty in production. Each worker state has its own, so tests that run
/// side by side do not see each other's faults.
#[derive(Debug, Default)]
pub struct Faults(Mutex<HashMap<FaultPoint, FaultAction>>);

impl Faults {
    pub fn set(&self, point: FaultPoint, action: FaultAction) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(point, action);
    }

    fn hit(&self, point: FaultPoint) -> Result<(), WorkerError> {
        let mut faults = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match faults.get(&point).copied() {
            Some(FaultAction::Exit) => std::process::exit(86),
            Some(FaultAction::Fail(n)) if n > 0 => {
                faults.insert(point, FaultAction::Fail(n - 1));
                Err(WorkerError::Injected(point))
            }
            _ => Ok(()),
        }
    }
}

pub struct WorkerState {
    pub pool: PgPool,
    pub sources: HashMap<String, SourceKind>,
    pub catalog: Catalog,
    pub lease: Duration,
    pub retry_delays: Vec<Duration>,
    pub faults: Faults,
}

impl WorkerState {
    pub fn new(pool: PgPool, sources: HashMap<String, SourceKind>, catalog: Catalog) -> Self {
        Self {
            pool,
            sources,
            catalog,
            lease: DEFAULT_LEASE,
            retry_delays: RETRY_DELAYS.to_vec(),
            faults: Faults::default(),
        }
    }

    pub fn from_config(config: &WorkerConfig, max_connections: u32) -> Result<Self, sqlx::Error> {
        let pool = crate::db::lazy_pool(&config.database_url, max_connections)?;
        Ok(Self::new(
            pool,
            config.sources.clone(),
            config.catalog.clone(),
        ))
    }
}

/// The wait before the next attempt after `attempts` failed ones; `None`: no attempt left.
fn retry_delay(delays: &[Duration], attempts: i32) -> Option<Duration> {
    let index = usize::try_from(attempts).ok()?.checked_sub(1)?;
    delays.get(index).copied()
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("source '{0}' is not configured")]
    UnknownSource(String),
    #[error("the lease on the event was lost to another worker")]
    LeaseLost,
    #[error("injected fault at {0:?}")]
    Injected(FaultPoint),
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// The event is final now, with this status and reason.
    Finished {
        status: &'static str,
        reason: String,
    },
    /// Nothing to do: the event is final, leased by another worker, not due, or gone.
    Skipped,
    /// This attempt failed; the event is `failed` (retry due later) or `dead`.
    Failed { status: &'static str, error: String },
}

struct Claimed {
    id: i64,
    source: String,
    dedupe_key: String,
    event_type: String,
    payload: Option<Value>,
    customer_key: Option<String>,
    occurred_at: Option<DateTime<Utc>>,
    attempts: i32,
}

/// Takes the event for this worker for one lease, if it is claimable: `received`, `failed`
/// and due, or `processing` with an expired lease. Commits at once, so the lease outlives a
/// crash and another worker can take the event when it expires.
async fn claim(
    pool: &PgPool,
    event_id: i64,
    lease: Duration,
) -> Result<Option<Claimed>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        UPDATE inbox_events e
        SET status = 'processing',
            locked_until = now() + make_interval(secs => $2),
            attempts = e.attempts + 1
        WHERE e.id = (
            SELECT id FROM inbox_events
            WHERE id = $1
              AND (status = 'received'
                   OR (status = 'failed' AND next_attempt_at <= now())
                   OR (status = 'processing' AND locked_until < now() AND attempts < $3))
            FOR UPDATE SKIP LOCKED
        )
        RETURNING e.id, e.source, e.dedupe_key, e.type, e.payload, e.customer_key, e.occurred_at, e.attempts
        "#,
        event_id,
        lease.as_secs_f64(),
        MAX_ATTEMPTS,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Claimed {
        id: r.id,
        source: r.source,
        dedupe_key: r.dedupe_key,
        event_type: r.r#type,
        payload: r.payload,
        customer_key: r.customer_key,
        occurred_at: r.occurred_at,
        attempts: r.attempts,
    }))
}

/// Processes one stored event. An error means the database could not be reached at all;
/// every other failure is recorded on the event and reported as `Failed`.
#[tracing::instrument(skip_all, fields(event_id))]
pub async fn process_event(state: &WorkerState, event_id: i64) -> Result<Processed, sqlx::Error> {
    let Some(event) = claim(&state.pool, event_id, state.lease).await? else {
        return Ok(Processed::Skipped);
    };
    match apply_claimed(state, &event).await {
        Ok((status, reason)) => Ok(Processed::Finished { status, reason }),
        Err(WorkerError::LeaseLost) => {
            tracing::warn!(event_id, "lease lost; another worker has the event");
            Ok(Processed::Skipped)
        }
        Err(error) => record_failure(state, &event, &error).await,
    }
}

/// Marks a failed attempt: `failed` with the next attempt's time, or `dead` after the last.
async fn record_failure(
    state: &WorkerState,
    event: &Claimed,
    error: &WorkerError,
) -> Result<Processed, sqlx::Error> {
    let message = error.to_string();
    let delay = retry_delay(&state.retry_delays, event.attempts);
    let status = if delay.is_some() { "failed" } else { "dead" };
    tracing::warn!(event_id = event.id, attempts = event.attempts, status, error = %message, "event attempt failed");
    sqlx::query!(
        r#"
        UPDATE inbox_events
        SET status = $2,
            last_error = $3,
            next_attempt_at = CASE WHEN $4::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => $4) END,
            locked_until = NULL
        WHERE id = $1 AND status = 'processing' AND attempts = $5
        "#,
        event.id,
        status,
        message,
        delay.map(|d| d.as_secs_f64()),
        event.attempts,
    )
    .execute(&state.pool)
    .await?;
    Ok(Processed::Failed {
        status,
        error: message,
    })
}

/// The one transaction: re-check the lease, decide, write the registers, log, finish.
async fn apply_claimed(
    state: &WorkerState,
    event: &Claimed,
) -> Result<(&'static str, String), WorkerError> {
    let kind = *state
        .sources
        .get(&event.source)
        .ok_or_else(|| WorkerError::UnknownSource(event.source.clone()))?;
    let mut conn = state.pool.acquire().await?;
    let mut tx = conn.begin().await?;

    // Still ours? Holding the row lock from here keeps other claims off it until commit.
    let held = sqlx::query_scalar!(
        "SELECT id FROM inbox_events WHERE id = $1 AND status = 'processing' AND attempts = $2 FOR UPDATE",
        event.id,
        event.attempts
    )
    .fetch_optional(&mut *tx)
    .await?;
    if held.is_none() {
        return Err(WorkerError::LeaseLost);
    }

    let decision = match (&event.payload, event.occurred_at) {
        (Some(payload), Some(_)) => decide(
            kind,
            &event.event_type,
            payload,
            &event.dedupe_key,
            &state.catalog,
        ),
        _ => Decision::Unprocessable("the stored event has no parsed payload".into()),
    };
    let (status, reason) = match (decision, event.customer_key.as_deref(), event.occurred_at) {
        (Decision::Unprocessable(reason), _, _) => ("unprocessable", reason),
        (Decision::Ignore(reason), customer, at) => {
            if let (Some(customer), Some(at)) = (customer, at) {
                let ctx = context(event, customer, at);
                apply::lock_account(&mut tx, &event.source, customer).await?;
                apply::log_outcome(&mut tx, &ctx, "ignored", &reason).await?;
            }
            ("ignored", reason)
        }
        (Decision::Apply(_), None, _) => ("ignored", "the event names no customer".to_owned()),
        (Decision::Apply(effects), Some(customer), Some(at)) => {
            let ctx = context(event, customer, at);
            apply::lock_account(&mut tx, &event.source, customer).await?;
            let mut changes = Vec::with_capacity(effects.len());
            for (i, effect) in effects.iter().enumerate() {
                if i == 1 {
                    state.faults.hit(FaultPoint::BetweenEffects)?;
                }
                changes.push(apply::apply_effect(&mut tx, &ctx, effect).await?);
            }
            let (status, reason) = outcome(&changes);
            apply::log_outcome(&mut tx, &ctx, status, &reason).await?;
            (status, reason)
        }
        (Decision::Apply(_), Some(_), None) => {
            ("unprocessable", "the event has no provider time".to_owned())
        }
    };
    state.faults.hit(FaultPoint::BeforeCommit)?;
    sqlx::query!(
        r#"
        UPDATE inbox_events
        SET status = $2, reason = $3, processed_at = now(), locked_until = NULL,
            next_attempt_at = NULL, last_error = NULL
        WHERE id = $1
        "#,
        event.id,
        status,
        reason,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(event_id = event.id, status, reason = %reason, "event finished");
    Ok((status, reason))
}

fn context<'a>(event: &'a Claimed, customer: &'a str, at: DateTime<Utc>) -> EventContext<'a> {
    EventContext {
        event_id: event.id,
        source: &event.source,
        customer,
        event_type: &event.event_type,
        version: Version {
            at,
            key: event.dedupe_key.clone(),
        },
    }
}

/// An event is applied when one of its writes took effect, or all of them already hold this
/// very event (a replay); it is ignored, with the first reason, when something newer won.
fn outcome(changes: &[Change]) -> (&'static str, String) {
    let made: Vec<&str> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Made(words) => Some(words.as_str()),
            _ => None,
        })
        .collect();
    let superseded = changes.iter().find_map(|c| match c {
        Change::Superseded(words) => Some(words.as_str()),
        _ => None,
    });
    let kept: Vec<&str> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Made(_) => None,
            Change::AlreadyApplied(words) | Change::Superseded(words) => Some(words.as_str()),
        })
        .collect();
    match (made.is_empty(), superseded) {
        (false, _) if kept.is_empty() => ("applied", made.join("; ")),
        (false, _) => (
            "applied",
            format!("{}; {}", made.join("; "), kept.join("; ")),
        ),
        (true, Some(words)) => ("ignored", words.to_owned()),
        (true, None) => ("applied", kept.join("; ")),
    }
}

/// Handles an SQS batch: every message names one event. Only messages whose event could not
/// be processed for a transient reason are reported, so SQS delivers them again.
pub async fn handle_batch(state: &WorkerState, event: SqsEvent) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for message in event.records {
        let Some(message_id) = message.message_id.clone() else {
            continue;
        };
        let Some(event_id) = message.body.as_deref().and_then(parse_message_body) else {
            // Not ours to retry: a body that is not an event id never will be.
            tracing::error!(message_id, "message body is not an event id; dropping it");
            continue;
        };
        let retry = match process_event(state, event_id).await {
            Ok(Processed::Failed { status, .. }) => status == "failed",
            Ok(_) => false,
            Err(error) => {
                tracing::error!(event_id, error = %error, "database unavailable; the message will be delivered again");
                true
            }
        };
        if retry {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = message_id;
            response.batch_item_failures.push(failure);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_schedule_then_dead() {
        let delays: Vec<_> = (1..=6)
            .map(|a| retry_delay(&RETRY_DELAYS, a).map(|d| d.as_secs()))
            .collect();
        assert_eq!(
            delays,
            [Some(5), Some(30), Some(120), Some(600), Some(3600), None]
        );
    }

    #[test]
    fn outcome_words() {
        let made = Change::Made("plan set to pro".into());
        let newer = Change::Superseded("a newer plan change is already stored".into());
        let granted = Change::Superseded("the pro allowance for 2026-03 is already granted".into());
        let again = Change::AlreadyApplied("this plan change is already stored".into());
        assert_eq!(outcome(std::slice::from_ref(&made)).0, "applied");
        assert_eq!(
            outcome(std::slice::from_ref(&newer)),
            (
                "ignored",
                "a newer plan change is already stored".to_owned()
            )
        );
        assert_eq!(outcome(&[newer, granted.clone()]).0, "ignored");
        assert_eq!(outcome(&[made, granted]).0, "applied");
        assert_eq!(outcome(&[again]).0, "applied");
    }
}
