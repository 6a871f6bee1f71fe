//! The scheduled run: rescue what the queue lost, report what died, reconcile with the
//! providers, purge what is done. Every step is bounded in rows and time, safe to run twice
//! at once, and fails alone: one step's error is reported, the others still run.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::config::{parse_sources, ConfigError};
use crate::queue::Queue;
use crate::reconcile::{self, ReconcileReport, Reconciler};

/// A row stored this long ago and never enqueued is rescued (the intake's send failed).
pub const NEVER_ENQUEUED_AFTER: Duration = Duration::from_secs(60);
/// A row enqueued this long ago and still `received` is enqueued again (its message was lost).
pub const STUCK_AFTER: Duration = Duration::from_secs(300);
pub const DEFAULT_RETENTION_DAYS: u64 = 30;
/// Twice the longest provider retry window (Stripe retries for 3 days).
pub const MIN_RETENTION_DAYS: u64 = 6;
const ROWS_PER_STEP: i64 = 1000;
const PURGE_BATCH: i64 = 500;
pub const METRICS_NAMESPACE: &str = "BillingInbox";

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub database_url: String,
    pub queue_url: String,
    pub sources: Vec<crate::config::SourceConfig>,
    pub retention: Duration,
}

impl SchedulerConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let var = |name: &'static str| {
            lookup(name)
                .filter(|v| !v.trim().is_empty())
                .ok_or(ConfigError {
                    var: name,
                    detail: "is not set".into(),
                })
        };
        let retention_days = match lookup("INBOX_RETENTION_DAYS") {
            None => DEFAULT_RETENTION_DAYS,
            Some(raw) => raw
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|d| *d >= MIN_RETENTION_DAYS)
                .ok_or_else(|| ConfigError {
                    var: "INBOX_RETENTION_DAYS",
                    detail: format!(
                        "'{raw}' is not a number of days of at least {MIN_RETENTION_DAYS} (twice the longest provider retry window)"
                    ),
                })?,
        };
        Ok(Self {
            database_url: var("DATABASE_URL")?,
            queue_url: var("QUEUE_URL")?,
            sources: parse_sources(&var("INBOX_SOURCES")?)?,
            retention: Duration::from_secs(retention_days * 86_400),
        })
    }
}

pub struct SchedulerState {
    pub pool: PgPool,
    pub queue: Queue,
    pub reconcilers: Vec<Reconciler>,
    pub retention: Duration,
    /// The run's time budget, well inside the function's timeout.
    pub budget: Duration,
}

impl SchedulerState {
    pub async fn from_config(config: &SchedulerConfig) -> anyhow::Result<Self> {
        let pool = crate::db::lazy_pool(&config.database_url, 2).context("DATABASE_URL")?;
        let queue = Queue::from_env(config.queue_url.clone()).await;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        let reconcilers = reconcile::reconcilers(&config.sources, &http)
            .map_err(|detail| anyhow::anyhow!("INBOX_SOURCES: {detail}"))?;
        Ok(Self {
            pool,
            queue,
            reconcilers,
            retention: config.retention,
            budget: Duration::from_secs(50),
        })
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Alerts {
    pub dead: Vec<i64>,
    pub unprocessable: Vec<i64>,
    pub conflicts: Vec<i64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Backlog {
    pub by_status: std::collections::BTreeMap<String, i64>,
    pub oldest_unapplied_age_secs: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    pub rescued: Vec<i64>,
    pub alerts: Alerts,
    pub reconciliation: Vec<ReconcileReport>,
    pub purged: u64,
    pub backlog: Backlog,
    /// Steps that failed, with their error; the others ran.
    pub errors: Vec<String>,
}

/// One scheduled run.
#[tracing::instrument(skip_all)]
pub async fn run(state: &SchedulerState) -> RunReport {
    let deadline = Instant::now() + state.budget;
    let mut report = RunReport::default();
    match rescue(&state.pool, &state.queue).await {
        Ok(ids) => report.rescued = ids,
        Err(e) => report.errors.push(format!("rescue: {e:#}")),
    }
    match collect_alerts(&state.pool).await {
        Ok(alerts) => report.alerts = alerts,
        Err(e) => report.errors.push(format!("alerts: {e:#}")),
    }
    for reconciler in &state.reconcilers {
        if Instant::now() >= deadline {
            report.errors.push(format!(
                "reconcile {}: skipped, the run's time is up",
                reconciler.source()
            ));
            continue;
        }
        report
            .reconciliation
            .push(reconcile::run(reconciler, &state.pool, &state.queue, deadline).await);
    }
    match purge(&state.pool, state.retention, deadline).await {
        Ok(n) => report.purged = n,
        Err(e) => report.errors.push(format!("purge: {e:#}")),
    }
    match backlog(&state.pool).await {
        Ok(b) => report.backlog = b,
        Err(e) => report.errors.push(format!("backlog: {e:#}")),
    }
    for error in &report.errors {
        tracing::error!(error = %error, "scheduler step failed");
    }
    // Metrics go to stdout as one EMF document, which CloudWatch turns into metrics.
    println!("{}", emf(&report, Utc::now()));
    report
}

/// Re-enqueues the rows the queue lost: stored but never enqueued, stuck `received`, leases
/// that expired and failed rows that are due. Each row is marked in the same statement that
/// picks it (SKIP LOCKED), so two overlapping runs never enqueue one row twice.
pub async fn rescue(pool: &PgPool, queue: &Queue) -> anyhow::Result<Vec<i64>> {
    // An event whose worker died on its last allowed attempt is dead, not retried: nothing
    // else would stop an event that crashes every worker.
    let buried = sqlx::query!(
        r#"
        UPDATE inbox_events
        SET status = 'dead', locked_until = NULL, next_attempt_at = NULL,
            last_error = COALESCE(last_error || '; ', '') || 'the worker stopped during the last attempt (lease expired)'
        WHERE status = 'processing' AND locked_until < now() AND attempts >= $1
        "#,
        crate::worker::MAX_ATTEMPTS,
    )
    .execute(pool)
    .await
    .context("burying events whose last attempt crashed")?
    .rows_affected();
    if buried > 0 {
        tracing::warn!(
            count = buried,
            "events died with their worker on the last attempt"
        );
    }
    let ids: Vec<i64> = sqlx::query_scalar!(
        r#"
        UPDATE inbox_events SET enqueued_at = now()
        WHERE id IN (
            SELECT id FROM inbox_events
            WHERE (status = 'received' AND received_at < now() - make_interval(secs => $2)
                   AND (enqueued_at IS NULL OR enqueued_at < now() - make_interval(secs => $3)))
               OR (status = 'processing' AND locked_until < now() AND attempts < $4
                   AND (enqueued_at IS NULL OR enqueued_at < locked_until))
               OR (status = 'failed' AND next_attempt_at <= now()
                   AND (enqueued_at IS NULL OR enqueued_at < next_attempt_at))
            ORDER BY id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        RETURNING id
        "#,
        ROWS_PER_STEP,
        NEVER_ENQUEUED_AFTER.as_secs_f64(),
        STUCK_AFTER.as_secs_f64(),
        crate::worker::MAX_ATTEMPTS,
    )
    .fetch_all(pool)
    .await
    .context("picking rows to rescue")?;
    if ids.is_empty() {
        return Ok(ids);
    }
    let unsent = send_or_unmark(pool, queue, &ids).await?;
    if !unsent.is_empty() {
        tracing::warn!(
            count = unsent.len(),
            "some rescued events could not be enqueued"
        );
    }
    let sent: Vec<i64> = ids.into_iter().filter(|id| !unsent.contains(id)).collect();
    tracing::info!(count = sent.len(), "rescued events enqueued");
    Ok(sent)
}

/// Reports each newly dead or unprocessable event and each new conflicting delivery once.
pub async fn collect_alerts(pool: &PgPool) -> anyhow::Result<Alerts> {
    let events = sqlx::query!(
        r#"
        UPDATE inbox_events SET alerted_at = now()
        WHERE id IN (
            SELECT id FROM inbox_events
            WHERE status IN ('dead', 'unprocessable') AND alerted_at IS NULL
            ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED
        )
        RETURNING id, source, type, status, last_error, reason
        "#,
        ROWS_PER_STEP,
    )
    .fetch_all(pool)
    .await
    .context("collecting dead and unprocessable events")?;
    let mut alerts = Alerts::default();
    for e in events {
        tracing::error!(
            alert = %e.status, event_id = e.id, source = %e.source, event_type = %e.r#type,
            last_error = e.last_error.as_deref().unwrap_or(""), reason = e.reason.as_deref().unwrap_or(""),
            "event needs an operator"
        );
        if e.status == "dead" {
            alerts.dead.push(e.id);
        } else {
            alerts.unprocessable.push(e.id);
        }
    }
    let conflicts = sqlx::query!(
        r#"
        UPDATE deliveries d SET alerted_at = now()
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
    .fetch_all(pool)
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

/// Deletes applied and ignored events (and their deliveries) older than the retention, in
/// batches. Dead, conflicting and unprocessable rows are kept for the operator.
pub async fn purge(pool: &PgPool, retention: Duration, deadline: Instant) -> anyhow::Result<u64> {
    let mut purged = 0;
    loop {
        let deleted = sqlx::query!(
            r#"
            DELETE FROM inbox_events
            WHERE id IN (
                SELECT id FROM inbox_events
                WHERE status IN ('applied', 'ignored')
                  AND received_at < now() - make_interval(secs => $1)
                ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED
            )
            "#,
            retention.as_secs_f64(),
            PURGE_BATCH,
        )
        .execute(pool)
        .await
        .context("purging finished events")?
        .rows_affected();
        purged += deleted;
        if deleted < PURGE_BATCH as u64 || Instant::now() >= deadline {
            return Ok(purged);
        }
    }
}

pub async fn backlog(pool: &PgPool) -> anyhow::Result<Backlog> {
    let rows =
        sqlx::query!(r#"SELECT status, count(*) AS "count!" FROM inbox_events GROUP BY status"#)
            .fetch_all(pool)
            .await
            .context("counting events by status")?;
    let oldest = sqlx::query_scalar!(
        r#"
        SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(received_at))::float8, 0) AS "age!"
        FROM inbox_events WHERE status IN ('received', 'processing', 'failed')
        "#
    )
    .fetch_one(pool)
    .await
    .context("measuring the backlog's age")?;
    Ok(Backlog {
        by_status: rows.into_iter().map(|r| (r.status, r.count)).collect(),
        oldest_unapplied_age_secs: oldest,
    })
}

/// The run's metrics as one CloudWatch Embedded Metric Format document.
///
/// `DeadEvents` counts every dead event still unresolved (an alarm on it stays raised until an
/// operator replays or resolves them); `ConflictEvents`, `UnprocessableEvents` and
/// `ReconcileDiscrepancies` count what this run found new; `StepErrors` counts the steps that
/// failed in this run (their numbers are then missing or zero).
pub fn emf(report: &RunReport, now: DateTime<Utc>) -> Value {
    let status = |s: &str| report.backlog.by_status.get(s).copied().unwrap_or(0);
    let discrepancies: i64 = report
        .reconciliation
        .iter()
        .map(|r| i64::from(r.discrepancies))
        .sum();
    // A failed step (or reconciliation source) makes the other numbers incomplete: say so.
    let step_errors = report.errors.len()
        + report
            .reconciliation
            .iter()
            .filter(|r| r.error.is_some())
            .count();
    let metrics: [(&str, f64, &str); 11] = [
        ("StepErrors", step_errors as f64, "Count"),
        ("DeadEvents", status("dead") as f64, "Count"),
        (
            "ConflictEvents",
            report.alerts.conflicts.len() as f64,
            "Count",
        ),
        (
            "UnprocessableEvents",
            report.alerts.unprocessable.len() as f64,
            "Count",
        ),
        ("ReconcileDiscrepancies", discrepancies as f64, "Count"),
        ("RescuedEvents", report.rescued.len() as f64, "Count"),
        ("PurgedEvents", report.purged as f64, "Count"),
        (
            "OldestUnappliedAgeSeconds",
            report.backlog.oldest_unapplied_age_secs,
            "Seconds",
        ),
        ("ReceivedEvents", status("received") as f64, "Count"),
        ("ProcessingEvents", status("processing") as f64, "Count"),
        ("FailedEvents", status("failed") as f64, "Count"),
    ];
    let mut document = json!({
        "_aws": {
            "Timestamp": now.timestamp_millis(),
            "CloudWatchMetrics": [{
                "Namespace": METRICS_NAMESPACE,
                "Dimensions": [[]],
                "Metrics": metrics.iter().map(|(name, _, unit)| json!({"Name": name, "Unit": unit})).collect::<Vec<_>>()
            }]
        }
    });
    for (name, value, _) in metrics {
        document[name] = json!(value);
    }
    document
}

/// Puts stored events back to `received` and enqueues them: the one way to replay, used by
/// operators. Applying an event again is harmless by construction. A row a worker holds right
/// now is left alone. Returns the ids replayed.
pub async fn replay(pool: &PgPool, queue: &Queue, ids: &[i64]) -> anyhow::Result<Vec<i64>> {
    let reset: Vec<i64> = sqlx::query_scalar!(
        r#"
        UPDATE inbox_events
        SET status = 'received', attempts = 0, next_attempt_at = NULL, locked_until = NULL,
            processed_at = NULL, alerted_at = NULL, reason = NULL, enqueued_at = now()
        WHERE id = ANY($1) AND NOT (status = 'processing' AND locked_until > now())
        RETURNING id
        "#,
        ids,
    )
    .fetch_all(pool)
    .await
    .context("resetting events for replay")?;
    // What the queue refused stays `received` and unmarked: the next rescue sends it.
    send_or_unmark(pool, queue, &reset).await?;
    Ok(reset)
}

/// Sends event ids already marked `enqueued_at`; unmarks those the queue refused, so that the
/// next rescue tries them again. Returns the refused ids.
async fn send_or_unmark(pool: &PgPool, queue: &Queue, ids: &[i64]) -> anyhow::Result<Vec<i64>> {
    let unsent = queue.send_events(ids).await;
    if !unsent.is_empty() {
        sqlx::query!(
            "UPDATE inbox_events SET enqueued_at = NULL WHERE id = ANY($1)",
            &unsent
        )
        .execute(pool)
        .await
        .context("unmarking events the queue refused")?;
    }
    Ok(unsent)
}

/// The ids of events in `status` (optionally of one source), oldest first, bounded.
pub async fn ids_with_status(
    pool: &PgPool,
    status: &str,
    source: Option<&str>,
) -> anyhow::Result<Vec<i64>> {
    sqlx::query_scalar!(
        r#"
        SELECT id FROM inbox_events
        WHERE status = $1 AND ($2::text IS NULL OR source = $2)
        ORDER BY id LIMIT $3
        "#,
        status,
        source,
        ROWS_PER_STEP,
    )
    .fetch_all(pool)
    .await
    .context("listing events by status")
}
